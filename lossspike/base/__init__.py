"""The lowest layer: the telemetry and alert schemas, time parsing, deadlines, the store's error.

Imports nothing of lossspike.
"""
