"""What a tick costs in BigQuery bytes: the model of each statement, the statements priced, the report."""
