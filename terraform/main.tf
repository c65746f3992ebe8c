locals {
  source_dir  = var.source_dir != null ? var.source_dir : abspath("${path.module}/..")
  bucket_name = var.source_bucket_name != "" ? var.source_bucket_name : "${var.project_id}-${var.name}-source"

  telemetry_parts   = split(".", var.telemetry_table)
  telemetry_project = join(".", slice(local.telemetry_parts, 0, length(local.telemetry_parts) - 2))
  telemetry_dataset = local.telemetry_parts[length(local.telemetry_parts) - 2]
  telemetry_table   = local.telemetry_parts[length(local.telemetry_parts) - 1]

  alerts_table_name = "loss_spike_alerts"
  alerts_table_id   = "${var.project_id}.${var.dataset_id}.${local.alerts_table_name}"
  rollup_table_name = "loss_spike_minutes"
  rollup_table_id   = "${var.project_id}.${var.dataset_id}.${local.rollup_table_name}"
  # A view cannot take a list of runs as a parameter: with run_ids it holds every run of the
  # service, and each tick reads the listed ones.
  rollup_run_pattern = length(var.run_ids) > 0 ? "%" : var.run_pattern
  # The view's lower bound, fixed when it is (re)built: an hour before the first tick's baseline.
  rollup_since = var.rollup_since != "" ? var.rollup_since : try(formatdate(
    "YYYY-MM-DD hh:mm:ss", timeadd(time_static.rollup_built[0].rfc3339, "-${var.baseline_minutes + 60}m")
  ), "")

  # Scheduler must wait longer than the function may run, or every slow tick is retried.
  attempt_deadline_seconds = max(var.scheduler_attempt_deadline_seconds, var.function_timeout_seconds + 10)

  metric_types = {
    alert        = "${var.metric_prefix}/alert"
    runs_watched = "${var.metric_prefix}/runs_watched"
  }

  # Terraform 1.0 has no cross-variable validation: a lookup of a key that is not in the map
  # fails the plan (every local is evaluated, referenced or not), and the error shows this
  # expression with the message as the key.
  window_check = { ok = true }[
    var.recent_minutes < var.baseline_minutes ? "ok" : "recent_minutes must be less than baseline_minutes"
  ]
  stall_check = { ok = true }[
    var.stall_minutes < var.baseline_minutes ? "ok" : "stall_minutes must be less than baseline_minutes"
  ]

  runbook = var.runbook_url != "" ? var.runbook_url : "docs/runbook.md in the lossspike repository"

  # The function's whole configuration. These names are the contract with the Python side
  # (lossspike's settings); this map is the one place Terraform lists them. An empty run list
  # is left out rather than set empty, so the pattern applies.
  # Without the rollup, LOSSSPIKE_ROLLUP_TABLE is left out and the tick runs the raw query.
  function_env = merge(
    length(var.run_ids) > 0 ? { LOSSSPIKE_RUN_IDS = join(",", var.run_ids) } : {},
    var.rollup_enabled ? { LOSSSPIKE_ROLLUP_TABLE = local.rollup_table_id } : {},
    {
      LOSSSPIKE_BACKEND              = "bigquery"
      LOSSSPIKE_PROJECT              = var.project_id
      LOSSSPIKE_LOCATION             = var.bigquery_location
      LOSSSPIKE_TELEMETRY_TABLE      = var.telemetry_table
      LOSSSPIKE_ALERTS_TABLE         = local.alerts_table_id
      LOSSSPIKE_RUN_PATTERN          = var.run_pattern
      LOSSSPIKE_METRIC               = var.metric_name
      LOSSSPIKE_SERVICE              = var.service_name
      LOSSSPIKE_BASELINE_MINUTES     = tostring(var.baseline_minutes)
      LOSSSPIKE_RECENT_MINUTES       = tostring(var.recent_minutes)
      LOSSSPIKE_SIGMA                = tostring(var.sigma)
      LOSSSPIKE_MIN_RISE             = tostring(var.min_rise)
      LOSSSPIKE_MIN_BASELINE_SAMPLES = tostring(var.min_baseline_samples)
      LOSSSPIKE_MIN_RECENT_SAMPLES   = tostring(var.min_recent_samples)
      LOSSSPIKE_REFERENCE            = var.reference
      LOSSSPIKE_STALL_MINUTES        = tostring(var.stall_minutes)
      LOSSSPIKE_METRIC_PREFIX        = var.metric_prefix
      LOSSSPIKE_MAX_BYTES_BILLED     = format("%d", var.max_bytes_billed)
  })

  services = toset([
    "artifactregistry.googleapis.com",
    "bigquery.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    "cloudscheduler.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "run.googleapis.com",
    "storage.googleapis.com",
  ])

  labels = merge({ app = var.name }, var.labels)
}

resource "google_project_service" "services" {
  for_each = var.enable_apis ? local.services : toset([])

  project            = var.project_id
  service            = each.value
  disable_on_destroy = false
}
