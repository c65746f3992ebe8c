"""Local stand-ins that speak Google's real wire protocols, for tests.

``bigquery``: the ``bqemulator`` package run as a subprocess (REST).
``monitoring``: an in-process gRPC fake of Cloud Monitoring's MetricService.
"""
