# ---------------------------------------------------------------------------------------------
# Where to deploy
# ---------------------------------------------------------------------------------------------

variable "project_id" {
  description = "Google Cloud project that hosts the evaluator, its alert table and its metrics."
  type        = string

  validation {
    # Domain-scoped IDs ("example.com:proj") are refused: the function's settings cannot name
    # their tables (project.dataset.table), so every cold start would fail.
    condition     = can(regex("^[a-z][-a-z0-9]{4,28}[a-z0-9]$", var.project_id))
    error_message = "The project_id must be a Google Cloud project ID such as \"my-project-123\" (6-30 lowercase letters, digits, hyphens; domain-scoped IDs like \"example.com:proj\" are not supported)."
  }
}

variable "region" {
  description = "Region of the Cloud Function, the Scheduler job and the source bucket."
  type        = string
  default     = "us-central1"

  validation {
    # Region names end in one or two digits: us-central1, europe-west12, me-central2.
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]{1,2}$", var.region))
    error_message = "The region must be a Google Cloud region such as \"us-central1\"."
  }
}

variable "name" {
  description = "Base name of every resource (function, job, service accounts, metrics dashboards)."
  type        = string
  default     = "lossspike"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,20}[a-z0-9]$", var.name))
    error_message = "The name must be 4-22 characters: lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "labels" {
  description = "Labels added to every resource that supports them."
  type        = map(string)
  default     = {}
}

variable "enable_apis" {
  description = "Enable the project services the evaluator needs (never disabled on destroy)."
  type        = bool
  default     = true
}

# ---------------------------------------------------------------------------------------------
# BigQuery
# ---------------------------------------------------------------------------------------------

# Terraform 1.0 runs a validation on a -var value before converting it to the variable's type,
# so `floor(var.x) == var.x` compares a number with the string "90" and fails; every whole-number
# check compares with tonumber(var.x) instead (found by tests/test_terraform.py).

variable "telemetry_table" {
  description = "Levanter telemetry table or view, as \"project.dataset.table\" (see README: adapter views)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][-a-z0-9]{4,28}[a-z0-9]\\.[A-Za-z0-9_]+\\.[A-Za-z0-9_$-]+$", var.telemetry_table))
    error_message = "The telemetry_table must be a fully qualified BigQuery table ID: \"project.dataset.table\" (domain-scoped projects are not supported)."
  }
}

variable "create_telemetry_table" {
  description = "Create telemetry_table (its dataset must exist, or be dataset_id) with the telemetry schema, partitioned by day."
  type        = bool
  default     = false
}

variable "telemetry_partition_type" {
  description = "Partitioning of the telemetry table, created or existing: \"DAY\" or \"HOUR\". The rollup view must use the same (BigQuery's rule); HOUR keeps a tick's rollup read flat through the day (see README costs)."
  type        = string
  default     = "DAY"

  validation {
    condition     = contains(["DAY", "HOUR"], var.telemetry_partition_type)
    error_message = "The telemetry_partition_type must be \"DAY\" or \"HOUR\"."
  }
}

variable "telemetry_shape" {
  description = "Which shape telemetry_table has (docs/data-contracts.md): \"contract\" (TIMESTAMP `timestamp`, a `service` column), \"levanter.metrics\" (Finelog's: INT64 `timestamp_ms` epoch milliseconds, INT64 `process_index`, `kind`, `seq`, no `service`) or \"telemetry_v1\" (`timestamp_ms`, STRING `process_index`, `service`, `kind`). The function reads the shape from the table's schema; the rollup view, which takes no parameters, is built from the template of this shape (terraform/sql/), and a created table gets its columns and partitioning."
  type        = string
  default     = "contract"

  validation {
    condition     = contains(["contract", "levanter.metrics", "telemetry_v1"], var.telemetry_shape)
    error_message = "The telemetry_shape must be \"contract\", \"levanter.metrics\" or \"telemetry_v1\"."
  }
}

variable "process" {
  description = "Whose rows count where the telemetry table has process_index: \"0\" (Levanter's process 0; before Aug 2026 every process published every metric) or \"any\"."
  type        = string
  default     = "0"

  validation {
    condition     = contains(["0", "any"], var.process)
    error_message = "The process must be \"0\" or \"any\"."
  }
}

