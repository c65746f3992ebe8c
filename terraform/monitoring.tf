# Series design (cost, issue #8): the function writes an `alert` point only for a run whose
# reason pages (spiking, not_finite, stalled): 1, or 0 while the run is silenced. Healthy and
# warming-up runs get no point, so a series that stops arriving must read as "not firing":
# the threshold condition evaluates missing data as false (EVALUATION_MISSING_DATA_INACTIVE,
# https://cloud.google.com/python/docs/reference/monitoring/latest/google.cloud.monitoring_v3.types.AlertPolicy.Condition.EvaluationMissingData),
# and the incident closes once the run stops paging.
#
# Every condition's filter names the metric type and the monitored resource type: points are
# written to the `global` resource, Cloud Run's logs to `cloud_run_revision`
# (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies#MetricThreshold).

locals {
  paging_reasons = ["spiking", "not_finite", "stalled"]

  failed_ticks_metric_type = "logging.googleapis.com/user/${google_logging_metric.failed_ticks.name}"
}

resource "google_monitoring_metric_descriptor" "alert" {
  project      = var.project_id
  type         = local.metric_types.alert
  display_name = "lossspike alert"
  description  = "Written each tick only for a run whose verdict pages (spiking, not_finite, stalled): 1, or 0 while the run is silenced. Healthy and warming-up runs write nothing. The run's job ID is in the alert rows, not in a label."
  metric_kind  = "GAUGE"
  value_type   = "INT64"
  unit         = "1"

  labels {
    key         = "cluster"
    value_type  = "STRING"
    description = "Cluster of the run ('unknown' when the telemetry has none)."
  }
  labels {
    key         = "run"
    value_type  = "STRING"
    description = "Run ID."
  }
  labels {
    key         = "reason"
    value_type  = "STRING"
    description = "Paging verdict: spiking, not_finite or stalled."
  }

  depends_on = [google_project_service.services]
}

resource "google_monitoring_metric_descriptor" "runs_watched" {
  project      = var.project_id
  type         = local.metric_types.runs_watched
  display_name = "lossspike runs watched"
  description  = "Runs the evaluator judged in its latest tick; written every tick, so its absence means the evaluator is down."
  metric_kind  = "GAUGE"
  value_type   = "INT64"
  unit         = "1"

  depends_on = [google_project_service.services]
}

# Counts failed ticks where every failure shows, once each: Cloud Scheduler's own log of each
# attempt (resource cloud_scheduler_job; a failed attempt is logged at ERROR with its HTTP status,
# "the failed attempt can be viewed in execution logs":
# https://cloud.google.com/scheduler/docs/reference/rest/v1/projects.locations.jobs). A tick that
# fails inside the function answers 5xx, a crash at cold start answers 5xx, and a wrong invoker
# grant or ingress fails the attempt before the function runs (no function log line at all): each
# is one failed attempt. Counting the function's ERROR lines instead missed the last kind and
# counted every failed tick twice (its own ERROR line and the 5xx request log).
resource "google_logging_metric" "failed_ticks" {
  project     = var.project_id
  name        = "${var.name}_failed_ticks"
  description = "Failed Cloud Scheduler attempts of the lossspike tick: 5xx answers, start-up crashes, refused or unreachable calls."
  filter      = "resource.type=\"cloud_scheduler_job\" AND resource.labels.job_id=\"${var.name}-tick\" AND severity>=ERROR"

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }

  depends_on = [google_project_service.services]
}

# A policy naming a metric created moments ago fails with "Cannot find metric(s) that match
# type ... If a metric was created recently, it could take up to 10 minutes to become
# available" (hashicorp/terraform-provider-google#11102, #10325). Wait that long once, in
# parallel with the function build; re-created descriptors wait again.
resource "time_sleep" "metrics_visible" {
  create_duration = "${var.metric_propagation_seconds}s"

  triggers = {
    alert        = google_monitoring_metric_descriptor.alert.id
    runs_watched = google_monitoring_metric_descriptor.runs_watched.id
    failed_ticks = google_logging_metric.failed_ticks.id
  }
}

