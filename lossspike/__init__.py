"""lossspike: a zero-ops training-loss spike alert for hero runs on Google Cloud."""

__version__ = "0.1.0"
