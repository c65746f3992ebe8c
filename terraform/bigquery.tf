resource "google_bigquery_dataset" "alerts" {
  #checkov:skip=CKV_GCP_81:Alert verdicts are not sensitive; Google-managed encryption applies. Add default_encryption_configuration in a fork if your policy needs CMEK.
  project                    = var.project_id
  dataset_id                 = var.dataset_id
  friendly_name              = "lossspike"
  description                = "Loss-spike alert rows written by the lossspike evaluator, and the latest-verdict view."
  location                   = var.bigquery_location
  delete_contents_on_destroy = false
  labels                     = local.labels

  depends_on = [google_project_service.services]
}

# One row per watched run per tick. The schema is lossspike/alerts_schema.json, shared with
# the Python code that writes the rows.
#
# Clustered by evaluated_at first: every reader filters a recent time range (the tick's existence
# test one minute, the Grafana rule and table the last minutes, the dashboard its range), and
# BigQuery prunes blocks inside a day partition only by a filter on the leading clustering column
# (https://cloud.google.com/bigquery/docs/querying-clustered-tables). A table deployed with the
# older clustering (cluster, run, reason) can be changed in place before the apply:
# `bq update --clustering_fields=evaluated_at,cluster,run,reason PROJECT:DATASET.loss_spike_alerts`
# (https://cloud.google.com/bigquery/docs/manage-clustered-tables#modifying-cluster-spec).
resource "google_bigquery_table" "alerts" {
  #checkov:skip=CKV_GCP_80:Alert verdicts are not sensitive; Google-managed encryption applies. Add encryption_configuration in a fork if your policy needs CMEK.
  project             = var.project_id
  dataset_id          = google_bigquery_dataset.alerts.dataset_id
  table_id            = local.alerts_table_name
  description         = "lossspike verdicts: one row per watched run per evaluation tick."
  deletion_protection = var.deletion_protection
  labels              = local.labels
  schema              = file("${path.module}/../lossspike/alerts_schema.json")
  clustering          = ["evaluated_at", "cluster", "run", "reason"]

  time_partitioning {
    type          = "DAY"
    field         = "evaluated_at"
    expiration_ms = var.alerts_retention_days * 86400000
  }
}

# Every row of each (cluster, run)'s newest evaluation (its loss row and its firing check rows),
# reading only recent partitions: a check that stopped firing has no row here, and resolves.
#
# The view names the alert schema's columns rather than SELECT *: a logical view keeps the schema
# it was saved with when its base table gains columns (supabase/etl#766 re-saves its views for
# this), so a new column changes the query here and the apply re-saves the view with it.
resource "google_bigquery_table" "latest" {
  #checkov:skip=CKV_GCP_80:A view stores no data; encryption is the base table's.
  project             = var.project_id
  dataset_id          = google_bigquery_dataset.alerts.dataset_id
  table_id            = "loss_spike_latest"
  description         = "Every row of the newest lossspike evaluation per (cluster, run) within the last ${var.latest_view_lookback_hours} hours: the loss row and the firing check rows."
  deletion_protection = var.deletion_protection
  labels              = local.labels

  view {
    use_legacy_sql = false
    # Shared with tests/test_grafana.py, which runs it over rows the real pipeline wrote.
    query = templatefile("${path.module}/sql/loss_spike_latest.sql", {
      alerts_table   = local.alerts_table_id
      lookback_hours = var.latest_view_lookback_hours
      columns        = join(", ", [for column in jsondecode(file("${path.module}/../lossspike/alerts_schema.json")) : column.name])
    })
  }

  depends_on = [google_bigquery_table.alerts]
}

