"""Replaying the rule over history: one query of per-minute partials, every tick judged, episodes,
labels and the report.
"""
