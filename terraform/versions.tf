terraform {
  # Kept inside Terraform 1.0 syntax: no optional() object attributes, no check blocks.
  required_version = ">= 1.0"

  required_providers {
    # 5.26.0 added build_config.service_account; 5.38.0 fixed the perpetual diff on
    # service_config.environment_variables (LOG_EXECUTION_ID) of google_cloudfunctions2_function
    # (hashicorp/terraform-provider-google CHANGELOG.md, #17841 and #18651).
    google = {
      source  = "hashicorp/google"
      version = ">= 5.38.0, < 7.0"
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