variable "grant_telemetry_access" {
  description = "Grant the function roles/bigquery.dataViewer on telemetry_table. Set false if you grant read access yourself (e.g. on the tables behind an adapter view)."
  type        = bool
  default     = true
}

variable "bigquery_location" {
  description = "BigQuery location of the alerts dataset; query jobs run here, so the telemetry dataset must be in the same location."
  type        = string
  default     = "US"
}

variable "dataset_id" {
  description = "Dataset created for the alert table and the latest-verdict view."
  type        = string
  default     = "lossspike"

  validation {
    condition     = can(regex("^[A-Za-z0-9_]+$", var.dataset_id))
    error_message = "The dataset_id may contain only letters, digits and underscores."
  }
}

variable "alerts_retention_days" {
  description = "Days an alert-table partition is kept before BigQuery expires it."
  type        = number
  default     = 90

  validation {
    condition     = var.alerts_retention_days >= 1 && floor(var.alerts_retention_days) == tonumber(var.alerts_retention_days)
    error_message = "The alerts_retention_days must be a whole number of days, at least 1."
  }
}

variable "latest_view_lookback_hours" {
  description = "The loss_spike_latest view reads only the last this-many hours of alert rows (partition pruning)."
  type        = number
  default     = 24

  validation {
    condition     = var.latest_view_lookback_hours >= 1 && var.latest_view_lookback_hours <= 720
    error_message = "The latest_view_lookback_hours must be between 1 and 720."
  }
}

variable "deletion_protection" {
  description = "Protect the BigQuery tables from terraform destroy."
  type        = bool
  default     = true
}

variable "max_bytes_billed" {
  description = "Per-query cap on bytes billed (LOSSSPIKE_MAX_BYTES_BILLED); a query above it fails instead of costing more."
  type        = number
  default     = 3221225472

  validation {
    condition     = var.max_bytes_billed >= 10485760 && floor(var.max_bytes_billed) == tonumber(var.max_bytes_billed)
    error_message = "The max_bytes_billed must be a whole number of bytes, at least 10485760 (BigQuery's 10 MB minimum)."
  }
}

# ---------------------------------------------------------------------------------------------
# Which runs are watched, and the rule's thresholds
# ---------------------------------------------------------------------------------------------

variable "run_pattern" {
  description = "SQL LIKE pattern of the run IDs to watch (ignored when run_ids is set)."
  type        = string
  default     = "hero-%"

  validation {
    # Written into the rollup view's SQL as a literal (a view takes no parameters): these
    # characters need no escaping. Same rule as lossspike.sql.dialects.literal.
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.run_pattern))
    error_message = "The run_pattern must be non-empty and use only letters, digits and _ . % / : @ + - (use \"%\" to watch every run)."
  }
}

variable "run_ids" {
  description = "Explicit run IDs to watch instead of run_pattern; empty means use the pattern."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for r in var.run_ids : length(r) > 0 && !can(regex(",", r))])
    error_message = "The run_ids must be non-empty and contain no commas."
  }
}

variable "metric_name" {
  description = "Telemetry metric name that is the training loss."
  type        = string
  default     = "train_loss"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.metric_name))
    error_message = "The metric_name must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

variable "service_name" {
  description = "Telemetry service whose samples are read."
  type        = string
  default     = "levanter"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.service_name))
    error_message = "The service_name must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

variable "baseline_minutes" {
  description = "Length of the window ending at now; the baseline is its part before the recent window."
  type        = number
  default     = 60

  validation {
    condition     = var.baseline_minutes >= 2 && floor(var.baseline_minutes) == tonumber(var.baseline_minutes)
    error_message = "The baseline_minutes must be a whole number, at least 2."
  }
}

variable "recent_minutes" {
  description = "Length of the recent window, in minutes (must be less than baseline_minutes; the plan fails otherwise)."
  type        = number
  default     = 5

  validation {
    condition     = var.recent_minutes >= 1 && floor(var.recent_minutes) == tonumber(var.recent_minutes)
    error_message = "The recent_minutes must be a whole number, at least 1."
  }
}

