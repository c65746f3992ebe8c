"""Shared helpers: telemetry in a DuckDB database, evaluated through the real pipeline."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from oracle import Sample  # noqa: E402
from tiers import QUICK, quick_examples  # noqa: E402

from lossspike.base.schema import TELEMETRY_ARROW_SCHEMA, TELEMETRY_COLUMNS, telemetry_table_ddl  # noqa: E402
from lossspike.config.settings import Settings  # noqa: E402
from lossspike.evaluation.evaluate import evaluate  # noqa: E402
from lossspike.stores.duckdb import DuckDBStore  # noqa: E402

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The quick tier runs each property test at a share of its examples (tests/tiers.py)."""
    if not QUICK:
        return
    from hypothesis import settings

    for item in items:
        test = getattr(item, "obj", None)
        # Hypothesis reads a test's settings from this attribute when the test runs (hypothesis/core.py).
        current = getattr(test, "_hypothesis_internal_use_settings", None)
        if current is not None:
            quick = settings(current, max_examples=quick_examples(current.max_examples))
            test._hypothesis_internal_use_settings = quick


def samples_table(samples: list[Sample]) -> pa.Table:
    return pa.Table.from_pylist(
        [{n: getattr(s, n) for n in TELEMETRY_COLUMNS} for s in samples], schema=TELEMETRY_ARROW_SCHEMA
    )


def load_telemetry(connection: duckdb.DuckDBPyConnection, samples: list[Sample], table: str = "telemetry") -> None:
    connection.execute(telemetry_table_ddl(table))
    data = samples_table(samples)
    connection.register("incoming", data)
    connection.execute(f"INSERT INTO {table} SELECT * FROM incoming")
    connection.unregister("incoming")


_SHARED: list[DuckDBStore] = []


def store_with(samples: list[Sample]) -> DuckDBStore:
    """One in-memory DuckDB store, its telemetry table refilled with `samples` at each call."""
    if not _SHARED:
        _SHARED.append(DuckDBStore(":memory:"))
    store = _SHARED[0]
    store.connection.execute("DROP TABLE IF EXISTS telemetry")
    load_telemetry(store.connection, samples)
    return store


def seed_settings(**values: object) -> Settings:
    """The seed rule alone on every attempt: what the oracle (tests/oracle.py) recomputes."""
    return Settings(detectors=(), checks=(), attempts="all", **values)


def evaluate_samples(samples: list[Sample], settings: Settings | None = None, now: datetime = NOW) -> list[dict]:
    """Rows the DuckDB SQL and the rule give for `samples`."""
    return evaluate(store_with(samples), settings or seed_settings(), now)


def write_database(path: Path, samples: list[Sample]) -> Path:
    with duckdb.connect(str(path)) as connection:
        load_telemetry(connection, samples)
    return path


@pytest.fixture(scope="session")
def demo_db_original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo fleet written once a session (about a second), for `demo_db` to copy."""
    from lossspike.cli.demo import write_demo_database

    path = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    write_demo_database(path, NOW)
    return path


@pytest.fixture
def demo_db(tmp_path: Path, demo_db_original: Path) -> Path:
    """A copy of the demo fleet of the test's own, which it may write to."""
    import shutil

    path = tmp_path / "demo.duckdb"
    shutil.copyfile(demo_db_original, path)
    return path
