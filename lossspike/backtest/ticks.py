"""A backtest's ticks: the whole minutes it judges, as Cloud Scheduler fires them, their minute
indexes (the grids' slots count the same minutes), and the overrides in force at each tick.

Apart from the engine (lossspike.backtest.run) because the check replay (lossspike.backtest.check_replay)
reads the same ticks and overrides, the attempt choice (lossspike.backtest.attempts) the same
minutes, and the command line asks for the ticks alone (`tick_times`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from lossspike.base.times import format_rfc3339
from lossspike.config.overrides import LOSS_SCOPE, OverrideRow, matches, resolve
from lossspike.rules.rule import RunPolicy, Thresholds

# A month of minutes is a few million (run, tick) verdicts; beyond that, split the range.
MAX_RANGE = timedelta(days=31)


def tick_times(start: datetime, end: datetime, every_minutes: int = 1) -> list[datetime]:
    """The ticks from `start` to `end`, both included: whole minutes, `every_minutes` apart.

    The first tick is `start` rounded up to a whole minute, as a scheduler firing
    every minute would. Raise ValueError naming the problem.
    """
    if isinstance(every_minutes, bool) or not isinstance(every_minutes, int) or every_minutes < 1:
        raise ValueError(f"every must be a positive whole number of minutes, got {every_minutes!r}")
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if end < start:
        raise ValueError(f"end ({format_rfc3339(end)}) is before start ({format_rfc3339(start)})")
    if end - start > MAX_RANGE:
        raise ValueError(f"the range is longer than {MAX_RANGE.days} days; split it into shorter backtests")
    first = start.replace(second=0, microsecond=0)
    if first < start:
        first += timedelta(minutes=1)
    if first > end:
        raise ValueError(f"no whole minute between {format_rfc3339(start)} and {format_rfc3339(end)}")
    count = int((end - first) // timedelta(minutes=every_minutes)) + 1
    return [first + timedelta(minutes=every_minutes * i) for i in range(count)]


def minute_index(moment: datetime) -> int:
    return int((moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(minutes=1))


def policies_in_force(
    rows: list[OverrideRow], key: tuple[str, str], ticks: list[datetime], base: Thresholds, scope: str = LOSS_SCOPE
) -> Callable[[int], RunPolicy]:
    """The overrides in force for one row of a run (`scope`: its loss row or a check's) at each
    tick; resolved again only when a row starts or ends."""
    mine = [r for r in rows if matches(r, *key) and r.reason in (None, scope)]
    if not mine:
        plain = RunPolicy(base)
        return lambda tick: plain
    changes = sorted({r.created_at for r in mine} | {r.silenced_until for r in mine if r.silenced_until is not None})
    cache: dict[int, RunPolicy] = {}

    def at(tick: int) -> RunPolicy:
        epoch = bisect.bisect_right(changes, ticks[tick])
        if epoch not in cache:
            cache[epoch] = resolve(mine, key[0], key[1], ticks[tick], base, scope)
        return cache[epoch]

    return at
