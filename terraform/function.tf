resource "google_cloudfunctions2_function" "evaluator" {
  project     = var.project_id
  location    = var.region
  name        = var.name
  description = "Loss-spike evaluator for hero training runs; called every minute by Cloud Scheduler."
  labels      = local.labels

  build_config {
    runtime         = var.runtime
    entry_point     = "evaluate"
    service_account = google_service_account.build.id

    source {
      storage_source {
        bucket = google_storage_bucket.source.name
        object = google_storage_bucket_object.source.name
      }
    }
  }

  service_config {
    service_account_email            = google_service_account.function.email
    ingress_settings                 = "ALLOW_INTERNAL_ONLY"
    all_traffic_on_latest_revision   = true
    min_instance_count               = 0
    max_instance_count               = 1
    max_instance_request_concurrency = 1
    available_memory                 = var.available_memory
    timeout_seconds                  = var.function_timeout_seconds
    environment_variables            = local.function_env
  }

  depends_on = [
    google_project_service.services,
    time_sleep.build_grants,
    google_bigquery_table_iam_member.alerts_editor,
    google_bigquery_table_iam_member.rollup_editor,
    google_bigquery_table_iam_member.overrides_viewer,
    google_project_iam_member.function_job_user,
    google_project_iam_member.function_metric_writer,
    google_project_iam_member.function_series_reader,
  ]
}
