"""The local servers answer the real Google clients, for exactly the calls production makes.

BigQuery: the ``bqemulator`` subprocess (run ``bash tools/bqemulator/setup.sh`` once).
Cloud Monitoring: the in-process gRPC fake in ``tests/servers/monitoring.py``.

Tests named ``*_quirk`` pin an emulator difference from real BigQuery, so that
the day the emulator changes, the workaround in production can be revisited.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import math
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from google.api import metric_pb2
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.cloud import bigquery, monitoring_v3
from servers import bigquery as bqserver
from servers import monitoring as monserver

PROJECT = "lossspike-smoke"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
S = bigquery.ScalarQueryParameter

TELEMETRY_SCHEMA = [bigquery.SchemaField(name, kind) for name, kind in bqserver.TELEMETRY_SCHEMA_FIELDS]
ALERT_SCHEMA = [
    bigquery.SchemaField("evaluated_at", "TIMESTAMP", mode="REQUIRED"),
    bigquery.SchemaField("cluster", "STRING"),
    bigquery.SchemaField("job", "STRING"),
    bigquery.SchemaField("run", "STRING"),
    bigquery.SchemaField("reason", "STRING"),
    bigquery.SchemaField("value", "INT64"),
    bigquery.SchemaField("baseline_mean", "FLOAT64"),
    bigquery.SchemaField("recent_peak", "FLOAT64"),
]
# What production should pass on every call so that a sick backend fails the
# tick in seconds instead of the client's default 600 s of retries.
FAST = {"retry": Retry(deadline=10), "job_retry": None, "timeout": 10}


@pytest.fixture(scope="module")
def bq():
    with bqserver.bigquery_emulator(PROJECT) as endpoint:
        client = bqserver.make_client(endpoint, PROJECT)
        client.create_dataset("obs")
        telemetry = bigquery.Table(f"{PROJECT}.obs.telemetry", schema=TELEMETRY_SCHEMA)
        telemetry.time_partitioning = bigquery.TimePartitioning(
            type_=bigquery.TimePartitioningType.DAY, field="timestamp"
        )
        client.create_table(telemetry)
        alerts = bigquery.Table(f"{PROJECT}.obs.alerts", schema=ALERT_SCHEMA)
        alerts.time_partitioning = bigquery.TimePartitioning(
            type_=bigquery.TimePartitioningType.DAY, field="evaluated_at"
        )
        client.create_table(alerts)
        _load_telemetry(client)
        yield client
        client.close()


def _load_telemetry(client: bigquery.Client) -> None:
    rows = []
    for run, cluster in (("hero-a", "c1"), ("hero-b", ""), ("other-c", "c1")):
        for i in range(30):  # one sample a minute over the last 30 minutes
            value: float | str | None = 2.0 - i / 100
            if run == "hero-b" and i == 1:
                value = "NaN"  # BigQuery's JSON spelling; "Infinity"/"-Infinity" likewise
            if run == "hero-b" and i == 3:
                value = None
            rows.append(
                {
                    "timestamp": (NOW - timedelta(minutes=i, seconds=30)).isoformat(),
                    "service": "levanter",
                    "name": "train_loss",
                    "value": value,
                    "cluster": cluster or None,
                    "run_id": run,
                    "job_id": f"job-{run}-{i}",
                    "execution_uid": "attempt-1",
                }
            )
    assert client.insert_rows_json(f"{PROJECT}.obs.telemetry", rows, **_no_job_retry()) == []


def _no_job_retry():
    return {"retry": FAST["retry"], "timeout": FAST["timeout"]}


def _params() -> list:
    return [
        S("now", "TIMESTAMP", NOW),
        S("service", "STRING", "levanter"),
        S("min_baseline", "INT64", 20),
        S("sigma", "FLOAT64", 6.0),
        bigquery.ArrayQueryParameter("ids", "STRING", ["hero-a", "hero-b"]),
        S("pattern", "STRING", "hero-%"),
    ]


def _config(params: list) -> bigquery.QueryJobConfig:
    return bigquery.QueryJobConfig(query_parameters=params, labels={"app": "lossspike"}, maximum_bytes_billed=10**10)


SCALARS_SQL = f"""
SELECT run_id, COUNT(*) AS n, @min_baseline AS m, @sigma AS s, @now AS t
FROM `{PROJECT}.obs.telemetry`
WHERE service = @service AND timestamp < @now AND run_id IN UNNEST(@ids)
GROUP BY run_id ORDER BY run_id
"""


def test_bigquery_named_and_array_parameters(bq):
    config = _config(_params())
    via_job = [dict(r) for r in bq.query(SCALARS_SQL, job_config=config, **FAST).result(**_no_job_retry())]
    assert [(r["run_id"], r["n"], r["m"], r["s"], r["t"]) for r in via_job] == [
        ("hero-a", 30, 20, 6.0, NOW),
        ("hero-b", 30, 20, 6.0, NOW),
    ]
    via_wait = bq.query_and_wait(
        SCALARS_SQL, job_config=config, retry=FAST["retry"], job_retry=None, api_timeout=10, wait_timeout=10
    )
    assert [dict(r) for r in via_wait] == via_job
    arrow = bq.query(SCALARS_SQL, job_config=config, **FAST).result().to_arrow(create_bqstorage_client=False)
    assert arrow.column("run_id").to_pylist() == ["hero-a", "hero-b"]
    assert str(arrow.schema.field("t").type) == "timestamp[us, tz=UTC]"

    like = bq.query(
        f"SELECT DISTINCT run_id FROM `{PROJECT}.obs.telemetry` WHERE run_id LIKE @pattern ORDER BY 1",
        job_config=_config([S("pattern", "STRING", "hero-%")]),
        **FAST,
    ).result()
    assert [r.run_id for r in like] == ["hero-a", "hero-b"]


WINDOWS_SQL = f"""
WITH samples AS (
  SELECT COALESCE(NULLIF(cluster, ''), 'unknown') AS cluster, run_id, job_id, timestamp, value,
         timestamp >= TIMESTAMP_SUB(@now, INTERVAL 5 MINUTE) AS recent,
         NOT (IS_NAN(value) OR IS_INF(value)) AS finite
  FROM `{PROJECT}.obs.telemetry`
  WHERE service = @service AND name = 'train_loss' AND value IS NOT NULL
    AND timestamp >= TIMESTAMP_SUB(@now, INTERVAL 60 MINUTE) AND timestamp < @now
    AND run_id IN UNNEST(@ids)
)
SELECT cluster, run_id,
  MAX_BY(job_id, timestamp) AS job,
  COUNTIF(NOT recent AND finite) AS baseline_n,
  AVG(IF(NOT recent AND finite, value, NULL)) AS baseline_mean,
  STDDEV_SAMP(IF(NOT recent AND finite, value, NULL)) AS baseline_sd,
  COUNTIF(recent) AS recent_n,
  COUNTIF(recent AND NOT finite) AS recent_not_finite,
  MAX(IF(recent, value, NULL)) AS recent_peak
