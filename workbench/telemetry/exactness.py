"""Where two runs are expected to end with the same weights, and where they are not by design:
said beside every ``param_digest`` comparison (the demo, ``compare``, the report).

zo-offload with ``master=fp32`` replays MeZO's arithmetic exactly: the same seed and settings
end with the same ``param_digest``. With a compressed master (``master=compressed`` or
``compressed-sr``: bf16 / fp16 weights), no MeZO run equals it: MeZO's half mode rounds every
weight to the half dtype, the embedding, the positions and the final norm too, while
zo-offload keeps those in fp32 and rounds only the blocks it streams.
"""
from __future__ import annotations

from typing import Any, Sequence

#: The pair whose digests are comparable at all (the other methods follow other rules).
ZO_PAIR = {"mezo", "zo-offload"}


def exactness_note(configs: Sequence[dict[str, Any]]) -> str:
    """One sentence on whether runs of ``configs`` (their ``config`` dicts) should end with one
    ``param_digest``; '' when the runs are not MeZO beside zo-offload."""
    methods = {c.get("method") for c in configs}
    if len(configs) < 2 or methods != ZO_PAIR:
        return ""
    masters = sorted({str(c.get("master", "fp32")) for c in configs})
    if masters == ["fp32"]:
        return ("expected identical: with master=fp32, zo-offload computes exactly what MeZO "
                "computes (same seed and settings, same param_digest)")
    half = ", ".join(m for m in masters if m != "fp32")
    return (f"not expected identical (master={half}): MeZO's half mode rounds every weight "
            "to the half dtype, embedding, positions and final norm included, while zo-offload "
            "keeps those in fp32 and rounds only the blocks it streams; no MeZO run equals a "
            "compressed-master zo-offload run, by design (compare what they learned)")