variable "sigma" {
  description = "Band width in baseline standard deviations."
  type        = number
  default     = 6.0

  validation {
    condition     = var.sigma >= 0
    error_message = "The sigma must not be negative."
  }
}

variable "min_rise" {
  description = "Smallest rise of the recent floor over the reference that counts as a spike."
  type        = number
  default     = 0.05

  validation {
    condition     = var.min_rise >= 0
    error_message = "The min_rise must not be negative."
  }
}

variable "min_baseline_samples" {
  description = "Finite baseline samples needed before a run is judged."
  type        = number
  default     = 20

  validation {
    # Same floor as the Python settings (a positive integer).
    condition     = var.min_baseline_samples >= 1 && floor(var.min_baseline_samples) == tonumber(var.min_baseline_samples)
    error_message = "The min_baseline_samples must be a whole number, at least 1."
  }
}

variable "min_recent_samples" {
  description = "Recent samples needed before a run is judged."
  type        = number
  default     = 5

  validation {
    condition     = var.min_recent_samples >= 1 && floor(var.min_recent_samples) == tonumber(var.min_recent_samples)
    error_message = "The min_recent_samples must be a whole number, at least 1."
  }
}

variable "reference" {
  description = "Baseline reference the recent floor is compared with: \"mean\" or \"floor\"."
  type        = string
  default     = "mean"

  validation {
    condition     = contains(["mean", "floor"], var.reference)
    error_message = "The reference must be \"mean\" or \"floor\"."
  }
}

variable "stall_minutes" {
  description = "Minutes without a loss sample before a run is stalled and pages; 0 turns the check off. Less than baseline_minutes. null (the default): the function's default, 15, or baseline_minutes - 1 where the baseline is shorter (a default never makes another setting invalid)."
  type        = number
  default     = null

  # A conditional, not ||: Terraform evaluates both sides of ||, and a null compared is an error.
  validation {
    condition     = var.stall_minutes == null ? true : (var.stall_minutes >= 0 && floor(var.stall_minutes) == tonumber(var.stall_minutes))
    error_message = "The stall_minutes must be a whole number >= 0, or null."
  }
}

variable "initializing_minutes" {
  description = "Minutes an attempt may publish phase INITIALIZING with no loss before it is stalled and pages (Marin's start-up allowance); 0 turns the check off. Less than baseline_minutes. null (the default): the function's default, 45, or baseline_minutes - 1 where the baseline is shorter (a default never makes another setting invalid)."
  type        = number
  default     = null

  validation {
    condition     = var.initializing_minutes == null ? true : (var.initializing_minutes >= 0 && floor(var.initializing_minutes) == tonumber(var.initializing_minutes))
    error_message = "The initializing_minutes must be a whole number >= 0, or null."
  }
}

variable "phase_metric" {
  description = "Telemetry metric name of Levanter's phase (0 initializing, 1 training, 2 finished); changing it rebuilds the rollup view."
  type        = string
  default     = "phase"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.phase_metric))
    error_message = "The phase_metric must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

# ---------------------------------------------------------------------------------------------
# The detectors beyond the seed rule (docs/rule-and-detectors.md); LOSSSPIKE_* of the same names
# ---------------------------------------------------------------------------------------------

variable "detectors" {
  description = "Detectors beyond the seed rule: \"all\", \"none\" or a comma list of level_shift, slow_divergence, instability."
  type        = string
  default     = "all"

  validation {
    condition     = contains(["all", "none"], var.detectors) || alltrue([for d in split(",", var.detectors) : contains(["level_shift", "slow_divergence", "instability"], trimspace(d))])
    error_message = "The detectors must be \"all\", \"none\" or a comma list of level_shift, slow_divergence, instability."
  }
}

variable "attempts" {
  description = "Which attempts (execution UIDs) a run's loss windows read: \"newest\" (a restart's rewind never pages) or \"all\" (the seed rule's reading)."
  type        = string
  default     = "newest"

  validation {
    condition     = contains(["newest", "all"], var.attempts)
    error_message = "The attempts must be \"newest\" or \"all\"."
  }
}