FROM samples GROUP BY cluster, run_id ORDER BY run_id
"""


def test_bigquery_window_query_functions(bq):
    rows = [dict(r) for r in bq.query(WINDOWS_SQL, job_config=_config(_params()), **FAST).result()]
    a, b = rows
    assert (a["cluster"], a["run_id"], a["job"]) == ("c1", "hero-a", "job-hero-a-0")
    assert (b["cluster"], b["run_id"]) == ("unknown", "hero-b")  # NULL cluster -> 'unknown'
    assert a["baseline_n"] == 25 and a["recent_n"] == 5 and a["recent_not_finite"] == 0
    assert a["baseline_mean"] == pytest.approx(sum(2.0 - i / 100 for i in range(5, 30)) / 25)
    assert a["baseline_sd"] == pytest.approx(0.0736, abs=1e-4)
    assert a["recent_peak"] == pytest.approx(2.0)
    # hero-b: the NULL at minute 3 is not a sample; the NaN at minute 1 is, and is not finite.
    assert b["recent_n"] == 4 and b["recent_not_finite"] == 1
    assert math.isnan(b["recent_peak"])  # MAX over a NaN is NaN, as in BigQuery


def test_bigquery_min_ignores_nan_quirk(bq):
    """BigQuery's MIN returns NaN when any input is NaN; DuckDB (so the emulator) ignores it."""
    row = next(
        iter(bq.query("SELECT MIN(x) AS lo, MAX(x) AS hi FROM UNNEST([1.0, CAST('NaN' AS FLOAT64)]) AS x").result())
    )
    assert row.lo == 1.0 and math.isnan(row.hi)


def _alert(evaluated_at, run, reason, value, mean, peak_text):
    return bigquery.StructQueryParameter(
        None,
        S("evaluated_at", "TIMESTAMP", evaluated_at),
        S("cluster", "STRING", "c1"),
        S("job", "STRING", ""),
        S("run", "STRING", run),
        S("reason", "STRING", reason),
        S("value", "INT64", value),
        S("baseline_mean", "FLOAT64", mean),
        # FLOAT64 fields that may be NaN travel as STRING and are CAST in SQL:
        # see test_bigquery_nan_inside_struct_param_quirk.
        S("recent_peak", "STRING", peak_text),
    )


MERGE_SQL = f"""
MERGE `{PROJECT}.obs.alerts` AS t
USING UNNEST(@rows) AS s
ON t.evaluated_at = s.evaluated_at AND t.cluster = s.cluster AND t.run = s.run
WHEN NOT MATCHED THEN
  INSERT (evaluated_at, cluster, job, run, reason, value, baseline_mean, recent_peak)
  VALUES (s.evaluated_at, s.cluster, s.job, s.run, s.reason, s.value, s.baseline_mean,
          CAST(s.recent_peak AS FLOAT64))
"""


