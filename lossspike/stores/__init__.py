"""Where telemetry is read and verdicts written: the store interface, DuckDB, BigQuery, and the factory
that opens one.
"""
