"""Publish training metrics into the telemetry table, from any training loop.

    publisher = Publisher(DuckDBSink("telemetry.duckdb"), run_id="hero-7b")
    for step in ...:
        publisher.log({"train/loss": loss, "grad/norm/total": norm}, step=step)
    publisher.finish()

Rows are the telemetry contract's (SPEC "Data contracts") plus `process_index`
and `step`, one per scalar per logged step, from process 0 only, named as
Levanter names them, with a `phase` row at start, on the first step with a loss,
every 60 s and at `finish()` (levanter-telemetry-facts.md sections 2-4).

The training loop never waits on the sink: `log()` only appends to a bounded
in-memory queue that a background thread drains in batches. When the sink is
down or slow the queue fills, the oldest rows go, and the count goes to the
`lossspike.publish` logger at most once a minute. Nothing the publisher or the
sink does raises into the loop. Each value is checked as log() takes it, so one
bad value costs only itself; a script that ends without finish() is flushed, within
a bound, at interpreter exit (docs/publishing.md has what each fault costs).

One module, over 600 lines, because it is what a training loop imports: the
Publisher and the sinks it writes through (DuckDB, BigQuery's Storage Write API
and its insertAll fallback) come from one place, as the example above reads,
and every sink writes the one Row shape defined here.
"""

from __future__ import annotations

import atexit
import collections
import logging
import math
import numbers
import operator
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any, Protocol

from lossspike.base.schema import TELEMETRY_COLUMNS

logger = logging.getLogger(__name__)

# Levanter's own service name, so rows read as Levanter's with today's `service` setting.
SERVICE = "levanter"
# Levanter republishes the phase this often (`_PHASE_HEARTBEAT_SECONDS` in its telemetry.py).
HEARTBEAT_SECONDS = 60.0
# Rows held while the sink is behind: 21 metrics at 1 Hz for about 40 minutes, a few MB.
MAX_QUEUE_ROWS = 50_000
# Rows per sink call: one BigQuery append of 500 rows is ~60 KB, far under every request cap.
BATCH_ROWS = 500
# The flusher wakes this often when nothing arrives, so rows reach the table within seconds.
FLUSH_INTERVAL_SECONDS = 1.0
# Drops and sink errors are logged at most this often, so a dead sink never floods the job's log.
LOG_EVERY_SECONDS = 60.0
# Metrics taken from one log() call; Levanter logs a few dozen a step, 10,000 is a bug upstream.
MAX_METRICS_PER_LOG = 1_000
# A metric name longer than this is not a metric (BigQuery's STRING would take it, nobody reads it).
MAX_NAME_CHARS = 256
# A failed batch is tried this often before it is dropped: rides out a blip, not an outage.
SINK_ATTEMPTS = 3
# The longest wait between retries of a failed batch; the queue keeps the newest rows meanwhile.
MAX_BACKOFF_SECONDS = 30.0
# finish() waits this long by default: a job's exit should not hang on a dead table.
FINISH_TIMEOUT_SECONDS = 30.0
# The key whose presence marks a training step (Levanter sets TRAINING on `train/loss`).
LOSS_KEY = "train/loss"
# The step column is BIGINT / INT64: a step outside this range is dropped (the row is written with NULL).
STEP_MIN, STEP_MAX = -(2**63), 2**63 - 1
# finish() gives close() what is left of its deadline, but at least this, so a slow flush still closes.
CLOSE_SECONDS = 0.5
# At interpreter exit without finish(), unfinished publishers get this long in all: a dead sink cannot hold it.
EXIT_FLUSH_SECONDS = 5.0
# ...and then this long for the write in flight to return: a thread still inside DuckDB at teardown aborts.
EXIT_WRITE_GRACE_SECONDS = 2.0

# Environment variables that carry a run's identity when no argument does.
ENV_RUN_ID = "LOSSSPIKE_RUN_ID"
ENV_JOB_ID = "LOSSSPIKE_JOB_ID"
ENV_EXECUTION_UID = "LOSSSPIKE_EXECUTION_UID"
ENV_CLUSTER = "LOSSSPIKE_CLUSTER"
ENV_PROCESS_INDEX = "LOSSSPIKE_PROCESS_INDEX"
ENV_NAMES = (ENV_RUN_ID, ENV_JOB_ID, ENV_EXECUTION_UID, ENV_CLUSTER, ENV_PROCESS_INDEX)

_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")

# The columns a sink receives, in order: the contract's eight, then process_index and step.
ROW_COLUMNS = (
    "timestamp",
    "service",
    "name",
    "value",
    "cluster",
    "run_id",
    "job_id",
    "execution_uid",
    "process_index",
    "step",
)


class TrainingPhase(IntEnum):
    """Levanter's `phase` values (TrainingPhase in its tracker/telemetry.py)."""

    INITIALIZING = 0
    TRAINING = 1
    FINISHED = 2


