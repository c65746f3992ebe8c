# Series design (cost, issue #8; once per run, issue #15): the function writes a `page` point only
# for a run with a paging row (a paging loss reason, or a page-severity check such as
# grad_norm_high): 1, or 0 while every paging row of the run is silenced. The series is labelled
# {cluster, run} and never by reason, so a run pages once whatever reasons fire and a change of
# reason inside an episode keeps the same incident. `notify` rows get a `notice` point each, on
# their own metric and policy. Runs with nothing firing get no point, so a series that stops
# arriving must read as "not firing": the threshold conditions evaluate missing data as false
# (EVALUATION_MISSING_DATA_INACTIVE,
# https://cloud.google.com/python/docs/reference/monitoring/latest/google.cloud.monitoring_v3.types.AlertPolicy.Condition.EvaluationMissingData),
# and the incident closes once the run stops paging.
#
# New metric types rather than a relabelled `alert`: a descriptor's labels are never removed once
# created (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.metricDescriptors/create),
# and altering a descriptor makes its existing data unusable; an upgrade deletes the old `alert`
# descriptor and its policy condition moves to `page`.
#
# Every condition's filter names the metric type and the monitored resource type: points are
# written to the `global` resource, Cloud Run's logs to `cloud_run_revision`
# (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies#MetricThreshold).

locals {
  failed_ticks_metric_type = "logging.googleapis.com/user/${google_logging_metric.failed_ticks.name}"

  # Where a page sends the reader for the reasons: policy documentation can insert labels
  # (${metric.label.KEY}) but not the rows, so it links them.
  dashboard_link = var.grafana_dashboard_url != "" ? "Dashboard, with the run selected: ${var.grafana_dashboard_url}?var-run=$${metric.label.run}" : "Set grafana_dashboard_url to link the Grafana dashboard here."
  reasons_query  = "SELECT reason, severity, value, onset_at, last_good_at, last_good_step, observed, threshold, metric FROM `${var.project_id}.${var.dataset_id}.loss_spike_latest` WHERE cluster = '$${metric.label.cluster}' AND run = '$${metric.label.run}'"
}

resource "google_monitoring_metric_descriptor" "page" {
  project      = var.project_id
  type         = local.metric_types.page
  display_name = "lossspike page"
  description  = "Written each tick only for a run with a paging row (a paging loss reason or a page-severity check): 1 while any of them fires, 0 while all are silenced. One series per run, whatever the reasons; they are in the alert rows. Runs with nothing paging write nothing."
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

  depends_on = [google_project_service.services]
}

resource "google_monitoring_metric_descriptor" "notice" {
  project      = var.project_id
  type         = local.metric_types.notice
  display_name = "lossspike notice"
  description  = "Written each tick for each notify-severity check row (throughput_low, mfu_low, eval_regressed, token_drops, router_entropy, router_bias): 1, or 0 while silenced. Never read by the paging policy."
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
    description = "The notify check that fired."
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
    page         = google_monitoring_metric_descriptor.page.id
    notice       = google_monitoring_metric_descriptor.notice.id
    runs_watched = google_monitoring_metric_descriptor.runs_watched.id
    failed_ticks = google_logging_metric.failed_ticks.id
  }
}