def test_bigquery_merge_from_struct_array_is_idempotent(bq):
    rows = bigquery.ArrayQueryParameter(
        "rows",
        "STRUCT",
        [
            _alert(NOW, "hero-a", "healthy", 0, 1.5, "1.75"),
            _alert(NOW, "hero-b", "not_finite", 1, None, "nan"),
            _alert(NOW, "hero-c", "warming_up", 0, None, None),
        ],
    )
    for expected_inserted in (3, 0):  # a retried tick inserts nothing
        job = bq.query(MERGE_SQL, job_config=_config([rows]), **FAST)
        job.result(**_no_job_retry())
        assert (job.statement_type, job.num_dml_affected_rows) == ("MERGE", expected_inserted)

    back = {r["run"]: dict(r) for r in bq.list_rows(f"{PROJECT}.obs.alerts", **_no_job_retry())}
    assert sorted(back) == ["hero-a", "hero-b", "hero-c"]
    assert back["hero-a"]["recent_peak"] == 1.75 and back["hero-a"]["baseline_mean"] == 1.5
    assert math.isnan(back["hero-b"]["recent_peak"]) and back["hero-b"]["baseline_mean"] is None
    assert back["hero-c"]["recent_peak"] is None
    assert back["hero-a"]["evaluated_at"] == NOW
    table = bq.list_rows(f"{PROJECT}.obs.alerts").to_arrow(create_bqstorage_client=False)
    assert table.num_rows == 3


def test_bigquery_merge_insert_row_quirk(bq):
    """Real BigQuery accepts ``INSERT ROW``; the emulator does not: list the columns."""
    rows = bigquery.ArrayQueryParameter("rows", "STRUCT", [_alert(NOW, "hero-z", "healthy", 0, 1.0, "1")])
    sql = f"""MERGE `{PROJECT}.obs.alerts` t USING UNNEST(@rows) s
              ON t.evaluated_at = s.evaluated_at AND t.run = s.run WHEN NOT MATCHED THEN INSERT ROW"""
    with pytest.raises(gexc.BadRequest, match="ROW"):
        bq.query(sql, job_config=_config([rows]), **FAST).result(**_no_job_retry())


def test_bigquery_nan_inside_struct_param_quirk(bq):
    """A NaN FLOAT64 inside an ARRAY or STRUCT parameter arrives as NULL in the emulator.

    Scalar FLOAT64 parameters keep NaN; a STRING field CAST to FLOAT64 keeps it too
    (BigQuery's CAST accepts 'nan', 'inf', '-inf', case-insensitive).
    """
    nan = float("nan")
    params = [
        S("scalar", "FLOAT64", nan),
        bigquery.ArrayQueryParameter(
            "rows", "STRUCT", [bigquery.StructQueryParameter(None, S("f", "FLOAT64", nan), S("t", "STRING", "nan"))]
        ),
        bigquery.ArrayQueryParameter("xs", "FLOAT64", [nan]),
    ]
    sql = """SELECT IS_NAN(@scalar) AS scalar_nan, s.f AS struct_float, IS_NAN(CAST(s.t AS FLOAT64)) AS cast_nan,
                    (SELECT x FROM UNNEST(@xs) AS x) AS array_float
             FROM UNNEST(@rows) AS s"""
    row = dict(next(iter(bq.query(sql, job_config=_config(params), **FAST).result())))
    assert row == {"scalar_nan": True, "struct_float": None, "cast_nan": True, "array_float": None}


def test_bigquery_insert_id_dedup_quirk(bq):
    """Real insertAll de-duplicates rows by insertId (best effort); the emulator never does."""
    table = f"{PROJECT}.obs.telemetry"
    row = {"timestamp": NOW.isoformat(), "service": "dedup", "name": "x", "value": 1.0, "run_id": "r"}
    for _ in range(2):
        assert bq.insert_rows_json(table, [row], row_ids=["same-id"], **_no_job_retry()) == []
    count = next(iter(bq.query(f"SELECT COUNT(*) AS n FROM `{table}` WHERE service = 'dedup'").result())).n
    assert count == 2


def test_bigquery_bad_sql_fails_fast(bq):
    started = time.monotonic()
    with pytest.raises(gexc.BadRequest, match="Syntax error"):
        bq.query("SELEC 1", job_config=_config([]), **FAST).result(**_no_job_retry())
    assert time.monotonic() - started < 5


def test_bigquery_query_and_wait_swallows_errors_quirk(bq):
    """The emulator answers a failing jobs.query with HTTP 200 + ``errors``; real BigQuery with 400.

    So ``query_and_wait`` returns no rows instead of raising. Run production's
    queries through ``client.query(...).result()`` (jobs.insert), which raises.
    """
    rows = bq.query_and_wait("SELEC 1", retry=FAST["retry"], job_retry=None, wait_timeout=10)
    assert list(rows) == []


