"""One time budget for a whole tick, which every call of the tick draws from.

Cloud Functions kills a request at its timeout (50 s in terraform/) with no
log line and whatever was half written left behind. A tick therefore carries a
Deadline: each network call takes its timeout and retry deadline from what
remains, and a step that cannot start in time fails with a message naming it,
so the tick reports what it did not write instead of being killed mid-way.

Interface for a store or sink: accept ``deadline: Deadline | None = None``;
call ``deadline.check("what")`` before a step (raises DeadlineExceeded), and
use ``deadline.timeout(cap)`` as a request's timeout and ``deadline.remaining()``
as a retry's deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The function's timeout is 50 s; 40 s leaves 10 s to log, answer and absorb a slow
# response, so the tick always reports its own outcome before it is killed.
TICK_DEADLINE_SECONDS = 40.0
# Below this, a network request cannot complete; fail the step rather than start it.
MIN_REQUEST_SECONDS = 0.5


class DeadlineExceeded(TimeoutError):
    """The tick's time budget ran out before a step could start or finish."""


class Deadline:
    """A point in time, on a monotonic clock, by which the tick must be done."""

    def __init__(self, seconds: float = TICK_DEADLINE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self._end - self._clock())

    def check(self, step: str) -> float:
        """Seconds left for `step`; DeadlineExceeded naming it when too few remain."""
        left = self.remaining()
        if left < MIN_REQUEST_SECONDS:
            raise DeadlineExceeded(f"tick deadline of {self.seconds:g} s exhausted before {step}")
        return left

    def timeout(self, cap: float, step: str = "a request") -> float:
        """A request's timeout: at most `cap`, at most what remains."""
        return min(cap, self.check(step))
