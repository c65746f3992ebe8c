"""A local BigQuery for tests: the PyPI ``bqemulator`` run as a subprocess.

The emulator lives in its own virtual environment (see
``tools/bqemulator/setup.sh``) because its pins (sqlglot < 30.12,
protobuf < 7) clash with the project's. Tests talk to it over HTTP with the
real ``google.cloud.bigquery.Client``.

Usage::

    with bigquery_emulator(project="test-project") as endpoint:
        client = make_client(endpoint, "test-project")
        client.create_dataset("telemetry")

or, in a conftest::

    @pytest.fixture(scope="session")
    def bq_endpoint():
        with bigquery_emulator() as endpoint:
            yield endpoint

Each emulator process is ephemeral (in-memory DuckDB); its state goes away
when the context exits.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SETUP_SCRIPT = "tools/bqemulator/setup.sh"
# lossspike's patches to the emulator; setup.sh copies this file into its venv.
PATCH_SOURCE = REPO_ROOT / "tools" / "bqemulator" / "lossspike_bqemu_patches.py"
# SPEC's telemetry contract as BigQuery columns.
TELEMETRY_SCHEMA_FIELDS = (
    ("timestamp", "TIMESTAMP"),
    ("service", "STRING"),
    ("name", "STRING"),
    ("value", "FLOAT64"),
    ("cluster", "STRING"),
    ("run_id", "STRING"),
    ("job_id", "STRING"),
    ("execution_uid", "STRING"),
)
DEFAULT_PROJECT = "lossspike-test"
# The gRPC port (Storage Read/Write API) of each running emulator, by its REST endpoint.
GRPC_PORTS: dict[str, int] = {}


class EmulatorUnavailable(RuntimeError):
    """The emulator's virtual environment is missing or the server did not start."""


def emulator_dir() -> pathlib.Path:
    return REPO_ROOT / ".tools" / "bqemulator"


def emulator_available() -> bool:
    """True when ``tools/bqemulator/setup.sh`` has been run (for ``skipif``)."""
    return (emulator_dir() / "bin" / "bqemulator").exists()


def _require_emulator() -> pathlib.Path:
    exe = emulator_dir() / "bin" / "bqemulator"
    if not exe.exists():
        raise EmulatorUnavailable(
            f"BigQuery emulator not found at {exe}. Run `bash {SETUP_SCRIPT}` "
            "(it installs bqemulator into <repo>/.tools/bqemulator)."
        )
    return exe


def _require_current_patches() -> None:
    """Refuse to start an emulator whose venv lacks the repo's current patches (a stale setup)."""
    installed = sorted(emulator_dir().glob(f"lib/python3*/site-packages/{PATCH_SOURCE.name}"))
    if not installed or installed[0].read_bytes() != PATCH_SOURCE.read_bytes():
        raise EmulatorUnavailable(
            f"The BigQuery emulator in {emulator_dir()} lacks the current {PATCH_SOURCE.name}: "
            f"re-run `bash {SETUP_SCRIPT}`."
        )


