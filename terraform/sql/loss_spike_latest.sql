SELECT ${columns}
FROM `${alerts_table}`
WHERE evaluated_at >= TIMESTAMP_SUB(CURRENT_TIMESTAMP(), INTERVAL ${lookback_hours} HOUR)
QUALIFY RANK() OVER (PARTITION BY cluster, run ORDER BY evaluated_at DESC) = 1
