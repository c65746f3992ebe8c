output "function_name" {
  description = "Name of the Cloud Function (2nd gen) that evaluates the runs."
  value       = google_cloudfunctions2_function.evaluator.name
}

output "function_uri" {
  description = "HTTPS URL of the function (internal ingress only; callable by the invoker service account)."
  value       = google_cloudfunctions2_function.evaluator.service_config[0].uri
}

output "smoke_test_command" {
  description = "Runs one tick now through Scheduler (the function takes internal traffic only); then check the logs and the alert table."
  value       = "gcloud scheduler jobs run ${google_cloud_scheduler_job.tick.name} --project ${var.project_id} --location ${var.region}"
}

output "build_service_account" {
  description = "Email of the service account Cloud Build builds the function as."
  value       = google_service_account.build.email
}

output "function_service_account" {
  description = "Email of the function's runtime service account."
  value       = google_service_account.function.email
}

output "invoker_service_account" {
  description = "Email of the service account Cloud Scheduler signs its OIDC token as."
  value       = google_service_account.invoker.email
}

output "scheduler_job" {
  description = "Name of the Cloud Scheduler job that ticks the evaluator."
  value       = google_cloud_scheduler_job.tick.name
}

output "alerts_table" {
  description = "Fully qualified alert table (project.dataset.table)."
  value       = local.alerts_table_id
}

output "latest_view" {
  description = "Fully qualified latest-verdict-per-run view."
  value       = "${var.project_id}.${var.dataset_id}.${google_bigquery_table.latest.table_id}"
}

output "telemetry_table" {
  description = "Telemetry table the evaluator reads."
  value       = var.telemetry_table
}

output "metric_types" {
  description = "Custom metric types the evaluator writes (page, notice, runs_watched)."
  value       = local.metric_types
}

output "alert_policies" {
  description = "IDs of the per-run paging policy, the notice policy, the evaluator-heartbeat policy and the failing-ticks policy."
  value = {
    loss_spike   = google_monitoring_alert_policy.loss_spike.name
    notice       = google_monitoring_alert_policy.notice.name
    heartbeat    = google_monitoring_alert_policy.heartbeat.name
    failed_ticks = google_monitoring_alert_policy.failed_ticks.name
  }
}

output "source_object" {
  description = "Bucket object holding the deployed source zip (its name carries the content hash)."
  value       = "gs://${google_storage_bucket.source.name}/${google_storage_bucket_object.source.name}"
}

output "function_environment_variable_names" {
  description = "Names of the LOSSSPIKE_* variables the function is configured with."
  value       = sort(keys(local.function_env))
}