# Optional: a telemetry table in the layout the evaluator reads, for deployments without one.
resource "google_bigquery_table" "telemetry" {
  #checkov:skip=CKV_GCP_80:Training-loss telemetry; Google-managed encryption applies. Add encryption_configuration in a fork if your policy needs CMEK.
  count = var.create_telemetry_table ? 1 : 0

  project             = local.telemetry_project
  dataset_id          = local.telemetry_dataset
  table_id            = local.telemetry_table
  description         = "Levanter telemetry samples (one row per metric value) read by lossspike."
  deletion_protection = var.deletion_protection
  labels              = local.labels
  clustering          = ["name", "run_id"]

  # The contract's TIMESTAMP: partitioned by time.
  dynamic "time_partitioning" {
    for_each = local.telemetry_time_column == "timestamp" ? [1] : []
    content {
      type  = var.telemetry_partition_type
      field = "timestamp"
    }
  }

  # Levanter's INT64 epoch milliseconds: integer-range partitions on the stored column, so a
  # window's integer bounds (lossspike.sql.dialects.time_bound) prune them as a TIMESTAMP filter prunes days
  # (https://cloud.google.com/bigquery/docs/creating-integer-range-partitions: the column must be
  # a top-level INTEGER). One day per partition from 2024-01-01 UTC: a table holds at most 10,000
  # partitions (https://cloud.google.com/bigquery/quotas#partitioned_tables), 27 years of days
  # and too few hours, so HOUR applies to a TIMESTAMP table only.
  dynamic "range_partitioning" {
    for_each = local.telemetry_time_column == "timestamp_ms" ? [1] : []
    content {
      field = "timestamp_ms"
      range {
        start    = local.telemetry_ms_start
        end      = local.telemetry_ms_start + 10000 * 86400000
        interval = 86400000
      }
    }
  }

  schema = jsonencode(concat(
    [
      local.telemetry_time_column == "timestamp"
      ? { name = "timestamp", type = "TIMESTAMP", mode = "REQUIRED", description = "When the sample was recorded." }
      : { name = "timestamp_ms", type = "INT64", mode = "REQUIRED", description = "When the sample was recorded, in epoch milliseconds." },
    ],
    var.telemetry_shape == "levanter.metrics" ? [] : [
      { name = "service", type = "STRING", mode = "NULLABLE", description = "Emitting service, e.g. levanter." },
    ],
    [
      { name = "name", type = "STRING", mode = "NULLABLE", description = "Metric name, e.g. train_loss." },
      { name = "value", type = "FLOAT64", mode = "NULLABLE", description = "Metric value; may be NULL, NaN or infinite." },
      { name = "cluster", type = "STRING", mode = "NULLABLE", description = "Cluster the run trains on; may be NULL or empty." },
      { name = "run_id", type = "STRING", mode = "NULLABLE", description = "Training run ID." },
      { name = "job_id", type = "STRING", mode = "NULLABLE", description = "Scheduler job ID; may be NULL." },
      { name = "execution_uid", type = "STRING", mode = "NULLABLE", description = "Attempt ID; may be NULL." },
    ],
    # lossspike.publish writes process_index and step beside the contract's columns.
    var.telemetry_shape == "contract" ? [
      { name = "process_index", type = "INT64", mode = "NULLABLE", description = "JAX process that published the row (lossspike.publish writes process 0's only)." },
      { name = "step", type = "INT64", mode = "NULLABLE", description = "Training step the row was logged at; NULL on a summary." },
      ] : [
      { name = "process_index", type = var.telemetry_shape == "telemetry_v1" ? "STRING" : "INT64", mode = "NULLABLE", description = "JAX process; only process 0's rows count by default (process)." },
      { name = "step", type = "INT64", mode = "NULLABLE", description = "Training step." },
      { name = "kind", type = "STRING", mode = "NULLABLE", description = "scalar/summary/histogram (levanter.metrics) or gauge/counter/... (telemetry_v1)." },
      { name = "seq", type = "INT64", mode = "NULLABLE", description = "Write-order counter." },
    ],
    # levanter.metrics keeps a summary's statistics in columns of their own and leaves `value` NULL
    # (levanter-telemetry-facts.md 1a): a table with mean and variance is read without its `kind`.
    var.telemetry_shape == "levanter.metrics" ? [
      for stat in ["min", "max", "sum", "sum_squares", "mean", "variance", "rms"] :
      { name = stat, type = "FLOAT64", mode = "NULLABLE", description = "Summary or histogram statistic; NULL on a scalar row." }
    ] : [],
  ))

  # The dataset may be the one this module creates.
  depends_on = [google_bigquery_dataset.alerts]
}

