"""Log-probabilities of chosen tokens through the LM head, chunked over positions.

A causal-LM loss over many positions needs log p(target) at each of N positions. Running the head
on all of them at once makes an (N, V) fp32 logits tensor: 8 x 2048 positions x 50k vocab is
3.3 GB, more than many models' weights. Here the head runs on ``chunk`` positions at a time and
only each position's log-probability survives; under autograd every chunk is checkpointed, so the
backward pass recomputes its logits instead of keeping them.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

#: The final modules: hidden states (N, D) -> logits (N, V) (e.g. ``BlockAdapter.head``).
Head = Callable[[torch.Tensor], torch.Tensor]

CHUNK_BYTES = 1 << 28  # fp32 logits of one chunk: 256 MiB


def chunk_rows(vocab: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Positions per chunk so that one chunk's fp32 logits take at most ``chunk_bytes``."""
    return max(1, chunk_bytes // (4 * vocab))


def _logprob(head: Head, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(n, D), (n,) -> (n,) fp32 log p(target) (the head's logits cast to fp32 first)."""
    return -F.cross_entropy(head(hidden).float(), targets, reduction="none")


def token_logprobs(hidden: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor,
                   head: Head, chunk: int = 1024) -> torch.Tensor:
    """log p(targets[i] | the prefix ending at positions[i]) for each scored position.

    Args:
        hidden: final hidden states (B, T, D), before the head modules.
        positions: (N,) flat indices into B x T of the positions that predict a target.
        targets: (N,) token ids they predict.
        head: (n, D) -> (n, V) logits.
        chunk: positions per head call: the fp32 logits alive at once are chunk x V x 4
            bytes (``chunk_rows`` picks it for a budget); ``chunk >= N`` is unchunked.
    Returns:
        (N,) float32.
    """
    flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
    n = flat.shape[0]
    grad = torch.is_grad_enabled()  # head weights may need grads even if hidden does not
    out = []
    for start in range(0, n, chunk):
        h, t = flat[start:start + chunk], targets[start:start + chunk]
        # Under autograd keep only h: the backward pass recomputes this chunk's logits.
        out.append(checkpoint(_logprob, head, h, t, use_reentrant=False) if grad
                   else _logprob(head, h, t))
    return torch.cat(out) if out else flat.new_zeros(0, dtype=torch.float32)
