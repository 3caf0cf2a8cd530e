"""A checkpoint's pending update applied one group at a time, with the engine's arithmetic.

A ZO checkpoint holds the weights before the update of its last step, which the next step
would apply (fused into its first pass). The weights after that step are the checkpoint with
the update applied as the engine's ``flush`` applies it outside any step: what
``engine/replay.py`` does after its last replayed step, here for one group at a time so an
export never holds the model. A streamed block goes through the run's own host format
(``transfers.py``: plain fp32, the compressed-sr master with its seeded rounding, the fp32
master behind a compressed mirror), the other groups through ``engine.zo.step.apply_update``.
Bit-identical to the run's own flush on the device type that trained (the CPU here unless
asked), as ``engine.methods.replay.restore_step`` is.
"""
from __future__ import annotations

import torch

from workbench.config import RunConfig

from workbench.engine.events import EventBus
from workbench.engine.groups import GroupLayout
from workbench.engine.zo.perturb import ZOOps, pending_from_dict
from workbench.engine.timing import OpTimer
from workbench.engine.stream.layout import trained_layout
from workbench.engine.stream.transfers import make_transfer
from workbench.engine.zo.step import apply_update

FLUSH_STEP = -1  # the step index a flush outside any step runs under (as ``replay``'s)


class PendingFlush:
    """Args:
        pending: the checkpoint's ``{"seed", "g", "lr", "wd"}`` (None: nothing to apply).
        config: the run's config (method, rng, master, codec, resident_blocks,
            stream_embeddings, peft).
        names / numels / n_decay: the checkpoint's groups, canonical order.
        device: where the arithmetic runs (the run's device type for bit-equality).
    """

    def __init__(self, pending: dict | None, config: RunConfig, names: list[str],
                 numels: list[int], n_decay: list[int], device: torch.device):
        self.device = device
        self.ops = ZOOps(config.rng, device, config.directions)
        self.upd = pending_from_dict(pending, device)
        self.layouts = [GroupLayout(n, [], k, d) for n, k, d in zip(names, numels, n_decay)]
        # the engine's own layout (as the replay's): which trained groups stream, and their ids
        self.layout = trained_layout(config, len(names) - 2)
        self.streamed = set(self.layout.streamed) if self.upd is not None else set()
        self.transfer = None
        if self.streamed:  # one for every unit, as the engine's: SR draws count its offloads
            self.transfer = make_transfer(config.master, config.codec, device,
                                          OpTimer(device, EventBus(), enabled=False), self.ops)

    def __call__(self, k: int, flat: torch.Tensor) -> torch.Tensor:
        """Group ``k``'s fp32 weights (``flat``, (n,), CPU, as the checkpoint holds them) with
        the pending update applied: a new or updated (n,) fp32 CPU tensor. Groups are taken
        in canonical order (a compressed-sr master's rounding draws depend on it)."""
        lay = self.layouts[k]
        if self.upd is None:
            return flat
        if k not in self.streamed:
            w = flat.to(self.device, torch.float32)
            apply_update(self.ops, w, lay, self.upd)
            return w.cpu()
        t, b = self.transfer, self.layout.uid(k)  # the unit's id, as the engine's transfer
        # counts its offloads
        host = t.host_storage(lay)
        t.store_fp32(host, flat)
        del flat
        slot, extra = t.slot_buffers(lay.numel)
        t.upload(host, slot, extra, FLUSH_STEP, b, None)
        apply_update(self.ops, slot, lay, self.upd, t.updater(extra, b))
        t.offload(host, slot, extra, FLUSH_STEP, b, lay, None)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # export only: the offload wrote the host copy
        t.wait_host(b)  # the mirror's host pass has written its master
        out = t.to_fp32(host)
        t.host.release()  # unpin this block's host copy now, not when the export ends
        return out

    def close(self) -> None:
        if self.transfer is not None:
            self.transfer.close()