variable "shift_min_rise" {
  description = "level_shift: smallest rise over the local level that counts."
  type        = number
  default     = 0.1

  validation {
    condition     = var.shift_min_rise >= 0
    error_message = "The shift_min_rise must not be negative."
  }
}

variable "shift_sigma" {
  description = "level_shift: robust minute-to-minute spreads above the local level."
  type        = number
  default     = 6.0

  validation {
    condition     = var.shift_sigma >= 0
    error_message = "The shift_sigma must not be negative."
  }
}

variable "divergence_min_rise" {
  description = "slow_divergence: rise over the horizon's best level that pages."
  type        = number
  default     = 0.15

  validation {
    condition     = var.divergence_min_rise > 0
    error_message = "The divergence_min_rise must be above 0 (0 pages every run whose loss is not at its horizon's best level)."
  }
}

variable "divergence_minutes" {
  description = "slow_divergence: the horizon, in minutes (at most 1440, the longest the tick reads)."
  type        = number
  default     = 180

  validation {
    condition     = var.divergence_minutes >= 1 && var.divergence_minutes <= 1440 && floor(var.divergence_minutes) == tonumber(var.divergence_minutes)
    error_message = "The divergence_minutes must be a whole number from 1 to 1440."
  }
}

variable "instability_sigma" {
  description = "instability: within-minute spreads an excursion clears."
  type        = number
  default     = 6.0

  validation {
    condition     = var.instability_sigma >= 0
    error_message = "The instability_sigma must not be negative."
  }
}

variable "instability_min_rise" {
  description = "instability: smallest excursion that counts."
  type        = number
  default     = 0.2

  validation {
    condition     = var.instability_min_rise >= 0
    error_message = "The instability_min_rise must not be negative."
  }
}

variable "instability_count" {
  description = "instability: separate excursions in the window that page."
  type        = number
  default     = 4

  validation {
    condition     = var.instability_count >= 1 && floor(var.instability_count) == tonumber(var.instability_count)
    error_message = "The instability_count must be a whole number, at least 1."
  }
}

variable "resume_min_rise" {
  description = "resume_jump: smallest rise of a new attempt over its previous one."
  type        = number
  default     = 1.0

  validation {
    condition     = var.resume_min_rise >= 0
    error_message = "The resume_min_rise must not be negative."
  }
}

variable "resume_sigma" {
  description = "resume_jump: previous attempt's spreads the rise must clear."
  type        = number
  default     = 6.0

  validation {
    condition     = var.resume_sigma >= 0
    error_message = "The resume_sigma must not be negative."
  }
}

variable "max_recent_minutes" {
  description = "How far the recent window widens for a run that steps slower than it allows (at most 1440)."
  type        = number
  default     = 15

  validation {
    condition     = var.max_recent_minutes >= 1 && var.max_recent_minutes <= 1440 && floor(var.max_recent_minutes) == tonumber(var.max_recent_minutes)
    error_message = "The max_recent_minutes must be a whole number from 1 to 1440."
  }
}

# ---------------------------------------------------------------------------------------------
# Run-health checks (SPEC.md, "Run health beyond loss"); LOSSSPIKE_* of the same names
# ---------------------------------------------------------------------------------------------

variable "checks" {
  description = "Run-health checks: \"\" (the default set: loss_jump, grad_norm_high, steps_skipped, eval_regressed), \"all\", \"none\" or a comma list. A model-specific check also needs its threshold."
  type        = string
  default     = ""

  validation {
    condition     = contains(["", "all", "none"], var.checks) || alltrue([for c in split(",", var.checks) : contains(["loss_jump", "grad_norm_high", "steps_skipped", "eval_regressed", "throughput_low", "mfu_low", "token_drops", "router_entropy", "router_bias"], trimspace(c))])
    error_message = "The checks must be \"\", \"all\", \"none\" or a comma list of loss_jump, grad_norm_high, steps_skipped, eval_regressed, throughput_low, mfu_low, token_drops, router_entropy, router_bias."
  }
}

variable "loss_jump_limit" {
  description = "loss_jump (page): recent loss floor minus baseline floor that fires."
  type        = number
  default     = 1.0

  validation {
    condition     = var.loss_jump_limit >= 0
    error_message = "The loss_jump_limit must not be negative."
  }
}