resource "google_monitoring_alert_policy" "loss_spike" {
  project               = var.project_id
  display_name          = "lossspike: a training run pages (loss or run health)"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "A run has a paging verdict (one incident per run, whatever the reasons)"

    condition_threshold {
      filter          = "metric.type = \"${local.metric_types.page}\" AND resource.type = \"global\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0.5
      # No second pending period: the evaluator already pends the checks (check_pending_minutes)
      # and writes 1 only for a verdict that pages now; 0s fires on the first point above 0.5.
      duration                = "0s"
      evaluation_missing_data = "EVALUATION_MISSING_DATA_INACTIVE"

      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_MAX"
        cross_series_reducer = "REDUCE_MAX"
        group_by_fields      = ["metric.label.cluster", "metric.label.run"]
      }

      trigger {
        count = 1
      }
    }
  }

  alert_strategy {
    auto_close = "${var.alert_auto_close_seconds}s"
  }

  # Policy documentation can insert labels (${metric.label.x}) but not values or times
  # (https://cloud.google.com/monitoring/alerts/doc-variables): the reasons firing now, and where
  # to go back (onset_at, last_good_at, last_good_step), are the run's rows in the latest view,
  # linked below. No metric label carries them: a per-step value would open a new series, and so
  # a new incident, at every step.
  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      Run **$${metric.label.run}** on cluster **$${metric.label.cluster}** pages. One incident per run: it stays
      open while any paging reason fires, and a change of reason does not open another.

      Which reasons fire now, with what they saw and the limit, and where to go back:

      - ${local.dashboard_link}
      - BigQuery: `${local.reasons_query}`

      Where to go back: each paging row's `onset_at` (when the excursion began), `last_good_at` and
      `last_good_step` (the newest good loss sample before it). Resume from the newest checkpoint at or
      before `last_good_step`; the batches between it and the onset are the suspect range.

      Paging reasons (the runbook has a section for each):

      - `spiking`: the floor of the last ${var.recent_minutes} minutes of ${var.metric_name} rose above the
        ${var.baseline_minutes}-minute baseline by more than max(${var.min_rise}, ${var.sigma} sigma).
      - `not_finite`: a NaN, infinite or absurdly large loss in the recent window.
      - `stalled`: the run has reported no loss for at least stall_minutes (a hung step, a stuck loader,
        a crash without a restart).
      - `level_shift`, `slow_divergence`, `instability`: the detectors beyond the seed rule (a shift against
        a trend-aware baseline, a creep over ${var.divergence_minutes} minutes, a train of spikes).
      - `resume_jump`: a new attempt resumed far above where its previous attempt left off (a checkpoint
        restored without its weights or optimizer state): roll back or stop it.
      - `loss_jump`, `grad_norm_high`, `steps_skipped`: run-health checks (the loss floor jumped by more than
        ${var.loss_jump_limit}, ${var.grad_norm_metric} above ${var.grad_norm_limit}, at least
        ${var.skipped_steps_limit} separate skip episodes in 15 minutes).

      Runbook: ${local.runbook}

      Silencing the run (`lossspike silence`) writes 0 and closes the incident; so does the run recovering.
      A scheduled data-stage boundary or learning-rate rewarm: silence it ahead of time
      (`lossspike silence RUN --until ...`).
    EOT
  }

  depends_on = [time_sleep.metrics_visible]
}

# Notices (throughput or MFU below its floor, an evaluation loss that got worse, MoE drops and
# router collapse) go to notify_channels only: with none set they open console incidents and reach
# nobody, and they never reach notification_channels, the pager.
resource "google_monitoring_alert_policy" "notice" {
  project               = var.project_id
  display_name          = "lossspike: run-health notice (does not page)"
  combiner              = "OR"
  notification_channels = var.notify_channels
  user_labels           = merge(local.labels, { severity = "notify" })

  conditions {
    display_name = "A run-health notice (one incident per run and reason)"

    condition_threshold {
      filter          = "metric.type = \"${local.metric_types.notice}\" AND resource.type = \"global\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0.5
      # No second pending period: the evaluator already pends the checks (check_pending_minutes)
      # and writes 1 only for a verdict that pages now; 0s fires on the first point above 0.5.
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
      Run **$${metric.label.run}** on cluster **$${metric.label.cluster}**: **$${metric.label.reason}** (a notice,
      not a page).

      - `throughput_low`, `mfu_low`: most minutes of the last 15 ran below the floor you set.
      - `eval_regressed`: the newest evaluation loss (${var.eval_metric}) is above the one before it.
      - `token_drops`, `router_entropy`, `router_bias`: MoE routing is dropping tokens or collapsing.

      What it saw and the limit: ${local.dashboard_link}; BigQuery: `${local.reasons_query}`

      Runbook: ${local.runbook}
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
