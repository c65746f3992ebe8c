"""Loading a team's history (CSV, JSON lines, Parquet, TensorBoard, W&B) into a telemetry table."""
