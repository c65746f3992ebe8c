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
  # The rollup view's template for the table's shape and the process setting
  # (lossspike.sql.rollup_view.rollup_template_name; tests/test_terraform.py checks every one is generated).
  rollup_template = var.telemetry_shape == "contract" ? "loss_spike_minutes.sql" : format(
    "loss_spike_minutes_%s%s.sql", replace(var.telemetry_shape, ".", "_"), var.process == "any" ? "_any_process" : ""
  )
  # Levanter's shapes keep time as INT64 epoch milliseconds (levanter-telemetry-facts.md 1a, 1b).
  telemetry_time_column = var.telemetry_shape == "contract" ? "timestamp" : "timestamp_ms"
  # 2024-01-01T00:00:00Z in epoch milliseconds: the first integer-range partition of a created
  # timestamp_ms table (Levanter's telemetry starts in 2026).
  telemetry_ms_start = 1704067200000
  rollup_table_id    = "${var.project_id}.${var.dataset_id}.${local.rollup_table_name}"
  # A view cannot take a list of runs as a parameter: with run_ids it holds every run of the
  # service, and each tick reads the listed ones.
  rollup_run_pattern = length(var.run_ids) > 0 ? "%" : var.run_pattern
  # The view's lower bound, fixed when it is (re)built: an hour before the longest horizon the
  # first tick reads (the baseline, the slow-divergence horizon, the evaluation loss's day:
  # lossspike.rules.checks.EVAL_LOOKBACK_MINUTES), so no check or detector is blind after a rebuild.
  # Without the rollup there is no build time and no bound.
  rollup_horizon_minutes = max(var.baseline_minutes, var.divergence_minutes, 24 * 60)
  rollup_since = var.rollup_since != "" ? var.rollup_since : try(formatdate(
    "YYYY-MM-DD hh:mm:ss", timeadd(time_static.rollup_built[0].rfc3339, "-${local.rollup_horizon_minutes + 60}m")
  ), "")

  # Scheduler must wait longer than the function may run, or every slow tick is retried.
  attempt_deadline_seconds = max(var.scheduler_attempt_deadline_seconds, var.function_timeout_seconds + 10)

  metric_types = {
    page         = "${var.metric_prefix}/page"
    notice       = "${var.metric_prefix}/notice"
    runs_watched = "${var.metric_prefix}/runs_watched"
  }

  # The check metric names by the rollup template's key (lossspike.sql.selection.CHECK_METRICS).
  check_metrics = {
    grad_norm       = var.grad_norm_metric
    skipped_steps   = var.skipped_steps_metric
    eval            = var.eval_metric
    throughput      = var.throughput_metric
    mfu             = var.mfu_metric
    token_drops     = var.token_drops_metric
    router_entropy  = var.router_entropy_metric
    router_bias_max = var.router_bias_max_metric
    router_bias_min = var.router_bias_min_metric
  }
  # Model-specific check thresholds: null leaves the variable out, so the check stays off.
  optional_limits = {
    LOSSSPIKE_THROUGHPUT_FLOOR     = var.throughput_floor
    LOSSSPIKE_MFU_FLOOR            = var.mfu_floor
    LOSSSPIKE_TOKEN_DROP_LIMIT     = var.token_drop_limit
    LOSSSPIKE_ROUTER_ENTROPY_LIMIT = var.router_entropy_limit
    LOSSSPIKE_ROUTER_BIAS_LIMIT    = var.router_bias_limit
  }

  # Terraform 1.0 has no cross-variable validation: a lookup of a key that is not in the map
  # fails the plan (every local is evaluated, referenced or not), and the error shows this
  # expression with the message as the key.
  window_check = { ok = true }[
    var.recent_minutes < var.baseline_minutes ? "ok" : "recent_minutes must be less than baseline_minutes"
  ]
  # Only a value set explicitly is checked: a null one is left out of the function's environment,
  # and the function's default follows the baseline (lossspike/rules/rule.py following_defaults).
  stall_check = { ok = true }[
    var.stall_minutes == null ? "ok" : (var.stall_minutes < var.baseline_minutes ? "ok" : "stall_minutes must be less than baseline_minutes")
  ]
  initializing_check = { ok = true }[
    var.initializing_minutes == null ? "ok" : (var.initializing_minutes < var.baseline_minutes ? "ok" : "initializing_minutes must be less than baseline_minutes")
  ]

  runbook = var.runbook_url != "" ? var.runbook_url : "docs/runbook.md in the lossspike repository"

  # The function's whole configuration. These names are the contract with the Python side
  # (lossspike's settings); this map is the one place Terraform lists them. An empty run list
  # is left out rather than set empty, so the pattern applies.
  # Without the rollup, LOSSSPIKE_ROLLUP_TABLE is left out and the tick runs the raw query.
  function_env = merge(
    length(var.run_ids) > 0 ? { LOSSSPIKE_RUN_IDS = join(",", var.run_ids) } : {},
    var.stall_minutes != null ? { LOSSSPIKE_STALL_MINUTES = tostring(var.stall_minutes) } : {},
    var.initializing_minutes != null ? { LOSSSPIKE_INITIALIZING_MINUTES = tostring(var.initializing_minutes) } : {},
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
      LOSSSPIKE_PROCESS              = var.process
      LOSSSPIKE_BASELINE_MINUTES     = tostring(var.baseline_minutes)
      LOSSSPIKE_RECENT_MINUTES       = tostring(var.recent_minutes)
      LOSSSPIKE_SIGMA                = tostring(var.sigma)
      LOSSSPIKE_MIN_RISE             = tostring(var.min_rise)
      LOSSSPIKE_MIN_BASELINE_SAMPLES = tostring(var.min_baseline_samples)
      LOSSSPIKE_MIN_RECENT_SAMPLES   = tostring(var.min_recent_samples)
      LOSSSPIKE_REFERENCE            = var.reference
      LOSSSPIKE_PHASE_METRIC         = var.phase_metric
      LOSSSPIKE_METRIC_PREFIX        = var.metric_prefix
      LOSSSPIKE_MAX_BYTES_BILLED     = format("%d", var.max_bytes_billed)
      LOSSSPIKE_DETECTORS            = var.detectors
      LOSSSPIKE_ATTEMPTS             = var.attempts
      LOSSSPIKE_SHIFT_MIN_RISE       = tostring(var.shift_min_rise)
      LOSSSPIKE_SHIFT_SIGMA          = tostring(var.shift_sigma)
      LOSSSPIKE_DIVERGENCE_MIN_RISE  = tostring(var.divergence_min_rise)
      LOSSSPIKE_DIVERGENCE_MINUTES   = tostring(var.divergence_minutes)
      LOSSSPIKE_INSTABILITY_SIGMA    = tostring(var.instability_sigma)
      LOSSSPIKE_INSTABILITY_MIN_RISE = tostring(var.instability_min_rise)
      LOSSSPIKE_INSTABILITY_COUNT    = tostring(var.instability_count)
      LOSSSPIKE_RESUME_MIN_RISE      = tostring(var.resume_min_rise)
      LOSSSPIKE_RESUME_SIGMA         = tostring(var.resume_sigma)
      LOSSSPIKE_MAX_RECENT_MINUTES   = tostring(var.max_recent_minutes)
      LOSSSPIKE_LOSS_JUMP_LIMIT      = tostring(var.loss_jump_limit)
      LOSSSPIKE_GRAD_NORM_LIMIT      = tostring(var.grad_norm_limit)
      LOSSSPIKE_SKIPPED_STEPS_LIMIT  = tostring(var.skipped_steps_limit)
    },
    local.check_env,
  )
  # Empty checks means the default set, so the variable is left out, like an unset limit.
  check_env = merge(
    var.checks != "" ? { LOSSSPIKE_CHECKS = var.checks } : {},
    { LOSSSPIKE_CHECK_PENDING_MINUTES = tostring(var.check_pending_minutes) },
    { for name, limit in local.optional_limits : name => tostring(limit) if limit != null },
    { for key, name in local.check_metrics : "LOSSSPIKE_${upper(key)}_METRIC" => name },
  )

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
