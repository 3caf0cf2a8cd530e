"""Numbers read from records: a value that may be missing (None), text, a bool or NaN, turned
into a float, tested for being a real finite number, or made fit for JSON (which has no NaN).
The one place every reader of a record (telemetry, recipes, ui) takes these from."""
from __future__ import annotations

import math
from typing import Any


def num(v: Any, default: float = math.nan) -> float:
    """``float(v)``; ``default`` (NaN) for None or anything that is not a number."""
    try:
        return default if v is None else float(v)
    except (TypeError, ValueError):
        return default


def finite(v: Any) -> bool:
    """Whether ``v`` is a finite int or float (a bool is not a number here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def finite_or_none(v: Any) -> float | None:
    """``num(v)`` when finite, else None (what a JSON field holds for "not measured")."""
    x = num(v)
    return x if math.isfinite(x) else None


def json_safe(x: Any) -> Any:
    """``x`` with every non-finite float replaced by None, in dicts, lists and tuples too
    (JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x
