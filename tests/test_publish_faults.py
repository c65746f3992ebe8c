"""The publisher's faults that survived tests (issue 46 part 1): a refusal naming some rows, a fault in
the flusher's own code, and two publishers at exit sharing one bound."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from lossspike.publish import Publisher, Row, RowsRefused
from lossspike.publish.publisher import EXIT_FLUSH_SECONDS, EXIT_WRITE_GRACE_SECONDS

# Rows the publisher writes besides the metrics in these tests: INITIALIZING, TRAINING and FINISHED.
PHASE_ROWS = 3


class ListSink:
    def __init__(self) -> None:
        self.rows: list[Row] = []

    def write(self, rows: Sequence[Row]) -> None:
        self.rows.extend(rows)

    def close(self) -> None:
        pass


class RefusingSink(ListSink):
    """Refuses, by index in the batch it is handed, the rows whose value is in `bad`; writes the others.

    Each refusal also names one of its rows twice and two indexes outside the batch, as a sink's
    error list may: neither names any other row.
    """

    def __init__(self, bad: set[float]) -> None:
        super().__init__()
        self.bad = bad

    def write(self, rows: Sequence[Row]) -> None:
        refused = [index for index, row in enumerate(rows) if row.name == "train_loss" and row.value in self.bad]
        if refused:
            raise RowsRefused([*refused, refused[0], len(rows), -1], f"{len(refused)} rows break a constraint")
        super().write(rows)


@pytest.mark.parametrize("start_thread", [True, False], ids=["flusher", "inline"])
def test_a_refusal_naming_some_rows_costs_exactly_those_rows(start_thread: bool) -> None:
    """Rows a RowsRefused names are counted refused, each once; every other row of their batch is written once."""
    bad = {3.0, 4.0, 17.0, 49.0}  # two close together (one batch of 10, or one alone), the last row
    sink = RefusingSink(bad)
    publisher = Publisher(sink, "hero-refuse", batch_rows=10, flush_interval_s=0.01, start_thread=start_thread)
    for step in range(50):
        publisher.log({"train/loss": float(step)}, step=step)
    assert publisher.finish(timeout_s=30) is False  # refused rows entered the queue and did not go out
    counts = publisher.counts
    assert counts.dropped_refused == len(bad), counts
    assert counts.written == 50 - len(bad) + PHASE_ROWS, counts
    assert counts.unsent() == len(bad), counts
    written = sorted(row.value for row in sink.rows if row.name == "train_loss")
    assert written == [float(step) for step in range(50) if step not in bad]


class Boom(BaseException):
    """Not an Exception, nor KeyboardInterrupt or SystemExit: a class nobody catches by name."""


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt, SystemExit, Boom])
@pytest.mark.parametrize("step", ["_rows", "_write", "_report"])
def test_a_fault_in_the_flusher_itself_does_not_stop_it(
    monkeypatch: pytest.MonkeyPatch, step: str, error: type[BaseException]
) -> None:
    """A fault raised by the flusher's own batching, writing or reporting code (not the sink's), of any
    class: later rows are still written, and every row is written or counted once."""
    original = getattr(Publisher, step)
    raised = threading.Event()

    def faulty(self: Publisher, *args: object, **kwargs: object) -> object:
        # Only in the flusher's thread, once: log() calls _report too, and the loop must not see the fault.
        if threading.current_thread().name == "lossspike-publisher" and not raised.is_set():
            raised.set()
            raise error(f"planted in {step}")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Publisher, step, faulty)
    sink = ListSink()
    publisher = Publisher(sink, "hero-fault", flush_interval_s=0.01)
    publisher.log({"train/loss": 1.0}, step=1)
    assert raised.wait(10), "the planted fault never ran"
    for later in range(2, 6):
        publisher.log({"train/loss": float(later)}, step=later)
    publisher.finish(timeout_s=30)
    assert publisher._thread is not None and not publisher._thread.is_alive()
    steps = [row.step for row in sink.rows if row.name == "train_loss"]
    assert [s for s in steps if s >= 2] == [2, 3, 4, 5], (steps, publisher.counts)
    counts = publisher.counts
    assert counts.written + counts.unsent() == 5 + PHASE_ROWS, counts
    assert counts.written == len(sink.rows), counts
    assert counts.dropped_at_finish == 0, counts  # the flusher went on: nothing was left at the deadline


TWO_HUNG_PUBLISHERS = """
import threading, time
from lossspike.publish import Publisher

