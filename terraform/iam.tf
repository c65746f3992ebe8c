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
  project    = var.project_id
  dataset_id = google_bigquery_dataset.alerts.dataset_id
  table_id   = google_bigquery_table.rollup.table_id
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
  ]
}
