"""fo-offload's GPU side of the update phase, for one placement.

Resident subgroups (the last ``gpu_resident_ratio`` of them, TwinFlow-style) keep their
(p, m, v) on the GPU and are updated in place. Interleaved subgroups go through ``N_SLOTS``
slots of up to ``SLOT_PIECE`` elements a piece at a time: each piece's (p, m, v) is prefetched
on its own stream (the first slots fill during forward and backward), updated with the fused
AdamW kernel on the compute stream, written into the compute weights, and flushed out (p, m, v
back to the host) on a stream of its own, while the slots rotate behind further prefetches.
Every dependency is an event; the host never waits here. With bf16 moments
(``moments.py``) the slots' and residents' m and v are bf16 too: 8 B of (p, m, v) cross the
link each way per parameter instead of 12, and the update upcasts and rounds them per piece.

What it owns: the residents' state and upcast scratch, the kept gradients of its subgroups
(``Kept``: the gradient flush writes them), the slots, the prefetch and flush-out streams and
their events.
"""
from __future__ import annotations

import torch

from workbench.engine.fo.adamw import AdamW, OptState, Segment, adamw, within
from workbench.engine.fo.flat import FlatParams
from workbench.engine.fo.grads import Kept
from workbench.engine.fo.moments import HalfMoments, adamw_half
from workbench.engine.fo.spans import PhaseTimer
from workbench.engine.device.streams import Streams
from workbench.plan import placement
from workbench.plan.placement import N_SLOTS, Schedule


def gpu_update(state: OptState, kept: torch.Tensor, scratch: torch.Tensor | None,
               out: torch.Tensor, segments: list[Segment], opt: AdamW,
               step_t: torch.Tensor, half: HalfMoments | None = None, j: int = 0,
               lo: int = 0) -> None:
    """AdamW on a GPU-side subgroup (or piece) from its kept gradients ``kept`` (compute
    dtype; upcast into the fp32 ``scratch`` when 16-bit, else used as they are), then its
    compute weights ``out`` from the new p (downcast on the GPU). All tensors flat, of one
    length (``scratch`` at least as long), on the device; ``step_t`` the 0-d step count there.
    bf16 moments: ``half``, and the piece's subgroup j and start ``lo`` within it."""
    g = kept if scratch is None else scratch[:kept.numel()].copy_(kept)
    if half is None:
        adamw(state, g, segments, opt, step_t)
    else:
        adamw_half(state, g, segments, opt, step_t, half, j, lo)
    out.copy_(state.p)  # the next forward's weights, downcast on the GPU


