"""The Publisher: a bounded queue a background thread drains into a sink, so the training loop never waits.

What it drops it counts by cause (Counts) and logs at most once a minute; a script that ends without
finish() is flushed, within a bound, at interpreter exit.
"""

from __future__ import annotations

import atexit
import collections
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from lossspike.publish.counts import Counts
from lossspike.publish.row import (
    BAD_STEP,
    LOSS_NAME,
    SERVICE,
    Row,
    RowsRefused,
    Sink,
    TrainingPhase,
    checked_step,
    checked_value,
    metric_name,
    one_line,
)

logger = logging.getLogger("lossspike.publish")  # one logger for the package, as before the split

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
# finish() gives close() what is left of its deadline, but at least this, so a slow flush still closes.
CLOSE_SECONDS = 0.5
# At interpreter exit without finish(), unfinished publishers get this long in all: a dead sink cannot hold it.
EXIT_FLUSH_SECONDS = 5.0
# ...and then this long for the write in flight to return: a thread still inside DuckDB at teardown aborts.
EXIT_WRITE_GRACE_SECONDS = 2.0

# Metric keys whose table name a publisher remembers: a run logs a few dozen, so each name is computed and
# stored once; a loop inventing keys every step stops filling the cache here instead of growing it.
MAX_CACHED_NAMES = 4_096

# Environment variables that carry a run's identity when no argument does.
ENV_RUN_ID = "LOSSSPIKE_RUN_ID"
ENV_JOB_ID = "LOSSSPIKE_JOB_ID"
ENV_EXECUTION_UID = "LOSSSPIKE_EXECUTION_UID"
ENV_CLUSTER = "LOSSSPIKE_CLUSTER"
ENV_PROCESS_INDEX = "LOSSSPIKE_PROCESS_INDEX"
ENV_NAMES = (ENV_RUN_ID, ENV_JOB_ID, ENV_EXECUTION_UID, ENV_CLUSTER, ENV_PROCESS_INDEX)


# A queued row: (timestamp, name, value, step), the rest of a Row being the publisher's identity. Its
# items are all atomic (a datetime, a str, a float, an int or None), so CPython's collector untracks the
# tuple at its first collection: a full queue adds nothing to any collection's work (issue 46's stall),
# and it holds about a third of what a Row does (benchmarks/publish_bench.py prints the bytes).
_Queued = tuple[datetime, str, float, int | None]


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


