"""Where to go back, property-tested against a plain-Python recomputation from the samples
(SPEC "Where to go back"): a NaN onset's `onset_at` is never later than the first non-finite loss
of the newest unbroken run of them, and `last_good_at` is a finite sample at or before the newest
finite loss before it, in a minute whose losses are all finite; where no stray NaN came before the
onset, both are exactly the minute layer's answer (the onset's minute, the newest sample of the
minute before it with a loss). A stall names its newest sample as both."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from conftest import NOW
from hypothesis import event, given, settings
from hypothesis import strategies as st
from incidents import loss_row, rows_for
from oracle import Sample

from lossspike.config.settings import Settings

MINUTE = timedelta(minutes=1)


def _minute_of(moment: datetime) -> datetime:
    """The minute (counted back from NOW, a whole minute) holding `moment`."""
    return moment.replace(second=0, microsecond=0)


@st.composite
def nan_runs(draw) -> tuple[list[Sample], bool]:
    """Ninety minutes of finite losses at a drawn cadence, NaN from a drawn instant in the recent
    window on; sometimes a few stray NaNs before it (single steps skip-step discarded), and
    sometimes the loss finite again for the last steps."""
    cadence = draw(st.sampled_from([2.0, 7.0, 10.0, 25.0]))
    # Long enough before now for a NaN sample at this cadence, before a recovery's last 15 s too.
    onset = NOW - timedelta(seconds=draw(st.integers(int(cadence) + 20, 290)))
    strays = draw(st.lists(st.integers(30, 1800), max_size=3))
    recovered = draw(st.booleans()) and cadence < 20
    out = []
    moment = NOW - timedelta(minutes=90)
    index = 0
    while moment < NOW:
        ago = (onset - moment).total_seconds()
        bad = moment >= onset and not (recovered and moment >= NOW - timedelta(seconds=15))
        stray = any(abs(ago - s) < cadence / 2 for s in strays) and moment < onset
        value = math.nan if bad or stray else 2.0 + 0.01 * math.sin(index)
        out.append(Sample(moment, value, "hero-a"))
        moment += timedelta(seconds=cadence)
        index += 1
    return out, bool(strays)


def _oracle(samples: list[Sample]) -> tuple[datetime, datetime | None]:
    """SPEC's sample-level answer: the first non-finite loss of the newest unbroken run of them,
    and the newest finite loss before it."""
    ordered = sorted(samples, key=lambda s: s.timestamp)
    newest_bad = max(i for i, s in enumerate(ordered) if math.isnan(s.value))
    first = newest_bad
    while first > 0 and math.isnan(ordered[first - 1].value):
        first -= 1
    before = [s.timestamp for s in ordered[:first] if not math.isnan(s.value)]
    return ordered[first].timestamp, (before[-1] if before else None)


@settings(max_examples=25, deadline=None)
@given(nan_runs())
def test_a_nan_onset_is_never_later_than_the_truth_and_its_last_good_point_never_inside_it(case):
    samples, strays = case
    row = loss_row(rows_for(samples, Settings()))
    assert (row["reason"], row["value"]) == ("not_finite", 1)
    truth, good = _oracle(samples)
    onset, last_good = row["onset_at"], row["last_good_at"]
    assert onset is not None and onset <= truth
    by_time = {s.timestamp: s.value for s in samples}
    if last_good is not None:
        # A finite sample, no newer than the newest finite loss before the truth, in a minute of
        # finite losses only.
        assert last_good in by_time and not math.isnan(by_time[last_good])
        assert good is not None and last_good <= good
        start = _minute_of(last_good)
        assert all(not math.isnan(v) for t, v in by_time.items() if start <= t < start + MINUTE)
    # Without stray NaNs before it, the minute layer's exact answer.
    if not strays:
        event("clean onset")
        assert onset == _minute_of(truth)
        earlier = [t for t in by_time if t < onset]
        prior = _minute_of(max(earlier))
        want = max(t for t in earlier if t >= prior)
        assert last_good == want
    else:
        event("stray NaNs before the onset")
    if not math.isnan(max(samples, key=lambda s: s.timestamp).value):
        event("finite again since the onset")


@settings(max_examples=15, deadline=None)
@given(st.integers(16 * 60, 50 * 60), st.sampled_from([3.0, 10.0, 40.0]))
def test_a_stall_names_its_newest_sample(silent_seconds: int, cadence: float):
    samples = []
    moment = NOW - timedelta(minutes=100)
    while moment < NOW - timedelta(seconds=silent_seconds):
        samples.append(Sample(moment, 2.0, "hero-a"))
        moment += timedelta(seconds=cadence)
    row = loss_row(rows_for(samples, Settings()))
    newest = max(s.timestamp for s in samples)
    event(f"cadence {cadence:g} s")
    assert (row["reason"], row["onset_at"], row["last_good_at"]) == ("stalled", newest, newest)