class GpuUpdates:
    """Args:
        flat: the parameters (host state, compute weights, subgroups).
        schedule: the placement's schedule (which subgroups are resident, which interleaved).
        streams: the engine's streams (updates on ``compute``).
        timer: its timer (``gpu-update``, ``prefetch``, ``flush-out`` spans).
        prefetch, evict: the prefetch and flush-out streams (None on a CPU).
        seed: the run's seed (the rounding of bf16 moments).

    Attributes: ``kept`` (the kept gradients), ``pieces`` ((subgroup, lo, hi) of the
    interleaved subgroups in order), ``slots``, ``half`` (bf16 moments' scratch and noise, or
    None), ``bytes_h2d`` / ``bytes_d2h`` (moved so far).
    """

    def __init__(self, flat: FlatParams, schedule: Schedule, streams: Streams,
                 timer: PhaseTimer, prefetch, evict, seed: int = 0):
        self.flat, self.schedule, self.streams, self.timer = flat, schedule, streams, timer
        self.prefetch, self.evict = prefetch, evict
        dev, sub, convert = flat.device, flat.sub, flat.wdtype != torch.float32
        self.cuda = dev.type == "cuda"
        self.r0 = schedule.resident.start * sub if len(schedule.resident) else flat.numel
        self.residents = (OptState(*(t[self.r0:].to(dev, copy=True) for t in flat.state(0, None)))
                          if self.r0 < flat.numel else None)
        at, n = {}, 0
        for j in sorted((*schedule.gpu, *schedule.resident)):
            at[j] = n
            n += flat.groups.numel_of(j)
        self.kept = Kept(torch.empty(n, dtype=flat.wdtype, device=dev), at)
        self.pieces = flat.groups.pieces(schedule)
        size = min(sub, placement.SLOT_PIECE)
        md = flat.mdtype
        self.state_bytes = 4 + 2 * md.itemsize  # p, m, v of one parameter
        self.half = (HalfMoments(seed, dev, size) if md == torch.bfloat16
                     and (self.pieces or self.residents is not None) else None)
        self.slots = [tuple(torch.empty(size, device=dev, dtype=dt) for dt in
                            (torch.float32, md, md, torch.float32)[:3 + convert])
                      for _ in range(min(N_SLOTS, len(self.pieces)))]
        self._res_g = (torch.empty(sub, device=dev)
                       if convert and len(schedule.resident) else None)
        self._flushed: dict[int, object] = {}  # subgroup -> its last flush-out (host copy valid)
        self._slot_free: list = [None] * N_SLOTS
        self._fetched: dict[int, object] = {}
        self._prefetch_span = None  # the prefetch span of the subgroup whose pieces go up now
        self.bytes_h2d = self.bytes_d2h = 0

    def buffers(self) -> list[torch.Tensor]:
        """Its device buffers (``gpu_param_bytes``)."""
        res = list(self.residents) if self.residents is not None else []
        return [self.kept.buffer, *res, *(t for t in (self._res_g,) if t is not None),
                *(t for slot in self.slots for t in slot),
                *(self.half.buffers() if self.half is not None else [])]

    def home(self) -> None:
        """The residents' state back into the host buffers (between steps, synchronized)."""
        if self.residents is not None:
            for host, dev in zip(self.flat.state(self.r0, None), self.residents):
                host.copy_(dev)

    def load(self) -> None:
        """The residents' p from the host masters (after new weights were loaded)."""
        if self.residents is not None:
            self.residents.p.copy_(self.flat.p32[self.r0:])

    def kept_of(self, j: int) -> torch.Tensor:
        """Subgroup j's kept gradients."""
        return self.kept.of(j, self.flat.groups.numel_of(j))

    def begin(self, step: int) -> None:
        """A new step: the first slots fill during its forward and backward passes."""
        self._step = step
        self._fetched = {}
        for k in range(len(self.slots)):
            self._prefetch(k)

    def run(self, step: int, opt: AdamW, step_t: torch.Tensor, adam_step: int = 0) -> None:
        """Enqueue the update of every GPU-side subgroup (after backward, on the compute
        stream): residents in place, then the interleaved ones piece by piece. ``adam_step``:
        the Adam step bf16 moments are rounded for."""
        s, f, half = self.streams, self.flat, self.half
        if half is not None:
            half.t = adam_step
        for j in self.schedule.resident:  # no transfers
            a, b = f.bounds(j)
            with self.timer.span("gpu-update", "compute", s.compute, step, j, 0, "resident"):
                gpu_update(self.residents.narrow(a - self.r0, b - self.r0), self.kept_of(j),
                           self._res_g, f.w_out[a:b], f.segments[j], opt, step_t, half, j)
        # One gpu-update and one flush-out span per subgroup, from its first piece to its last.
        updating = flushing = None
        for k, (j, a, b) in enumerate(self.pieces):
            ja, jb = f.bounds(j)
            n, q, first, last = b - a, k % len(self.slots), a == ja, b == jb
            slot = self.slots[q]
            s.wait(s.compute, self._fetched.pop(k))  # update only once p, m, v have landed
            if first:
                updating = self.timer.open(s.compute)
            gpu_update(OptState(*(t[:n] for t in slot[:3])), self.kept_of(j)[a - ja:b - ja],
                       slot[3] if len(slot) > 3 else None, f.w_out[a:b],
                       within(f.segments[j], a - ja, b - ja), opt, step_t, half, j, a - ja)
            if last:
                self.timer.close(updating, "gpu-update", "compute", s.compute, step, j, 0,
                                 "interleaved")
            updated = s.record(s.compute)  # this piece's update and compute weights are done
            with s.on(self.evict):
                s.wait(self.evict, updated)  # flush out only the updated values
                if first:
                    flushing = self.timer.open(self.evict)
                for src, dst in zip(slot[:3], f.state(a, b)):
                    dst.copy_(src[:n], non_blocking=self.cuda)
                # The slot may be refilled after this point, and j's host copy read once its
                # last piece is out.
                self._slot_free[q] = s.record(self.evict)
                if last:
                    self.timer.close(flushing, "flush-out", "offload", self.evict, step, j,
                                     self.state_bytes * (jb - ja))
                    self._flushed[j] = self._slot_free[q]
            self.bytes_d2h += self.state_bytes * n
            if k + len(self.slots) < len(self.pieces):
                self._prefetch(k + len(self.slots))

    def _prefetch(self, k: int) -> None:
        """(p, m, v) of the k-th piece of the interleaved subgroups into its slot, on the
        prefetch stream; one ``prefetch`` span per subgroup, from its first piece to its last."""
        s, f, (j, a, b) = self.streams, self.flat, self.pieces[k]
        ja, jb = f.bounds(j)
        slot = self.slots[k % len(self.slots)]
        with s.on(self.prefetch):
            s.wait(self.prefetch, self._slot_free[k % len(self.slots)])  # last user flushed it
            s.wait(self.prefetch, self._flushed.get(j))  # last step's flush-out wrote j's copy
            if a == ja:  # pieces are prefetched in order: one subgroup's span open at a time
                self._prefetch_span = self.timer.open(self.prefetch)
            for dst, src in zip(slot[:3], f.state(a, b)):
                dst[:b - a].copy_(src, non_blocking=self.cuda)
            if b == jb:
                self.timer.close(self._prefetch_span, "prefetch", "upload", self.prefetch,
                                 self._step, j, self.state_bytes * (jb - ja))
            self._fetched[k] = s.record(self.prefetch)  # this piece of j is on the GPU
        self.bytes_h2d += self.state_bytes * (b - a)


def host_grads(flat: FlatParams, gpu: GpuUpdates) -> list[torch.Tensor]:
    """The last step's fp32 gradients per group on the host: a subgroup whose gradient the GPU
    kept is read from there, the rest from the host's flushed buffer (``flat.g``)."""
    full = torch.empty(flat.numel)
    for j in range(flat.groups.count):
        a, b = flat.bounds(j)
        full[a:b] = gpu.kept_of(j).float().cpu() if j in gpu.kept.at else flat.g[a:b]
    return flat.per_group(full)
