terraform {
  # Kept inside Terraform 1.0 syntax: no optional() object attributes, no check blocks.
  required_version = ">= 1.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.0, < 7.0"
    }
    archive = {
      source  = "hashicorp/archive"
      version = ">= 2.4, < 3.0"
    }
    # time_sleep: waits for IAM grants and new metric descriptors to propagate.
    time = {
      source  = "hashicorp/time"
      version = ">= 0.9, < 1.0"
    }
  }
}