def _size(metrics: Any) -> int:
    """How many metrics a failed call held: its length, else 1 (the call itself)."""
    try:
        return max(1, len(metrics))
    except Exception:  # noqa: BLE001 - a mapping whose len() fails still lost one call
        return 1


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
    "dropped_flusher_error": "in hand when the publisher's own thread failed",
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
        self._queue: collections.deque[_Queued] = collections.deque(maxlen=max_queue_rows)
        # Each metric key's table name, computed once (and the one str every row of that name shares).
        self._names: dict[str, str] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        # Rows the flusher holds (taken from the queue, neither written nor dropped yet): what a fault in the
        # flusher itself costs, counted as dropped_flusher_error.
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
        row_step = checked_step(step)
        bad_step = row_step is BAD_STEP
        if bad_step:
            row_step = None
        rows: list[_Queued] = []
        lost: dict[str, int] = {}
        loss = False
        names = self._names
        for index, (key, raw) in enumerate(metrics.items()):
            if index >= MAX_METRICS_PER_LOG:
                lost["dropped_too_many"] = len(metrics) - MAX_METRICS_PER_LOG
                break
            if not isinstance(key, str) or len(key) > MAX_NAME_CHARS:
                lost["dropped_long_name"] = lost.get("dropped_long_name", 0) + 1
                continue
            value = checked_value(raw)
            if type(value) is str:
                lost[value] = lost.get(value, 0) + 1
                continue
            name = names.get(key)
            if name is None:
                name = metric_name(key)
                if len(names) < MAX_CACHED_NAMES:
                    names[key] = name
            loss = loss or name == LOSS_NAME
            rows.append((now, name, value, row_step))
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
            # Swapped, not cleared: the rows are freed below, after the lock, so a log() never waits on that.
            dropped, self._queue = self._queue, collections.deque(maxlen=self._queue.maxlen)
            self._in_flight = 0
            self._settled = True
            self._result = self.counts.unsent() == 0
        dropped.clear()

    def _close(self, deadline: float) -> None:
        """Close the sink in a thread of its own, waiting for it until `deadline` (CLOSE_SECONDS at least)."""
        done = threading.Event()

        def close() -> None:
            try:
                self._sink.close()
            except BaseException as error:  # noqa: BLE001 - the rows are written; a close error loses none
                logger.warning("lossspike publisher: closing the sink failed: %s", one_line(error))
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

    def _rows(self, queued: list[_Queued]) -> list[Row]:
        """The sink's Rows of queued tuples: built by the flusher a batch at a time, outside the lock."""
        cluster, run_id, job_id, execution_uid = self.cluster, self.run_id, self.job_id, self.execution_uid
        process_index = self.process_index
        return [
            Row(now, SERVICE, name, value, cluster, run_id, job_id, execution_uid, process_index, step)
            for now, name, value, step in queued
        ]

    def _enqueue(self, rows: list[_Queued]) -> None:
        with self._lock:
            queue = self._queue
            # deque(maxlen) drops from the left as the new rows go in on the right: the oldest go.
            self.counts.dropped_queue_full += max(0, len(queue) + len(rows) - (queue.maxlen or 0))
            queue.extend(rows)
            self._wake.notify_all()
        self._report()

    def _take(self) -> list[Row]:
        """The next batch from the queue, counted as in flight under the lock and made Rows outside it."""
        with self._lock:
            if self._settled:  # finish() or the exit has counted what was left: nothing more goes out
                return []
            queue = self._queue
            taken = [queue.popleft() for _ in range(min(self._batch_rows, len(queue)))]
            self._in_flight = len(taken)
        return self._rows(taken)

    def _set_phase(self, phase: TrainingPhase, force: bool = False) -> None:
        """Write a phase row on a change (a repeat is the heartbeat's job), or always with `force`."""
        with self._lock:
            if self._phase == phase and not force:
                return
            self._phase = phase
            step = self._step
        self._enqueue([(self._clock(), "phase", float(phase), step)])

    def heartbeat(self) -> None:
        """Republish the current phase (the background thread calls this every `heartbeat_s`)."""
        with self._lock:
            phase, step = self._phase, self._step
        if phase is not None and phase is not TrainingPhase.FINISHED and not self._finished:
            self._enqueue([(self._clock(), "phase", float(phase), step)])

    def _run(self) -> None:
        """The flusher thread: whatever a sink (or a bug here) raises, it goes on with the next batch.

        A fault outside the sink call (batching, counting, reporting) costs the rows in hand, counted
        as dropped_flusher_error, never the rows behind them.
        """
        while True:
            try:
                self._flush_loop()
                return
            except BaseException as error:  # noqa: BLE001 - nothing may end publishing for the rest of the run
                try:
                    self._batch = []
                    self._settle(self._in_flight, "dropped_flusher_error")
                    self._announce(error, "the publisher's flusher")
                except BaseException:  # noqa: BLE001, S110 - a fault while counting a fault must not end the thread
                    pass
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
                if self._settled:
                    return
                self._batch = self._take()  # empty once settled, and the loop ends below
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
            self._last_error = one_line(error)
            kind = type(error).__name__
            first = not isinstance(error, Exception) and kind not in self._announced
            self._announced.add(kind)
        if first:
            logger.warning(
                "lossspike publisher (run %s): %s raised %s, which is not an Exception; publishing goes on (said once)",
                self.run_id,
                where,
                one_line(error),
            )

    def _drain_inline(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            batch = self._take()
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
