"""Cloud Function entry point (filled in by the cloud issue)."""