variable "grad_norm_limit" {
  description = "grad_norm_high (page): newest gradient norm above this fires."
  type        = number
  default     = 2.0

  validation {
    condition     = var.grad_norm_limit > 0
    error_message = "The grad_norm_limit must be above 0 (a gradient norm is above 0 at every step)."
  }
}

variable "check_pending_minutes" {
  description = "Run-health checks fire only when their condition held at every minute tick this many minutes back (0: at once; Marin's rules pend five)."
  type        = number
  default     = 5

  validation {
    condition     = var.check_pending_minutes >= 0 && var.check_pending_minutes <= 60 && floor(var.check_pending_minutes) == var.check_pending_minutes
    error_message = "The check_pending_minutes must be a whole number from 0 to 60."
  }
}

variable "skipped_steps_limit" {
  description = "steps_skipped (page): skip episodes starting in 15 minutes that fire (one burst is one episode)."
  type        = number
  default     = 3.0

  validation {
    condition     = var.skipped_steps_limit >= 1
    error_message = "The skipped_steps_limit must be at least 1 (steps_skipped fires at this many skip episodes or more, so below 1 it fires on every run)."
  }
}

variable "throughput_floor" {
  description = "throughput_low (notify): tokens per second below this. null (the default) keeps the check off: the right value depends on the model and hardware."
  type        = number
  default     = null

  # lossspike/rules/rule.py's THRESHOLD_RANGES. A conditional, not ||: Terraform evaluates both sides of ||, and a null
  # compared is an error (github.com/cloudposse-terraform-components/aws-aurora-postgres/releases/tag/v2.2.0).
  validation {
    condition     = var.throughput_floor == null ? true : (var.throughput_floor > 0)
    error_message = "The throughput_floor must be above 0, or null (tokens per second are never below 0)."
  }
}

variable "mfu_floor" {
  description = "mfu_low (notify): MFU in percent below this. null (the default) keeps the check off: the right value depends on the model and hardware."
  type        = number
  default     = null

  # lossspike/rules/rule.py's THRESHOLD_RANGES. A conditional, not ||: Terraform evaluates both sides of ||, and a null
  # compared is an error (github.com/cloudposse-terraform-components/aws-aurora-postgres/releases/tag/v2.2.0).
  validation {
    condition     = var.mfu_floor == null ? true : (var.mfu_floor > 0 && var.mfu_floor <= 100)
    error_message = "The mfu_floor must be above 0 and at most 100 (MFU is a percentage), or null."
  }
}

variable "token_drop_limit" {
  description = "token_drops (notify): MoE drop fraction above this (Marin: 0.07). null (the default) keeps the check off: the right value depends on the model and hardware."
  type        = number
  default     = null

  # lossspike/rules/rule.py's THRESHOLD_RANGES. A conditional, not ||: Terraform evaluates both sides of ||, and a null
  # compared is an error (github.com/cloudposse-terraform-components/aws-aurora-postgres/releases/tag/v2.2.0).
  validation {
    condition     = var.token_drop_limit == null ? true : (var.token_drop_limit >= 0 && var.token_drop_limit < 1)
    error_message = "The token_drop_limit must be at least 0 and below 1 (a drop fraction), or null."
  }
}

variable "router_entropy_limit" {
  description = "router_entropy (notify): routing entropy below this (Marin: 5.92 for 384 experts). null (the default) keeps the check off: the right value depends on the model and hardware."
  type        = number
  default     = null

  # lossspike/rules/rule.py's THRESHOLD_RANGES. A conditional, not ||: Terraform evaluates both sides of ||, and a null
  # compared is an error (github.com/cloudposse-terraform-components/aws-aurora-postgres/releases/tag/v2.2.0).
  validation {
    condition     = var.router_entropy_limit == null ? true : (var.router_entropy_limit > 0)
    error_message = "The router_entropy_limit must be above 0, or null (routing entropy is never below 0)."
  }
}