class _Always500(http.server.BaseHTTPRequestHandler):
    def _reply(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps(
            {"error": {"code": 500, "message": "boom", "errors": [{"reason": "internalError", "message": "boom"}]}}
        ).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _reply

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass


def test_bigquery_client_fails_fast_on_server_errors():
    """With job_retry=None and a bounded retry, a persistent 5xx surfaces in seconds.

    Any non-None ``job_retry`` wraps jobs.insert in the client's private
    600-second retry whatever deadline it carries; so does the default.
    """
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Always500)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = bqserver.make_client(f"http://127.0.0.1:{server.server_address[1]}", PROJECT)
        quick = Retry(deadline=2)
        calls = {
            "query": lambda: client.query("SELECT 1", retry=quick, job_retry=None, timeout=5).result(
                retry=quick, timeout=5
            ),
            "query_and_wait": lambda: client.query_and_wait(
                "SELECT 1", retry=quick, job_retry=None, api_timeout=5, wait_timeout=5
            ),
            "insert_rows_json": lambda: client.insert_rows_json(f"{PROJECT}.obs.t", [{"a": 1}], retry=quick, timeout=5),
        }
        for name, call in calls.items():
            started = time.monotonic()
            with pytest.raises((gexc.RetryError, gexc.InternalServerError)):
                call()
            assert time.monotonic() - started < 6, name
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------- BigQuery scripts (multi-statement jobs)
# Real BigQuery binds a request's named parameters in every statement of a
# multi-statement query (https://cloud.google.com/bigquery/docs/parameterized-queries,
# https://cloud.google.com/bigquery/docs/multi-statement-queries). bqemulator 1.4.0
# does not; tools/bqemulator/lossspike_bqemu_patches.py makes it, and these tests pin it.

TRICKY = 'it\'s "quoted" \\ back\\slash\nnew line, ünïcödé ✓, @s and @@error.message'
STRUCT_FIELDS = (("at", "TIMESTAMP"), ("name", "STRING"), ("n", "INT64"), ("x", "FLOAT64"), ("ok", "BOOL"))


def _struct(values: tuple) -> bigquery.StructQueryParameter:
    fields = (S(name, kind, value) for (name, kind), value in zip(STRUCT_FIELDS, values, strict=True))
    return bigquery.StructQueryParameter(None, *fields)


def test_bigquery_script_binds_every_parameter_type(bq):
    nan, inf = float("nan"), float("inf")
    params = [
        S("ts", "TIMESTAMP", NOW),
        S("s", "STRING", TRICKY),
        S("i", "INT64", -(2**63)),
        S("big", "INT64", 2**63 - 1),
        S("f", "FLOAT64", 0.1),
        S("f_nan", "FLOAT64", nan),
        S("f_inf", "FLOAT64", inf),
        S("f_ninf", "FLOAT64", -inf),
        S("f_null", "FLOAT64", None),
        S("b", "BOOL", True),
        S("b_false", "BOOL", False),
        S("ts_null", "TIMESTAMP", None),
        S("s_null", "STRING", None),
        bigquery.ArrayQueryParameter("names", "STRING", ["a'b", "", TRICKY]),
        bigquery.ArrayQueryParameter("none", "STRING", []),
    ]
    script = """
DECLARE copy STRING DEFAULT @s;
IF @b AND NOT @b_false AND @i < 0 THEN
  SELECT 'if branch' AS never_last;
END IF;
SELECT @ts AS ts, @s AS s, copy = @s AS same, '@s' AS literal, @i AS i, @big AS big,
       @f AS f, IS_NAN(@f_nan) AS f_nan, @f_inf AS f_inf, @f_ninf AS f_ninf, @f_null AS f_null,
       @b AS b, @b_false AS b_false, @ts_null AS ts_null, @s_null AS s_null,
       @names AS names, ARRAY_LENGTH(@none) AS none_len,
       (SELECT COUNT(*) FROM UNNEST(@names) AS n WHERE n = @s) AS found
"""
    job = bq.query(script, job_config=_config(params), **FAST)
    row = dict(next(iter(job.result(**_no_job_retry()))))
    assert job.statement_type == "SCRIPT"
    assert row == {
        "ts": NOW,
        "s": TRICKY,
        "same": True,
        "literal": "@s",  # a string literal is never a parameter
        "i": -(2**63),
        "big": 2**63 - 1,
        "f": 0.1,
        "f_nan": True,
        "f_inf": inf,
        "f_ninf": -inf,
        "f_null": None,
        "b": True,
        "b_false": False,
        "ts_null": None,
        "s_null": None,
        "names": ["a'b", "", TRICKY],
        "none_len": 0,
        "found": 1,
    }


