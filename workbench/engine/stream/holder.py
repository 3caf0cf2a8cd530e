"""The full-parameter streamed holder: the weights of a streamed run and everything an engine
does with them but its step (``methods/`` composes it with a rule: the ZO step of
``zo_offload.py``, the jvp of ``forward_grad.py``).

The blocks stream through a ``BlockStreamer`` (``scheduler.py``: where each group is and when it
moves); each step's update stays pending (``defer``) until the next step's uploads apply it,
fused with that step's first perturbation, or runs in a pass of its own (fused_update=false);
``flush`` applies it everywhere (before an evaluation, a checkpoint, the end).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.config import RunConfig
from workbench.engine.checkpoint import Snapshot
from workbench.engine.device.shared_host import NodeShare
from workbench.engine.events import EMBED, EventBus
from workbench.engine.groups import GroupLayout
from workbench.engine.objective import Objective, Total, evaluate, objective_for
from workbench.engine.peft import block_adapter
from workbench.engine.stream.scheduler import BlockStreamer
from workbench.engine.timing import OpTimer
from workbench.engine.zo.perturb import PendingUpdate, ZOOps, pending_from_dict
from workbench.engine.zo.step import ApplyUpdate, apply_update
from workbench.models.adapter import Inputs


class StreamedWeights:
    """The full-parameter holder: every group trains, the blocks (and with
    ``stream_embeddings`` the embedding and head) streamed by a ``BlockStreamer``, each step's
    update pending until the next step's uploads (``pending``). Everything an engine is but
    its step. Args: as ``MeZOEngine``; the scheduler knobs come from ``cfg`` (overlap,
    reuse_buffers, fused_update, resident_blocks, prefetch_depth); ``share``: the node's one
    host copy under data parallel (``device/shared_host.py``)."""

    #: the embedding and head train (a rule perturbs them and writes streamed blocks back)
    trains_all = True

    def __init__(self, model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                 share: NodeShare | None = None, objective: Objective | None = None):
        self.cfg, self.device = cfg, device
        self.adapter = block_adapter(model, cfg)
        self.ops = ZOOps(cfg.rng, device, cfg.directions)
        self.timer = OpTimer(device, bus, cfg.telemetry)
        self.objective = objective or objective_for(cfg, model.config.vocab_size)
        self.streamer = BlockStreamer(self.adapter, source, cfg, device, self.timer, self.ops,
                                      share)
        self.pending: PendingUpdate | None = None
        # Data parallel: averages the shard losses over ranks (the only traffic of a step).
        self.reduce = None

    @property
    def bytes_h2d(self) -> int:
        return self.streamer.bytes_h2d

    @property
    def bytes_d2h(self) -> int:
        return self.streamer.bytes_d2h

    def defer(self, step: int, seed: int, g: torch.Tensor, lr: float, wd: float) -> None:
        """Keep the step's update pending for the next step's uploads (fused_update), or apply
        it now in a separate pass with its own transfers (the unfused baseline)."""
        self.pending = PendingUpdate.of(self.cfg, step, seed, g, lr, wd)
        if not self.cfg.fused_update:
            self.flush(step)

    @torch.no_grad()
    def flush(self, step: int = -1) -> None:
        """Apply the pending update everywhere (end of training, before eval or a checkpoint)."""
        upd, self.pending = self.pending, None
        if upd is None:
            return
        s, ops = self.streamer, self.ops
        if not s.ends:
            with self.timer.span("update", "compute", s.streams.compute, step, EMBED):
                for k, group in ((0, s.embed), (len(s.blocks) + 1, s.head)):
                    apply_update(ops, group.flat, group.layout, upd, state=self.group_state(k))
        s.stream_blocks(step, lambda i, flat, apply: apply_update(
            ops, flat, s.group(i).layout, upd, apply, s.state_for(i)),
                        write_back=True, op="update", state=True)

    def trained_block(self, i: int, flat: torch.Tensor, apply: ApplyUpdate | None
                      ) -> tuple[GroupLayout, torch.Tensor, ApplyUpdate | None,
                                 torch.Tensor | None]:
        """(layout, weights, how its pending update arrives, optimizer state) of what trains in
        block i while its weights ``flat`` sit in their slot: the block itself."""
        return self.streamer.blocks[i].layout, flat, apply, self.streamer.state_for(i)

    def group_state(self, k: int) -> torch.Tensor | None:
        """Group k's (canonical index) optimizer state on the device (None: none kept)."""
        st = self.streamer.opt_state
        return None if st is None else st.for_group(k)

    @torch.no_grad()
    def evaluate(self, dev, batch_size: int, total: Total | None = None) -> dict[str, float]:
        """The objective's metrics on ``dev`` with the current weights; every forward pass
        (one per eval batch, one per generated token) streams the blocks read-only."""
        self.flush()
        return evaluate(self.objective, self.adapter, dev, self.device, self.cfg.amp, batch_size,
                        self.streamed_forward, total,
                        self.streamed_head if self.streamer.ends else None)

    def streamed_forward(self, input_ids: torch.Tensor,
                         attention_mask: torch.Tensor) -> torch.Tensor:
        """Final hidden states (B, T, D) with the current weights (the update flushed first),
        the blocks (and a streamed embedding) through the GPU once, read-only
        (``models/generate.py::Forward``)."""
        adapter, s, inputs = self.adapter, self.streamer, Inputs(input_ids, attention_mask)
        state: list = [None, None]  # hidden states, block context
        if not s.ends:
            state[:] = adapter.embed(inputs)

        def forward(i: int, flat: torch.Tensor, apply) -> None:
            if i == EMBED:
                state[:] = adapter.embed(inputs)
            else:
                state[0] = adapter.run_block(adapter.blocks[i], state[0], state[1])

        s.stream_blocks(-1, forward, write_back=False, op="eval",  # a streamed head: apart
                        units=s.order[:-1] if s.ends else None)  # (``streamed_head``)
        return state[0]

    def streamed_head(self, hidden: torch.Tensor, ctx=None) -> torch.Tensor:
        """``BlockAdapter.head`` with a streamed head: its one unit uploaded, read-only."""
        out: list = [None]

        def head(i: int, flat: torch.Tensor, apply) -> None:
            out[0] = self.adapter.head(hidden, ctx)

        self.streamer.stream_blocks(-1, head, write_back=False, op="eval",
                                    units=self.streamer.order[-1:])
        return out[0]

    # --- state ------------------------------------------------------------------------------
    def state_flats(self) -> Sequence[torch.Tensor]:
        return self.streamer.state_flats()

    def base_flats(self) -> list[torch.Tensor]:
        """No frozen base: every weight trains."""
        return []

    def load_state_flats(self, flats: list[torch.Tensor]) -> None:
        self.streamer.load_state_flats(flats)

    def group_layouts(self) -> list[GroupLayout]:
        return self.streamer.group_layouts()

    def snapshot(self, next_step: int):
        return self.streamer.snapshot(next_step, self.pending)

    def restore(self, snap: Snapshot) -> None:
        self.streamer.load_state_flats(snap.flats)
        self.streamer.load_opt_state(snap)
        self.pending = pending_from_dict(snap.pending, self.device)

    def buffer_bytes(self) -> dict[str, int]:
        """The holder's own device buffers by item (bytes): the streamer's."""
        return self.streamer.buffer_bytes()

    def gpu_param_bytes(self) -> int:
        return self.streamer.gpu_param_bytes()

    def host_report(self) -> dict[str, int]:
        """Host bytes of the streamed blocks this rank sees, and how many of them it allocated
        itself (``private``), created for its node or mapped from it (data parallel)."""
        total, node = self.streamer.host_param_bytes(), self.streamer.node
        return {"streamed_bytes": total,
                "private_bytes": total - node.created_bytes - node.mapped_bytes,
                "created_bytes": node.created_bytes, "mapped_bytes": node.mapped_bytes}

    def close(self) -> None:
        """Drain transfers and timing events, free GPU and pinned host memory."""
        self.streamer.close()
        self.timer.poll(wait=True)
