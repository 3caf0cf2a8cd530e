"""Which groups stream, in which order, under which id: said once, for the scheduler that
streams them, the replay that rebuilds a run's weights and the export that applies a
checkpoint's pending update.

Groups are named by canonical index k: the embedding 0, block i at i + 1, the head N + 1. A
streamed engine visits the blocks in order, and with ``stream_embeddings`` the embedding first
and the head last; every visited group except the ``resident_blocks`` first blocks keeps its
master in host memory behind the run's transfer (``transfers.make_transfer``). Transfers,
events and a pass's ``compute`` name a unit by its id: the block index, or ``EMBED`` / ``HEAD``.
"""
from __future__ import annotations

from dataclasses import dataclass

from workbench.config import RunConfig
from workbench.engine.events import EMBED, HEAD


@dataclass(frozen=True)
class StreamLayout:
    """Where a streamed run's groups are.

    Attributes:
        n_blocks: the model's transformer blocks (N); groups are 0 .. N + 1.
        order: canonical indices a full pass visits, in order.
        streamed: canonical indices whose master lives in host memory, in pass order.
    """
    n_blocks: int
    order: tuple[int, ...]
    streamed: tuple[int, ...]

    def uid(self, k: int) -> int:
        """Group k's id for transfers, events and ``compute``: EMBED, HEAD or the block index."""
        return EMBED if k == 0 else HEAD if k == self.n_blocks + 1 else k - 1


def stream_layout(cfg: RunConfig, n_blocks: int) -> StreamLayout:
    """The layout a streaming engine (zo-offload, lora-offload, forward-grad) gives a model of
    ``n_blocks`` blocks under ``cfg`` (``resident_blocks``, ``stream_embeddings``)."""
    resident = set(range(min(cfg.resident_blocks, n_blocks)))
    order = tuple(range(n_blocks + 2)) if cfg.stream_embeddings else tuple(range(1, n_blocks + 1))
    return StreamLayout(n_blocks, order, tuple(k for k in order if k - 1 not in resident))


def trained_layout(cfg: RunConfig, n_blocks: int) -> StreamLayout:
    """Where the TRAINED groups' masters are: MeZO keeps every group on the device, and an
    adapter run (``peft=lora``) trains adapters that stay on the device while its frozen base
    streams; so nothing trained streams there. Otherwise ``stream_layout``."""
    if cfg.method == "mezo" or cfg.peft == "lora":
        return StreamLayout(n_blocks, tuple(range(n_blocks + 2)), ())
    return stream_layout(cfg, n_blocks)
