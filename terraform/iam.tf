# Three identities, each holding only what it uses, each role on the narrowest resource.

resource "google_service_account" "function" {
  project      = var.project_id
  account_id   = "${var.name}-fn"
  display_name = "lossspike evaluator (Cloud Function runtime)"
  description  = "Reads Levanter telemetry, writes loss-spike alert rows and custom metrics."

  depends_on = [google_project_service.services]
}

# Cloud Build runs the function's build as this account. Since July 2024 a new project's default
# build account may lack the rights to build, and where the organization policy
# iam.automaticIamGrantsForDefaultServiceAccounts is enforced it certainly does; so the module
# names its own (https://cloud.google.com/functions/docs/securing/build-custom-sa).
resource "google_service_account" "build" {
  project      = var.project_id
  account_id   = "${var.name}-build"
  display_name = "lossspike build (Cloud Build for the function)"
  description  = "Builds the evaluator's container: reads its source zip, writes the image and the build logs."

  depends_on = [google_project_service.services]
}

resource "google_service_account" "invoker" {
  project      = var.project_id
  account_id   = "${var.name}-invoker"
  display_name = "lossspike tick (Cloud Scheduler invoker)"
  description  = "Identity of the Scheduler job's OIDC token; may only invoke the evaluator."

  depends_on = [google_project_service.services]
}

# Read the telemetry table (or view) only.
resource "google_bigquery_table_iam_member" "telemetry_viewer" {
  count = var.grant_telemetry_access ? 1 : 0

  project    = local.telemetry_project
  dataset_id = local.telemetry_dataset
  table_id   = local.telemetry_table
  role       = "roles/bigquery.dataViewer"
  member     = "serviceAccount:${google_service_account.function.email}"

  depends_on = [google_bigquery_table.telemetry]
}

# Write (and de-duplicate) rows in the alert table only.
resource "google_bigquery_table_iam_member" "alerts_editor" {
  project    = var.project_id
  dataset_id = google_bigquery_dataset.alerts.dataset_id
  table_id   = google_bigquery_table.alerts.table_id
  role       = "roles/bigquery.dataEditor"
  member     = "serviceAccount:${google_service_account.function.email}"
}

# Read the override rows and their table's metadata (the tick re-reads them only after a change).
resource "google_bigquery_table_iam_member" "overrides_viewer" {
  project    = var.project_id
  dataset_id = google_bigquery_dataset.alerts.dataset_id
  table_id   = google_bigquery_table.overrides.table_id
  role       = "roles/bigquery.dataViewer"
  member     = "serviceAccount:${google_service_account.function.email}"
}

# Refresh the rollup view before each read: a manual refresh needs bigquery.tables.updateData
# on the view (https://cloud.google.com/bigquery/docs/materialized-views-manage#refresh).
resource "google_bigquery_table_iam_member" "rollup_editor" {
  count = var.rollup_enabled ? 1 : 0

  project    = var.project_id
  dataset_id = google_bigquery_dataset.alerts.dataset_id
  table_id   = google_bigquery_table.rollup[0].table_id
  role       = "roles/bigquery.dataEditor"
  member     = "serviceAccount:${google_service_account.function.email}"
}

# Run query jobs (a job is a project-level resource; there is no narrower scope).
resource "google_project_iam_member" "function_job_user" {
  project = var.project_id
  role    = "roles/bigquery.jobUser"
  member  = "serviceAccount:${google_service_account.function.email}"
}

# Write custom metric points (project-level by nature).
resource "google_project_iam_member" "function_metric_writer" {
  project = var.project_id
  role    = "roles/monitoring.metricWriter"
  member  = "serviceAccount:${google_service_account.function.email}"
}

# A re-run of a minute reads its refused points back (lossspike/cloud/monitoring.py) to tell "already
# written" from "kept another value". roles/monitoring.metricWriter is write-only
# (https://cloud.google.com/monitoring/access-control) and roles/monitoring.viewer would also read
# every dashboard, policy and channel; this role holds the one permission ListTimeSeries needs
# (https://cloud.google.com/iam/docs/roles-permissions/monitoring).
resource "google_project_iam_custom_role" "series_reader" {
  project     = var.project_id
  role_id     = "${replace(var.name, "-", "_")}_series_reader"
  title       = "lossspike series reader"
  description = "Reads back the time series the lossspike evaluator wrote (a re-run's refused points)."
  permissions = ["monitoring.timeSeries.list"]
}

resource "google_project_iam_member" "function_series_reader" {
  project = var.project_id
  role    = google_project_iam_custom_role.series_reader.id
  member  = "serviceAccount:${google_service_account.function.email}"
}

# The invoker may call this one function's Cloud Run service and nothing else.
resource "google_cloud_run_service_iam_member" "invoker" {
  project  = var.project_id
  location = var.region
  service  = google_cloudfunctions2_function.evaluator.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.invoker.email}"
}

# The build account's roles, as listed by build-custom-sa (link above): build logs, the
# image in Artifact Registry (gcf-artifacts, a repository the service creates, hence the
# project), and the source object in this module's bucket only.
resource "google_project_iam_member" "build_log_writer" {
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.build.email}"
}

