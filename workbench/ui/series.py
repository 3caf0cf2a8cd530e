"""Record rows as bounded float series: the columns, the downsampling, read once per build.

Figures read runs as lists of dicts (steps, evals, samples); here a column becomes a float
array (NaN where a value is missing or null), and a series is bounded to about ``MAX_POINTS``
points by keeping each bucket's minimum and maximum, so an hour-long run stays smooth in the
browser and its peaks survive.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np

from workbench.telemetry.values import num  # noqa: F401  (the views import it from here)

MAX_POINTS = 2000


_shared = threading.local()  # columns already read, while a dashboard is being built


def seed_columns(rows: Sequence[dict[str, Any]], columns: dict[str, np.ndarray]) -> None:
    """Inside ``shared_columns()``: ``rows``' columns, already read (the live view keeps the
    samples' columns and only reads the rows added since its last refresh)."""
    cache = getattr(_shared, "columns", None)
    if cache is not None:
        for key, values in columns.items():
            cache[(id(rows), len(rows), key)] = values


@contextmanager
def shared_columns() -> Iterator[None]:
    """Within, each column of the same rows is read once: a dashboard reads the samples' time
    column for eight series, and an hour at 20 Hz is 72,000 rows. Keyed by the rows' identity,
    which is only safe while they are alive: for the duration of one build."""
    outer = getattr(_shared, "columns", None)
    if outer is None:
        _shared.columns = {}
    try:
        yield
    finally:
        if outer is None:
            _shared.columns = None


def col(rows: Sequence[dict[str, Any]], key: str) -> np.ndarray:
    """Column ``key`` as floats, NaN where missing or null (numpy reads None as NaN)."""
    cache = getattr(_shared, "columns", None)
    slot = (id(rows), len(rows), key)
    if cache is not None and slot in cache:
        return cache[slot]
    try:
        out = np.array([r.get(key) for r in rows], dtype=float)
    except (TypeError, ValueError):  # text where a number belongs: NaN there, not a failure
        out = np.array([num(r.get(key)) for r in rows], dtype=float)
    if cache is not None:
        cache[slot] = out
    return out


def finite(a: np.ndarray) -> np.ndarray:
    return a[np.isfinite(a)]


def xy(rows: Sequence[dict[str, Any]], xkey: str, ykey: str,
        max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Columns ``xkey``/``ykey`` as float arrays (rows without an x dropped), bounded."""
    x, y = col(rows, xkey), col(rows, ykey)
    ok = np.isfinite(x)
    return downsample(x[ok], y[ok], max_points)


def downsample(x: np.ndarray, y: np.ndarray,
               max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points: the min and the max of ``y`` in each of ``max_points/2``
    equal-size buckets, in x order, so spikes (memory peaks, PCIe bursts) stay visible; an
    all-NaN bucket keeps its first point (a gap). Vectorised: the live view runs it on every
    refresh."""
    n = len(x)
    if n <= max_points:
        return x, y
    k = max_points // 2
    size = -(-n // k)  # ceil: k buckets of ``size`` points, the last one padded with NaN
    padded = np.full(k * size, np.nan)
    padded[:n] = y
    grid = padded.reshape(k, size)
    empty = np.isnan(grid).all(axis=1)
    lo = np.where(np.isnan(grid), np.inf, grid).argmin(axis=1)
    hi = np.where(np.isnan(grid), -np.inf, grid).argmax(axis=1)
    lo[empty] = hi[empty] = 0
    base = np.arange(k) * size
    idx = np.stack([np.minimum(lo, hi), np.maximum(lo, hi)], axis=1) + base[:, None]
    idx = idx.ravel()
    idx = np.unique(idx[idx < n])  # one point where min and max coincide; in x order
    return x[idx], y[idx]
