SELECT
  COALESCE(NULLIF(cluster, ''), 'unknown') AS run_cluster,
  run_id AS run_id,
  execution_uid AS execution_uid,
  TIMESTAMP_TRUNC(timestamp, MINUTE) AS minute,
  IF(name = '${metric}' AND ABS(value) < 1e150, TRUNC(value), NULL) AS loss_base,
  COUNT(*) AS samples,
  COUNTIF(name = '${metric}') AS loss_samples,
  COUNTIF(name = '${metric}' AND NOT ABS(value) < 1e150) AS loss_not_finite,
  COUNTIF(name = '${metric}' AND ABS(value) < 1e150) AS loss_finite,
  SUM(IF(name = '${metric}' AND ABS(value) < 1e150, value - TRUNC(value), NULL)) AS loss_sum,
  SUM(IF(name = '${metric}' AND ABS(value) < 1e150, (value - TRUNC(value)) * (value - TRUNC(value)), NULL)) AS loss_sum_squares,
  MIN(IF(name = '${metric}' AND ABS(value) < 1e150, value, NULL)) AS loss_floor,
  MAX(IF(name = '${metric}' AND ABS(value) < 1e150, value, NULL)) AS loss_peak,
  MAX(IF(name = '${metric}', timestamp, NULL)) AS last_loss_at,
  MAX_BY(NULLIF(job_id, ''), IF(job_id <> '', timestamp, NULL)) AS job,
  MAX(IF(job_id <> '', timestamp, NULL)) AS job_at
FROM `${telemetry_table}`
WHERE timestamp >= TIMESTAMP '${since}'
  AND service = '${service}'
  AND value IS NOT NULL
  AND run_id <> ''
  AND run_id LIKE '${run_pattern}'
GROUP BY run_cluster, run_id, execution_uid, minute, loss_base