resource "google_project_iam_member" "build_artifact_writer" {
  project = var.project_id
  role    = "roles/artifactregistry.writer"
  member  = "serviceAccount:${google_service_account.build.email}"
}

resource "google_storage_bucket_iam_member" "build_source_reader" {
  bucket = google_storage_bucket.source.name
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.build.email}"
}

# The build does not read the zip from the bucket above: a 2nd-gen function copies it into the
# service's own bucket gcf-v2-sources-PROJECT_NUMBER-REGION and the build fetches it from there
# (https://cloud.google.com/functions/docs/building; without this grant the first apply fails with
# "Access to bucket gcf-v2-sources-... denied. You must grant Storage Object Viewer permission",
# hashicorp/terraform-provider-google#20571). That bucket does not exist before the first deploy,
# so the grant is on the project, narrowed by an IAM condition to buckets named gcf-v2-sources-*
# (condition syntax: https://cloud.google.com/storage/docs/access-control/iam#conditions).
resource "google_project_iam_member" "build_gcf_source_reader" {
  project = var.project_id
  role    = "roles/storage.objectViewer"
  member  = "serviceAccount:${google_service_account.build.email}"

  condition {
    title       = "gcf-v2-sources buckets only"
    description = "The function service's source buckets, where the build fetches the uploaded zip."
    expression  = "resource.name.startsWith(\"projects/_/buckets/gcf-v2-sources-\")"
  }
}

# IAM grants are eventually consistent; a build started right after them can fail with a
# permission error. Waiting once here keeps the first apply from failing.
resource "time_sleep" "build_grants" {
  create_duration = "${var.iam_propagation_seconds}s"

  triggers = {
    account = google_service_account.build.email
  }

  depends_on = [
    google_project_iam_member.build_log_writer,
    google_project_iam_member.build_artifact_writer,
    google_storage_bucket_iam_member.build_source_reader,
    google_project_iam_member.build_gcf_source_reader,
  ]
}

# Grafana's data source account (or whoever reads the dashboard) reads the alert rows, the latest
# view and the per-minute rollup. A logical view's reader needs read access on the tables it reads,
# and a materialized view's reader needs it on the view and on its base table
# (https://cloud.google.com/bigquery/docs/materialized-views-use#required_roles): so the rollup
# comes with the telemetry table. Running query jobs (roles/bigquery.jobUser) is granted in the
# data source's own billing project, outside this module.
locals {
  dashboard_tables = merge(
    {
      alerts = { project = var.project_id, dataset = var.dataset_id, table = local.alerts_table_name }
      latest = { project = var.project_id, dataset = var.dataset_id, table = "loss_spike_latest" }
    },
    var.rollup_enabled ? {
      rollup    = { project = var.project_id, dataset = var.dataset_id, table = local.rollup_table_name }
      telemetry = { project = local.telemetry_project, dataset = local.telemetry_dataset, table = local.telemetry_table }
    } : {},
  )
  dashboard_grants = {
    for pair in setproduct(keys(local.dashboard_tables), var.dashboard_readers) :
    "${pair[0]} ${pair[1]}" => merge(local.dashboard_tables[pair[0]], { member = pair[1] })
  }
}

resource "google_bigquery_table_iam_member" "dashboard_reader" {
  for_each = local.dashboard_grants

  project    = each.value.project
  dataset_id = each.value.dataset
  table_id   = each.value.table
  role       = "roles/bigquery.dataViewer"
  member     = each.value.member

  depends_on = [
    google_bigquery_table.alerts,
    google_bigquery_table.latest,
    google_bigquery_table.rollup,
    google_bigquery_table.telemetry,
  ]
}

# The training jobs publish (lossspike.publish, BigQuery sink) through the Storage Write API's
# default stream, which needs bigquery.tables.updateData on the table and nothing else
# (https://cloud.google.com/bigquery/docs/write-api#required_permissions). roles/bigquery.dataEditor
# would also let a job read, update and delete the table, so the grant is a custom role holding that
# one permission, on the telemetry table only. A project-level custom role is usable only in its own
# project, so it lives in the telemetry table's.
resource "google_project_iam_custom_role" "telemetry_writer" {
  count = length(var.publisher_members) > 0 ? 1 : 0

  project     = local.telemetry_project
  role_id     = "${replace(var.name, "-", "_")}_telemetry_writer"
  title       = "lossspike telemetry writer"
  description = "Appends training telemetry rows (Storage Write API default stream); cannot read, change or delete them."
  permissions = ["bigquery.tables.updateData"]
}

resource "google_bigquery_table_iam_member" "telemetry_writer" {
  for_each = toset(var.publisher_members)

  project    = local.telemetry_project
  dataset_id = local.telemetry_dataset
  table_id   = local.telemetry_table
  role       = google_project_iam_custom_role.telemetry_writer[0].id
  member     = each.value

  depends_on = [google_bigquery_table.telemetry]
}
