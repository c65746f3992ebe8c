"""The minute layer and what reads it: per-minute partials merged into windows, the detectors, the seed
rule's verdicts.
"""
