resource "google_cloud_scheduler_job" "tick" {
  project          = var.project_id
  region           = var.region
  name             = "${var.name}-tick"
  description      = "Evaluates every watched run once a minute; now = the scheduled time."
  schedule         = var.schedule
  time_zone        = "Etc/UTC"
  paused           = var.scheduler_paused
  attempt_deadline = "${local.attempt_deadline_seconds}s"

  # No retries (SPEC "Time"): the next tick, a minute later, is the retry. A retry of an old
  # minute would overlap the fresh ticks and Scheduler skips a tick while one is running.
  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = google_cloudfunctions2_function.evaluator.service_config[0].uri
    headers = {
      "Content-Type" = "application/json"
    }
    body = base64encode("{}")

    oidc_token {
      service_account_email = google_service_account.invoker.email
      audience              = google_cloudfunctions2_function.evaluator.service_config[0].uri
    }
  }

  depends_on = [
    google_project_service.services,
    google_cloud_run_service_iam_member.invoker,
  ]
}