def test_script_parameter_binding_replaces_whole_tokens_only():
    """Only a whole ``@name`` token of a given parameter outside string literals is bound."""
    spec = importlib.util.spec_from_file_location("patches", bqserver.PATCH_SOURCE)
    patches = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(patches)
    params = {
        name: {"name": name, "parameterType": {"type": "STRING"}, "parameterValue": {"value": name.upper()}}
        for name in ("s", "error")
    }
    sql = "SELECT @s, @ss, '@s', `@s`, \"@s x\", @@error.message, @1 FROM t WHERE x = @s"
    bound, values = patches.bind_named_parameters(sql, ["var"], params)
    assert bound == (
        "SELECT CAST(@2 AS STRING), @ss, '@s', `@s`, '@s x', @@error.message, @1 FROM t WHERE x = CAST(@3 AS STRING)"
    )
    assert values == ["var", "S", "S"]
    assert patches.bind_named_parameters("SELECT '@s'", [], params) == ("SELECT '@s'", [])


def test_bigquery_script_writes_struct_array_parameter_exactly(bq):
    table = f"{PROJECT}.obs.script_structs"
    bq.create_table(bigquery.Table(table, schema=[bigquery.SchemaField(f, k) for f, k in STRUCT_FIELDS]))
    nan, inf = float("nan"), float("inf")
    rows = [
        (NOW, TRICKY, 2**63 - 1, nan, True),
        (NOW - timedelta(microseconds=1), "", -1, inf, False),
        (None, None, None, None, None),
        (NOW, "x", 0, -inf, None),
        (NOW, "y", 7, 1e-300, True),
    ]
    script = f"""
BEGIN TRANSACTION;
INSERT INTO `{table}` (at, name, n, x, ok) SELECT r.at, r.name, r.n, r.x, r.ok FROM UNNEST(@rows) AS r;
COMMIT TRANSACTION;
"""
    param = bigquery.ArrayQueryParameter("rows", "STRUCT", [_struct(r) for r in rows])
    bq.query(script, job_config=_config([param]), **FAST).result(**_no_job_retry())
    back = sorted(
        (tuple(r.values()) for r in bq.list_rows(table, **_no_job_retry())),
        key=lambda r: (r[2] is None, r[2] or 0),
    )
    want = sorted(rows, key=lambda r: (r[2] is None, r[2] or 0))
    assert len(back) == len(want)
    for got, expected in zip(back, want, strict=True):
        assert got[:3] == expected[:3] and got[4] == expected[4]
        assert got[3] == expected[3] or (math.isnan(got[3]) and math.isnan(expected[3]))


WRITE_SCRIPT = """
BEGIN TRANSACTION;
IF EXISTS(SELECT 1 FROM `{table}` WHERE evaluated_at = @now) THEN
  DELETE FROM `{table}` WHERE evaluated_at = @now;
END IF;
INSERT INTO `{table}` (evaluated_at, cluster, job, run, reason, value, baseline_mean, recent_peak)
SELECT @now, r.cluster, r.job, r.run, r.reason, r.value, r.baseline_mean, CAST(r.recent_peak AS FLOAT64)
FROM UNNEST(@rows) AS r;
COMMIT TRANSACTION;
"""


def test_bigquery_write_script_run_twice_leaves_one_copy(bq):
    table = f"{PROJECT}.obs.script_alerts"
    bq.create_table(bigquery.Table(table, schema=ALERT_SCHEMA))
    earlier = NOW - timedelta(minutes=1)

    def write(now: datetime, runs: list[str]) -> None:
        rows = bigquery.ArrayQueryParameter("rows", "STRUCT", [_alert(now, r, "healthy", 0, 1.5, "nan") for r in runs])
        params = [S("now", "TIMESTAMP", now), rows]
        job = bq.query(WRITE_SCRIPT.format(table=table), job_config=_config(params), **FAST)
        job.result(**_no_job_retry())

    write(earlier, ["hero-a"])
    write(NOW, ["hero-a", "hero-b"])
    write(NOW, ["hero-a", "hero-b"])  # the retried tick replaces its own rows
    back = sorted((r.evaluated_at, r.run) for r in bq.list_rows(table, **_no_job_retry()))
    assert back == [(earlier, "hero-a"), (NOW, "hero-a"), (NOW, "hero-b")]
    write(NOW, ["hero-c"])  # a later write of the same tick wins whole
    back = sorted((r.evaluated_at, r.run) for r in bq.list_rows(table, **_no_job_retry()))
    assert back == [(earlier, "hero-a"), (NOW, "hero-c")]
    peaks = [r.recent_peak for r in bq.list_rows(table, **_no_job_retry())]
    assert all(math.isnan(p) for p in peaks)


