"""fo-offload's parameters as one flat range: where the masters, moments and gradients live.

The trained groups (embedding, blocks, head; or the adapter groups under peft=lora) are
concatenated in canonical order and cut into subgroups (``plan/placement.py::Subgroups``). The
host holds, page-locked, the fp32 master weights ``p32``, Adam's ``m`` and ``v`` (fp32, or bf16
under adam_state_dtype=bf16: ``moments.py``) and the fp32 gradients ``g`` of the whole range
(16 bytes per parameter, 12 with bf16 moments); the device holds the compute
weights ``w`` (bf16 under amp=bf16, else fp32) that the forward and backward passes read.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.engine.fo.adamw import OptState, Segment
from workbench.engine.groups import GroupLayout
from workbench.engine.device.pinned import HostMemory
from workbench.models.build import RandomInit
from workbench.plan.placement import Subgroups


class FlatParams:
    """Args:
        layouts: the trained groups, in canonical order.
        subgroup_size: parameters per subgroup (``cfg.subgroup_size``; at most the whole range).
        device: where the compute weights live.
        wdtype: their dtype (bf16 under amp=bf16, else fp32).
        memory: the page-locked host memory the host buffers come from.
        mdtype: the dtype of Adam's m and v (fp32, or bf16).
        gdtype: the dtype of the host gradients (fp32, or bf16 for the one-pass CPU AdamW).

    Attributes: ``layouts``, ``offsets`` (each group's start), ``groups`` (the subgroups),
    ``p32`` (host, fp32, (numel,)), ``g`` (host, ``gdtype``, (numel,)), ``m``, ``v`` (host,
    ``mdtype``, (numel,)), ``w``
    (device, (numel,)) and ``w_out`` (an alias of ``w`` the updates write through),
    ``segments`` (per subgroup, its decayed and undecayed runs).
    """

    def __init__(self, layouts: list[GroupLayout], subgroup_size: int, device: torch.device,
                 wdtype: torch.dtype, memory: HostMemory, mdtype: torch.dtype = torch.float32,
                 gdtype: torch.dtype = torch.float32):
        self.layouts, self.device, self.wdtype, self.mdtype = layouts, device, wdtype, mdtype
        self.gdtype = gdtype
        self.offsets, n = [], 0
        for lay in layouts:
            self.offsets.append(n)
            n += lay.numel
        self.numel = n
        self.recut(subgroup_size)
        self.p32, self.g = memory.empty(n), memory.empty(n, gdtype)
        self.m, self.v = memory.empty(n, mdtype), memory.empty(n, mdtype)
        self.m.zero_()
        self.v.zero_()
        self.w = torch.empty(n, dtype=wdtype, device=device)
        # Updates write w through this alias: the same memory, but a version counter of its
        # own, so uploading block j while backward still holds saved views of earlier blocks'
        # weights trips no autograd check (backward is done with j once its grads are in).
        self.w_out = self.w.data

    def recut(self, subgroup_size: int) -> None:
        """Cut the range into subgroups of ``subgroup_size`` (at most the whole range): the
        buffers stay as they are, only ``groups`` and ``segments`` change (between steps,
        before a placement is made: subgroup_size=auto tries sizes)."""
        self.groups = Subgroups.of(self.numel, subgroup_size)
        self.segments = [self._decay_segments(j) for j in range(self.groups.count)]

    @property
    def sub(self) -> int:
        """Parameters per subgroup (the last may hold fewer)."""
        return self.groups.size

    def bounds(self, j: int) -> tuple[int, int]:
        """Subgroup j's [start, end) in the flat parameter order."""
        return self.groups.bounds(j)

    def state(self, a: int, b: int) -> OptState:
        """The host masters and moments of elements [a, b)."""
        return OptState(self.p32[a:b], self.m[a:b], self.v[a:b])

    def materialise(self, source, seed: int) -> None:
        """Fill the fp32 masters (random init runs on the GPU, as the other engines do there)
        and the compute weights."""
        cuda = self.device.type == "cuda"
        for lay, o in zip(self.layouts, self.offsets):
            if not lay.numel:
                continue
            host = self.p32[o:o + lay.numel]
            if cuda and isinstance(source, RandomInit):
                staging = torch.empty(lay.numel, device=self.device)
                source.fill(lay.name, lay.named_views(staging), seed)
                host.copy_(staging)  # setup only: a synchronous copy is fine here
                self.w[o:o + lay.numel].copy_(staging)
            else:
                source.fill(lay.name, lay.named_views(host), seed)
                self.w[o:o + lay.numel].copy_(host)

    def per_group(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``flat`` (numel,) cut into the groups' views, in canonical order."""
        return [flat[o:o + lay.numel] for lay, o in zip(self.layouts, self.offsets)]

    def load(self, flats: Sequence[torch.Tensor]) -> None:
        """Set the masters and the compute weights from fp32 ``flats`` (one per group)."""
        for lay, o, flat in zip(self.layouts, self.offsets, flats):
            self.p32[o:o + lay.numel].copy_(flat)
            self.w[o:o + lay.numel].copy_(self.p32[o:o + lay.numel])

    def _decay_segments(self, j: int) -> list[Segment]:
        """(lo, hi, decayed) runs of subgroup j, relative to its start."""
        a, b = self.bounds(j)
        cuts: list[Segment] = []
        for lay, o in zip(self.layouts, self.offsets):
            for lo, hi, d in ((o, o + lay.n_decay, True), (o + lay.n_decay, o + lay.numel, False)):
                lo, hi = max(lo, a), min(hi, b)
                if hi > lo:
                    if cuts and cuts[-1].decayed == d and cuts[-1].hi == lo - a:
                        cuts[-1] = Segment(cuts[-1].lo, hi - a, d)
                    else:
                        cuts.append(Segment(lo - a, hi - a, d))
        return cuts
