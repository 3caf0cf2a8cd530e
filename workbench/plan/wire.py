"""Facts of the wire that the engine and the cost model share, written once, torch-free (the
engine imports them from here: ``plan/`` is below it).

* ``codec_bytes``: the encoded size of n fp32 elements in a transfer format (``Codec.nbytes``
  in ``engine/codecs/wire.py`` returns it): 4 or 2 B an element, or for fp8 one byte an
  element padded to 16 B, then one fp32 scale per ``FP8_CHUNK`` elements.
* ``wire_kind``: which transfer a streamed block takes for a codec and master
  (``engine/stream/transfers.py::make_transfer`` builds it): plain (fp32), sr (the compressed
  master itself travels, rounded on the way back), mirror (an fp32 master on the host, a
  compressed mirror up, a bf16 delta down).
* ``zo_regens``: regenerations of z per element of a group per ZO step: each query perturbs
  +, -2 (central only) and restores +, and its update adds one more (``engine/zo/``).
"""
from __future__ import annotations

from typing import Literal

FP8_CHUNK = 256  # elements per fp8 scale
HALF_CODECS = ("bf16", "fp16")

WireKind = Literal["plain", "sr", "mirror"]


def codec_bytes(codec: str, n: int) -> int:
    """Bytes of n fp32 elements encoded in ``codec`` (scales included)."""
    if codec == "fp32":
        return 4 * n
    if codec in HALF_CODECS:
        return 2 * n
    return fp8_scales_offset(n) + 4 * ((n + FP8_CHUNK - 1) // FP8_CHUNK)


def fp8_scales_offset(n: int) -> int:
    """Where an fp8 buffer's fp32 scales begin: its n bytes padded to 16, so they are aligned."""
    return (n + 15) // 16 * 16


def wire_kind(codec: str, master: str) -> WireKind:
    """The transfer of a streamed block under ``codec`` and ``master``."""
    if codec == "fp32":
        return "plain"
    return "sr" if master in ("compressed", "compressed-sr") else "mirror"


def zo_regens(queries: int, estimator: str) -> int:
    """z regenerations per element of a group per ZO step (mezo, zo-offload, adapters): per
    query + (with the previous update), -2 and + (restore) under ``central``; under
    ``one-sided`` + and + (restore), the update's add with them."""
    return (4 if estimator == "central" else 3) * queries