def test_bigquery_script_refreshes_view_then_reads_late_rows(bq):
    source = f"{PROJECT}.obs.mv_source"
    view = f"{PROJECT}.obs.mv_minutes"
    bq.create_table(bigquery.Table(source, schema=TELEMETRY_SCHEMA))
    bq.query(
        f"""CREATE MATERIALIZED VIEW `{view}` AS
        SELECT run_id, TIMESTAMP_TRUNC(timestamp, MINUTE) AS minute, COUNT(*) AS samples, MAX(value) AS peak
        FROM `{source}` GROUP BY run_id, minute""",
        **FAST,
    ).result(**_no_job_retry())
    tick = f"""CALL BQ.REFRESH_MATERIALIZED_VIEW('{view}');
SELECT run_id, minute, samples, peak FROM `{view}` WHERE minute >= @start ORDER BY minute"""
    start = NOW - timedelta(minutes=2)

    def insert(*at_values: tuple[datetime, float]) -> None:
        rows = [{"timestamp": at.isoformat(), "service": "s", "run_id": "hero-a", "value": v} for at, v in at_values]
        assert bq.insert_rows_json(source, rows, **_no_job_retry()) == []

    def read() -> list[tuple]:
        job = bq.query(tick, job_config=_config([S("start", "TIMESTAMP", start)]), **FAST)
        return [tuple(r.values()) for r in job.result(**_no_job_retry())]

    insert((NOW - timedelta(seconds=110), 1.0), (NOW - timedelta(seconds=50), 2.0))
    assert read() == [("hero-a", NOW - timedelta(minutes=2), 1, 1.0), ("hero-a", NOW - timedelta(minutes=1), 1, 2.0)]
    # A late sample for an old minute, and one before @start: the next tick sees the first only.
    insert((NOW - timedelta(seconds=115), 3.0), (NOW - timedelta(minutes=5), 9.0))
    assert read() == [("hero-a", NOW - timedelta(minutes=2), 2, 3.0), ("hero-a", NOW - timedelta(minutes=1), 1, 2.0)]


def test_bigquery_script_statistics_quirk(bq):
    """Pinned emulator facts a real script job reports differently.

    - Real BigQuery fills ``mview_last_refresh_time`` after a refresh
      (REST Table.materializedView.lastRefreshTime); the emulator leaves it None.
    - A real script job reports bytes processed/billed summed over its child jobs and
      has one child job per statement; the emulator reports 0 bytes processed, no
      bytes billed and no child jobs.
    - ``maximum_bytes_billed`` is ignored: real BigQuery fails a query that would bill
      more (and bills at least 10 MB a query), the emulator runs it.
    """
    source = f"{PROJECT}.obs.quirk_source"
    view = f"{PROJECT}.obs.quirk_view"
    bq.create_table(bigquery.Table(source, schema=TELEMETRY_SCHEMA))
    ddl = f"CREATE MATERIALIZED VIEW `{view}` AS SELECT run_id, COUNT(*) AS n FROM `{source}` GROUP BY run_id"
    bq.query(ddl, **FAST).result(**_no_job_retry())
    job = bq.query(
        f"CALL BQ.REFRESH_MATERIALIZED_VIEW('{view}');\nSELECT * FROM `{view}` WHERE n > @min",
        job_config=_config([S("min", "INT64", 0)]),
        **FAST,
    )
    job.result(**_no_job_retry())
    assert bq.get_table(view).mview_last_refresh_time is None
    assert (job.total_bytes_processed, job.total_bytes_billed, job.num_child_jobs) == (0, None, 0)
    assert list(bq.list_jobs(parent_job=job.job_id)) == []
    capped = bigquery.QueryJobConfig(maximum_bytes_billed=1)
    rows = bq.query(f"SELECT COUNT(*) AS n FROM `{PROJECT}.obs.telemetry`", job_config=capped, **FAST).result()
    assert next(iter(rows)).n > 0


# The query `lossspike cost --actual` runs; INFORMATION_SCHEMA.JOBS and its columns:
# https://cloud.google.com/bigquery/docs/information-schema-jobs. That doc says to
# leave out statement_type = 'SCRIPT' when summing cost: a script's row repeats the
# sum of its child jobs' rows.
COST_SQL = """
SELECT DATE(creation_time) AS day, COUNT(*) AS jobs, SUM(total_bytes_billed) AS bytes_billed
FROM `region-us`.INFORMATION_SCHEMA.JOBS
WHERE creation_time >= @since AND statement_type != 'SCRIPT'
  AND EXISTS(SELECT 1 FROM UNNEST(labels) AS l WHERE l.key = 'app' AND l.value = 'lossspike')
GROUP BY day ORDER BY day
"""


def _job(job_id: str, at: datetime, billed: int | None, labels: dict, **columns) -> dict:
    row = {"job_id": job_id, "creation_time": at, "project_id": PROJECT, "job_type": "QUERY"}
    row |= {"statement_type": "SELECT", "total_bytes_billed": billed, "state": "DONE"}
    return row | {"labels": [{"key": k, "value": v} for k, v in labels.items()]} | columns