variable "router_bias_limit" {
  description = "router_bias (notify): largest absolute router bias above this (Marin: 400). null (the default) keeps the check off: the right value depends on the model and hardware."
  type        = number
  default     = null

  # lossspike/rules/rule.py's THRESHOLD_RANGES. A conditional, not ||: Terraform evaluates both sides of ||, and a null
  # compared is an error (github.com/cloudposse-terraform-components/aws-aurora-postgres/releases/tag/v2.2.0).
  validation {
    condition     = var.router_bias_limit == null ? true : (var.router_bias_limit >= 0)
    error_message = "The router_bias_limit must not be negative, or null."
  }
}

variable "grad_norm_metric" {
  description = "Telemetry metric name the grad_norm_high check reads (changing it rebuilds the rollup view)."
  type        = string
  default     = "grad_norm_total"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.grad_norm_metric))
    error_message = "The grad_norm_metric must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

variable "skipped_steps_metric" {
  description = "Telemetry metric name the steps_skipped check reads (changing it rebuilds the rollup view)."
  type        = string
  default     = "optim_skipped_step"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.skipped_steps_metric))
    error_message = "The skipped_steps_metric must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

variable "eval_metric" {
  description = "Telemetry metric name the eval_regressed check reads (changing it rebuilds the rollup view)."
  type        = string
  default     = "eval_paloma_macro_loss"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.eval_metric))
    error_message = "The eval_metric must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

variable "throughput_metric" {
  description = "Telemetry metric name the throughput_low check reads (changing it rebuilds the rollup view)."
  type        = string
  default     = "throughput_tokens_per_second"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.throughput_metric))
    error_message = "The throughput_metric must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

variable "mfu_metric" {
  description = "Telemetry metric name the mfu_low check reads (changing it rebuilds the rollup view)."
  type        = string
  default     = "throughput_mfu"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.mfu_metric))
    error_message = "The mfu_metric must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

variable "token_drops_metric" {
  description = "Telemetry metric name the token_drops check reads (changing it rebuilds the rollup view)."
  type        = string
  default     = "moe_drop_fraction"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.token_drops_metric))
    error_message = "The token_drops_metric must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

variable "router_entropy_metric" {
  description = "Telemetry metric name the router_entropy check reads (changing it rebuilds the rollup view)."
  type        = string
  default     = "train_router_routing_entropy_mean"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.router_entropy_metric))
    error_message = "The router_entropy_metric must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

variable "router_bias_max_metric" {
  description = "Telemetry metric name the router_bias (upper bound) check reads (changing it rebuilds the rollup view)."
  type        = string
  default     = "train_router_bias_max"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.router_bias_max_metric))
    error_message = "The router_bias_max_metric must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

variable "router_bias_min_metric" {
  description = "Telemetry metric name the router_bias (lower bound) check reads (changing it rebuilds the rollup view)."
  type        = string
  default     = "train_router_bias_min"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.%/:@+-]+$", var.router_bias_min_metric))
    error_message = "The router_bias_min_metric must be non-empty and use only letters, digits and _ . % / : @ + - (it is a literal in the rollup view's SQL)."
  }
}

# ---------------------------------------------------------------------------------------------
# Function and schedule
# ---------------------------------------------------------------------------------------------

variable "source_dir" {
  description = "Directory holding main.py, requirements.txt and the lossspike/ package; null means the repository root above this module."
  type        = string
  default     = null
}

variable "runtime" {
  description = "Cloud Functions Python runtime."
  type        = string
  default     = "python313"

  validation {
    condition     = can(regex("^python3[0-9]+$", var.runtime))
    error_message = "The runtime must be a Python runtime such as \"python313\"."
  }
}

variable "available_memory" {
  description = "Memory of the function instance."
  type        = string
  default     = "256M"

  validation {
    condition     = can(regex("^[0-9]+(M|Mi|G|Gi)$", var.available_memory))
    error_message = "The available_memory must look like \"256M\" or \"1Gi\"."
  }
}

variable "function_timeout_seconds" {
  description = "Function timeout; must stay below scheduler_attempt_deadline_seconds."
  type        = number
  default     = 50

  validation {
    condition     = var.function_timeout_seconds >= 10 && var.function_timeout_seconds <= 540
    error_message = "The function_timeout_seconds must be between 10 and 540."
  }
}