@contextlib.contextmanager
def bigquery_emulator(project: str = DEFAULT_PROJECT, *, start_timeout: float = 60.0) -> Iterator[str]:
    """Start the emulator on a free loopback port; yield its endpoint URL.

    The URL (``http://127.0.0.1:PORT``) is what ``make_client`` and
    ``client_options={"api_endpoint": ...}`` take. The process is stopped
    (SIGTERM, then SIGKILL) on exit.
    """
    from tiers import require_tool

    require_tool("the BigQuery emulator")
    exe = _require_emulator()
    _require_current_patches()
    venv = emulator_dir()
    workdir = tempfile.TemporaryDirectory(prefix="lossspike-bqemu-")
    env = {
        # A clean environment: nothing of the caller's venv, credentials or
        # proxies leaks into the emulator.
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        # DuckDB finds the offline-installed spatial extension under $HOME.
        "HOME": str(venv / "home"),
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        # The avro extension would be downloaded; nothing here needs it.
        "BQEMU_ENABLE_FORMAT_EXTENSIONS": "false",
        "NO_PROXY": "*",
    }
    cmd = [
        str(exe),
        "start",
        "--rest-host",
        "127.0.0.1",
        "--rest-port",
        "0",
        "--grpc-host",
        "127.0.0.1",
        "--grpc-port",
        "0",
        "--ephemeral",
        "--project",
        project,
        "--log-level",
        "info",
        "--log-format",
        "json",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=workdir.name,  # keeps any stray .bqemu.toml out of play
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    log: list[str] = []
    port_found = threading.Event()
    port: list[int] = []
    grpc_port: list[int] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if len(log) < 2000:
                log.append(line.rstrip("\n"))
            if not grpc_port and '"grpc.listen"' in line:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    grpc_port.append(int(json.loads(line)["port"]))
            if not port and '"rest.listen"' in line:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    port.append(int(json.loads(line)["port"]))
                    port_found.set()

    reader = threading.Thread(target=pump, name="bqemulator-log", daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + start_timeout
        while not port_found.wait(0.05):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log[-40:])
                why = (
                    f"exited with {proc.returncode}"
                    if proc.poll() is not None
                    else f"did not listen within {start_timeout:.0f}s"
                )
                raise EmulatorUnavailable(
                    f"bqemulator {why}. Re-run `bash {SETUP_SCRIPT}` if its venv is broken. Last output:\n{tail}"
                )
        endpoint = f"http://127.0.0.1:{port[0]}"
        _wait_http_ready(endpoint, project, deadline)
        grpc_deadline = time.monotonic() + 5  # logged beside rest.listen; a moment at most
        while not grpc_port and time.monotonic() < grpc_deadline:
            time.sleep(0.02)
        if grpc_port:
            GRPC_PORTS[endpoint] = grpc_port[0]
        yield endpoint
    finally:
        GRPC_PORTS.pop(f"http://127.0.0.1:{port[0]}" if port else "", None)
        _stop(proc)
        reader.join(timeout=5)
        workdir.cleanup()


def _wait_http_ready(endpoint: str, project: str, deadline: float) -> None:
    import urllib.request

    url = f"{endpoint}/bigquery/v2/projects/{project}/datasets"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise EmulatorUnavailable(f"bqemulator at {endpoint} never answered {url}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def make_client(endpoint: str, project: str = DEFAULT_PROJECT, **kwargs):
    """A real ``google.cloud.bigquery.Client`` pointed at ``endpoint``.

    Anonymous credentials, no BigQuery Storage API: read results with
    ``.to_arrow(create_bqstorage_client=False)`` / ``to_dataframe(...)`` likewise.
    """
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery

    return bigquery.Client(
        project=project,
        credentials=AnonymousCredentials(),
        client_options=ClientOptions(api_endpoint=endpoint),
        **kwargs,
    )


def create_lossspike_tables(client, telemetry: str, alerts: str) -> None:
    """The telemetry table (SPEC's contract) and the alerts table (DAY-partitioned), as Terraform makes them."""
    from google.cloud import bigquery

    from lossspike.base.schema import ALERTS_SCHEMA

    telemetry_schema = [bigquery.SchemaField(name, kind) for name, kind in TELEMETRY_SCHEMA_FIELDS]
    for table in (telemetry, alerts):
        client.create_dataset(table.rsplit(".", 1)[0], exists_ok=True)
    client.create_table(bigquery.Table(telemetry, schema=telemetry_schema))
    table = bigquery.Table(alerts, schema=[bigquery.SchemaField.from_api_repr(c) for c in ALERTS_SCHEMA])
    table.time_partitioning = bigquery.TimePartitioning(field="evaluated_at")
    client.create_table(table)


def make_write_client(endpoint: str):
    """A real ``BigQueryWriteClient`` (Storage Write API) on the emulator's gRPC port, without TLS or credentials."""
    import grpc
    from google.cloud import bigquery_storage_v1
    from google.cloud.bigquery_storage_v1.services.big_query_write.transports import BigQueryWriteGrpcTransport

    if endpoint not in GRPC_PORTS:
        raise EmulatorUnavailable(f"the emulator at {endpoint} logged no grpc.listen port")
    channel = grpc.insecure_channel(f"127.0.0.1:{GRPC_PORTS[endpoint]}")
    return bigquery_storage_v1.BigQueryWriteClient(transport=BigQueryWriteGrpcTransport(channel=channel))


@functools.cache
def emulator_patches():
    """The emulator patch module (``PATCH_SOURCE``), loaded here for its names: it imports only the stdlib."""
    spec = importlib.util.spec_from_file_location("lossspike_bqemu_patches", PATCH_SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seed_jobs(client, rows: list[dict], *, region: str = "us") -> None:
    """Add job rows to the emulator's ```region-<region>`.INFORMATION_SCHEMA.JOBS`` of ``client.project``.

    Rows use the view's column names (``emulator_patches().JOBS_COLUMNS``):
    TIMESTAMP columns take datetimes, ``labels`` a list of ``{"key": ..., "value": ...}``.
    The emulator records none of its own jobs there; only seeded rows are seen.
    """
    patches = emulator_patches()
    unknown = sorted(set().union(*rows) - {name for name, _ in patches.JOBS_COLUMNS}) if rows else []
    if unknown:
        raise ValueError(f"seed_jobs: not INFORMATION_SCHEMA.JOBS columns: {', '.join(unknown)}")
    # The first query naming the view creates its table in the emulator.
    client.query(f"SELECT job_id FROM `region-{region}`.INFORMATION_SCHEMA.JOBS LIMIT 0").result()
    table = client.get_table(patches.jobs_table(client.project, region))
    errors = client.insert_rows(table, rows)
    if errors:
        raise ValueError(f"seed_jobs: rows rejected: {errors}")


def insert_samples(client, table: str, samples) -> None:
    """Stream test samples (tests/oracle.py's Sample) into a telemetry table, NaN and inf included."""
    import math

    def number(v):
        if v is None or math.isfinite(v):
            return v
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")

    rows = [
        {
            "timestamp": s.timestamp.isoformat(),
            "service": s.service,
            "name": s.name,
            "value": number(s.value),
            "cluster": s.cluster,
            "run_id": s.run_id,
            "job_id": s.job_id,
            "execution_uid": s.execution_uid,
        }
        for s in samples
    ]
    for start in range(0, len(rows), 5000):
        errors = client.insert_rows_json(table, rows[start : start + 5000])
        if errors:
            raise RuntimeError(f"insert into {table} failed: {errors[:3]}")


def create_rollup_view(client, rollup: str, telemetry: str, selection, since) -> None:
    """The rollup view as Terraform makes it, in its unpartitioned form: the emulator
    answers 404 to refreshing a view declared with PARTITION BY (tests/test_terraform.py
    checks the partitioned form in the plan)."""
    from lossspike.sql.rollup_view import rollup_view_query

    client.query(f"CREATE MATERIALIZED VIEW `{rollup}` AS\n{rollup_view_query(telemetry, selection, since)}").result()