def test_bigquery_information_schema_jobs_is_seedable(bq):
    app = {"app": "lossspike"}
    yesterday = NOW - timedelta(days=1)
    bqserver.seed_jobs(
        bq,
        [
            _job("old", NOW - timedelta(days=9), 10**9, app),
            _job("y1", yesterday, 10 * 2**20, app | {"env": "prod"}),
            _job("y2", yesterday + timedelta(hours=1), None, app),  # e.g. a cache hit
            _job("script", NOW, 30 * 2**20, app, statement_type="SCRIPT"),
            _job("child1", NOW, 10 * 2**20, app, parent_job_id="script", statement_type="DELETE"),
            _job("child2", NOW, 20 * 2**20, app, parent_job_id="script", statement_type="INSERT"),
            _job("other", NOW, 99, {"app": "other"}),
            _job("unlabelled", NOW, 99, {}),
        ],
    )
    since = NOW - timedelta(days=2)
    job = bq.query(COST_SQL, job_config=_config([S("since", "TIMESTAMP", since)]), **FAST)
    rows = [tuple(r.values()) for r in job.result(**_no_job_retry())]
    assert rows == [(yesterday.date(), 2, 10 * 2**20), (NOW.date(), 2, 30 * 2**20)]
    # The project-qualified and JOBS_BY_PROJECT spellings read the same rows; another region is empty.
    for view in (
        f"`{PROJECT}`.`region-us`.INFORMATION_SCHEMA.JOBS_BY_PROJECT",
        f"`{PROJECT}.region-us.INFORMATION_SCHEMA.JOBS`",
    ):
        n = next(iter(bq.query(f"SELECT COUNT(*) AS n FROM {view}", **FAST).result(**_no_job_retry()))).n
        assert n == 8
    empty = bq.query("SELECT COUNT(*) AS n FROM `region-eu`.INFORMATION_SCHEMA.JOBS", **FAST).result()
    assert next(iter(empty)).n == 0
    with pytest.raises(ValueError, match="not INFORMATION_SCHEMA.JOBS columns: bytes"):
        bqserver.seed_jobs(bq, [{"job_id": "x", "bytes": 1}])


# --------------------------------------------------------------------------- Monitoring


def _series(run: str, reason: str, value: int, end: datetime) -> monitoring_v3.TimeSeries:
    series = monitoring_v3.TimeSeries()
    series.metric.type = "custom.googleapis.com/lossspike/alert"
    series.metric.labels["cluster"] = "c1"
    series.metric.labels["run"] = run
    series.metric.labels["reason"] = reason
    series.resource.type = "global"
    series.resource.labels["project_id"] = PROJECT
    series.metric_kind = metric_pb2.MetricDescriptor.MetricKind.GAUGE
    series.value_type = metric_pb2.MetricDescriptor.ValueType.INT64
    point = monitoring_v3.Point(
        interval=monitoring_v3.TimeInterval(end_time=end), value=monitoring_v3.TypedValue(int64_value=value)
    )
    series.points = [point]
    return series


@pytest.fixture
def monitoring():
    with monserver.monitoring_server() as fake:
        client = monserver.make_client(fake.address)
        yield fake, client
        client.transport.close()


def test_monitoring_create_time_series_is_recorded(monitoring):
    fake, client = monitoring
    client.create_time_series(
        name=f"projects/{PROJECT}",
        time_series=[_series("hero-a", "spiking", 1, NOW), _series("hero-b", "healthy", 0, NOW)],
        timeout=5,
    )
    (request,) = fake.requests
    assert request.name == f"projects/{PROJECT}"
    first = request.time_series[0]
    assert first.metric.type == "custom.googleapis.com/lossspike/alert"
    assert dict(first.metric.labels) == {"cluster": "c1", "run": "hero-a", "reason": "spiking"}
    assert first.metric_kind == metric_pb2.MetricDescriptor.MetricKind.GAUGE
    assert first.points[0].value.int64_value == 1
    assert first.points[0].interval.end_time == NOW
    assert [p.value for p in fake.points] == [1, 0]
    assert fake.metadata[0].get("x-goog-request-params") == f"name=projects/{PROJECT}"


def test_monitoring_unavailable_surfaces_as_service_unavailable(monitoring):
    fake, client = monitoring
    fake.fail_next(1)
    with pytest.raises(gexc.ServiceUnavailable):
        client.create_time_series(name=f"projects/{PROJECT}", time_series=[_series("a", "healthy", 0, NOW)], timeout=5)
    assert fake.points == []
    client.create_time_series(name=f"projects/{PROJECT}", time_series=[_series("a", "healthy", 0, NOW)], timeout=5)
    assert len(fake.requests) == 2 and len(fake.points) == 1


def test_monitoring_points_must_be_written_in_order(monitoring):
    fake, client = monitoring
    name = f"projects/{PROJECT}"
    client.create_time_series(name=name, time_series=[_series("a", "healthy", 0, NOW)], timeout=5)
    # A retried tick writes the same end time again: rejected; the new series in
    # the same request is still written, as in Cloud Monitoring.
    with pytest.raises(gexc.InvalidArgument, match="Points must be written in order") as info:
        client.create_time_series(
            name=name,
            time_series=[_series("a", "healthy", 0, NOW), _series("b", "healthy", 0, NOW)],
            timeout=5,
        )
    assert "timeSeries[0]" in str(info.value) and "timeSeries[1]" not in str(info.value)
    assert [p.series.metric.labels["run"] for p in fake.points] == ["a", "b"]
    client.create_time_series(
        name=name, time_series=[_series("a", "healthy", 0, NOW + timedelta(minutes=1))], timeout=5
    )
    assert len(fake.points) == 3


