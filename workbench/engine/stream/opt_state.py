"""The optimizer state of a streamed run (zo_optimizer=momentum / adam), kept where its group is.

The groups on the GPU (embedding, head, resident blocks) keep their state there, fp32. A
streamed block's state lives on the host in the master's format (fp32, or bf16 / fp16 rounded
stochastically under master=compressed-sr) and travels with the block through a transfer of
the master's own kind: uploaded right after the block's weights on the upload stream into a
state slot beside the weight slot, updated by the compute stream with the weights, offloaded
before them on the offload stream, so every event the scheduler records for the block's slot
(its upload, its release, its offload) also covers its state. It moves only in a pass that
applies an update; an eval's read-only stream leaves it on the host. Each k-slot rule adds
k x the weights' bytes to a streamed block's PCIe traffic each way (``plan/zo.py`` counts it).
"""
from __future__ import annotations

import torch

from workbench.engine.groups import GroupLayout
from workbench.engine.stream.transfers import make_transfer
from workbench.engine.timing import OpTimer
from workbench.engine.zo.optim import STATE_SUFFIX, new_state, state_numel
from workbench.engine.zo.perturb import ZOOps


class StreamedState:
    """Args:
        rule: the run's zo_optimizer (one that keeps state).
        master, codec: the run's host format (a mirror master is refused by the config).
        layouts: every group's layout in canonical order (embedding, blocks, head).
        streamed: canonical indices of the streamed blocks.
        n_slots, reuse: the block slots the scheduler keeps (the state keeps as many).
    """

    def __init__(self, rule: str, master: str, codec: str, layouts: list[GroupLayout],
                 streamed: list[int], device: torch.device, timer: OpTimer, ops: ZOOps,
                 n_slots: int, reuse: bool):
        self.device = device
        self.transfer = make_transfer(master, codec, device, timer, ops)
        self.layouts = {k: GroupLayout(layouts[k].name + STATE_SUFFIX, [],
                                       state_numel(rule, layouts[k].numel), 0) for k in streamed}
        self.gpu = {k: new_state(rule, lay.numel, device) for k, lay in enumerate(layouts)
                    if k not in self.layouts}
        self.host = {}
        for k, lay in self.layouts.items():
            self.host[k] = self.transfer.host_storage(lay)
            self.transfer.store_fp32(self.host[k], torch.zeros(lay.numel))
        most = max((lay.numel for lay in self.layouts.values()), default=0)
        self.slots = ([self.transfer.slot_buffers(most, shared=True) for _ in range(n_slots)]
                      if reuse and most else [])
        self.current: dict[int, tuple[torch.Tensor, dict]] = {}  # uploaded: k -> (slot, extra)

    def for_group(self, k: int) -> torch.Tensor:
        """Group k's state on the device: its own buffer, or the slot its upload filled (None
        for a streamed block outside a pass that moves its state)."""
        return self.gpu[k] if k in self.gpu else self.current.get(k, (None,))[0]

    def upload(self, k: int, slot: int, step: int, stream) -> int:
        """Block k's state into state slot ``slot`` on ``stream`` (the caller has made the
        stream wait for the slot's last user); returns the bytes moved."""
        lay = self.layouts[k]
        if self.slots:
            flat, extra = self.transfer.slot_view(self.slots[slot][0], lay.numel), \
                self.slots[slot][1]
        else:
            flat, extra = self.transfer.slot_buffers(lay.numel)
        self.current[k] = (flat, extra)
        return self.transfer.upload(self.host[k], flat, extra, step, k - 1, stream)

    def offload(self, k: int, step: int, stream) -> int:
        """Block k's updated state back to the host on ``stream`` (after the compute that
        updated it); returns the bytes sent."""
        flat, extra = self.current.pop(k)
        return self.transfer.offload(self.host[k], flat, extra, step, k - 1, self.layouts[k],
                                     stream)

    def buffers(self) -> list[torch.Tensor]:
        """Every device buffer the state holds, each once (the slots share their wires; fresh
        slots of reuse_buffers=false: none)."""
        held = [t for t in self.gpu.values() if t is not None]
        held += [t for flat, extra in self.slots for t in (flat, *extra.values())]
        return list({t.data_ptr(): t for t in held}.values())

    def host_copies(self, n_groups: int) -> list[torch.Tensor | None]:
        """Host copies of the streamed blocks' state in the master's format, by canonical index
        (None for the groups on the device); the caller has waited for every transfer."""
        out: list[torch.Tensor | None] = [None] * n_groups
        tr = self.transfer
        for k, lay in self.layouts.items():
            out[k] = tr.read_master(self.host[k], torch.empty(lay.numel, dtype=tr.master_dtype))
        return out

    def load(self, values) -> None:
        """Every group's state from ``values`` (fp32, canonical order; a checkpoint's)."""
        for k, t in self.gpu.items():
            t.copy_(values[k])
        for k in self.layouts:
            self.transfer.store_fp32(self.host[k], values[k])

    def close(self) -> None:
        self.slots, self.gpu, self.current = [], {}, {}
        self.transfer.close()
