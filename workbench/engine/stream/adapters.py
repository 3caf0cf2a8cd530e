"""The streamed adapter holder (``peft=lora``): adapters that train over a frozen, streamed base.

The base never changes, so each streamed block comes up (host -> GPU, in its ``base_codec``,
decoded into the slot) and is never sent back: no offload pass, no update pass over base
weights, no D2H traffic at all. The adapter groups (one per block, ``block.{i}.lora``) stay on
the GPU for the whole run, with their optimizer state (momentum / adam) beside them; a rule's
passes for block i run on its adapter group while the block's base sits in its slot. The
embedding and head are frozen and resident. The base is a ``StreamedWeights`` of its own (a
frozen streamer: nothing of it is ever pending), held, not inherited from.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from workbench.config import RunConfig
from workbench.engine.checkpoint import Snapshot
from workbench.engine.device.shared_host import NodeShare
from workbench.engine.events import EMBED, EventBus
from workbench.engine.groups import GroupLayout, release
from workbench.engine.objective import Objective, Total
from workbench.engine.peft import adapter_groups
from workbench.engine.snapshots import DeviceSnapshots
from workbench.engine.stream.holder import StreamedWeights
from workbench.engine.zo.optim import load_opt_state, new_state
from workbench.engine.zo.perturb import PendingUpdate, pending_from_dict
from workbench.engine.zo.step import ApplyUpdate, apply_update


class StreamedAdapters:
    """Args: as ``StreamedWeights`` (``share``: the node's one host copy of the frozen base
    under data parallel; only local rank 0 fills it)."""

    #: only the adapters train: the embedding and head stay as loaded, base blocks never return
    trains_all = False

    def __init__(self, model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                 share: NodeShare | None = None, objective: Objective | None = None):
        self.base = StreamedWeights(model, source, cfg, device, bus, share, objective)
        self.cfg, self.device = cfg, device
        self.adapter, self.ops, self.timer = self.base.adapter, self.base.ops, self.base.timer
        self.objective, self.streamer = self.base.objective, self.base.streamer
        self.loras = adapter_groups(self.adapter, cfg, device)
        # momentum / adam: each adapter group's optimizer state beside it (else None)
        self.lora_state = [new_state(cfg.zo_optimizer, g.layout.numel, device)
                           for g in self.loras]
        self.pending: PendingUpdate | None = None
        # Data parallel: averages the shard losses over ranks (the only traffic of a step).
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.snapshots = DeviceSnapshots(device, cfg.to_dict())  # of the adapters
        if cfg.checkpoint_every:  # at setup, not in the first snapshot's step
            self.snapshots.prepare(self._adapters(), pending=cfg.queries, state=self._state())

    bytes_h2d = property(lambda self: self.streamer.bytes_h2d)
    bytes_d2h = property(lambda self: self.streamer.bytes_d2h)
    #: the step's update kept pending (applied by the next step's first perturbation of each
    #: adapter), or applied now (fused_update=false)
    defer = StreamedWeights.defer

    @torch.no_grad()
    def flush(self, step: int = -1) -> None:
        """Apply the pending update to the adapters (resident: no block moves)."""
        upd, self.pending = self.pending, None
        if upd is None:
            return
        with self.timer.span("update", "compute", self.streamer.streams.compute, step, EMBED):
            for lora, state in zip(self.loras, self.lora_state):
                apply_update(self.ops, lora.flat, lora.layout, upd, state=state)

    def trained_block(self, i: int, flat: torch.Tensor, apply: ApplyUpdate | None
                      ) -> tuple[GroupLayout, torch.Tensor, ApplyUpdate | None,
                                 torch.Tensor | None]:
        """Block i's adapters, resident: their pending update is applied in place (the base's
        ``flat`` and ``apply`` are the frozen block's and carry none)."""
        lora = self.loras[i]
        return lora.layout, lora.flat, None, self.lora_state[i]

    @torch.no_grad()
    def evaluate(self, dev, batch_size: int, total: Total | None = None) -> dict[str, float]:
        """The objective's metrics with the current adapters (the pending update applied)."""
        self.flush()
        return self.base.evaluate(dev, batch_size, total)

    def streamed_forward(self, input_ids: torch.Tensor,
                         attention_mask: torch.Tensor) -> torch.Tensor:
        """Final hidden states (B, T, D) with the adapters as they are (``StreamedWeights``')."""
        return self.base.streamed_forward(input_ids, attention_mask)

    def streamed_head(self, hidden: torch.Tensor, ctx=None) -> torch.Tensor:
        """The (frozen) head over ``hidden`` (``StreamedWeights.streamed_head``)."""
        return self.base.streamed_head(hidden, ctx)

    # --- state: the adapters; the base is the streamer's ------------------------------------
    def state_flats(self) -> list[torch.Tensor]:
        return [g.flat for g in self.loras]

    def load_state_flats(self, flats: list[torch.Tensor]) -> None:
        for group, flat in zip(self.loras, flats):
            group.flat.copy_(flat)

    def base_flats(self) -> list[torch.Tensor]:
        """Embedding, every block's decoded base, head (host copies of streamed blocks)."""
        return self.streamer.state_flats()

    def group_layouts(self) -> list[GroupLayout]:
        return [g.layout for g in self.loras]

    def _adapters(self) -> dict[int, torch.Tensor]:
        return dict(enumerate(g.flat for g in self.loras))

    def _state(self) -> dict[int, torch.Tensor]:
        return {k: s for k, s in enumerate(self.lora_state) if s is not None}

    def snapshot(self, next_step: int):
        """Host copies of the adapters and the pending g (``engine/snapshots.py``; never
        blocking the step); returns the function the checkpoint writer calls. Call it only
        once the writer is done with the last one."""
        return self.snapshots.take(next_step, self._adapters(), self.group_layouts(),
                                   self.pending, state=self._state())

    def restore(self, snap: Snapshot) -> None:
        self.load_state_flats(snap.flats)
        load_opt_state(self.lora_state, snap)
        self.pending = pending_from_dict(snap.pending, self.device)

    def buffer_bytes(self) -> dict[str, int]:
        """The holder's own device buffers by item (bytes): the streamer's and the adapters."""
        state = sum(4 * s.numel() for s in self.lora_state if s is not None)
        return {**self.streamer.buffer_bytes(),
                "adapters (fp32)": sum(g.layout.nbytes for g in self.loras),
                **({"optimizer state": state} if state else {})}

    def gpu_param_bytes(self) -> int:
        return sum(self.buffer_bytes().values()) if self.device.type == "cuda" else 0

    def host_report(self) -> dict[str, int]:
        """The frozen base's host bytes (``StreamedWeights.host_report``)."""
        return self.base.host_report()

    def close(self) -> None:
        for group in self.loras:
            release(group.layout)
        self.loras, self.lora_state = [], []
        self.snapshots.release()
        self.base.close()