def test_monitoring_rejects_more_than_200_series_and_duplicates(monitoring):
    fake, client = monitoring
    name = f"projects/{PROJECT}"
    with pytest.raises(gexc.InvalidArgument, match="200"):
        client.create_time_series(
            name=name, time_series=[_series(f"r{i}", "healthy", 0, NOW) for i in range(201)], timeout=5
        )
    with pytest.raises(gexc.InvalidArgument, match="Duplicate TimeSeries"):
        client.create_time_series(name=name, time_series=[_series("r", "healthy", 0, NOW)] * 2, timeout=5)
    client.create_time_series(
        name=name, time_series=[_series(f"r{i}", "healthy", 0, NOW) for i in range(200)], timeout=5
    )
    assert len(fake.points) == 201  # 200 + the first copy of the duplicated series


# Limits the fake enforces as the service documents them: https://cloud.google.com/monitoring/quotas
# ("User-defined metrics": label value length 1,024, 200 series per request, one point
# per series per request, points of a series at least 5 seconds apart and in order).


def test_monitoring_refuses_label_values_over_1024_bytes(monitoring):
    fake, client = monitoring
    name = f"projects/{PROJECT}"
    with pytest.raises(gexc.InvalidArgument, match="exceeds the maximum length of 1024"):
        client.create_time_series(name=name, time_series=[_series("é" * 513, "spiking", 1, NOW)], timeout=5)
    client.create_time_series(name=name, time_series=[_series("é" * 512, "spiking", 1, NOW)], timeout=5)
    assert len(fake.points) == 1


def test_monitoring_points_of_a_series_are_5_seconds_apart(monitoring):
    fake, client = monitoring
    name = f"projects/{PROJECT}"
    client.create_time_series(name=name, time_series=[_series("a", "spiking", 1, NOW)], timeout=5)
    with pytest.raises(gexc.InvalidArgument, match="written in order"):
        client.create_time_series(
            name=name, time_series=[_series("a", "spiking", 1, NOW + timedelta(seconds=4))], timeout=5
        )
    client.create_time_series(
        name=name, time_series=[_series("a", "spiking", 1, NOW + timedelta(seconds=5))], timeout=5
    )
    assert len(fake.points) == 2


def test_monitoring_refusing_200_series_stays_an_invalid_argument(monitoring):
    # The first fake listed every refused series and overflowed gRPC's metadata at ~100.
    fake, client = monitoring
    name = f"projects/{PROJECT}"
    batch = [_series(f"hero-{i:04d}-" + "x" * 200, "spiking", 1, NOW) for i in range(200)]
    client.create_time_series(name=name, time_series=batch, timeout=5)
    with pytest.raises(gexc.InvalidArgument, match="and 197 more") as info:
        client.create_time_series(name=name, time_series=batch, timeout=5)
    assert len(str(info.value)) < 4096


def test_monitoring_list_time_series_at_an_instant(monitoring):
    fake, client = monitoring
    name = f"projects/{PROJECT}"
    client.create_time_series(name=name, time_series=[_series("a", "spiking", 1, NOW)], timeout=5)
    later = NOW + timedelta(minutes=1)
    client.create_time_series(
        name=name, time_series=[_series("a", "spiking", 0, later), _series("b", "spiking", 1, later)], timeout=5
    )

    def at(moment: datetime) -> dict[str, int]:
        found = client.list_time_series(
            name=name,
            filter='metric.type = "custom.googleapis.com/lossspike/alert"',
            interval=monitoring_v3.TimeInterval(start_time=moment, end_time=moment),
            view=monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL,
            timeout=5,
        )
        return {s.metric.labels["run"]: s.points[0].value.int64_value for s in found}

    assert at(NOW) == {"a": 1}
    assert at(later) == {"a": 0, "b": 1}
    assert at(NOW + timedelta(seconds=30)) == {}


def test_bigquery_dml_leaves_last_modified_quirk(bq):
    # BigQuery moves a table's lastModifiedTime when its contents change, not only its metadata
    # ("either metadata or table contents"); the emulator moves it for metadata only, so tests
    # of the tick's override cache change the metadata to stand for a DML write.
    client = bq
    table = f"{PROJECT}.obs.modified_probe"
    client.query(f"CREATE TABLE `{table}` (a INT64)").result()
    before = client.get_table(table).modified
    client.query(f"INSERT INTO `{table}` (a) VALUES (1)").result()
    assert client.get_table(table).modified == before
    time.sleep(0.01)  # lastModifiedTime has millisecond resolution
    changed = client.get_table(table)
    changed.description = "probe"
    client.update_table(changed, ["description"])
    assert client.get_table(table).modified > before
