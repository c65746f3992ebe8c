resource "google_monitoring_metric_descriptor" "alert" {
  project      = var.project_id
  type         = local.metric_types.alert
  display_name = "lossspike alert"
  description  = "1 while a watched run's loss is spiking or not finite, 0 otherwise; one series per run and reason."
  metric_kind  = "GAUGE"
  value_type   = "INT64"
  unit         = "1"

  labels {
    key         = "cluster"
    value_type  = "STRING"
    description = "Cluster of the run ('unknown' when the telemetry has none)."
  }
  labels {
    key         = "job"
    value_type  = "STRING"
    description = "Newest job ID of the run."
  }
  labels {
    key         = "run"
    value_type  = "STRING"
    description = "Run ID."
  }
  labels {
    key         = "reason"
    value_type  = "STRING"
    description = "Verdict: warming_up, not_finite, spiking or healthy."
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

resource "google_monitoring_alert_policy" "loss_spike" {
  project               = var.project_id
  display_name          = "lossspike: training loss spike or non-finite loss"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "Run's loss alert is firing"

    condition_threshold {
      filter                  = "metric.type = \"${local.metric_types.alert}\""
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

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      Run **$${metric.label.run}** on cluster **$${metric.label.cluster}** reports **$${metric.label.reason}**.

      `spiking`: the floor of the last ${var.recent_minutes} minutes of ${var.metric_name} rose above the
      ${var.baseline_minutes}-minute baseline by more than max(${var.min_rise}, ${var.sigma} sigma): a sustained
      divergence, not a single skipped step. `not_finite`: a NaN or infinite loss in the recent window.

      The window statistics behind the verdict are in `${local.alerts_table_id}` and the
      `${var.project_id}.${var.dataset_id}.loss_spike_latest` view. The incident closes when the run recovers.
    EOT
  }

  depends_on = [google_monitoring_metric_descriptor.alert]
}

resource "google_monitoring_alert_policy" "heartbeat" {
  project               = var.project_id
  display_name          = "lossspike: evaluator is not reporting"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "No lossspike heartbeat for ${var.heartbeat_absent_seconds / 60} minutes"

    condition_absent {
      filter   = "metric.type = \"${local.metric_types.runs_watched}\""
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

      Check the Scheduler job `${var.name}-tick` (paused? failing attempts?) and the logs of the
      Cloud Function `${var.name}` in ${var.region}.
    EOT
  }

  depends_on = [google_monitoring_metric_descriptor.runs_watched]
}