variable "scheduler_attempt_deadline_seconds" {
  description = "How long Scheduler waits for one attempt; must exceed function_timeout_seconds."
  type        = number
  default     = 60

  validation {
    condition     = var.scheduler_attempt_deadline_seconds >= 15 && var.scheduler_attempt_deadline_seconds <= 1800
    error_message = "The scheduler_attempt_deadline_seconds must be between 15 and 1800."
  }
}

variable "schedule" {
  description = "Cron schedule of the evaluation tick (UTC)."
  type        = string
  default     = "* * * * *"
}

variable "scheduler_paused" {
  description = "Create the Scheduler job paused (no ticks, so the heartbeat alert fires)."
  type        = bool
  default     = false
}

variable "source_bucket_name" {
  description = "Bucket for the zipped function source; empty means \"<project_id>-<name>-source\"."
  type        = string
  default     = ""
}

# ---------------------------------------------------------------------------------------------
# Cloud Monitoring
# ---------------------------------------------------------------------------------------------

variable "metric_prefix" {
  description = "Prefix of the custom metric types the function writes."
  type        = string
  default     = "custom.googleapis.com/lossspike"

  validation {
    condition     = can(regex("^custom\\.googleapis\\.com/[A-Za-z0-9_/.-]+[A-Za-z0-9_]$", var.metric_prefix))
    error_message = "The metric_prefix must start with \"custom.googleapis.com/\" and not end with a slash."
  }
}

variable "dashboard_readers" {
  description = "IAM members (e.g. \"serviceAccount:grafana@my-project.iam.gserviceaccount.com\") granted roles/bigquery.dataViewer on what the Grafana dashboard reads: the alert table, the latest view, the rollup view and, because a materialized view's reader needs it, the telemetry table."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for m in var.dashboard_readers : can(regex("^(serviceAccount|user|group|domain):.+$", m))])
    error_message = "Each dashboard reader must be an IAM member such as \"serviceAccount:grafana@my-project.iam.gserviceaccount.com\"."
  }
}

variable "notification_channels" {
  description = "Cloud Monitoring notification channel IDs (projects/P/notificationChannels/N) the paging policies notify: a run that pages, a silent evaluator, failing ticks."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.notification_channels : can(regex("^projects/[^/]+/notificationChannels/[^/]+$", c))])
    error_message = "Each notification channel must be \"projects/PROJECT/notificationChannels/ID\"."
  }
}

variable "notify_channels" {
  description = "Cloud Monitoring notification channel IDs the notify policy (throughput, MFU, evaluation loss, MoE notices) notifies. Empty (the default): the notices open incidents in the console and reach nobody; they never go to notification_channels, the pager."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.notify_channels : can(regex("^projects/[^/]+/notificationChannels/[^/]+$", c))])
    error_message = "Each notify channel must be \"projects/PROJECT/notificationChannels/ID\"."
  }
}

variable "grafana_dashboard_url" {
  description = "URL of the imported lossspike Grafana dashboard (grafana/dashboard.json), linked from every page with the run selected; empty links nothing and the page points at the latest view instead."
  type        = string
  default     = ""

  validation {
    condition     = var.grafana_dashboard_url == "" || can(regex("^https?://[^?#]+$", var.grafana_dashboard_url))
    error_message = "The grafana_dashboard_url must be empty or an http(s) URL without a query string."
  }
}

variable "alert_auto_close_seconds" {
  description = "Close a per-run incident this long after its run stops reporting (a finished run)."
  type        = number
  default     = 1800

  validation {
    condition     = var.alert_auto_close_seconds >= 1800
    error_message = "Cloud Monitoring requires alert_auto_close_seconds of at least 1800."
  }
}

variable "failed_ticks_to_page" {
  description = "Page when this many Scheduler attempts failed (the function answered 5xx, crashed, or was never reached) within failed_ticks_window_seconds."
  type        = number
  default     = 3

  validation {
    condition     = var.failed_ticks_to_page >= 1 && floor(var.failed_ticks_to_page) == tonumber(var.failed_ticks_to_page)
    error_message = "The failed_ticks_to_page must be a whole number, at least 1."
  }
}