@dataclass(frozen=True)
class Row:
    """One telemetry row: the contract's eight columns plus process_index and step."""

    timestamp: datetime
    service: str
    name: str
    value: float
    cluster: str | None
    run_id: str
    job_id: str | None
    execution_uid: str | None
    process_index: int
    step: int | None


class RowsRefused(Exception):  # noqa: N818 - a refusal, not a failure of the sink
    """A sink's answer that some rows of a batch can never be written (bad data, not a bad connection).

    `rows` are their indexes in the batch, empty when the sink cannot tell which:
    the publisher then splits the batch until it can. The other rows are written again at once.
    """

    def __init__(self, rows: Iterable[int], reason: str) -> None:
        super().__init__(reason)
        self.rows = tuple(rows)


class Sink(Protocol):
    """Where rows go. `write` may raise or be slow: the publisher counts, never propagates.

    Raise RowsRefused for rows no retry can write; anything else is retried.
    """

    def write(self, rows: Sequence[Row]) -> None: ...

    def close(self) -> None: ...


def metric_name(key: str) -> str:
    """The table name of a metric key: lower case, every other character than an ASCII letter,
    digit or underscore `_` (SPEC "Publishing telemetry").

    Levanter's `_metric_name` (marin-community/marin lib/levanter/src/levanter/tracker/telemetry.py)
    makes the same substitution; every key Levanter logs is lower case already, so its names come
    out identical (`train/loss` -> `train_loss`), and a plain loop's `Train/Loss` still lands on
    the name the alert reads by default.
    """
    return _NOT_NAME.sub("_", key).lower()


# The loss by its table name: TRAINING follows `train/loss`, `train_loss` or `Train/Loss` alike.
LOSS_NAME = metric_name(LOSS_KEY)
# _step's answer for a step no BIGINT holds (None is a valid step: log_summary's).
_BAD_STEP: Any = object()


