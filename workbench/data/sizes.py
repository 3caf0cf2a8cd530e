"""How many examples a run trains and evaluates on, for its record."""
from __future__ import annotations

from typing import Any


def data_sizes(train: Any, dev: Any) -> dict[str, int]:
    """``train examples`` / ``dev examples`` where the data has a length (synthetic batches are
    drawn without end; no dev split: 0 dev examples): the summary prints them, and the health
    weighs the dev set by them."""
    out = {}
    for key, data in (("train examples", train), ("dev examples", dev)):
        try:
            out[key] = len(data) if data is not None else 0
        except TypeError:
            pass
    return out
