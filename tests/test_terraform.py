"""The Terraform module, checked offline: fmt, init, validate, plan, and checkov.

Terraform 1.0.3 and checkov come from ``tools/terraform/setup.sh``; the google and archive
providers are plan-only stand-ins serving the real provider schema. The module is planned once
per session (in a copy of the repository files it packages) and the plan JSON is asserted on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tiers import require_tool

from lossspike.base.schema import SHAPES
from lossspike.config.settings import OPTIONS, load_settings
from lossspike.rules.checks import EVAL_LOOKBACK_MINUTES
from lossspike.rules.rule import PAGING_REASONS, Thresholds
from lossspike.sql.rollup_view import ROLLUP_TEMPLATES, rollup_template_name, rollup_view_query, rollup_view_template
from lossspike.sql.selection import CHECK_METRICS, Selection

REPO = Path(__file__).resolve().parent.parent
MODULE = REPO / "terraform"
TOOLS = REPO / ".tools" / "iac"
TERRAFORM = TOOLS / "bin" / "terraform"
CHECKOV = TOOLS / "bin" / "checkov"
CLI_CONFIG = TOOLS / "terraformrc"

PROJECT = "example-project"
CHANNEL = f"projects/{PROJECT}/notificationChannels/1234567890"
GRAFANA = f"serviceAccount:grafana@{PROJECT}.iam.gserviceaccount.com"
TRAINER = f"serviceAccount:trainer@{PROJECT}.iam.gserviceaccount.com"
# Thresholds away from their defaults, so a setting Terraform drops or renames shows.
THRESHOLD_VARS = {
    "baseline_minutes": 90,
    "recent_minutes": 10,
    "sigma": 7.5,
    "min_rise": 0.125,
    "min_baseline_samples": 1,  # Python's floor: Terraform must accept it too
    "min_recent_samples": 3,
    "reference": "floor",
    "stall_minutes": 20,
    "shift_min_rise": 0.125,
    "shift_sigma": 5.5,
    "divergence_min_rise": 0.25,
    "divergence_minutes": 240,
    "instability_sigma": 7.0,
    "instability_min_rise": 0.375,
    "instability_count": 4,
    "max_recent_minutes": 20,
    "loss_jump_limit": 1.5,
    "grad_norm_limit": 2.5,
    "skipped_steps_limit": 5.0,
    "check_pending_minutes": 3,
    "throughput_floor": 150000.0,  # the other model-specific limits stay unset: their checks stay off
}
# Check metric names away from their defaults (lossspike.sql.selection.Selection's *_metric fields).
METRIC_VARS = {f"{key}_metric": f"my_{key}" for key in CHECK_METRICS}
NOTIFY_CHANNEL = f"projects/{PROJECT}/notificationChannels/555"
DASHBOARD_URL = "https://grafana.example.com/d/lossspike/lossspike"
EXAMPLE_VARS = {
    "project_id": PROJECT,
    "region": "europe-west12",  # a two-digit region
    "telemetry_table": f"{PROJECT}.lossspike.telemetry",
    "create_telemetry_table": True,
    "notification_channels": [CHANNEL],
    "run_ids": ["hero-a", "hero-b"],
    "run_pattern": "big-%",
    "metric_name": "loss",
    "service_name": "levanter2",
    "bigquery_location": "EU",
    "max_bytes_billed": 2**31,
    "metric_prefix": "custom.googleapis.com/lossspike_eu",
    "alerts_retention_days": 30,
    "metric_propagation_seconds": 300,
    "runbook_url": "https://runbooks.example.com/lossspike",
    "telemetry_partition_type": "HOUR",
    "rollup_since": "2026-11-30 10:00:00",
    "detectors": "level_shift,instability",
    "attempts": "all",
    "checks": "grad_norm_high,steps_skipped,throughput_low",
    "notify_channels": [NOTIFY_CHANNEL],
    "grafana_dashboard_url": DASHBOARD_URL,
    "dashboard_readers": [GRAFANA],
    "publisher_members": [TRAINER],
    **THRESHOLD_VARS,
    **METRIC_VARS,
}

# Every role the module may grant, and to whom (resource address -> (role, service account)).
EXPECTED_BINDINGS = {
    "google_bigquery_table_iam_member.telemetry_viewer[0]": ("roles/bigquery.dataViewer", "function"),
    "google_bigquery_table_iam_member.alerts_editor": ("roles/bigquery.dataEditor", "function"),
    "google_bigquery_table_iam_member.rollup_editor[0]": ("roles/bigquery.dataEditor", "function"),
    "google_bigquery_table_iam_member.overrides_viewer": ("roles/bigquery.dataViewer", "function"),
    "google_project_iam_member.function_job_user": ("roles/bigquery.jobUser", "function"),
    "google_project_iam_member.function_metric_writer": ("roles/monitoring.metricWriter", "function"),
    # A custom role holding monitoring.timeSeries.list only (its ID is known after apply).
    "google_project_iam_member.function_series_reader": (None, "function"),
    "google_cloud_run_service_iam_member.invoker": ("roles/run.invoker", "invoker"),
    "google_project_iam_member.build_log_writer": ("roles/logging.logWriter", "build"),
    "google_project_iam_member.build_artifact_writer": ("roles/artifactregistry.writer", "build"),
    "google_storage_bucket_iam_member.build_source_reader": ("roles/storage.objectViewer", "build"),
    "google_project_iam_member.build_gcf_source_reader": ("roles/storage.objectViewer", "build"),
}
# What the dashboard reads, granted to each of dashboard_readers (table key -> table ID).
DASHBOARD_TABLES = {
    "alerts": "loss_spike_alerts",
    "latest": "loss_spike_latest",
    "rollup": "loss_spike_minutes",
    "telemetry": "telemetry",
}
FUNCTION_URL = "google_cloudfunctions2_function.evaluator.service_config[0].uri"
SOURCE_FILES = ["main.py", "requirements.txt", "lossspike/alerts_schema.json"]


def _require_tools() -> None:
    require_tool("the offline Terraform toolchain")
    missing = [str(p) for p in (TERRAFORM, CHECKOV, CLI_CONFIG) if not p.exists()]
    if missing:
        pytest.fail(
            "offline Terraform toolchain missing (" + ", ".join(missing) + "): run `bash tools/terraform/setup.sh`",
            pytrace=False,
        )


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    env.update(TF_CLI_CONFIG_FILE=str(CLI_CONFIG), TF_IN_AUTOMATION="1", TF_INPUT="0", CHECKPOINT_DISABLE="1")
    return env


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"`{' '.join(args)}` exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return proc


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    """A copy of the module and the files it packages, so init and plan write nothing in the repo."""
    _require_tools()
    missing = [f for f in SOURCE_FILES if not (REPO / f).is_file()]
    if missing:
        pytest.fail(f"the module packages files that do not exist: {missing}", pytrace=False)
    root = tmp_path_factory.mktemp("tf")
    ignore = shutil.ignore_patterns(".terraform*", "*.tfstate*", "*.tfplan", "__pycache__", "*.pyc")
    shutil.copytree(MODULE, root / "terraform", ignore=ignore)
    shutil.copytree(REPO / "lossspike", root / "lossspike", ignore=ignore)
    for name in ("main.py", "requirements.txt"):
        shutil.copy2(REPO / name, root / name)
    tf_dir = root / "terraform"
    (tf_dir / "example.tfvars.json").write_text(json.dumps(EXAMPLE_VARS))
    _run([str(TERRAFORM), "init", "-backend=false", "-input=false", "-no-color"], tf_dir)
    return tf_dir


@pytest.fixture(scope="session")
def plan(workdir: Path) -> dict:
    _run([str(TERRAFORM), "validate", "-no-color"], workdir)
    _run(
        [
            str(TERRAFORM),
            "plan",
            "-refresh=false",
            "-input=false",
            "-no-color",
            "-lock=false",
            "-var-file=example.tfvars.json",
            "-out=example.tfplan",
        ],
        workdir,
    )
    return json.loads(_run([str(TERRAFORM), "show", "-json", "example.tfplan"], workdir).stdout)


def _after(plan: dict, address: str) -> dict:
    for rc in plan["resource_changes"]:
        if rc["address"] == address:
            assert rc["change"]["actions"] == ["create"], address
            return rc["change"]["after"]
    raise AssertionError(f"{address} is not in the plan")


def _unknown(plan: dict, address: str) -> dict:
    return next(rc["change"]["after_unknown"] for rc in plan["resource_changes"] if rc["address"] == address)


def _config(plan: dict, address: str) -> dict:
    for res in plan["configuration"]["root_module"]["resources"]:
        if res["address"] == address.split("[")[0]:
            return res
    raise AssertionError(f"{address} is not in the configuration")


def _refs(expr: dict) -> list[str]:
    return expr.get("references", [])


# ---------------------------------------------------------------------------------------------


def test_fmt() -> None:
    _require_tools()
    proc = subprocess.run(
        [str(TERRAFORM), "fmt", "-check", "-recursive", "-diff", "-no-color", str(MODULE)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"run `terraform fmt -recursive terraform`:\n{proc.stdout}{proc.stderr}"


def test_plan_creates_the_whole_stack(plan: dict) -> None:
    types = {rc["type"] for rc in plan["resource_changes"]}
    assert {
        "google_project_service",
        "google_service_account",
        "google_storage_bucket",
        "google_storage_bucket_object",
        "google_cloudfunctions2_function",
        "google_cloud_scheduler_job",
        "google_bigquery_dataset",
        "google_bigquery_table",
        "google_monitoring_metric_descriptor",
        "google_monitoring_alert_policy",
    } <= types
    assert all(rc["change"]["actions"] == ["create"] for rc in plan["resource_changes"])


def test_scheduler_calls_the_function_with_an_oidc_token(plan: dict) -> None:
    job = _after(plan, "google_cloud_scheduler_job.tick")
    assert job["schedule"] == "* * * * *"
    assert job["time_zone"] == "Etc/UTC"
    assert job["http_target"][0]["http_method"] == "POST"
    # SPEC "Time": Scheduler never retries; the next minute is the retry.
    assert job["retry_config"][0]["retry_count"] == 0
    # The URL is unknown until the function exists: check the expressions instead.
    target = _config(plan, "google_cloud_scheduler_job.tick")["expressions"]["http_target"][0]
    assert FUNCTION_URL in _refs(target["uri"])
    oidc = target["oidc_token"][0]
    assert FUNCTION_URL in _refs(oidc["audience"])
    assert "google_service_account.invoker.email" in _refs(oidc["service_account_email"])
    unknown = _unknown(plan, "google_cloud_scheduler_job.tick")["http_target"][0]
    assert unknown["uri"] is True and unknown["oidc_token"][0]["audience"] is True

    function = _after(plan, "google_cloudfunctions2_function.evaluator")["service_config"][0]
    deadline = int(job["attempt_deadline"].rstrip("s"))
    assert function["timeout_seconds"] < deadline


def test_function_is_private_and_single_instance(plan: dict) -> None:
    fn = _after(plan, "google_cloudfunctions2_function.evaluator")
    build, service = fn["build_config"][0], fn["service_config"][0]
    assert re.fullmatch(r"python3\d+", build["runtime"])
    assert build["entry_point"] == "evaluate"
    assert service["ingress_settings"] == "ALLOW_INTERNAL_ONLY"
    assert service["max_instance_count"] == 1
    assert service["available_memory"] == "256M"
    assert service["timeout_seconds"] == 50
    assert service["all_traffic_on_latest_revision"] is True
    expr = _config(plan, "google_cloudfunctions2_function.evaluator")["expressions"]["service_config"][0]
    assert "google_service_account.function.email" in _refs(expr["service_account_email"])
    storage = _config(plan, "google_cloudfunctions2_function.evaluator")["expressions"]["build_config"][0]
    assert "google_storage_bucket_object.source.name" in _refs(storage["source"][0]["storage_source"][0]["object"])


def test_gcp_belief_build_runs_as_a_named_account_after_its_grants(plan: dict) -> None:
    # Belief (https://cloud.google.com/functions/docs/securing/build-custom-sa): since July 2024
    # the default build account may lack build rights; a named one needs logs, Artifact Registry
    # and the source object, and IAM grants take a while to apply.
    config = _config(plan, "google_cloudfunctions2_function.evaluator")
    build = config["expressions"]["build_config"][0]
    assert "google_service_account.build.id" in _refs(build["service_account"])
    assert "time_sleep.build_grants" in config["depends_on"]
    sleep = _config(plan, "time_sleep.build_grants")
    assert set(sleep["depends_on"]) == {
        address for address, (_, account) in EXPECTED_BINDINGS.items() if account == "build"
    }
    assert _after(plan, "time_sleep.build_grants")["create_duration"] == "60s"


def test_function_environment_is_what_the_variables_say_and_python_accepts(plan: dict) -> None:
    env = _after(plan, "google_cloudfunctions2_function.evaluator")["service_config"][0]["environment_variables"]
    # The Python side parses it at every cold start; any name it does not know is refused there.
    settings = load_settings(env)
    assert settings.backend == "bigquery" and settings.monitoring_enabled
    # Each setting against the variable given, never against another rendering of the same map.
    assert settings.project == EXAMPLE_VARS["project_id"]
    assert settings.location == EXAMPLE_VARS["bigquery_location"]
    assert settings.telemetry_table == EXAMPLE_VARS["telemetry_table"]
    assert settings.alerts_table == f"{PROJECT}.lossspike.loss_spike_alerts"
    assert settings.rollup_table == f"{PROJECT}.lossspike.loss_spike_minutes"
    assert settings.metric_prefix == EXAMPLE_VARS["metric_prefix"]
    assert settings.max_bytes_billed == EXAMPLE_VARS["max_bytes_billed"]
    assert settings.selection.run_ids == tuple(EXAMPLE_VARS["run_ids"])
    assert settings.selection.run_pattern == EXAMPLE_VARS["run_pattern"]
    assert (settings.selection.metric, settings.selection.service) == ("loss", "levanter2")
    assert settings.thresholds == Thresholds(**THRESHOLD_VARS)
    assert (settings.detectors, settings.attempts) == (("level_shift", "instability"), "all")
    assert settings.checks == ("grad_norm_high", "steps_skipped", "throughput_low")
    assert {name: getattr(settings.selection, name) for name in METRIC_VARS} == METRIC_VARS
    # An unset model-specific limit is left out, so its check stays off.
    assert "LOSSSPIKE_MFU_FLOOR" not in env and settings.thresholds.mfu_floor is None
    names = plan["planned_values"]["outputs"]["function_environment_variable_names"]["value"]
    assert names == sorted(env)


# Settings the function takes from elsewhere than a variable of the same name: the backend and
# tables are the module's own, the monitoring switch follows the backend, attempts are narrowed
# per query by hand, never per deployment.
NOT_VARIABLES = {
    "backend": "always bigquery",
    "database": "DuckDB only",
    "project": "project_id",
    "location": "bigquery_location",
    "telemetry_table": "telemetry_table",
    "alerts_table": "the module's table",
    "rollup_table": "the module's view",
    "monitoring": "on with bigquery",
    "service": "service_name",
    "metric": "metric_name",
    "execution_uids": "a per-query narrowing, not a deployment setting",
}


def test_every_setting_is_a_variable_passed_to_the_function(plan: dict) -> None:
    # Drift: a setting added to lossspike.config.settings.OPTIONS needs a Terraform variable of the same
    # name that reaches the function as its LOSSSPIKE_* variable (or a line above saying why not).
    variables = set(plan["configuration"]["root_module"]["variables"])
    env = _after(plan, "google_cloudfunctions2_function.evaluator")["service_config"][0]["environment_variables"]
    missing = [o.key for o in OPTIONS if o.key not in NOT_VARIABLES and o.key not in variables]
    assert missing == [], f"settings without a Terraform variable: {missing}"
    # Left out only where unset means the default: no run list, the default checks, a model-specific
    # limit nobody set, a window whose default follows the baseline.
    optional = {"run_ids", "checks", "stall_minutes", "initializing_minutes"}
    optional |= {k for k, v in vars(Thresholds()).items() if v is None}
    absent = {o.key for o in OPTIONS if o.key not in NOT_VARIABLES and o.env not in env}
    assert absent <= optional, absent


def test_empty_run_ids_leave_the_variable_unset(workdir: Path) -> None:
    console = subprocess.run(
        [str(TERRAFORM), "console", "-var-file=example.tfvars.json", "-var", "run_ids=[]"],
        cwd=workdir,
        env=_env(),
        input="jsonencode(local.function_env)\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert console.returncode == 0, console.stderr
    env = json.loads(json.loads(console.stdout.strip()))
    assert "LOSSSPIKE_RUN_IDS" not in env
    assert load_settings(env).selection.run_ids == ()


def test_a_shorter_baseline_alone_plans_and_the_windows_left_unset_follow_it(workdir: Path) -> None:
    """SPEC "Phase": a setting left at its default never makes another one invalid. baseline_minutes = 30
    with stall_minutes and initializing_minutes left null plans; they stay out of the function's
    environment, where the function's defaults follow the baseline (45 becomes 29)."""
    # A null reaches a variable only through a variable file (-var takes a number).
    shorter = {"baseline_minutes": 30, "recent_minutes": 5, "stall_minutes": None}
    (workdir / "shorter.tfvars.json").write_text(json.dumps(shorter))
    args = ["-var-file=example.tfvars.json", "-var-file=shorter.tfvars.json"]
    console = subprocess.run(
        [str(TERRAFORM), "console", *args],
        cwd=workdir,
        env=_env(),
        input="jsonencode(local.function_env)\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert console.returncode == 0, console.stderr
    env = json.loads(json.loads(console.stdout.strip()))
    assert "LOSSSPIKE_STALL_MINUTES" not in env and "LOSSSPIKE_INITIALIZING_MINUTES" not in env
    t = load_settings(env).thresholds
    assert (t.baseline_minutes, t.stall_minutes, t.initializing_minutes) == (30, 15, 29)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"recent_minutes": 90}, "recent_minutes must be less than baseline_minutes"),
        ({"recent_minutes": 120}, "recent_minutes must be less than baseline_minutes"),
        ({"project_id": "example.com:proj"}, "domain-scoped"),
        ({"telemetry_table": "example.com:proj.d.t"}, "domain-scoped"),
        ({"region": "europe-west123"}, "must be a Google Cloud region"),
        ({"min_baseline_samples": 0}, "at least 1"),
        ({"stall_minutes": 90}, "stall_minutes must be less than baseline_minutes"),
        ({"initializing_minutes": 90}, "initializing_minutes must be less than baseline_minutes"),
        ({"phase_metric": "phase x"}, "phase_metric must be non-empty"),
        # A view takes no parameters: a value that would need quoting in its SQL is refused.
        ({"run_pattern": "hero-'x"}, "run_pattern must be non-empty"),
        ({"service_name": "lev anter"}, "service_name must be non-empty"),
        ({"grad_norm_metric": "grad norm"}, "grad_norm_metric must be non-empty"),
        ({"detectors": "level_shift,spiking"}, "The detectors must be"),
        ({"checks": "grad_norm"}, "The checks must be"),
        ({"divergence_minutes": 2000}, "whole number from 1 to 1440"),
        # Thresholds that parse but cannot work (issue 25), the ranges of lossspike/rules/rule.py THRESHOLD_RANGES.
        ({"skipped_steps_limit": 0}, "skipped_steps_limit must be at least 1"),
        ({"throughput_floor": -5}, "throughput_floor must be above 0, or null"),
        ({"token_drop_limit": 1}, "token_drop_limit must be at least 0 and below 1"),
    ],
)
def test_plan_refuses_bad_variables(workdir: Path, extra: dict, message: str) -> None:
    args = [str(TERRAFORM), "plan", "-refresh=false", "-input=false", "-no-color", "-lock=false"]
    args.append("-var-file=example.tfvars.json")
    for key, value in extra.items():
        args += ["-var", f"{key}={value}"]
    proc = subprocess.run(args, cwd=workdir, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert message in " ".join((proc.stdout + proc.stderr).split()), proc.stderr


def test_iam_is_least_privilege(plan: dict) -> None:
    bindings = {
        rc["address"]: rc for rc in plan["resource_changes"] if re.search(r"_iam_(member|binding|policy)$", rc["type"])
    }
    dashboard = {
        a: rc for a, rc in bindings.items() if a.startswith("google_bigquery_table_iam_member.dashboard_reader")
    }
    publishers = {
        a: rc for a, rc in bindings.items() if a.startswith("google_bigquery_table_iam_member.telemetry_writer")
    }
    assert set(publishers) == {f'google_bigquery_table_iam_member.telemetry_writer["{TRAINER}"]'}
    bindings = {a: rc for a, rc in bindings.items() if a not in publishers}
    assert set(bindings) - set(dashboard) == set(EXPECTED_BINDINGS)
    for address, rc in bindings.items():
        assert rc["type"].endswith("_iam_member"), f"{address}: only additive members, never authoritative"
        after = rc["change"]["after"]
        assert after.get("member") not in ("allUsers", "allAuthenticatedUsers")
        if address in dashboard:
            assert (after["role"], after["member"]) == ("roles/bigquery.dataViewer", GRAFANA), address
            continue
        role, account = EXPECTED_BINDINGS[address]
        assert after.get("role") == role, address
        assert after.get("role") not in ("roles/owner", "roles/editor", "roles/viewer")
        expr = _config(plan, address)["expressions"]["member"]
        assert f"google_service_account.{account}.email" in _refs(expr), address
    reader = _config(plan, "google_project_iam_member.function_series_reader")["expressions"]["role"]
    assert "google_project_iam_custom_role.series_reader.id" in _refs(reader)
    # Table-level grants on exactly the right tables, run.invoker on this function only.
    alerts = _config(plan, "google_bigquery_table_iam_member.alerts_editor")["expressions"]
    assert "google_bigquery_table.alerts.table_id" in _refs(alerts["table_id"])
    telemetry = _after(plan, "google_bigquery_table_iam_member.telemetry_viewer[0]")
    assert (telemetry["project"], telemetry["dataset_id"], telemetry["table_id"]) == (PROJECT, "lossspike", "telemetry")
    invoker = _config(plan, "google_cloud_run_service_iam_member.invoker")["expressions"]
    assert "google_cloudfunctions2_function.evaluator.name" in _refs(invoker["service"])


def test_training_jobs_may_append_telemetry_and_nothing_more(plan: dict) -> None:
    # The Storage Write API needs bigquery.tables.updateData and only that
    # (https://cloud.google.com/bigquery/docs/write-api#required_permissions): a custom role with that
    # one permission, in the telemetry table's project, granted on the telemetry table alone.
    role = _after(plan, "google_project_iam_custom_role.telemetry_writer[0]")
    assert role["permissions"] == ["bigquery.tables.updateData"]
    assert role["project"] == PROJECT
    address = f'google_bigquery_table_iam_member.telemetry_writer["{TRAINER}"]'
    grant = _after(plan, address)
    assert (grant["project"], grant["dataset_id"], grant["table_id"], grant["member"]) == (
        PROJECT,
        "lossspike",
        "telemetry",
        TRAINER,
    )
    role_expr = _config(plan, address)["expressions"]["role"]
    assert "google_project_iam_custom_role.telemetry_writer" in " ".join(_refs(role_expr))
    # The table Terraform creates has the columns the publisher writes beside the contract's.
    schema = json.loads(_after(plan, "google_bigquery_table.telemetry[0]")["schema"])
    assert {(c["name"], c["type"]) for c in schema} >= {("process_index", "INT64"), ("step", "INT64")}


def test_services_stay_enabled_on_destroy(plan: dict) -> None:
    services = [rc for rc in plan["resource_changes"] if rc["type"] == "google_project_service"]
    assert {rc["change"]["after"]["service"] for rc in services} >= {
        "cloudfunctions.googleapis.com",
        "run.googleapis.com",
        "cloudscheduler.googleapis.com",
        "bigquery.googleapis.com",
        "monitoring.googleapis.com",
        "cloudbuild.googleapis.com",
    }
    assert all(rc["change"]["after"]["disable_on_destroy"] is False for rc in services)


def test_source_bucket_and_object(plan: dict) -> None:
    bucket = _after(plan, "google_storage_bucket.source")
    assert bucket["public_access_prevention"] == "enforced"
    assert bucket["uniform_bucket_level_access"] is True
    assert bucket["versioning"] == [{"enabled": True}]
    obj = _after(plan, "google_storage_bucket_object.source")
    assert re.fullmatch(r"lossspike-[0-9a-f]{32}\.zip", obj["name"])


def test_source_zip_holds_the_function(plan: dict, workdir: Path) -> None:
    import zipfile

    obj = _after(plan, "google_storage_bucket_object.source")
    path = Path(obj["source"])
    path = path if path.is_absolute() else workdir / path
    names = set(zipfile.ZipFile(path).namelist())
    assert {"main.py", "requirements.txt", "lossspike/__init__.py", "lossspike/alerts_schema.json"} <= names
    assert not any("__pycache__" in n or n.startswith(("tests/", "terraform/")) for n in names)


def test_alert_table_layout(plan: dict) -> None:
    table = _after(plan, "google_bigquery_table.alerts")
    assert table["table_id"] == "loss_spike_alerts"
    part = table["time_partitioning"][0]
    assert (part["type"], part["field"]) == ("DAY", "evaluated_at")
    assert part["expiration_ms"] == EXAMPLE_VARS["alerts_retention_days"] * 86_400_000
    # Readers filter recent evaluated_at ranges; blocks are pruned by the leading clustering column
    # (https://cloud.google.com/bigquery/docs/querying-clustered-tables).
    assert table["clustering"] == ["evaluated_at", "cluster", "run", "reason"]
    assert table["deletion_protection"] is True
    assert json.loads(table["schema"]) == json.loads((REPO / "lossspike" / "alerts_schema.json").read_text())

    view = _after(plan, "google_bigquery_table.latest")
    assert view["table_id"] == "loss_spike_latest"
    query = view["view"][0]["query"]
    assert view["view"][0]["use_legacy_sql"] is False
    assert f"`{PROJECT}.lossspike.loss_spike_alerts`" in query
    assert re.search(r"WHERE evaluated_at >= TIMESTAMP_SUB\(CURRENT_TIMESTAMP\(\), INTERVAL \d+ HOUR\)", query)
    # RANK, not ROW_NUMBER: every row of the newest evaluation (the loss row and each firing check).
    assert "QUALIFY RANK() OVER (PARTITION BY cluster, run ORDER BY evaluated_at DESC) = 1" in query


def test_the_alert_table_and_its_page_say_where_to_go_back(plan: dict) -> None:
    """SPEC "Where to go back": the table gains three NULLABLE columns (an in-place update of a
    deployed table), the latest view lists them, and the page says where to read them."""
    columns = {c["name"]: c for c in json.loads(_after(plan, "google_bigquery_table.alerts")["schema"])}
    types = {"onset_at": "TIMESTAMP", "last_good_at": "TIMESTAMP", "last_good_step": "INTEGER"}
    assert {n: (columns[n]["type"], columns[n]["mode"]) for n in types} == {
        n: (t, "NULLABLE") for n, t in types.items()
    }
    assert all(columns[n]["description"] for n in types)
    # The view names each column, so a new one changes its query and the apply re-saves it.
    query = _after(plan, "google_bigquery_table.latest")["view"][0]["query"]
    assert query.startswith("SELECT " + ", ".join(columns) + "\n")
    spike = _after(plan, "google_monitoring_alert_policy.loss_spike")["documentation"][0]["content"]
    selected = re.search(r"SELECT (.*?) FROM `[^`]*loss_spike_latest`", spike)
    assert selected and {"onset_at", "last_good_at", "last_good_step"} <= set(selected.group(1).split(", "))
    assert "before `last_good_step`; the batches between it and the onset are the suspect range" in spike
    # No label takes a per-step value: the page series stays one per run.
    labels = [label["key"] for label in _after(plan, "google_monitoring_metric_descriptor.page")["labels"]]
    assert labels == ["cluster", "run"]


def test_optional_telemetry_table(plan: dict) -> None:
    table = _after(plan, "google_bigquery_table.telemetry[0]")
    part = table["time_partitioning"][0]
    assert (part["type"], part["field"]) == (EXAMPLE_VARS["telemetry_partition_type"], "timestamp")
    assert table["clustering"] == ["name", "run_id"]
    columns = {c["name"]: (c["type"], c["mode"]) for c in json.loads(table["schema"])}
    assert columns == {
        "timestamp": ("TIMESTAMP", "REQUIRED"),
        "service": ("STRING", "NULLABLE"),
        "name": ("STRING", "NULLABLE"),
        "value": ("FLOAT64", "NULLABLE"),
        "cluster": ("STRING", "NULLABLE"),
        "run_id": ("STRING", "NULLABLE"),
        "job_id": ("STRING", "NULLABLE"),
        "execution_uid": ("STRING", "NULLABLE"),
        # Written by lossspike.publish beside the contract's eight (docs/publishing.md).
        "process_index": ("INT64", "NULLABLE"),
        "step": ("INT64", "NULLABLE"),
    }


PREFIX = EXAMPLE_VARS["metric_prefix"]
POLICIES = ("loss_spike", "notice", "heartbeat", "failed_ticks")


def test_page_metric_has_one_series_per_run_and_notices_their_own(plan: dict) -> None:
    page = _after(plan, "google_monitoring_metric_descriptor.page")
    assert page["type"] == f"{PREFIX}/page"
    assert (page["metric_kind"], page["value_type"]) == ("GAUGE", "INT64")
    # No reason label: a run pages once whatever reasons fire (SPEC.md, "Run health beyond loss").
    # No job label: a new job ID would otherwise resolve the incident and open another.
    assert {label["key"] for label in page["labels"]} == {"cluster", "run"}
    notice = _after(plan, "google_monitoring_metric_descriptor.notice")
    assert notice["type"] == f"{PREFIX}/notice"
    assert {label["key"] for label in notice["labels"]} == {"cluster", "run", "reason"}
    beat = _after(plan, "google_monitoring_metric_descriptor.runs_watched")
    assert beat["type"] == f"{PREFIX}/runs_watched"
    assert (beat["metric_kind"], beat["value_type"]) == ("GAUGE", "INT64")
    assert plan["planned_values"]["outputs"]["metric_types"]["value"] == {
        "page": f"{PREFIX}/page",
        "notice": f"{PREFIX}/notice",
        "runs_watched": f"{PREFIX}/runs_watched",
    }


def test_gcp_belief_policy_filters_name_metric_and_resource_type(plan: dict) -> None:
    # Belief (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies):
    # a condition's filter must name the metric type and the monitored resource type.
    # The function writes to the `global` resource; log-based metrics keep the log's resource.
    spike = _after(plan, "google_monitoring_alert_policy.loss_spike")["conditions"][0]["condition_threshold"][0]
    assert spike["filter"] == f'metric.type = "{PREFIX}/page" AND resource.type = "global"'
    notice = _after(plan, "google_monitoring_alert_policy.notice")["conditions"][0]["condition_threshold"][0]
    assert notice["filter"] == f'metric.type = "{PREFIX}/notice" AND resource.type = "global"'
    absent = _after(plan, "google_monitoring_alert_policy.heartbeat")["conditions"][0]["condition_absent"][0]
    assert absent["filter"] == f'metric.type = "{PREFIX}/runs_watched" AND resource.type = "global"'
    failed = _after(plan, "google_monitoring_alert_policy.failed_ticks")["conditions"][0]["condition_threshold"][0]
    assert failed["filter"] == (
        'metric.type = "logging.googleapis.com/user/lossspike_failed_ticks" AND resource.type = "cloud_scheduler_job"'
    )


def test_gcp_belief_paging_policy_pages_once_per_run_and_closes_when_points_stop(plan: dict) -> None:
    # Belief: only paging runs get points, so missing data must evaluate as false
    # (EVALUATION_MISSING_DATA_INACTIVE: "If there is no data to evaluate the condition, then
    # evaluate the condition as false", https://cloud.google.com/python/docs/reference/monitoring/
    # latest/google.cloud.monitoring_v3.types.AlertPolicy.Condition.EvaluationMissingData).
    # An incident is opened per time series the condition's aggregation leaves: grouped by
    # cluster and run only, a run is one incident whatever its reasons.
    spike = _after(plan, "google_monitoring_alert_policy.loss_spike")
    assert spike["notification_channels"] == [CHANNEL]
    cond = spike["conditions"][0]["condition_threshold"][0]
    assert (cond["comparison"], cond["threshold_value"]) == ("COMPARISON_GT", 0.5)
    assert cond["evaluation_missing_data"] == "EVALUATION_MISSING_DATA_INACTIVE"
    group = cond["aggregations"][0]["group_by_fields"]
    assert sorted(group) == ["metric.label.cluster", "metric.label.run"]
    assert spike["alert_strategy"][0]["auto_close"]


def test_notices_reach_no_pager(plan: dict) -> None:
    notice = _after(plan, "google_monitoring_alert_policy.notice")
    assert notice["notification_channels"] == [NOTIFY_CHANNEL]
    assert notice["user_labels"]["severity"] == "notify"
    cond = notice["conditions"][0]["condition_threshold"][0]
    assert sorted(cond["aggregations"][0]["group_by_fields"]) == [
        "metric.label.cluster",
        "metric.label.reason",
        "metric.label.run",
    ]
    assert cond["evaluation_missing_data"] == "EVALUATION_MISSING_DATA_INACTIVE"
    # Offline, as far as a plan can tell: the notice policy's channels come from notify_channels
    # alone, whose default is empty, and no paging policy reads the notice metric or that variable.
    config = _config(plan, "google_monitoring_alert_policy.notice")["expressions"]
    assert _refs(config["notification_channels"]) == ["var.notify_channels"]
    assert plan["configuration"]["root_module"]["variables"]["notify_channels"]["default"] == []
    for name in ("loss_spike", "heartbeat", "failed_ticks"):
        policy = _after(plan, f"google_monitoring_alert_policy.{name}")
        assert NOTIFY_CHANNEL not in policy["notification_channels"]
        assert "var.notify_channels" not in _refs(
            _config(plan, f"google_monitoring_alert_policy.{name}")["expressions"]["notification_channels"]
        )
        assert f"{PREFIX}/notice" not in json.dumps(policy["conditions"])


def test_every_page_links_the_runbook_and_names_the_run(plan: dict) -> None:
    docs = {p: _after(plan, f"google_monitoring_alert_policy.{p}")["documentation"][0]["content"] for p in POLICIES}
    assert all(EXAMPLE_VARS["runbook_url"] in text for text in docs.values())
    # Belief: documentation content is at most 8,192 characters and 10,240 UTF-8 bytes
    # (https://cloud.google.com/python/docs/reference/monitoring/latest/google.cloud.monitoring_v3.types.AlertPolicy.Documentation).
    assert all(len(text) <= 8192 and len(text.encode()) <= 10240 for text in docs.values())
    spike = docs["loss_spike"]
    # Policy documentation substitutes ${metric.label.KEY} (a label, never a value or a time).
    for label in ("run", "cluster"):
        assert "${metric.label." + label + "}" in spike
    assert "${metric.label.job}" not in spike and "${metric.label.reason}" not in spike
    assert "no loss for at least stall_minutes" in spike
    # The page names every paging reason and links where the firing ones are listed.
    paging_checks = ("loss_jump", "grad_norm_high", "steps_skipped")
    assert all(f"`{reason}`" in spike for reason in (*PAGING_REASONS, *paging_checks))
    assert DASHBOARD_URL + "?var-run=${metric.label.run}" in spike
    assert f"`{PROJECT}.lossspike.loss_spike_latest` WHERE cluster = '${{metric.label.cluster}}'" in spike
    assert "lossspike silence RUN --until" in spike
    notice = _after(plan, "google_monitoring_alert_policy.notice")["documentation"][0]["content"]
    assert "${metric.label.reason}" in notice and DASHBOARD_URL in notice


def test_gcp_belief_a_deployment_that_never_succeeds_pages(plan: dict) -> None:
    # Belief: an absence condition never fires for a series that never had a point
    # (MetricAbsence, https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies),
    # and a call refused before the function runs (invoker grant, ingress) leaves no function log:
    # Scheduler's own log of each attempt is what shows every failed tick, once
    # (https://cloud.google.com/scheduler/docs/reference/rest/v1/projects.locations.jobs).
    metric = _after(plan, "google_logging_metric.failed_ticks")
    assert metric["name"] == "lossspike_failed_ticks"
    assert metric["filter"] == (
        'resource.type="cloud_scheduler_job" AND resource.labels.job_id="lossspike-tick" AND severity>=ERROR'
    )
    policy = _after(plan, "google_monitoring_alert_policy.failed_ticks")
    assert policy["notification_channels"] == [CHANNEL]
    cond = policy["conditions"][0]["condition_threshold"][0]
    assert cond["aggregations"][0]["per_series_aligner"] == "ALIGN_SUM"
    assert cond["threshold_value"] == 2.5  # three failed ticks page
    heartbeat = _after(plan, "google_monitoring_alert_policy.heartbeat")
    assert heartbeat["conditions"][0]["condition_absent"][0]["duration"] == "300s"
    assert "gcloud scheduler jobs run" in plan["planned_values"]["outputs"]["smoke_test_command"]["value"]


def test_gcp_belief_policies_wait_for_new_metrics(plan: dict) -> None:
    # Belief (hashicorp/terraform-provider-google#11102): a policy naming a metric created
    # moments ago fails with "Cannot find metric(s)...; it could take up to 10 minutes".
    for policy in POLICIES:
        assert _config(plan, f"google_monitoring_alert_policy.{policy}")["depends_on"] == ["time_sleep.metrics_visible"]
    sleep = _config(plan, "time_sleep.metrics_visible")["expressions"]["triggers"]
    refs = set(_refs(sleep))
    assert {
        "google_monitoring_metric_descriptor.page.id",
        "google_monitoring_metric_descriptor.notice.id",
        "google_monitoring_metric_descriptor.runs_watched.id",
        "google_logging_metric.failed_ticks.id",
    } <= refs
    assert _after(plan, "time_sleep.metrics_visible")["create_duration"] == "300s"


def test_checkov_passes_and_skips_are_documented() -> None:
    _require_tools()
    proc = subprocess.run(
        [str(CHECKOV), "-d", str(MODULE), "--framework", "terraform", "--skip-download", "--compact", "--quiet"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"checkov found failures:\n{proc.stdout}{proc.stderr}"
    readme = (MODULE / "README.md").read_text()
    skips = set()
    for tf in MODULE.glob("*.tf"):
        skips.update(re.findall(r"#checkov:skip=(CKV\w*_\d+):", tf.read_text()))
    undocumented = sorted(s for s in skips if s not in readme)
    assert not undocumented, f"checkov skips missing from terraform/README.md: {undocumented}"


def test_rollup_view_is_the_python_definition_partitioned_like_telemetry(plan: dict) -> None:
    view = _after(plan, "google_bigquery_table.rollup[0]")
    # Terraform renders terraform/sql/loss_spike_minutes.sql; it must be the query the Python
    # side defines, for the run list's covering pattern ('%' with run_ids) and the fixed start.
    want = rollup_view_query(
        EXAMPLE_VARS["telemetry_table"],
        Selection(service="levanter2", metric="loss", run_pattern="%", **METRIC_VARS),
        datetime(2026, 11, 30, 10, 0, tzinfo=UTC),
    )
    mv = view["materialized_view"][0]
    assert mv["query"].strip() == want.strip()
    assert mv["enable_refresh"] is True and mv["refresh_interval_ms"] == 30 * 60000
    # A partitioned view must use its base table's granularity (BigQuery's rule, cited in bigquery.tf).
    assert view["time_partitioning"][0]["type"] == EXAMPLE_VARS["telemetry_partition_type"]
    assert view["time_partitioning"][0]["field"] == "minute"
    # "Partition expiration can't be set on materialized views ... it inherits the base table's"
    # (https://cloud.google.com/bigquery/docs/materialized-views-create#partition_expiration).
    assert view["time_partitioning"][0].get("expiration_ms") is None
    # Every part of the tick's read (lossspike.sql.tick) filters its metric role, then a minute range,
    # not a run: BigQuery prunes blocks by filters on the clustering columns in their order
    # (https://cloud.google.com/bigquery/docs/querying-clustered-tables), and each role's blocks
    # are sorted by minute, so the minute filter still prunes inside a day partition.
    assert view["clustering"] == ["metric", "minute", "run_id"]
    assert view["table_id"] == "loss_spike_minutes"


def test_rollup_template_is_generated_from_the_python_definition() -> None:
    assert (MODULE / "sql" / "loss_spike_minutes.sql").read_text() == rollup_view_template()
    # One template per telemetry shape and process setting, each the Python definition.
    for name, (shape, process) in ROLLUP_TEMPLATES.items():
        assert (MODULE / "sql" / name).read_text() == rollup_view_template(SHAPES[shape], process), name
    shipped = {p.name for p in (MODULE / "sql").glob("loss_spike_minutes*.sql")}
    assert shipped == set(ROLLUP_TEMPLATES)


@pytest.fixture(scope="session")
def levanter_plan(workdir: Path) -> dict:
    """The module planned for Finelog's levanter.metrics shape (timestamp_ms, INT64 process_index)."""
    _run(
        [
            str(TERRAFORM),
            "plan",
            "-refresh=false",
            "-input=false",
            "-no-color",
            "-lock=false",
            "-var-file=example.tfvars.json",
            "-var",
            "telemetry_shape=levanter.metrics",
            "-out=levanter.tfplan",
        ],
        workdir,
    )
    return json.loads(_run([str(TERRAFORM), "show", "-json", "levanter.tfplan"], workdir).stdout)


def test_a_timestamp_ms_table_gets_its_own_view_and_integer_range_partitions(levanter_plan: dict) -> None:
    view = _after(levanter_plan, "google_bigquery_table.rollup[0]")
    want = rollup_view_query(
        EXAMPLE_VARS["telemetry_table"],
        Selection(service="levanter2", metric="loss", run_pattern="%", **METRIC_VARS),
        datetime(2026, 11, 30, 10, 0, tzinfo=UTC),
        SHAPES["levanter.metrics"],
    )
    assert view["materialized_view"][0]["query"].strip() == want.strip()
    # Bounded on the stored integer, process 0 only, sample kinds; no service column to filter.
    assert "timestamp_ms >= UNIX_MILLIS(TIMESTAMP '2026-11-30 10:00:00')" in want
    assert "process_index = 0" in want and "service" not in want
    # A partitioned materialized view must be partitioned like its base table, on the same column
    # (https://cloud.google.com/bigquery/docs/materialized-views-create#partitioned_materialized_views):
    # the view's rows have no timestamp_ms, so it is clustered only.
    assert view["time_partitioning"] == [] and view["clustering"] == ["metric", "minute", "run_id"]
    table = _after(levanter_plan, "google_bigquery_table.telemetry[0]")
    assert table["time_partitioning"] == []
    # Integer-range partitioning needs a top-level INTEGER column
    # (https://cloud.google.com/bigquery/docs/creating-integer-range-partitions); one day a partition.
    [ranges] = table["range_partitioning"]
    assert ranges["field"] == "timestamp_ms" and ranges["range"][0]["interval"] == 86400000
    # 10,000 partitions at most per table (https://cloud.google.com/bigquery/quotas#partitioned_tables).
    assert (ranges["range"][0]["end"] - ranges["range"][0]["start"]) // 86400000 == 10000
    columns = {c["name"]: c["type"] for c in json.loads(table["schema"])}
    assert columns["timestamp_ms"] == "INT64" and columns["process_index"] == "INT64" and "service" not in columns
    env = _after(levanter_plan, "google_cloudfunctions2_function.evaluator")["service_config"][0][
        "environment_variables"
    ]
    assert env["LOSSSPIKE_PROCESS"] == "0"


@pytest.mark.parametrize(("shape", "process"), [("contract", "0"), ("telemetry_v1", "any"), ("levanter.metrics", "0")])
def test_the_view_template_follows_the_shape_and_process(workdir: Path, shape: str, process: str) -> None:
    got = _console(workdir, "local.rollup_template", "-var", f"telemetry_shape={shape}", "-var", f"process={process}")
    assert got == f'"{rollup_template_name(shape, process)}"'


def test_overrides_table_has_the_python_schema(plan: dict) -> None:
    table = _after(plan, "google_bigquery_table.overrides")
    assert table["table_id"] == "loss_spike_overrides"
    assert json.loads(table["schema"]) == json.loads((REPO / "lossspike" / "overrides_schema.json").read_text())


def _console(workdir: Path, expression: str, *extra: str) -> str:
    console = subprocess.run(
        [str(TERRAFORM), "console", "-var-file=example.tfvars.json", *extra],
        cwd=workdir,
        env=_env(),
        input=expression + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert console.returncode == 0, console.stderr
    return console.stdout.strip()


def test_a_rebuilt_view_holds_the_longest_horizon_a_tick_reads(workdir: Path) -> None:
    # SPEC.md: the view keeps at least the longest horizon a detector reads, also right after a
    # rebuild; the evaluation loss's lookback (a day) is the longest by default.
    assert int(_console(workdir, "local.rollup_horizon_minutes")) == EVAL_LOOKBACK_MINUTES
    # The lower bound, when not pinned, is an hour before that horizon.
    since = _console(workdir, "local.rollup_since", "-var", "rollup_since=")
    assert since == "(known after apply)" or re.fullmatch(r'"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"', since)


# BigQuery takes new NULLABLE columns and REQUIRED -> NULLABLE relaxations in place ("Modifying
# table schemas", https://cloud.google.com/bigquery/docs/managing-table-schemas); the google
# provider updates the table in place for those changes and replaces it (losing every row) for a
# new REQUIRED column, a type change or any other mode change (resourceBigQueryTableSchemaIsChangeable
# and bigQueryTableModeIsForceNew, hashicorp/terraform-provider-google, google/resource_bigquery_table.go
# at 8fa339ef and google/services/bigquery/resource_bigquery_table.go at 00b984c6; the newer one also
# drops top-level columns in place, which this module never does).
_SAME_TYPES = [{"INTEGER", "INT64"}, {"FLOAT", "FLOAT64"}, {"BOOLEAN", "BOOL"}]


def _updates_in_place(old: list[dict], new: list[dict]) -> bool:
    def same_type(a: str, b: str) -> bool:
        return a.upper() == b.upper() or any({a.upper(), b.upper()} <= group for group in _SAME_TYPES)

    before = {c["name"]: c for c in old}
    after = {c["name"]: c for c in new}
    if not set(before) <= set(after):
        return False
    for name, column in after.items():
        mode = column.get("mode", "NULLABLE").upper()
        if name not in before:
            if mode == "REQUIRED":
                return False
            continue
        was = before[name].get("mode", "NULLABLE").upper()
        if not same_type(before[name]["type"], column["type"]) or (
            mode != was and (was, mode) != ("REQUIRED", "NULLABLE")
        ):
            return False
    return True


@pytest.mark.parametrize("table", ["alerts", "overrides"])
def test_gcp_belief_upgrading_a_deployed_table_keeps_its_rows(table: str) -> None:
    # tests/released/ holds the schemas of the release before the run-health checks and detectors.
    released = json.loads((REPO / "tests" / "released" / f"{table}_schema.json").read_text())
    current = json.loads((REPO / "lossspike" / f"{table}_schema.json").read_text())
    assert _updates_in_place(released, current)
    # The rule is not vacuous: a new REQUIRED column, a type change or a NULLABLE column made
    # REQUIRED would replace the table.
    first, *rest = released
    nullable = next(c for c in released if c["mode"] == "NULLABLE")
    assert not _updates_in_place(released, [*released, {"name": "x", "type": "STRING", "mode": "REQUIRED"}])
    assert not _updates_in_place(released, [{**first, "type": "BYTES"}, *rest])
    assert not _updates_in_place(released, [{**c, "mode": "REQUIRED"} if c is nullable else c for c in released])


def test_gcp_belief_the_build_reads_the_function_services_source_bucket(plan: dict) -> None:
    # Belief (https://cloud.google.com/functions/docs/building; hashicorp/terraform-provider-google
    # #20571: "Access to bucket gcf-v2-sources-... denied. You must grant Storage Object Viewer
    # permission to <build SA>"): the build fetches the zip from the service's bucket
    # gcf-v2-sources-PROJECT_NUMBER-REGION, which exists only after the first deploy. Storage IAM
    # conditions match resource.name "projects/_/buckets/NAME[/objects/...]"
    # (https://cloud.google.com/storage/docs/access-control/iam#conditions).
    grant = _after(plan, "google_project_iam_member.build_gcf_source_reader")
    [condition] = grant["condition"]
    assert condition["expression"] == 'resource.name.startsWith("projects/_/buckets/gcf-v2-sources-")'
    assert "google_project_iam_member.build_gcf_source_reader" in _config(plan, "time_sleep.build_grants")["depends_on"]


def test_gcp_belief_the_function_may_read_back_its_points_and_nothing_else(plan: dict) -> None:
    # Belief (https://cloud.google.com/monitoring/access-control): roles/monitoring.metricWriter is
    # write-only, so the re-run read-back (list_time_series) needs monitoring.timeSeries.list.
    role = _after(plan, "google_project_iam_custom_role.series_reader")
    assert role["permissions"] == ["monitoring.timeSeries.list"]
    assert role["role_id"] == "lossspike_series_reader"
    depends = _config(plan, "google_cloudfunctions2_function.evaluator")["depends_on"]
    assert "google_project_iam_member.function_series_reader" in depends


def test_gcp_belief_provider_floor_has_what_the_module_uses(plan: dict) -> None:
    # Belief (hashicorp/terraform-provider-google CHANGELOG.md): build_config.service_account came
    # in 5.26.0 (#17841) and the perpetual diff on service_config.environment_variables
    # (LOG_EXECUTION_ID) was fixed in 5.38.0 (#18651).
    google = plan["configuration"]["provider_config"]["google"]
    assert google["version_constraint"].startswith(">= 5.38.0, < 7.0")


def test_dashboard_readers_can_read_what_the_dashboard_reads(plan: dict) -> None:
    # A materialized view's reader needs read access on the view and on its base table
    # (https://cloud.google.com/bigquery/docs/materialized-views-use#required_roles).
    grants = {
        rc["change"]["after"]["table_id"]: rc["change"]["after"]
        for rc in plan["resource_changes"]
        if rc["address"].startswith("google_bigquery_table_iam_member.dashboard_reader")
    }
    assert set(grants) == set(DASHBOARD_TABLES.values())
    telemetry = grants["telemetry"]
    assert (telemetry["project"], telemetry["dataset_id"]) == (PROJECT, "lossspike")


def test_without_the_rollup_the_tick_reads_raw_telemetry(workdir: Path) -> None:
    # A materialized view cannot read a logical view: rollup_enabled = false builds none, grants
    # nothing on it, and leaves LOSSSPIKE_ROLLUP_TABLE unset so the function runs the raw query.
    args = [str(TERRAFORM), "plan", "-refresh=false", "-input=false", "-no-color", "-lock=false"]
    args += ["-var-file=example.tfvars.json", "-var", "rollup_enabled=false", "-out=raw.tfplan"]
    _run(args, workdir)
    raw = json.loads(_run([str(TERRAFORM), "show", "-json", "raw.tfplan"], workdir).stdout)
    addresses = {rc["address"] for rc in raw["resource_changes"]}
    assert not {a for a in addresses if "rollup" in a}
    readers = {
        rc["change"]["after"]["table_id"] for rc in raw["resource_changes"] if "dashboard_reader" in rc["address"]
    }
    assert readers == {"loss_spike_alerts", "loss_spike_latest"}
    env = _after(raw, "google_cloudfunctions2_function.evaluator")["service_config"][0]["environment_variables"]
    settings = load_settings(env)
    assert settings.rollup_table == "" and settings.telemetry_table == EXAMPLE_VARS["telemetry_table"]


def test_gcp_belief_the_paging_and_notice_policies_add_no_pending_period(plan: dict) -> None:
    """The evaluator pends the checks (check_pending_minutes, SPEC.md "Pending period"); a policy
    duration would hold each page that much longer again. Belief: a threshold condition's
    `duration` is "the amount of time that a time series must violate the threshold to be
    considered failing", in whole minutes, 0 included
    (https://cloud.google.com/ruby/docs/reference/google-cloud-monitoring-v3/latest/Google-Cloud-Monitoring-V3-AlertPolicy-Condition-MetricThreshold);
    with 60 s alignment, 0s fails on the first aligned point above 0.5."""
    for name in ("loss_spike", "notice"):
        condition = _after(plan, f"google_monitoring_alert_policy.{name}")["conditions"][0]["condition_threshold"][0]
        assert condition["duration"] == "0s", (name, condition["duration"])
        assert condition["aggregations"][0]["alignment_period"] == "60s"