def scalar(value: Any) -> float | None:
    """The float of a real scalar (Python or NumPy/JAX 0-d), NaN and inf kept; None for anything else.

    Booleans, strings, bytes, arrays of more than one element and complex numbers
    are not metrics: Levanter's `_as_scalar` refuses the same.
    """
    if isinstance(value, bool | str | bytes):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    shape = getattr(value, "shape", None)
    if shape is not None and tuple(shape) == () and hasattr(value, "item"):
        try:
            item = value.item()
        except (TypeError, ValueError, RuntimeError):
            return None
        if isinstance(item, bool) or not isinstance(item, numbers.Real):
            return None
        return float(item)
    return None


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _identity(value: Any, source: str) -> str | None:
    """`value` if it is a string every sink can store (valid UTF-8), else a one-line error naming `source`.

    A byte that is not UTF-8 in an environment variable reaches Python as a lone
    surrogate (os.environ decodes with surrogateescape); no sink can encode it, so
    every batch would fail for the rest of the run.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{source} must be a string, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{source}={ascii(value)} is not valid UTF-8") from None
    return value


def _value(raw: Any) -> float | str:
    """The float of `raw`, or the name of the Counts field its loss goes to."""
    try:
        value = scalar(raw)
    except OverflowError:
        return "dropped_out_of_range"
    except Exception:  # noqa: BLE001 - a value that raises converting is that value's loss, not its call's
        return "dropped_not_numeric"
    return "dropped_not_numeric" if value is None else value


def _step(step: Any) -> int | None:
    """`step` as an int a BIGINT / INT64 column holds; _BAD_STEP for anything else."""
    if step is None:
        return None
    if isinstance(step, bool | str | bytes):
        return _BAD_STEP
    if isinstance(step, float):
        if not step.is_integer():
            return _BAD_STEP
        step = int(step)
    try:
        step = operator.index(step)  # ints, NumPy integers and 0-d integer arrays
    except Exception:  # noqa: BLE001 - anything else is not a step
        return _BAD_STEP
    return int(step) if STEP_MIN <= step <= STEP_MAX else _BAD_STEP


def _size(metrics: Any) -> int:
    """How many metrics a failed call held: its length, else 1 (the call itself)."""
    try:
        return max(1, len(metrics))
    except Exception:  # noqa: BLE001 - a mapping whose len() fails still lost one call
        return 1


@dataclass
class Counts:
    """What the publisher did not write, by cause; a snapshot for logs and tests.

    Every row is counted once: `written`, or one `dropped_*` field. `steps_dropped`
    counts rows written with a NULL step because their step fit no BIGINT.
    """

    written: int = 0
    dropped_queue_full: int = 0
    dropped_sink_error: int = 0
    dropped_refused: int = 0
    dropped_not_numeric: int = 0
    dropped_out_of_range: int = 0
    dropped_too_many: int = 0
    dropped_long_name: int = 0
    dropped_log_failed: int = 0
    dropped_at_finish: int = 0
    dropped_at_exit: int = 0
    steps_dropped: int = 0
    sink_errors: int = 0

    def dropped(self) -> int:
        return self.unsent() + (
            self.dropped_not_numeric
            + self.dropped_out_of_range
            + self.dropped_too_many
            + self.dropped_long_name
            + self.dropped_log_failed
        )

    def unsent(self) -> int:
        """Rows that entered the queue and were not written: finish() is True only when this is 0."""
        return (
            self.dropped_queue_full
            + self.dropped_sink_error
            + self.dropped_refused
            + self.dropped_at_finish
            + self.dropped_at_exit
        )


# Each loss cause as the warning names it.
_CAUSES = {
    "dropped_queue_full": "queue full",
    "dropped_sink_error": "sink errors",
    "dropped_refused": "refused by the sink row by row",
    "dropped_not_numeric": "not numeric",
    "dropped_out_of_range": "beyond float64",
    "dropped_too_many": f"over {MAX_METRICS_PER_LOG} metrics in one log()",
    "dropped_long_name": f"name over {MAX_NAME_CHARS} chars or not a string",
    "dropped_log_failed": "in log() calls that failed",
    "dropped_at_finish": "unflushed at finish()",
    "dropped_at_exit": "unflushed at exit",
}


class Publisher:
    """Telemetry rows from a training loop to a sink, without ever blocking or failing the loop.

    Identity comes from the arguments, else from LOSSSPIKE_RUN_ID, LOSSSPIKE_JOB_ID,
    LOSSSPIKE_EXECUTION_UID, LOSSSPIKE_CLUSTER and LOSSSPIKE_PROCESS_INDEX. Only
    process 0 writes; on any other process every method is a no-op (as Levanter's
    tracker is since marin PR #8678).

    `clock` returns the row timestamps (UTC); `heartbeat_s` and `flush_interval_s`
    exist for tests and the demo. With `start_thread=False` the rows are written
    by finish() in the caller's thread, and a hanging sink holds finish() up.
    """

    def __init__(
        self,
        sink: Sink,
        run_id: str | None = None,
        job_id: str | None = None,
        execution_uid: str | None = None,
        cluster: str | None = None,
        process_index: int | None = None,
        *,
        clock: Callable[[], datetime] | None = None,
        max_queue_rows: int = MAX_QUEUE_ROWS,
        batch_rows: int = BATCH_ROWS,
        heartbeat_s: float | None = HEARTBEAT_SECONDS,
        flush_interval_s: float = FLUSH_INTERVAL_SECONDS,
        start_thread: bool = True,
    ) -> None:
        run = _identity(run_id, "run_id") if run_id else _identity(_env(ENV_RUN_ID), ENV_RUN_ID)
        if not run:
            raise ValueError(f"Publisher needs a run_id: pass run_id= or set {ENV_RUN_ID}")
        if process_index is None:
            raw = _env(ENV_PROCESS_INDEX)
            try:
                process_index = int(raw) if raw is not None else 0
            except ValueError:
                raise ValueError(f"{ENV_PROCESS_INDEX}={raw!r} is not an integer process index") from None
        if max_queue_rows < 1 or batch_rows < 1:
            raise ValueError("max_queue_rows and batch_rows must be at least 1")
        self.run_id = run
        self.job_id = _identity(job_id, "job_id") if job_id else _identity(_env(ENV_JOB_ID), ENV_JOB_ID)
        self.execution_uid = (
            _identity(execution_uid, "execution_uid")
            if execution_uid
            else _identity(_env(ENV_EXECUTION_UID), ENV_EXECUTION_UID)
        )
        self.cluster = (
            _identity(cluster, "cluster") if cluster is not None else _identity(_env(ENV_CLUSTER), ENV_CLUSTER)
        )
        self.process_index = process_index
        self.active = process_index == 0
        self.counts = Counts()
        self._sink = sink
        self._clock = clock or (lambda: datetime.now(UTC))
        self._batch_rows = batch_rows
        self._heartbeat_s = heartbeat_s
        self._flush_interval_s = flush_interval_s
        self._queue: collections.deque[Row] = collections.deque(maxlen=max_queue_rows)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        # Rows the flusher holds (taken from the queue, neither written nor dropped yet).
        self._in_flight = 0
        self._batch: list[Row] = []
        self._stopping = False
        self._finished = False
        # Set when finish() (or the exit) has counted what was left: the flusher's later results count nothing.
        self._settled = False
        self._result = True
        self._phase: TrainingPhase | None = None
        self._step: int | None = None
        self._last_warning = -math.inf
        self._last_error: str | None = None
        self._announced: set[str] = set()
        self._deadline = math.inf
        self._stop = threading.Event()
        self._reported = Counts()
        self._thread: threading.Thread | None = None
        if not self.active:
            return
        self._set_phase(TrainingPhase.INITIALIZING)
        _LIVE.add(self)
        # Registered again now, after the sink's libraries registered theirs, so it runs before them
        # (atexit runs last-in first-out): DuckDB's refuses queries once its own handler has run.
        atexit.unregister(_flush_at_exit)
        atexit.register(_flush_at_exit)
        if start_thread:
            self._thread = threading.Thread(target=self._run, name="lossspike-publisher", daemon=True)
            self._thread.start()

    # -- the training loop's side: never raises, never waits on the sink ----------------

    def log(self, metrics: Mapping[str, Any], step: int | None) -> None:
        """Queue one row per scalar in `metrics` at `step`; on process != 0, nothing."""
        if not self.active or self._finished:
            return
        try:
            self._log(metrics, step)
        except Exception:  # noqa: BLE001 - a publisher bug must cost rows, not the run
            lost = _size(metrics)
            with self._lock:
                self.counts.dropped_log_failed += lost
            logger.exception("lossspike publisher: log() failed; its %d metric(s) are lost and counted", lost)

    def _log(self, metrics: Mapping[str, Any], step: int | None) -> None:
        now = self._clock()
        if not isinstance(now, datetime):
            raise TypeError(f"the clock returned {type(now).__name__}, not a datetime")
        row_step = _step(step)
        bad_step = row_step is _BAD_STEP
        if bad_step:
            row_step = None
        rows: list[Row] = []
        lost: dict[str, int] = {}
        loss = False
        for index, (key, raw) in enumerate(metrics.items()):
            if index >= MAX_METRICS_PER_LOG:
                lost["dropped_too_many"] = len(metrics) - MAX_METRICS_PER_LOG
                break
            if not isinstance(key, str) or len(key) > MAX_NAME_CHARS:
                lost["dropped_long_name"] = lost.get("dropped_long_name", 0) + 1
                continue
            value = _value(raw)
            if type(value) is str:
                lost[value] = lost.get(value, 0) + 1
                continue
            name = metric_name(key)
            loss = loss or name == LOSS_NAME
            rows.append(self._row(now, name, value, row_step))
        with self._lock:
            if row_step is not None:
                self._step = row_step
            for field, count in lost.items():
                setattr(self.counts, field, getattr(self.counts, field) + count)
            if bad_step:
                self.counts.steps_dropped += len(rows)
        self._enqueue(rows)
        if loss and step is not None:
            self._set_phase(TrainingPhase.TRAINING)

    def finish(self, timeout_s: float = FINISH_TIMEOUT_SECONDS) -> bool:
        """Write FINISHED, flush what is queued within `timeout_s`, close the sink; True if all went.

        True only when every row that entered the queue was written (Counts.unsent()
        is 0); a second call gives the first one's answer. Never raises, and returns
        within `timeout_s` (plus CLOSE_SECONDS at most, for close()) whatever the
        sink does. Rows still queued or being written at the deadline are dropped
        and counted once, as `dropped_at_finish`.
        """
        if not self.active:
            return True
        if self._finished:
            return self._result
        try:
            return self._finish(timeout_s)
        except Exception:  # noqa: BLE001 - finish() runs on the way out of a job: never fail it
            logger.exception("lossspike publisher: finish() failed")
            return False

    def _finish(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout_s)
        self._set_phase(TrainingPhase.FINISHED, force=True)
        self._finished = True
        self._stop_flusher(deadline, "dropped_at_finish")
        if self._thread is None or not self._thread.is_alive():
            self._close(deadline)
        self._report(force=True)
        return self._result

    def _exit(self, deadline: float) -> None:
        """At interpreter exit without finish(): flush until `deadline`, no FINISHED row (the run did not finish).

        After a finish() that gave up mid-write, only wait (within the grace) for that write to return.
        """
        if self._finished:
            if self._thread is not None:
                self._thread.join(max(0.0, deadline + EXIT_WRITE_GRACE_SECONDS - time.monotonic()))
            return
        self._finished = True
        self._stop_flusher(deadline, "dropped_at_exit", grace_s=EXIT_WRITE_GRACE_SECONDS)
        if self._thread is None or not self._thread.is_alive():
            self._close(deadline)
        self._report(force=True)

    def _stop_flusher(self, deadline: float, cause: str, grace_s: float = 0.0) -> None:
        """Flush until `deadline`, then count what is left under `cause`; the counts are final after this.

        The flusher starts no write after `deadline`; `grace_s` more lets the one in flight return.
        """
        with self._lock:
            self._deadline = deadline
            self._stopping = True
            self._wake.notify_all()
        self._stop.set()
        if self._thread is None:
            self._drain_inline(deadline)
        else:
            self._thread.join(max(0.0, deadline + grace_s - time.monotonic()))  # one bound for every publisher
        with self._lock:
            left = len(self._queue) + self._in_flight
            setattr(self.counts, cause, getattr(self.counts, cause) + left)
            self._queue.clear()
            self._in_flight = 0
            self._settled = True
            self._result = self.counts.unsent() == 0

    def _close(self, deadline: float) -> None:
        """Close the sink in a thread of its own, waiting for it until `deadline` (CLOSE_SECONDS at least)."""
        done = threading.Event()

        def close() -> None:
            try:
                self._sink.close()
            except BaseException as error:  # noqa: BLE001 - the rows are written; a close error loses none
                logger.warning("lossspike publisher: closing the sink failed: %s", _one_line(error))
            finally:
                done.set()

        threading.Thread(target=close, name="lossspike-publisher-close", daemon=True).start()
        wait = max(deadline - time.monotonic(), CLOSE_SECONDS)
        if not done.wait(wait):
            logger.warning("lossspike publisher: the sink's close() did not return in %.1f s; not waiting", wait)

    def flush(self, timeout_s: float = FINISH_TIMEOUT_SECONDS) -> bool:
        """Wait until every queued row has been handed to the sink; True if that happened in time."""
        if not self.active:
            return True
        deadline = time.monotonic() + timeout_s
        if self._thread is None:
            self._drain_inline(deadline)
        with self._lock:
            self._wake.notify_all()
            while self._queue or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0 or (self._thread is None or not self._thread.is_alive()):
                    break
                self._idle.wait(min(left, 0.1))
            return not self._queue and not self._in_flight

    # -- internals -----------------------------------------------------------------------

    def _row(self, now: datetime, name: str, value: float, step: int | None) -> Row:
        return Row(
            timestamp=now,
            service=SERVICE,
            name=name,
            value=value,
            cluster=self.cluster,
            run_id=self.run_id,
            job_id=self.job_id,
            execution_uid=self.execution_uid,
            process_index=self.process_index,
            step=step,
        )

    def _enqueue(self, rows: Iterable[Row]) -> None:
        with self._lock:
            for row in rows:
                if len(self._queue) == self._queue.maxlen:
                    self.counts.dropped_queue_full += 1
                self._queue.append(row)
            self._wake.notify_all()
        self._report()

    def _set_phase(self, phase: TrainingPhase, force: bool = False) -> None:
        """Write a phase row on a change (a repeat is the heartbeat's job), or always with `force`."""
        with self._lock:
            if self._phase == phase and not force:
                return
            self._phase = phase
            step = self._step
        self._enqueue([self._row(self._clock(), "phase", float(phase), step)])

    def heartbeat(self) -> None:
        """Republish the current phase (the background thread calls this every `heartbeat_s`)."""
        with self._lock:
            phase, step = self._phase, self._step
        if phase is not None and phase is not TrainingPhase.FINISHED and not self._finished:
            self._enqueue([self._row(self._clock(), "phase", float(phase), step)])

    def _run(self) -> None:
        """The flusher thread: whatever a sink (or a bug here) raises, it goes on with the next batch."""
        while True:
            try:
                self._flush_loop()
                return
            except BaseException as error:  # noqa: BLE001 - nothing may end publishing for the rest of the run
                self._announce(error, "the publisher's flusher")
                if self._stopping and time.monotonic() >= self._deadline:
                    return
                self._stop.wait(self._flush_interval_s)

    def _flush_loop(self) -> None:
        next_beat = time.monotonic() + (self._heartbeat_s or math.inf)
        attempts = 0
        backoff = 0.0
        while True:
            if not self._stopping and time.monotonic() >= next_beat:
                self.heartbeat()
                next_beat = time.monotonic() + (self._heartbeat_s or math.inf)
            if self._stopping and time.monotonic() >= self._deadline:
                return
            if not self._batch:
                with self._lock:
                    if self._settled:
                        return
                    self._batch = [self._queue.popleft() for _ in range(min(self._batch_rows, len(self._queue)))]
                    self._in_flight = len(self._batch)
                attempts, backoff = 0, 0.0
            if self._batch:
                attempts += 1
                self._batch = self._write(self._batch, final=attempts >= SINK_ATTEMPTS)
                if self._batch:
                    backoff = min(max(2 * backoff, self._flush_interval_s), MAX_BACKOFF_SECONDS)
                self._report()
            with self._lock:
                if not self._queue and not self._batch:
                    self._idle.notify_all()
                    if self._stopping:
                        return
                    self._wake.wait(max(0.0, min(self._flush_interval_s, next_beat - time.monotonic())))
                    continue
            if self._batch:
                # A failed batch waits before its retry; finish() cuts the wait short.
                if self._stopping:
                    time.sleep(min(backoff, 0.05))
                else:
                    self._stop.wait(max(0.0, min(backoff, next_beat - time.monotonic())))

    def _write(self, batch: list[Row], final: bool) -> list[Row]:
        """Hand `batch` to the sink; the rows still to try (none once written, or dropped when `final`).

        Rows the sink refuses one by one (RowsRefused) are dropped at once and the
        rest written again; a refusal that names no rows is split in halves until
        it does. Any other error, of any exception class, fails the attempt.
        """
        pending = [batch]
        while pending:
            part = pending.pop()
            try:
                self._sink.write(part)
            except RowsRefused as refused:
                self._announce(refused)
                bad = {index for index in refused.rows if 0 <= index < len(part)}
                if not bad and len(part) == 1:
                    bad = {0}
                if bad:
                    self._settle(len(bad), "dropped_refused")
                    rest = [row for index, row in enumerate(part) if index not in bad]
                    if rest:
                        pending.append(rest)
                else:
                    half = len(part) // 2
                    pending += [part[half:], part[:half]]
                continue
            except BaseException as error:  # noqa: BLE001 - any sink failure costs this batch at most
                self._announce(error)
                left = part + [row for rest in reversed(pending) for row in rest]
                if final:
                    self._settle(len(left), "dropped_sink_error")
                    return []
                return left
            self._settle(len(part), "written")
        return []

    def _settle(self, rows: int, field: str) -> None:
        """Count `rows` of the batch in hand under `field`, unless finish() has counted them already."""
        with self._lock:
            if self._settled:
                return
            setattr(self.counts, field, getattr(self.counts, field) + rows)
            self._in_flight = max(0, self._in_flight - rows)

    def _announce(self, error: BaseException, where: str = "the sink") -> None:
        """Count a sink error for the once-a-minute report; one that is not an Exception is also said, once."""
        with self._lock:
            self.counts.sink_errors += 1
            self._last_error = _one_line(error)
            kind = type(error).__name__
            first = not isinstance(error, Exception) and kind not in self._announced
            self._announced.add(kind)
        if first:
            logger.warning(
                "lossspike publisher (run %s): %s raised %s, which is not an Exception; publishing goes on (said once)",
                self.run_id,
                where,
                _one_line(error),
            )

    def _drain_inline(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            with self._lock:
                batch = [self._queue.popleft() for _ in range(min(self._batch_rows, len(self._queue)))]
                self._in_flight = len(batch)
            if not batch:
                return
            self._write(batch, final=True)

    def _report(self, force: bool = False) -> None:
        """Log what was lost since the last report, at most once a minute (or now, with `force`)."""
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last_warning < LOG_EVERY_SECONDS:
                return
            counts, last = self.counts, self._reported
            lost = {why: getattr(counts, field) - getattr(last, field) for field, why in _CAUSES.items()}
            steps = counts.steps_dropped - last.steps_dropped
            errors = counts.sink_errors - last.sink_errors
            if not any(lost.values()) and not errors and not steps:
                return
            self._last_warning = now
            self._reported = Counts(**vars(counts))
            error = self._last_error
        parts = ", ".join(f"{count} {why}" for why, count in lost.items() if count)
        kept = f"; {steps} row(s) written with step NULL (a step no BIGINT holds)" if steps else ""
        tail = f"; {errors} sink error(s), last: {error}" if errors and error else ""
        logger.warning(
            "lossspike publisher (run %s): rows dropped: %s (%d in all)%s%s",
            self.run_id,
            parts or "none",
            counts.dropped(),
            kept,
            tail,
        )


# Publishers flushed (or, finished, waited for) at interpreter exit. Weak, so a dropped publisher is not kept
# alive; a flusher still writing keeps its publisher here through its thread.
_LIVE: weakref.WeakSet[Publisher] = weakref.WeakSet()


def _flush_at_exit() -> None:
    """Flush every unfinished publisher within EXIT_FLUSH_SECONDS in all, and stop every flusher.

    Python stops daemon threads where they stand once atexit handlers have run; a
    flusher stopped inside DuckDB's C++ code aborts the process ("FATAL: exception
    not rethrown"). Stopping the flusher first keeps the exit clean and its code.
    """
    deadline = time.monotonic() + EXIT_FLUSH_SECONDS
    for publisher in list(_LIVE):
        try:
            publisher._exit(deadline)
        except Exception:  # noqa: BLE001 - the training script's own exit stands
            logger.exception("lossspike publisher: flushing at exit failed")


atexit.register(_flush_at_exit)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


# -- sinks -------------------------------------------------------------------------------

# The DuckDB table: the contract's types (SPEC "Data contracts") plus process_index and step.
DUCKDB_COLUMNS = {**TELEMETRY_COLUMNS, "process_index": "BIGINT", "step": "BIGINT"}


class DuckDBSink:
    """Append rows to a DuckDB file's `telemetry` table, creating it in the contract's types if absent.

    Each batch opens the file, appends in one transaction and closes it, so the
    file is never held between batches and a reader (lossspike evaluate) can
    open it in between; a batch that finds the file locked fails and is counted.
    """

    def __init__(self, path: str | os.PathLike[str], table: str = "telemetry") -> None:
        # Imported now, not at the first write, so DuckDB's exit handlers are registered before the
        # Publisher's: the exit flush must run while DuckDB still takes queries.
        import duckdb  # noqa: F401

        from lossspike.sql.dialects import DUCKDB, quote_table

        self.path = os.fspath(path)
        self._table = quote_table(DUCKDB, table)
        self._created = False

    def _create(self, connection: Any) -> None:
        columns = ", ".join(f'"{name}" {kind}' for name, kind in DUCKDB_COLUMNS.items())
        connection.execute(f"CREATE TABLE IF NOT EXISTS {self._table} ({columns})")
        present = {r[0] for r in connection.execute(f"SELECT * FROM {self._table} LIMIT 0").description}
        for name in ("process_index", "step"):
            if name not in present:
                connection.execute(f'ALTER TABLE {self._table} ADD COLUMN "{name}" BIGINT')
        self._created = True

    def write(self, rows: Sequence[Row]) -> None:
        import duckdb

        data = _arrow_rows(rows)
        names = ", ".join(f'"{name}"' for name in ROW_COLUMNS)
        with duckdb.connect(self.path) as connection:
            if not self._created:
                self._create(connection)
            connection.register("lossspike_publish_rows", data)
            try:
                connection.execute(f"INSERT INTO {self._table} ({names}) SELECT {names} FROM lossspike_publish_rows")
            except (duckdb.DataError, duckdb.IntegrityError) as error:
                # A value the table's types or constraints refuse: the whole insert fails, naming no row.
                raise RowsRefused((), f"DuckDB refused the batch: {_one_line(error)}") from error

    def write_arrow(self, data: Any, memory_limit: str | None = None) -> int:
        """Insert an Arrow table or RecordBatchReader whose columns are the table's own, in one
        statement (one transaction: all of it or none); the number of rows inserted.

        A reader is consumed as DuckDB scans it, so a load of any size is held a batch at a time;
        `memory_limit` caps DuckDB's buffers too (it writes a large insert's row groups to the file).
        """
        import duckdb

        names = ", ".join(f'"{name}"' for name in data.schema.names)
        config = {"memory_limit": memory_limit} if memory_limit else {}
        with duckdb.connect(self.path, config=config) as connection:
            # A missing table is made in the sink's columns, and its creation commits with the rows
            # (a failed insert leaves no empty table behind); an existing one is never altered.
            connection.begin()
            columns = ", ".join(f'"{name}" {kind}' for name, kind in DUCKDB_COLUMNS.items())
            connection.execute(f"CREATE TABLE IF NOT EXISTS {self._table} ({columns})")
            connection.register("lossspike_arrow_rows", data)
            inserted = connection.execute(
                f"INSERT INTO {self._table} ({names}) SELECT {names} FROM lossspike_arrow_rows"
            ).fetchone()
            connection.commit()
        return int(inserted[0]) if inserted else 0

    def close(self) -> None:
        pass


def _arrow_rows(rows: Sequence[Row]) -> Any:
    """The rows as an Arrow table in the sink column types (TIMESTAMP as UTC microseconds).

    A row that does not convert is refused by index (RowsRefused): the Publisher's
    rows always convert, so this only costs time for rows built elsewhere.
    """
    import pyarrow as pa

    try:
        return pa.table({name: [getattr(row, name) for row in rows] for name in ROW_COLUMNS}, schema=_arrow_schema())
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
        bad = [index for index, row in enumerate(rows) if not _converts(row)]
        raise RowsRefused(bad, f"{len(bad)} of {len(rows)} rows do not fit the columns: {_one_line(error)}") from error


def _converts(row: Row) -> bool:
    import pyarrow as pa

    try:
        pa.table({name: [getattr(row, name)] for name in ROW_COLUMNS}, schema=_arrow_schema())
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return False
    return True


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("service", pa.string()),
            ("name", pa.string()),
            ("value", pa.float64()),
            ("cluster", pa.string()),
            ("run_id", pa.string()),
            ("job_id", pa.string()),
            ("execution_uid", pa.string()),
            ("process_index", pa.int64()),
            ("step", pa.int64()),
        ]
    )


class BigQueryWriteSink:
    """Append rows through the BigQuery Storage Write API's default stream, as Arrow record batches.

    The cheapest write that keeps rows readable at once (docs/publishing.md has
    the prices): $0.025/GiB with 2 TiB a month free, at-least-once, committed on
    acknowledgement. `table` is `project.dataset.table`; the table must exist with
    process_index and step columns. `client` is a BigQueryWriteClient (the
    tests pass one bound to the emulator's gRPC port). A response with an error
    or row errors raises, so the publisher counts the batch.
    """

    def __init__(self, table: str, client: Any = None, timeout_s: float = 10.0) -> None:
        project, dataset, name = table.split(".")
        self.table = table
        self._stream = f"projects/{project}/datasets/{dataset}/tables/{name}/streams/_default"
        if client is None:
            from google.cloud import bigquery_storage_v1

            client = bigquery_storage_v1.BigQueryWriteClient()
        self._client = client
        self._timeout_s = timeout_s

    def write(self, rows: Sequence[Row]) -> None:
        from google.cloud.bigquery_storage_v1 import types

        data = _arrow_rows(rows)
        batch = data.to_batches()[0] if data.num_rows else None
        if batch is None:
            return
        request = types.AppendRowsRequest(
            write_stream=self._stream,
            arrow_rows=types.AppendRowsRequest.ArrowData(
                writer_schema=types.ArrowSchema(serialized_schema=data.schema.serialize().to_pybytes()),
                rows=types.ArrowRecordBatch(serialized_record_batch=batch.serialize().to_pybytes()),
            ),
        )
        # The stream name routes the call (x-goog-request-params), as the client library's writer sends it.
        metadata = (("x-goog-request-params", f"write_stream={self._stream}"),)
        for response in self._client.append_rows(iter([request]), timeout=self._timeout_s, metadata=metadata):
            if response.row_errors:
                # Row errors mean no row of the request was appended; the caller drops those rows and
                # sends the rest again (AppendRowsResponse.row_errors,
                # https://cloud.google.com/python/docs/reference/bigquerystorage/latest/google.cloud.bigquery_storage_v1.types.AppendRowsResponse).
                detail = response.row_errors[0].message
                refused = [error.index for error in response.row_errors]
                raise RowsRefused(
                    refused, f"BigQuery Storage Write refused {len(refused)} of {len(rows)} rows: {detail}"
                )
            if response.error.code:
                raise RuntimeError(f"BigQuery Storage Write refused {len(rows)} rows: {response.error.message}")
            return
        raise RuntimeError("BigQuery Storage Write closed the stream without an answer")

    def write_arrow(self, batch: Any) -> int:
        """Append one Arrow record batch whose schema is the table's own columns (any subset, in
        the table's types); raise as `write` does. The number of rows appended."""
        from google.cloud.bigquery_storage_v1 import types

        if not batch.num_rows:
            return 0
        request = types.AppendRowsRequest(
            write_stream=self._stream,
            arrow_rows=types.AppendRowsRequest.ArrowData(
                writer_schema=types.ArrowSchema(serialized_schema=batch.schema.serialize().to_pybytes()),
                rows=types.ArrowRecordBatch(serialized_record_batch=batch.serialize().to_pybytes()),
            ),
        )
        metadata = (("x-goog-request-params", f"write_stream={self._stream}"),)
        for response in self._client.append_rows(iter([request]), timeout=self._timeout_s, metadata=metadata):
            if response.error.code or response.row_errors:
                detail = response.error.message or response.row_errors[0].message
                raise RuntimeError(f"BigQuery Storage Write refused {batch.num_rows} rows: {detail}")
            return batch.num_rows
        raise RuntimeError("BigQuery Storage Write closed the stream without an answer")

    def close(self) -> None:
        transport = getattr(self._client, "transport", None)
        if transport is not None:
            transport.close()


def _bigquery_json(row: Row) -> dict[str, Any]:
    value: float | str = row.value
    if math.isnan(row.value):
        value = "NaN"  # BigQuery's JSON spelling of non-finite FLOAT64 values
    elif math.isinf(row.value):
        value = "Infinity" if row.value > 0 else "-Infinity"
    return {
        "timestamp": row.timestamp.astimezone(UTC).isoformat(),
        "service": row.service,
        "name": row.name,
        "value": value,
        "cluster": row.cluster,
        "run_id": row.run_id,
        "job_id": row.job_id,
        "execution_uid": row.execution_uid,
        "process_index": row.process_index,
        "step": row.step,
    }


class BigQueryInsertAllSink:
    """Append rows with BigQuery's legacy streaming inserts (tabledata.insertAll).

    `table` is `project.dataset.table`. The table must exist (Terraform makes it)
    with process_index and step columns; a batch whose insert fails, wholly or in
    part, raises so the publisher counts it. See docs/publishing.md for why this
    path and what the Storage Write API would cost instead.
    """

    def __init__(self, table: str, client: Any = None, timeout_s: float = 10.0) -> None:
        from google.cloud import bigquery

        self.table = table
        self._client = client or bigquery.Client()
        self._timeout_s = timeout_s

    def write(self, rows: Sequence[Row]) -> None:
        from google.api_core.retry import Retry

        errors = self._client.insert_rows_json(
            self.table,
            [_bigquery_json(row) for row in rows],
            row_ids=[None] * len(rows),
            retry=Retry(deadline=self._timeout_s),
            timeout=self._timeout_s,
        )
        if errors:
            # insertAll answers per row; rows refused only because another row was bad say `stopped`
            # (https://cloud.google.com/bigquery/docs/reference/rest/v2/tabledata/insertAll).
            bad = [e["index"] for e in errors if any(r.get("reason") != "stopped" for r in e.get("errors", []))]
            first = errors[0].get("errors", [{}])[0].get("message", errors[0])
            raise RowsRefused(bad, f"BigQuery refused {len(errors)} of {len(rows)} rows: {first}")

    def close(self) -> None:
        self._client.close()