# The per-minute rollup the tick reads (lossspike/sql/rollup_view.py, minute_buckets): an incremental
# materialized view over telemetry, so a tick bills the rows that arrived since the last tick
# once, plus the watched runs' minute rows of the hour, never the day so far. BigQuery requires
# a partitioned view to use the base table's partition granularity (DAY or HOUR):
# https://cloud.google.com/bigquery/docs/materialized-views-create#partitioned_materialized_views
#
# Clustered by metric role, then `minute`: every part of the tick's read (loss minutes,
# evaluation minutes, the other metrics' minutes) filters the role first and then the minute
# range of its windows, not a run, and BigQuery prunes the blocks of a clustered table by
# filters on its clustering columns in their order
# (https://cloud.google.com/bigquery/docs/querying-clustered-tables). Each role's blocks are
# sorted by minute, so within a DAY partition the minute filter still prunes: a part touches the
# blocks of its window, not the whole day so far (`lossspike cost` prices it with and without
# that pruning).
#
# No partition expiration: a materialized view cannot carry one; its partitions expire with the
# base table's ("Partition expiration can't be set on materialized views. A materialized view
# implicitly inherits the partition expiration time from the base table",
# https://cloud.google.com/bigquery/docs/materialized-views-create#partition_expiration).
#
# Changing the service, a metric name, the run pattern or the run list changes the query, which
# replaces the view: the new view reads the telemetry since `local.rollup_since` once (the
# longest horizon a tick reads, a day for the evaluation loss, plus an hour; `lossspike cost`
# prices a rebuild), and the first ticks are not blind.
# `rollup_enabled = false` leaves it out (a telemetry view BigQuery cannot build one on): the
# tick then runs the raw query.
resource "google_bigquery_table" "rollup" {
  #checkov:skip=CKV_GCP_80:Per-minute loss aggregates; Google-managed encryption applies. Add encryption_configuration in a fork if your policy needs CMEK.
  #checkov:skip=CKV_GCP_121:A view derived from telemetry: changing the run pattern must replace it, and replacing rebuilds it from telemetry.
  count = var.rollup_enabled ? 1 : 0

  project             = var.project_id
  dataset_id          = google_bigquery_dataset.alerts.dataset_id
  table_id            = local.rollup_table_name
  description         = "lossspike per-minute buckets (loss, evaluation loss, check metrics) since ${local.rollup_since} UTC; rebuilt when service_name, metric_name, a check metric name, run_pattern or run_ids change."
  deletion_protection = false
  labels              = local.labels
  # Metric role, then minute: see the comment above.
  clustering = ["metric", "minute", "run_id"]

  # On a timestamp_ms table (integer-range partitioned) the view is not partitioned: a partitioned
  # materialized view must be partitioned like its base table, on the same column
  # (https://cloud.google.com/bigquery/docs/materialized-views-create#partitioned_materialized_views),
  # and the view's rows have a minute, not timestamp_ms. Its clustering on role and minute still
  # prunes a tick's read to its windows' blocks.
  dynamic "time_partitioning" {
    for_each = local.telemetry_time_column == "timestamp" ? [1] : []
    content {
      type  = var.telemetry_partition_type
      field = "minute"
    }
  }

  materialized_view {
    # The tick refreshes the view before every read; automatic refresh is the backstop that
    # absorbs a backlog after an outage outside the tick's byte cap.
    enable_refresh      = true
    refresh_interval_ms = var.rollup_refresh_interval_minutes * 60000
    query = templatefile("${path.module}/sql/${local.rollup_template}", merge(
      { for key, name in local.check_metrics : "${key}_metric" => name },
      {
        telemetry_table = var.telemetry_table
        service         = var.service_name
        metric          = var.metric_name
        phase_metric    = var.phase_metric
        run_pattern     = local.rollup_run_pattern
        since           = local.rollup_since
      },
    ))
  }

  depends_on = [google_bigquery_table.telemetry, google_bigquery_table_iam_member.telemetry_viewer]
}

# When the view was (re)built: it holds telemetry from an hour before the longest horizon a
# tick reads on (local.rollup_since).
resource "time_static" "rollup_built" {
  count = var.rollup_enabled ? 1 : 0

  triggers = {
    telemetry_table = var.telemetry_table
    service         = var.service_name
    metric          = var.metric_name
    phase_metric    = var.phase_metric
    run_pattern     = local.rollup_run_pattern
    check_metrics   = jsonencode(local.check_metrics)
    template        = local.rollup_template
  }
}

# Per-run overrides and silences, one row per change, written only by INSERT (lossspike silence /
# override); the schema is lossspike/overrides_schema.json, shared with the Python code.
resource "google_bigquery_table" "overrides" {
  #checkov:skip=CKV_GCP_80:Override rows are not sensitive; Google-managed encryption applies. Add encryption_configuration in a fork if your policy needs CMEK.
  project             = var.project_id
  dataset_id          = google_bigquery_dataset.alerts.dataset_id
  table_id            = "loss_spike_overrides"
  description         = "lossspike per-run overrides and silences: one row per change, never updated."
  deletion_protection = var.deletion_protection
  labels              = local.labels
  schema              = file("${path.module}/../lossspike/overrides_schema.json")
}
