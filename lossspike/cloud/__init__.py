"""The Cloud Function's side: the HTTP handler and the Cloud Monitoring writer."""