class Hung:
    def __init__(self):
        self.entered = threading.Event()

    def write(self, rows):
        self.entered.set()
        threading.Event().wait()  # never returns: a call with no deadline

    def close(self):
        pass

sinks = [Hung(), Hung()]
publishers = [Publisher(sink, f"hero-{index}") for index, sink in enumerate(sinks)]
for publisher in publishers:
    publisher.log({"train/loss": 2.0}, step=1)
for sink in sinks:
    assert sink.entered.wait(30)
print(time.monotonic(), flush=True)  # the script's last line: the exit's bound starts here
"""


def test_two_publishers_with_hung_sinks_exit_within_one_bound(tmp_path: Path) -> None:
    """The exit flush gives every unfinished publisher EXIT_FLUSH_SECONDS in all, plus one grace for the
    writes in flight: two hung publishers exit within 5 s + 2 s, not twice that, each one's rows counted."""
    script = tmp_path / "two.py"
    script.write_text(TWO_HUNG_PUBLISHERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    ended = time.monotonic()
    assert done.returncode == 0, done.stderr[-2000:]
    exit_s = ended - float(done.stdout.strip().splitlines()[-1])
    bound = EXIT_FLUSH_SECONDS + EXIT_WRITE_GRACE_SECONDS
    # The slack is the interpreter's own teardown on a loaded machine; one more publisher's bound is 7 s.
    assert exit_s < bound + 3.0, f"exit took {exit_s:.1f} s, the bound is {bound} s"
    for run in ("hero-0", "hero-1"):
        said = re.search(rf"\(run {run}\): rows dropped: (\d+) unflushed at exit", done.stderr)
        assert said and int(said.group(1)) >= 1, done.stderr[-2000:]


MANY_HUNG_CLOSES = """
import threading, time
from lossspike.publish import Publisher

class HungClose:
    def __init__(self):
        self.written = threading.Event()

    def write(self, rows):
        self.written.set()

    def close(self):
        threading.Event().wait()  # never returns

sinks = [HungClose() for _ in range(PUBLISHERS)]
publishers = [Publisher(sink, f"hero-{index}") for index, sink in enumerate(sinks)]
for publisher in publishers:
    publisher.log({"train/loss": 2.0}, step=1)
for sink in sinks:
    assert sink.written.wait(30)
print(time.monotonic(), flush=True)  # the script's last line: the exit's bound starts here
"""
# Enough publishers that a wait of CLOSE_SECONDS each for its close(), on top of the shared bound,
# would pass the bound by more than the teardown's slack (12 x 0.5 s).
MANY_PUBLISHERS = 12


def test_many_publishers_whose_close_hangs_exit_within_one_bound(tmp_path: Path) -> None:
    """At exit the unfinished publishers' flushes and sink closes all fit in the one shared 5 s + 2 s bound:
    twelve publishers whose close() never returns do not each add a wait of their own past it."""
    script = tmp_path / "many.py"
    script.write_text(MANY_HUNG_CLOSES.replace("PUBLISHERS", str(MANY_PUBLISHERS)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    ended = time.monotonic()
    assert done.returncode == 0, done.stderr[-2000:]
    exit_s = ended - float(done.stdout.strip().splitlines()[-1])
    bound = EXIT_FLUSH_SECONDS + EXIT_WRITE_GRACE_SECONDS
    assert exit_s < bound + 3.0, f"exit took {exit_s:.1f} s, the bound is {bound} s"
