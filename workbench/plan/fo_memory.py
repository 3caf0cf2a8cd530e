"""fo-offload's GPU memory part by part for one placement, and the placement a GPU memory cap
(``gpu_mem_limit_gb``) leaves room for. Pure arithmetic, like the rest of ``plan/``.

Parts (bytes; P trained parameters, w the bytes of a compute weight: 2 under amp, else 4):
  compute weights                 w P, which forward and backward read.
  gradients kept for the GPU      w P (gpu + resident share): the GPU-updated subgroups'
                                  gradients wait in one buffer for the update phase
                                  (``engine/fo/grads.py::Kept``).
  gradients queued for the link   CPU-updated gradients backward has written and the D2H has
                                  not read yet: at most ``QUEUE_BYTES`` (beyond that the flush
                                  waits for the link) and at most w P (cpu share).
  resident optimizer share        the resident share's (p, m, v), and under amp one subgroup of
                                  fp32 gradient upcast for them.
  subgroups in flight             ``N_SLOTS`` slots of min(subgroup, ``SLOT_PIECE``) (p, m, v),
                                  + an fp32 gradient under amp.
  gradient upcast staging         two ``CHUNK`` fp32 buffers under amp (none where bf16
                                  gradients go down as they are: the one-pass CPU AdamW).
  weight upload slot              one subgroup of fp32 when 16-bit weights are downcast on the
                                  GPU (``engine/fo/host.py``).
The activations (``plan/fo.py``) come on top. They peak as backward starts, when nothing is
queued yet, and are freed as the queue fills, so counting both is an upper bound.

Under a cap, "auto" runs the fastest placement whose parts fit (``fitting``): the planner's pick
for a plan, and the first of the engine's candidates it times (``engine/fo/trial.py`` then drops
the ones its measured peak leaves no room for).
"""
from __future__ import annotations

from workbench.plan.placement import CHUNK, N_SLOTS, NO_GPU, SLOT_PIECE, Split, fewer

#: The most bytes of gradients the flush lets wait for the link (``engine/fo/grads.py``).
QUEUE_BYTES = 1 << 30


def device_parts(n_params: int, word: int, state_bytes: int, split: Split, sub: int,
                 gpu_downcast: bool, grad_bytes: int = 4) -> dict[str, int]:
    """The GPU bytes of a placement by part (module docstring). ``word``: bytes of a compute
    weight; ``state_bytes``: (p, m, v) of one parameter (``placement.STATE_BYTES``); ``split``:
    the parameter shares of each side; ``sub``: the subgroup size (parameters);
    ``gpu_downcast``: 16-bit weights go up as fp32 and are downcast on the GPU;
    ``grad_bytes``: a flushed gradient's (2: bf16 for the one-pass CPU AdamW, not upcast)."""
    P, amp = n_params, word == 2
    piece = min(sub, SLOT_PIECE, P)
    slots = min(N_SLOTS, -(-round(split.gpu * P) // piece)) if split.gpu > 0 else 0
    return {"compute weights": word * P,
            "gradients kept for the GPU": round(word * P * (split.gpu + split.resident)),
            "gradients queued for the link": min(QUEUE_BYTES, round(word * P * split.cpu)),
            "resident optimizer share": round(state_bytes * split.resident * P)
            + (4 * min(sub, P) if amp and split.resident > 0 else 0),
            "subgroups in flight": slots * (state_bytes + 4 * amp) * piece,
            "gradient upcast staging": 2 * 4 * min(CHUNK, P) * (amp and grad_bytes == 4),
            "weight upload slot": 4 * min(sub, P) * (amp and gpu_downcast)}


def fitting(options: list, parts_of, budget: int):
    """The first of ``options`` (fastest first) whose parts (``parts_of(option)``, a dict of
    bytes) fit ``budget`` bytes, else None."""
    for option in options:
        if sum(parts_of(option).values()) <= budget:
            return option
    return None


def leaner_strides(first: int, n_sub: int) -> list[int]:
    """``first`` and every stride with fewer GPU subgroups after it (``placement.fewer``), up
    to the last that still sends one of ``n_sub`` subgroups to the GPU, then ``NO_GPU``."""
    out, s = [], first
    while s != NO_GPU and (s < 0 or s <= n_sub):
        out.append(s)
        s = fewer(s)
    return [*out, NO_GPU]
