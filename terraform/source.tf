# The function's source: main.py, requirements.txt and the lossspike/ package, zipped.
# The object name carries a hash of the files, so any code change uploads a new object and
# redeploys the function.

locals {
  source_files = concat(
    ["main.py", "requirements.txt"],
    sort(fileset(local.source_dir, "lossspike/**/*.{py,json,sql}")),
  )
  source_hash = md5(join("\n", [for f in local.source_files : "${f} ${filemd5("${local.source_dir}/${f}")}"]))
}

data "archive_file" "source" {
  type        = "zip"
  output_path = "${path.root}/.terraform/lossspike/source-${local.source_hash}.zip"

  dynamic "source" {
    for_each = local.source_files
    content {
      filename = source.value
      content  = file("${local.source_dir}/${source.value}")
    }
  }
}

resource "google_storage_bucket" "source" {
  #checkov:skip=CKV_GCP_62:Holds only the function's zipped source, written by Terraform; access logs would add cost and no signal.
  project                     = var.project_id
  name                        = local.bucket_name
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false
  labels                      = local.labels

  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 30
    }
    action {
      type = "Delete"
    }
  }

  depends_on = [google_project_service.services]
}

resource "google_storage_bucket_object" "source" {
  name         = "${var.name}-${local.source_hash}.zip"
  bucket       = google_storage_bucket.source.name
  source       = data.archive_file.source.output_path
  content_type = "application/zip"
}
