"""`lossspike load` into BigQuery: the Storage Write API sink against the emulator, into each shape, idempotent."""

from __future__ import annotations

import math

import pytest
import servers.bigquery as bqserver
from shapes import create_bigquery
from test_load import RUN, series, write_csv

from lossspike.ingest.bigquery import BigQueryTarget
from lossspike.ingest.load import LoadError, load_history

PROJECT = "lossspike-load"


@pytest.fixture(scope="module")
def bq_endpoint():
    with bqserver.bigquery_emulator(PROJECT) as endpoint:
        client = bqserver.make_client(endpoint, PROJECT)
        client.create_dataset("obs")
        client.close()
        yield endpoint


def create(client, table: str, shape: str) -> None:
    from google.cloud import bigquery

    if shape == "contract":
        # The contract's table as Terraform declares it: partitioned on its time column.
        fields = (*bqserver.TELEMETRY_SCHEMA_FIELDS, ("process_index", "INT64"), ("step", "INT64"))
        definition = bigquery.Table(table, schema=[bigquery.SchemaField(n, t) for n, t in fields])
        definition.time_partitioning = bigquery.TimePartitioning(field="timestamp")
        client.create_table(definition)
    else:
        create_bigquery(client, table, shape)


def rows_of(client, table: str) -> list[dict]:
    return [dict(row.items()) for row in client.query(f"SELECT * FROM `{table}`").result()]


@pytest.mark.parametrize("shape", ["contract", "levanter.metrics", "telemetry_v1"])
def test_a_load_appends_through_the_storage_write_api_in_the_tables_shape_once(tmp_path, bq_endpoint, shape):
    client = bqserver.make_client(bq_endpoint, PROJECT)
    table = f"{PROJECT}.obs.telemetry_{shape.replace('.', '_')}"
    create(client, table, shape)
    rows = series()
    source = write_csv(tmp_path / "history.csv", rows)

    def load():
        target = BigQueryTarget(table, client, bqserver.make_write_client(bq_endpoint))
        return load_history([str(source)], RUN, target, metric_map={"loss": "train_loss"}, cluster="us-c1")

    report = load()
    # The rows, and the FINISHED phase row at the run's end (read as finished: a CSV cannot say).
    assert report.rows_written == len(rows) + 1
    assert "bytes billed" in report.cost
    written = rows_of(client, table)
    assert len(written) == len(rows) + 1
    assert {(r["run_id"], r["cluster"], r["name"]) for r in written} == {
        (RUN, "us-c1", "train_loss"),
        (RUN, "us-c1", "phase"),
    }
    assert {r["execution_uid"] for r in written} == {"history-attempt-1", "history-attempt-2"}
    # NaN lands as a value (BigQuery's FLOAT64 keeps it:
    # https://cloud.google.com/bigquery/docs/reference/standard-sql/data-types#floating_point_types).
    assert sum(1 for r in written if math.isnan(r["value"])) == sum(1 for r in rows if math.isnan(r["loss"]))
    if shape != "contract":
        # The kind and process the shape's reader keeps (levanter-telemetry-facts.md 1a, 1b, 5.6).
        kind = "scalar" if shape == "levanter.metrics" else "gauge"
        assert {(r["kind"], r["process_index"]) for r in written} == {(kind, 0 if kind == "scalar" else "0")}
        times = sorted(r["timestamp_ms"] for r in written)
        assert times[0] == int(rows[0]["time"].timestamp() * 1000)
    again = load()
    assert again.rows_written == 0 and again.rows_present == len(rows) + 1
    assert len(rows_of(client, table)) == len(rows) + 1
    client.close()


def test_a_missing_table_is_one_line_and_nothing_written(tmp_path, bq_endpoint):
    client = bqserver.make_client(bq_endpoint, PROJECT)
    source = write_csv(tmp_path / "history.csv", series())
    target = BigQueryTarget(f"{PROJECT}.obs.absent", client, bqserver.make_write_client(bq_endpoint))
    with pytest.raises(LoadError, match="does not exist"):
        load_history([str(source)], RUN, target, metric_map={"loss": "train_loss"})
    client.close()


def test_a_load_cut_off_part_way_says_what_landed_and_the_same_load_writes_the_rest(tmp_path, bq_endpoint, monkeypatch):
    import pyarrow as pa
    import pyarrow.csv as pcsv

    import lossspike.ingest.bigquery as load_bigquery

    # Small appends, so the connection can drop between two of them.
    monkeypatch.setattr(load_bigquery, "APPEND_ROWS", 500)
    client = bqserver.make_client(bq_endpoint, PROJECT)
    table = f"{PROJECT}.obs.telemetry_cut"
    create(client, table, "contract")
    rows = series()
    source = tmp_path / "history.csv"
    pcsv.write_csv(
        pa.table(
            {
                "timestamp": [r["time"] for r in rows],
                "loss": [r["loss"] for r in rows],
                "grad_norm": [1.0 + r["step"] for r in rows],
                "attempt": [r["attempt"] for r in rows],
            }
        ),
        source,
    )

    class Dropping(BigQueryTarget):
        """The write client's connection closes after the second append: a real gRPC failure."""

        appends = 0

        def _append(self, table, written):
            if Dropping.appends == 2:
                self._sink._client.transport.close()
            Dropping.appends += 1
            return super()._append(table, written)

    mapping = {"loss": "train_loss", "grad_norm": "grad_norm_total"}
    cut = Dropping(table, client, bqserver.make_write_client(bq_endpoint))
    with pytest.raises(LoadError, match="after 1,000 rows landed") as failure:
        load_history([str(source)], RUN, cut, metric_map=mapping)
    assert "run the same load again" in str(failure.value)
    assert len(rows_of(client, table)) == 1000
    report = load_history(
        [str(source)], RUN, BigQueryTarget(table, client, bqserver.make_write_client(bq_endpoint)), metric_map=mapping
    )
    # The rest, and the FINISHED phase row at the run's end.
    assert report.rows_written == 2 * len(rows) - 1000 + 1
    written = rows_of(client, table)
    keys = {(r["execution_uid"], r["name"], r["timestamp"]) for r in written}
    assert len(written) == len(keys) == 2 * len(rows) + 1
    client.close()
