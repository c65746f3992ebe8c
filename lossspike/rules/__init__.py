"""The rule and its policies in plain Python: thresholds and reasons, the checks, the phase, the
median. Imports only base.
"""