variable "failed_ticks_window_seconds" {
  description = "Window over which failed ticks are counted."
  type        = number
  default     = 600

  validation {
    condition     = var.failed_ticks_window_seconds >= 60 && floor(var.failed_ticks_window_seconds / 60) * 60 == tonumber(var.failed_ticks_window_seconds)
    error_message = "The failed_ticks_window_seconds must be a whole number of minutes, at least 60."
  }
}

variable "metric_propagation_seconds" {
  description = "Wait after creating metric descriptors before the alert policies that name them (Monitoring says a new metric may take up to 10 minutes to become visible). Runs in parallel with the function build."
  type        = number
  default     = 600

  validation {
    condition     = var.metric_propagation_seconds >= 0 && var.metric_propagation_seconds <= 1800
    error_message = "The metric_propagation_seconds must be between 0 and 1800."
  }
}

variable "iam_propagation_seconds" {
  description = "Wait after granting the build account its roles before the function is built (IAM changes take time to apply)."
  type        = number
  default     = 60

  validation {
    condition     = var.iam_propagation_seconds >= 0 && var.iam_propagation_seconds <= 600
    error_message = "The iam_propagation_seconds must be between 0 and 600."
  }
}

variable "runbook_url" {
  description = "URL of your copy of docs/runbook.md, linked from every page; empty names the file in the lossspike repository instead."
  type        = string
  default     = ""

  validation {
    condition     = var.runbook_url == "" || can(regex("^https?://", var.runbook_url))
    error_message = "The runbook_url must be empty or an http(s) URL."
  }
}

variable "heartbeat_absent_seconds" {
  description = "Page when the fleet heartbeat metric has been absent this long (a dead evaluator)."
  type        = number
  default     = 300

  validation {
    condition     = var.heartbeat_absent_seconds >= 120 && floor(var.heartbeat_absent_seconds / 60) * 60 == tonumber(var.heartbeat_absent_seconds)
    error_message = "The heartbeat_absent_seconds must be a whole number of minutes, at least 120."
  }
}

# ---------------------------------------------------------------------------------------------
# The per-minute rollup view (loss_spike_minutes)
# ---------------------------------------------------------------------------------------------

variable "rollup_enabled" {
  description = "Build the per-minute rollup view over telemetry_table and have the tick read it. Set false when telemetry_table is a logical view (a materialized view cannot read one): the tick then runs the raw query, which bills the telemetry of the hour at every tick (see `lossspike cost`). The view keeps its partitions as long as telemetry_table does (a materialized view inherits its base table's partition expiration)."
  type        = bool
  default     = true
}

variable "rollup_refresh_interval_minutes" {
  description = "Automatic refresh interval of the rollup view: the backstop that catches up after an outage (the tick refreshes it every minute)."
  type        = number
  default     = 30

  validation {
    condition     = var.rollup_refresh_interval_minutes >= 1 && var.rollup_refresh_interval_minutes <= 10080
    error_message = "The rollup_refresh_interval_minutes must be between 1 and 10080 (BigQuery's bounds)."
  }
}

variable "rollup_since" {
  description = "Fixed lower bound of the rollup view, \"YYYY-MM-DD hh:mm:ss\" UTC; empty means an hour before the longest horizon a tick reads (a day, for the evaluation loss) at the apply that (re)builds it."
  type        = string
  default     = ""

  validation {
    condition     = var.rollup_since == "" || can(regex("^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}$", var.rollup_since))
    error_message = "The rollup_since must be empty or \"YYYY-MM-DD hh:mm:ss\"."
  }
}

variable "publisher_members" {
  description = "IAM members of the training jobs that publish telemetry with lossspike.publish's BigQuery sink (e.g. \"serviceAccount:trainer@my-project.iam.gserviceaccount.com\"): each may append rows to telemetry_table, nothing more."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for m in var.publisher_members : can(regex("^(serviceAccount|user|group|domain):.+$", m))])
    error_message = "Each publisher must be an IAM member such as \"serviceAccount:trainer@my-project.iam.gserviceaccount.com\"."
  }
}
