"""What Levanter's `phase` metric makes of a run's loss verdict (SPEC "Data contracts", Phase).

Levanter publishes `phase` (0 initializing, 1 training, 2 finished) when its tracker starts,
on the first step with a loss, every 60 s while the run lives and FINISHED when the tracker
finishes (levanter-telemetry-facts.md section 3). So the phase says what the loss alone
cannot: that a run ended on purpose (no `stalled` page when it goes quiet), that a job is
still starting (not judged until Marin's start-up allowance runs out), and that a stalled
run's process is alive but not stepping. A run without phase rows reads exactly as before:
every function here returns its input unchanged for it.

Pure functions over one run's state, called by the tick (lossspike.evaluation.evaluate) and, cell by
cell where a run has phase rows, by the backtest: one definition.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import NamedTuple

from lossspike.base.times import format_rfc3339
from lossspike.rules.rule import (
    NOT_FINITE,
    PHASE_FINISHED,
    PHASE_INITIALIZING,
    STALLED,
    WARMING_UP,
    RunPolicy,
    Thresholds,
)


class PhaseState(NamedTuple):
    """The judged attempt's phase rows in the hour."""

    # The newest phase value (float as stored; NULL values are no rows) and its time.
    value: float
    at: datetime
    # The oldest phase row of the attempt in the hour: when it started initializing, as far
    # as the hour shows.
    since: datetime
    # The attempt's loss samples in the hour (any value, NaN included).
    losses: int


def _join(note: str | None, more: str) -> str:
    return more if not note else f"{note}; {more}"


def is_finished(state: PhaseState | None, policy: RunPolicy, last_loss_at: datetime | None) -> bool:
    """The run published FINISHED last, no loss arrived after it, and no override row says it is
    not finished. A loss newer than the FINISHED row is a run training again (a restart that
    reuses the attempt, a tracker finished early): it is judged, failing toward paging. A loss at
    the FINISHED row's own instant is the last step's (finish() follows it in the millisecond)."""
    if state is None or state.value != PHASE_FINISHED or policy.finished is False:
        return False
    return last_loss_at is None or last_loss_at <= state.at


def finished_policy(state: PhaseState | None, policy: RunPolicy, last_loss_at: datetime | None) -> RunPolicy:
    """The policy of any row of a run (loss or check) once its phase is read: a run that
    published FINISHED (and logged no loss since, `last_loss_at` being its newest) is silenced
    with a note, as an override `finished = true` would."""
    if not is_finished(state, policy, last_loss_at) or state is None:
        return policy
    note = _join(policy.note, f"the run published FINISHED at {format_rfc3339(state.at)}")
    return dataclasses.replace(policy, silenced=True, note=note)


def initializing_too_long(state: PhaseState, now: datetime, t: Thresholds) -> bool:
    """The attempt has published INITIALIZING for longer than its start-up allowance."""
    return t.initializing_minutes > 0 and state.since < now - timedelta(minutes=t.initializing_minutes)


def loss_verdict(
    reason: str, state: PhaseState | None, last_loss_at: datetime | None, now: datetime, policy: RunPolicy
) -> tuple[str, RunPolicy]:
    """The loss row's reason and policy (silence, note) once the run's phase is read."""
    if state is None:
        return reason, policy
    policy = finished_policy(state, policy, last_loss_at)
    if is_finished(state, policy, last_loss_at):
        return reason, policy
    t = policy.thresholds
    if state.value == PHASE_INITIALIZING and state.losses == 0 and reason != NOT_FINITE:
        # Not judged until the allowance runs out: a job dying before its first step then pages.
        since = format_rfc3339(state.since)
        if initializing_too_long(state, now, t):
            return STALLED, dataclasses.replace(
                policy, note=_join(policy.note, f"no loss since initializing at {since}")
            )
        return WARMING_UP, dataclasses.replace(policy, note=_join(policy.note, f"initializing since {since}"))
    if reason == STALLED:
        fresh = now - timedelta(minutes=t.stall_minutes)
        if (last_loss_at is None or state.at > last_loss_at) and state.at >= fresh:
            note = f"process alive: phase heartbeat at {format_rfc3339(state.at)}, no loss since " + (
                "the attempt started" if last_loss_at is None else format_rfc3339(last_loss_at)
            )
        else:
            newest = state.at if last_loss_at is None else max(state.at, last_loss_at)
            note = f"silent: no loss or phase row since {format_rfc3339(newest)}"
        return reason, dataclasses.replace(policy, note=_join(policy.note, note))
    return reason, policy
