"""What a deployment sets: the settings from flags and LOSSSPIKE_* variables, and the per-run overrides
kept as rows.
"""