resource "google_monitoring_alert_policy" "loss_spike" {
  project               = var.project_id
  display_name          = "lossspike: training loss spiking, not finite or stalled"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "A run's paging verdict (spiking, not_finite, stalled)"

    condition_threshold {
      filter                  = "metric.type = \"${local.metric_types.alert}\" AND resource.type = \"global\""
      comparison              = "COMPARISON_GT"
      threshold_value         = 0.5
      duration                = "0s"
      evaluation_missing_data = "EVALUATION_MISSING_DATA_INACTIVE"

      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_MAX"
        cross_series_reducer = "REDUCE_MAX"
        group_by_fields      = ["metric.label.cluster", "metric.label.run", "metric.label.reason"]
      }

      trigger {
        count = 1
      }
    }
  }

  alert_strategy {
    auto_close = "${var.alert_auto_close_seconds}s"
  }

  # Policy documentation can insert labels (${metric.label.x}) but not values or times.
  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      Run **$${metric.label.run}** on cluster **$${metric.label.cluster}** reports **$${metric.label.reason}**.

      - `spiking`: the floor of the last ${var.recent_minutes} minutes of ${var.metric_name} rose above the
        ${var.baseline_minutes}-minute baseline by more than max(${var.min_rise}, ${var.sigma} sigma): a sustained
        divergence, not a single skipped step.
      - `not_finite`: a NaN, infinite or absurdly large loss in the recent window.
      - `stalled`: the run has reported no loss for at least stall_minutes (a hung step, a stuck loader,
        a crash without a restart).

      Runbook: ${local.runbook}

      The run's job ID and the window statistics behind the verdict are in `${local.alerts_table_id}` and
      `${var.project_id}.${var.dataset_id}.loss_spike_latest`. Silencing the run (`lossspike silence`)
      writes 0 and closes the incident; so does the run recovering.
    EOT
  }

  depends_on = [time_sleep.metrics_visible]
}

# An absence condition is violated when a time series "does not include any data in the specified
# duration" (AlertPolicy.Condition.MetricAbsence,
# https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies#metricabsence): a
# series that never had a point is not there to be absent, and Monitoring's alerting docs say such
# a condition is not met when the writer never wrote a point. So this policy catches an evaluator
# that stopped; one that never started pages through failed_ticks (Scheduler's failed attempts).
resource "google_monitoring_alert_policy" "heartbeat" {
  project               = var.project_id
  display_name          = "lossspike: evaluator is not reporting"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "No lossspike heartbeat for ${var.heartbeat_absent_seconds / 60} minutes"

    condition_absent {
      filter   = "metric.type = \"${local.metric_types.runs_watched}\" AND resource.type = \"global\""
      duration = "${var.heartbeat_absent_seconds}s"

      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }

      trigger {
        count = 1
      }
    }
  }

  alert_strategy {
    auto_close = "${var.alert_auto_close_seconds}s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      The lossspike evaluator has written no `${local.metric_types.runs_watched}` point for
      ${var.heartbeat_absent_seconds / 60} minutes, so no run's loss is being watched.

      Check the Scheduler job `${var.name}-tick` in ${var.region} (paused? failing attempts?) and the
      logs of the Cloud Function `${var.name}`. An absence condition never fires for a metric that
      never had a point, so a deployment that never succeeded pages through "ticks are failing".

      Runbook: ${local.runbook}
    EOT
  }

  depends_on = [time_sleep.metrics_visible]
}

resource "google_monitoring_alert_policy" "failed_ticks" {
  project               = var.project_id
  display_name          = "lossspike: evaluator ticks are failing"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "At least ${var.failed_ticks_to_page} failed ticks in ${var.failed_ticks_window_seconds / 60} minutes"

    condition_threshold {
      filter                  = "metric.type = \"${local.failed_ticks_metric_type}\" AND resource.type = \"cloud_scheduler_job\""
      comparison              = "COMPARISON_GT"
      threshold_value         = var.failed_ticks_to_page - 0.5
      duration                = "0s"
      evaluation_missing_data = "EVALUATION_MISSING_DATA_INACTIVE"

      aggregations {
        alignment_period     = "${var.failed_ticks_window_seconds}s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
      }

      trigger {
        count = 1
      }
    }
  }

  alert_strategy {
    auto_close = "${var.alert_auto_close_seconds}s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      At least ${var.failed_ticks_to_page} attempts of the Scheduler job `${var.name}-tick` in ${var.region} failed
      in ${var.failed_ticks_window_seconds / 60} minutes: ticks are failing (wrong table, location or grant,
      bad settings at start-up, a BigQuery byte cap, or the call never reached the function: invoker
      grant, ingress), so runs may not be watched.

      The Scheduler log (resource "Cloud Scheduler Job" `${var.name}-tick`) shows each attempt's HTTP
      status; when the function ran, its ERROR line names the cause (resource "Cloud Run Revision"
      `${var.name}`, severity ERROR). Runbook: ${local.runbook}
    EOT
  }

  depends_on = [time_sleep.metrics_visible]
}
