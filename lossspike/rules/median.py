"""The median of NaN-holed arrays, shared by the detectors and the checks' loss_jump.

A module of its own, below both: lossspike.judge.detectors reads the minute layer, which
reads lossspike.rules.checks, so the checks cannot import it from the detectors.
"""

from __future__ import annotations

import numpy as np


def _middles(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lower and upper middle finite values over the last axis (one axis kept), both NaN
    where there is none: NaN sorts last, so an all-NaN row's first value is NaN."""
    ordered = np.sort(values, axis=-1)
    count = values.shape[-1] - np.isnan(ordered).sum(axis=-1, keepdims=True)
    low = np.take_along_axis(ordered, np.maximum(count - 1, 0) // 2, axis=-1)
    high = np.take_along_axis(ordered, np.minimum(count // 2, values.shape[-1] - 1), axis=-1)
    return low, high


def median(values: np.ndarray) -> np.ndarray:
    """np.nanmedian over the last axis, bit for bit: the two middle finite values' sum halved
    (one value's double halved is itself), NaN without one. One sort replaces nanmedian's
    masked-array path, which took most of a detector's time."""
    if values.shape[-1] == 0:
        return np.full(values.shape[:-1], np.nan)
    low, high = _middles(values)
    with np.errstate(invalid="ignore", over="ignore"):
        return ((low + high) / 2.0)[..., 0]


def low_median(values: np.ndarray) -> np.ndarray:
    """The lower of the two middle finite values over the last axis (the median of an odd
    count), NaN without one: a value more than half of them are at or above."""
    if values.shape[-1] == 0:
        return np.full(values.shape[:-1], np.nan)
    return _middles(values)[0][..., 0]
