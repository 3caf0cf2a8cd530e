"""First-order training with interleaved offloaded optimizer states (Deep Optimizer States).

Where things live. The host holds, page-locked, the fp32 master weights p, Adam's m and v and
the fp32 gradients of all parameters (16 bytes per parameter), as one buffer each over the
canonically ordered, concatenated parameter groups. That range is cut into subgroups of
``subgroup_size`` parameters. The GPU holds the compute weights w (bf16 under amp=bf16, else
fp32) the forward and backward passes read, the gradients of GPU-updated subgroups, three
slots of up to ``SLOT_PIECE`` elements, and the (p, m, v) of the static resident share (``gpu_resident_ratio``, the
last subgroups, TwinFlow-style).

A step. Forward and backward on w; the first interleaved subgroups' (p, m, v) are prefetched
into their slots meanwhile. As each group's gradients complete (post-accumulate-grad hooks),
the GPU-updated parts are copied aside on the compute stream and the CPU-updated parts upcast
to fp32 and sent to the host on the offload stream, subgroup by subgroup; a CPU subgroup whose
gradients are all on their way goes to the host worker (``fo_host``), which updates it with
torch's fused CPU AdamW as soon as they land, while backward goes on, and sends the result up
into w. After backward: resident subgroups update in place; every interleaved GPU subgroup is
updated with the fused AdamW kernel on the compute stream a slot-sized piece at a time (its
pieces through the slots in turn), written into w and evicted (p, m, v back to the host) on its
own stream, the slots rotating behind further prefetches. The next forward waits for the last upload. Every GPU-side dependency is an event;
the host blocks only where it must read or reuse host memory that a copy is still writing or
reading, and at the end of the step for the worker. On a CPU-only machine both sides run on the
CPU and the streams are no-ops, so the schedule is tested in CI.

The timeline. Per subgroup and step: ``grad-d2h`` (offload), ``cpu-wait`` / ``cpu-update`` /
``downcast`` / ``upload-weights`` (the CPU side), ``prefetch`` / ``gpu-update`` / ``flush-out``
(the GPU side), and one ``gpu-wait`` per step (the compute stream waiting for the CPU side).

Adapters (``peft=lora``): the range above is the adapter groups only (their p, m, v and
gradients on the host, their compute weights in w); the frozen base is held on the device as
``engine/peft.py`` builds it for every whole-model engine, never updated and never moved: the
adapters are what an optimizer state would be offloaded for, and they are small.

Longer than the usual module (about 700 lines) because the schedule, its gradient routing and
the GPU side only make sense together; the model is ``perfmodel``, its measurement
``fo_calibrate``, the choice among its candidates ``fo_trial``, the CPU side ``fo_host``.
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from functools import partial

import torch

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.engine.events import EMBED, HEAD, EventBus, InfoEvent
from workbench.engine.fo import calibrate as fo_calibrate
from workbench.engine.fo import trial as fo_trial
from workbench.engine.fo.host import HostUpdates, adamw, default_threads
from workbench.engine.fo.resident import (FirstOrderContract, prompt_loss, refuse_unsupported,
                                 trainable_params)
from workbench.engine.groups import GroupLayout, adapter_layouts, build_layouts, move_buffers
from workbench.engine.objective import Total, evaluate, objective_for
from workbench.engine.peft import base_values, block_adapter, frozen_groups
from workbench.engine.precision import autocast
from workbench.engine.protocol import StepOutput
from workbench.engine.stream.pinned import HostMemory
from workbench.engine.stream.streams import Streams
from workbench.engine.timing import OpTimer
from workbench.models.build import RandomInit
from workbench.models.lora import LoRAInit
from workbench.plan import placement
from workbench.plan.placement import (CHUNK, N_SLOTS, Candidate, Placement, Rate, Schedule,
                                      Stride, Subgroups)

class FOOffloadEngine(FirstOrderContract):
    """Args:
        model, source, device, bus: as ``FOEngine``.
        cfg: the run config; besides the FO knobs (amp, adam_*), ``subgroup_size``,
            ``update_stride`` ("auto": the performance model's candidates, one timed step
            each, the fastest kept: ``fo_trial``), ``gpu_resident_ratio`` and
            ``update_threads``.

    Attributes beyond the engine protocol: ``schedule``, ``calibration`` (measured rates,
    ``perfmodel.Rate`` by name: B, Bd, Ug, Uc, Dc), ``perf`` (the model's inputs from them),
    ``cpu_downcast`` (where 16-bit weights are downcast), ``predicted_update_s`` and
    ``update_seconds`` (measured per step: from the end of the backward pass on the GPU to the
    end of the last update work on either side).
    """

    def __init__(self, model, source, cfg: RunConfig, device: torch.device, bus: EventBus):
        refuse_unsupported(cfg, device)
        self.cfg, self.device, self.bus = cfg, device, bus
        self.cuda = device.type == "cuda"
        self.wdtype = torch.bfloat16 if cfg.amp == "bf16" else torch.float32
        self.word = 2 if self.wdtype == torch.bfloat16 else 4
        self.adapter = block_adapter(model, cfg)
        self.objective = objective_for(cfg, model.config.vocab_size)
        if cfg.peft == "lora":  # AdamW over the adapters only; the frozen base stays put
            self.frozen = frozen_groups(self.adapter, source, cfg, device)
            self.layouts, source = adapter_layouts(self.adapter), LoRAInit()
            self.block_ids = list(range(len(self.layouts)))
        else:
            embed, blocks, head = build_layouts(self.adapter)
            self.frozen, self.layouts = [], [embed, *blocks, head]
            self.block_ids = [EMBED, *range(len(blocks)), HEAD]
        self.offsets, n = [], 0
        for lay in self.layouts:
            self.offsets.append(n)
            n += lay.numel
        self.groups = Subgroups(n, max(1, min(cfg.subgroup_size, n)))
        self.numel, self.sub, self.n_sub = n, self.groups.size, self.groups.count
        self.host = HostMemory(self.cuda)
        self.p32, self.m, self.v, self.g32 = (self.host.empty(n) for _ in range(4))
        self.m.zero_()
        self.v.zero_()
        self.w = torch.empty(n, dtype=self.wdtype, device=device)
        # Updates write w through this alias: the same memory, but a version counter of its
        # own, so uploading block j while backward still holds saved views of earlier blocks'
        # weights trips no autograd check (backward is done with j once its grads are in).
        self.w_out = self.w.data
        self._materialise(source)
        self.params = [trainable_params(lay, self.w[o:o + lay.numel])
                       for lay, o in zip(self.layouts, self.offsets)]
        self._hooks = [p.register_post_accumulate_grad_hook(partial(self._on_grad, gi, ei))
                       for gi, ps in enumerate(self.params) for ei, p in enumerate(ps)]
        move_buffers([model], device)
        self.segments = [self._decay_segments(j) for j in range(self.n_sub)]
        self.streams = Streams(device, overlap=True)
        self.prefetch = torch.cuda.Stream(device) if self.cuda else None
        # Flush-outs get a stream of their own: not queued behind the gradients' D2H.
        self.evict = torch.cuda.Stream(device) if self.cuda else None
        self.timer = OpTimer(device, bus, cfg.telemetry)
        self.bytes_h2d = self.bytes_d2h = 0
        self.adam_step = 0
        self._step_dev = torch.zeros((), device=device)
        self._step_cpu = torch.zeros(())
        self.scale, self._good_steps = (2.0 ** 16 if cfg.amp == "fp16" else 1.0), 0
        self._found_inf = torch.zeros(2, device=device)  # [offload stream, compute stream]
        self._inv_scale = torch.full((), 1.0 / self.scale, device=device)
        # fp32 staging of 16-bit gradients on their way to the host (``grads_down``).
        self._upcast = (None if self.wdtype == torch.float32 else
                        [torch.empty(min(CHUNK, n), device=device) for _ in range(2)])
        self._upcast_turn = 0
        self._flushed: dict[int, object] = {}  # subgroup -> its last flush-out (host copy valid)
        self._slot_free: list = [None] * N_SLOTS
        self._prefetch_span = None  # the prefetch span of the subgroup whose pieces go up now
        self._clock: deque = deque()
        self.update_seconds: list[float] = []
        if self.cuda:
            torch.cuda.synchronize(device)  # setup: pins the CUDA clock to the host clock
            self._origin = torch.cuda.Event(enable_timing=True)
            self._origin.record()  # time zero of the update clock on the GPU ...
            torch.cuda.synchronize(device)  # ... read with the host clock right after it passed
            self._origin_host = time.perf_counter()
        self.host_side = HostUpdates(self, cfg.update_threads or default_threads(self.cuda))
        self.calibration = self.calibrate()
        self.perf = placement.inputs(self.calibration, self.word)
        self.res_p = self.res_m = self.res_v = None
        self.schedule: Schedule | None = None
        tries = (self.candidates(cfg.gpu_resident_ratio) if cfg.update_stride == "auto"
                 else [])
        self._trial = fo_trial.ScheduleTrial(tries) if len(tries) > 1 else None
        self._next: fo_trial.Candidate | None = None  # the placement the next step begins with
        if self._trial is not None:
            first = self._trial.current
            self.reschedule(first.stride, cfg.gpu_resident_ratio, first.cpu_downcast)
        else:
            self.reschedule(cfg.update_stride, cfg.gpu_resident_ratio)

    # --- setup ------------------------------------------------------------------------------
    def _materialise(self, source) -> None:
        """Fill the fp32 masters (random init runs on the GPU, as the other engines do there)
        and the compute weights."""
        for lay, o in zip(self.layouts, self.offsets):
            if not lay.numel:
                continue
            host = self.p32[o:o + lay.numel]
            if self.cuda and isinstance(source, RandomInit):
                staging = torch.empty(lay.numel, device=self.device)
                source.fill(lay.name, lay.named_views(staging), self.cfg.seed)
                host.copy_(staging)  # setup only: a synchronous copy is fine here
                self.w[o:o + lay.numel].copy_(staging)
            else:
                source.fill(lay.name, lay.named_views(host), self.cfg.seed)
                self.w[o:o + lay.numel].copy_(host)

    def _decay_segments(self, j: int) -> list[tuple[int, int, bool]]:
        """(lo, hi, decayed) runs of subgroup j, relative to its start."""
        a, b = self.bounds(j)
        cuts = []
        for lay, o in zip(self.layouts, self.offsets):
            for lo, hi, d in ((o, o + lay.n_decay, True), (o + lay.n_decay, o + lay.numel, False)):
                lo, hi = max(lo, a), min(hi, b)
                if hi > lo:
                    if cuts and cuts[-1][2] == d and cuts[-1][1] == lo - a:
                        cuts[-1] = (cuts[-1][0], hi - a, d)
                    else:
                        cuts.append((lo - a, hi - a, d))
        return cuts

    def bounds(self, j: int) -> tuple[int, int]:
        """Subgroup j's [start, end) in the flat parameter order."""
        return self.groups.bounds(j)

    def calibrate(self, stopwatch=None, reps: int = fo_calibrate.REPS) -> dict[str, Rate]:
        """The model's inputs measured with the step's own operations (``fo_calibrate``);
        published as ``fo_calibration`` (every repetition, median, spread)."""
        rates = fo_calibrate.calibrate(self, stopwatch, reps)
        self.bus.publish(InfoEvent("fo_calibration", {k: r.as_dict() for k, r in rates.items()}))
        return rates

    def reschedule(self, update_stride: str | int, resident_ratio: float,
                   cpu_downcast: bool | None = None) -> Schedule:
        """(Re)place subgroups: "auto" or a stride, the resident share, and where 16-bit
        weights are downcast (None: the site the model predicts faster). Moves resident state
        between host and GPU; waits for all pending work (call between steps)."""
        self.sync()
        if self.res_p is not None:  # bring the old residents' state home
            r0 = self.schedule.resident.start * self.sub
            for host, dev in ((self.p32, self.res_p), (self.m, self.res_m), (self.v, self.res_v)):
                host[r0:].copy_(dev)
        # Free the old placement's GPU buffers before allocating the new ones (memory caps).
        self.res_p = self.res_m = self.res_v = self._res_g = self.keep = None
        self.slots = []
        self.host_side.slot = None
        sixteen = self.wdtype != torch.float32
        self.placement = placed = self.plan(update_stride, resident_ratio, cpu_downcast)
        self.predicted_update_s, self.cpu_downcast = placed.predicted_s, placed.cpu_downcast
        s, self.split = placed.schedule, placed.split
        self.schedule = s
        r0 = s.resident.start * self.sub if len(s.resident) else self.numel
        self.res_p, self.res_m, self.res_v = (
            tuple(t[r0:].to(self.device, copy=True) for t in (self.p32, self.m, self.v))
            if r0 < self.numel else (None,) * 3)
        self._keep_at: dict[int, int] = {}  # GPU-side subgroup -> offset of its grads in `keep`
        kept = 0
        for j in sorted((*s.gpu, *s.resident)):
            self._keep_at[j] = kept
            kept += self._size(j)
        self.keep = torch.empty(kept, dtype=self.wdtype, device=self.device)
        convert = self.wdtype != torch.float32
        self._pieces = self.groups.pieces(s)
        size = min(self.sub, placement.SLOT_PIECE)
        self.slots = [tuple(torch.empty(size, device=self.device) for _ in range(3 + convert))
                      for _ in range(min(N_SLOTS, len(self._pieces)))]
        self._res_g = (torch.empty(self.sub, device=self.device)
                       if convert and len(s.resident) else None)
        self.host_side.place(self.cpu_downcast)
        self._routes = [self._route(gi) for gi in range(len(self.layouts))]
        self._flushed.clear()
        self._slot_free = [None] * N_SLOTS
        k = placed.balance
        t_cpu, t_gpu = placed.sides(self.numel)
        self.bus.publish(InfoEvent("fo_stride", s.stride))
        self.bus.publish(InfoEvent("fo_perf_inputs", {
            **self.perf.as_dict(), "k": k if math.isfinite(k) else None, "subgroups": self.n_sub,
            "subgroup_size": self.sub, "gpu_subgroups": len(s.gpu),
            "resident_subgroups": len(s.resident), "cpu_subgroups": len(s.cpu),
            "downcast": "cpu" if self.cpu_downcast else "gpu" if sixteen else "none",
            "update_threads": self.host_side.threads, "predicted_cpu_s": t_cpu,
            "predicted_gpu_s": t_gpu,
            "spread": {name: r.spread for name, r in self.calibration.items()}}))
        self.bus.publish(InfoEvent("fo_update_predicted_s", self.predicted_update_s))
        self.update_seconds = []
        return s

    def plan(self, update_stride: Stride, resident_ratio: float,
             cpu_downcast: bool | None = None) -> Placement:
        """The placement ``reschedule`` would make, without making it (``plan/placement.py``)."""
        return placement.place(self.perf, self.groups, update_stride, resident_ratio,
                               cpu_downcast)

    def candidates(self, resident_ratio: float) -> list[Candidate]:
        """What "auto" tries (``fo/trial.py``; ``placement.candidates``)."""
        return placement.candidates(self.perf, self.groups, resident_ratio)

    def _size(self, j: int) -> int:
        return self.groups.numel_of(j)

    def _route(self, gi: int) -> tuple[list, list, dict]:
        """Group gi's gradient routing, ranges relative to the group: host pieces (lo, hi, j),
        one per CPU subgroup j it overlaps; kept pieces (lo, hi, keep offset); and how many
        host pieces each CPU subgroup gets from it."""
        o, n = self.offsets[gi], self.layouts[gi].numel
        host, kept, touches = [], [], {}
        cpu = set(self.schedule.cpu)
        for j in range(o // self.sub, -(-(o + n) // self.sub) if n else o // self.sub):
            a, b = self.bounds(j)
            lo, hi = max(a, o) - o, min(b, o + n) - o
            if hi <= lo:
                continue
            if j in cpu:
                touches[j] = touches.get(j, 0) + 1
                host.append((lo, hi, j))
            else:
                kept.append((lo, hi, self._keep_at[j] + (lo + o - a)))
        return host, kept, touches

    # --- forward / backward and the gradient flush -------------------------------------------
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One AdamW step on the batch's prompt loss; returns the loss (0-d device tensor).
        While "auto" tries its candidates (``fo_trial``) the step is timed whole, and the next
        candidate (or the winner) is placed when the next step begins: between steps the
        gradients and state still read as this step's placement left them."""
        nxt, self._next = self._next, None
        if nxt is not None and (nxt.stride, bool(nxt.cpu_downcast)) != (
                self.schedule.stride, self.cpu_downcast):
            self.reschedule(nxt.stride, self.cfg.gpu_resident_ratio, nxt.cpu_downcast)
        if self._trial is None:
            return self._train_step(batch, step, lr, wd)
        self.sync()  # a trial step is timed whole: nothing of the one before still running ...
        t0 = time.perf_counter()
        out = self._train_step(batch, step, lr, wd)
        self.sync()  # ... up to its last copy
        self._next = self._trial.record(time.perf_counter() - t0)
        if self._trial.done:
            self.bus.publish(InfoEvent("fo_trial", self._trial.summary()))
            self._trial = None
        return out

    @property
    def trying(self) -> bool:
        """True while "auto" is still timing its candidate placements (the winner is placed
        at the start of the first step after)."""
        return self._trial is not None

    def _train_step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        self._resolve_clock()
        compute = self.streams.compute
        self._step = step
        self._grads = [[None] * len(ps) for ps in self.params]
        self._left = [len(ps) for ps in self.params]
        self._waiting = {}  # CPU subgroup -> host pieces still to be flushed
        for _, _, touches in self._routes:
            for j, c in touches.items():
                self._waiting[j] = self._waiting.get(j, 0) + c
        self._ready: dict[int, object] = {}  # CPU subgroup -> its gradients' D2H, as they come
        # Loss scaling (fp16) decides whether to skip only once every gradient is in: then the
        # CPU side starts after backward; otherwise each CPU subgroup as its gradients land.
        self._early = self.scale == 1.0
        if self._early:
            self._begin_update(step, lr, wd)
        else:
            self._found_inf.zero_()
        self._fetched: dict[int, object] = {}
        for k in range(len(self.slots)):  # the first slots fill during forward and backward
            self._prefetch(k)
        with autocast(self.device, self.cfg.amp):
            loss = prompt_loss(self.adapter, self.objective, batch, self.timer, step, compute)
        with self.timer.span("backward", "compute", compute, step, EMBED):
            (loss * self.scale if self.scale != 1.0 else loss).backward()
        for gi, left in enumerate(self._left):  # groups with parameters that got no gradient
            if left > 0 and self.layouts[gi].numel:
                self._flush_group(gi)
        self._update(step, lr, wd)
        self.timer.poll()
        return StepOutput(loss.detach())

    def _begin_update(self, step: int, lr: float, wd: float) -> None:
        self.adam_step += 1
        self._step_dev.fill_(self.adam_step)
        self._step_cpu.fill_(self.adam_step)
        cfg = self.cfg
        self._hyper = dict(lr=lr, beta1=cfg.adam_beta1, beta2=cfg.adam_beta2, eps=cfg.adam_eps)
        self._wd = wd
        self.host_side.begin(step, wd, self._hyper, self._step_cpu)

    def _on_grad(self, gi: int, ei: int, param: torch.Tensor) -> None:
        """Post-accumulate-grad hook (on the autograd thread): take the gradient; flush the
        group once all its parameters have one."""
        self._grads[gi][ei], param.grad = param.grad, None
        self._left[gi] -= 1
        if self._left[gi] == 0:
            self._flush_group(gi)

    def _flush_group(self, gi: int) -> None:
        s, lay = self.streams, self.layouts[gi]
        grads = [g if g is not None else torch.zeros(e.shape, dtype=self.wdtype, device=self.device)
                 for g, e in zip(self._grads[gi], lay.entries)]
        self._grads[gi], self._left[gi] = [], -1  # flushed
        host, kept, _ = self._routes[gi]
        for lo, hi, at in kept:  # on the compute stream, where backward wrote them
            _gather(grads, lo, hi, self.keep[at:at + hi - lo])
        if kept and self.scale != 1.0:  # fp32 grads of a scaled loss: unscale, note inf / nan
            torch._amp_foreach_non_finite_check_and_unscale_(
                [self.keep[at:at + hi - lo] for lo, hi, at in kept], self._found_inf[1],
                self._inv_scale)
        if not host:
            return
        o = self.offsets[gi]
        # The grads are complete where backward has got to on its (compute) stream.
        produced = s.record(torch.cuda.current_stream(self.device) if self.cuda else None)
        with s.on(s.offload):
            s.wait(s.offload, produced)  # the backward kernels that wrote these grads must finish
            if self.scale != 1.0:  # in place: the kept parts were copied aside already
                torch._amp_foreach_non_finite_check_and_unscale_(grads, self._found_inf[0],
                                                                 self._inv_scale)
            for lo, hi, j in host:
                with self.timer.span("grad-d2h", "offload", s.offload, self._step, j,
                                     4 * (hi - lo)):
                    self.grads_down(grads, lo, hi, o + lo)
                done = s.record(s.offload)  # j's piece is on the host after this
                self.bytes_d2h += 4 * (hi - lo)
                self._waiting[j] -= 1
                if self._waiting[j] == 0:
                    self._ready[j] = done
                    if self._early:
                        self.host_side.submit(j, done)
        if self.cuda:
            for g in grads:
                g.record_stream(s.offload)  # allocated on the compute stream, read on this one

    def grads_down(self, parts: list[torch.Tensor], lo: int, hi: int, at: int) -> None:
        """Elements [lo, hi) of the concatenated gradients ``parts`` (compute dtype, on the
        device; no concatenated copy is made) into ``g32[at:]`` as fp32, on the offload stream.
        fp32 goes down as it is. 16-bit is upcast a ``CHUNK`` at a time into the two staging
        buffers in turn: the stream's order makes each upcast wait for the copy that last read
        its buffer, so the GPU memory this takes does not grow with the gradients queued
        behind the link (an fp32 temporary per chunk did: 4 B per queued parameter)."""
        if self._upcast is None:
            _gather(parts, lo, hi, self.g32[at:at + hi - lo], non_blocking=self.cuda)
            return
        for c in range(lo, hi, CHUNK):
            e = min(c + CHUNK, hi)
            buf = self._upcast[self._upcast_turn][:e - c]
            self._upcast_turn ^= 1
            _gather(parts, c, e, buf)
            self.g32[at + c - lo:at + e - lo].copy_(buf, non_blocking=self.cuda)

    # --- the update phase -------------------------------------------------------------------
    def _update(self, step: int, lr: float, wd: float) -> None:
        s = self.streams
        start = self._mark(s.compute)  # the backward pass has been enqueued up to here
        if not self._early:
            if self._skip_step(s.record(s.offload), s.record(s.compute)):
                return
            self._begin_update(step, lr, wd)
            for j, ready in self._ready.items():  # in the order their gradients landed
                self.host_side.submit(j, ready)
        self._gpu_side(step)
        if self.cuda:
            self.host_side.finish()  # the host waits for the worker to enqueue every upload
            with self.timer.span("gpu-wait", "wait", s.compute, step, EMBED):
                s.wait(s.compute, s.record(s.upload))  # the next forward reads uploaded weights
        else:
            with self.timer.span("gpu-wait", "wait", None, step, EMBED):
                self.host_side.finish()  # this thread (the "GPU") waits for the CPU side
        ends = [self._mark(st) for st in (s.compute, s.offload, s.upload, self.evict)]
        self._clock.append((start, ends, time.perf_counter()))
        self._resolve_clock()

    def _gpu_side(self, step: int) -> None:
        s, sched = self.streams, self.schedule
        r0 = sched.resident.start * self.sub
        for j in sched.resident:  # no transfers
            a, b = self.bounds(j)
            with self.timer.span("gpu-update", "compute", s.compute, step, j, 0, "resident"):
                self.update_on_gpu(self.res_p[a - r0:b - r0], self.res_m[a - r0:b - r0],
                                    self.res_v[a - r0:b - r0], self._kept(j), self._res_g,
                                    self.w_out[a:b], self.segments[j], self._wd, self._hyper,
                                    self._step_dev)
        # One gpu-update and one flush-out span per subgroup, from its first piece to its last.
        updating = flushing = None
        for k, (j, a, b) in enumerate(self._pieces):
            ja, jb = self.bounds(j)
            n, q, first, last = b - a, k % len(self.slots), a == ja, b == jb
            slot = self.slots[q]
            s.wait(s.compute, self._fetched.pop(k))  # update only once p, m, v have landed
            if first:
                updating = self.timer.open(s.compute)
            self.update_on_gpu(*(t[:n] for t in slot[:3]), self._kept(j)[a - ja:b - ja],
                                slot[3] if len(slot) > 3 else None, self.w_out[a:b],
                                _within(self.segments[j], a - ja, b - ja), self._wd,
                                self._hyper, self._step_dev)
            if last:
                self.timer.close(updating, "gpu-update", "compute", s.compute, step, j, 0,
                                 "interleaved")
            updated = s.record(s.compute)  # this piece's update and compute weights are done
            with s.on(self.evict):
                s.wait(self.evict, updated)  # flush out only the updated values
                if first:
                    flushing = self.timer.open(self.evict)
                for src, dst in zip(slot[:3], (self.p32, self.m, self.v)):
                    dst[a:b].copy_(src[:n], non_blocking=self.cuda)
                # The slot may be refilled after this point, and j's host copy read once its
                # last piece is out.
                self._slot_free[q] = s.record(self.evict)
                if last:
                    self.timer.close(flushing, "flush-out", "offload", self.evict, step, j,
                                     12 * (jb - ja))
                    self._flushed[j] = self._slot_free[q]
            self.bytes_d2h += 12 * n
            if k + len(self.slots) < len(self._pieces):
                self._prefetch(k + len(self.slots))

    def _prefetch(self, k: int) -> None:
        """(p, m, v) of the k-th piece of the interleaved subgroups into its slot, on the
        prefetch stream; one ``prefetch`` span per subgroup, from its first piece to its last."""
        s, (j, a, b) = self.streams, self._pieces[k]
        ja, jb = self.bounds(j)
        slot = self.slots[k % len(self.slots)]
        with s.on(self.prefetch):
            s.wait(self.prefetch, self._slot_free[k % len(self.slots)])  # last user flushed it
            s.wait(self.prefetch, self._flushed.get(j))  # last step's flush-out wrote j's copy
            if a == ja:  # pieces are prefetched in order: one subgroup's span open at a time
                self._prefetch_span = self.timer.open(self.prefetch)
            for dst, src in zip(slot[:3], (self.p32, self.m, self.v)):
                dst[:b - a].copy_(src[a:b], non_blocking=self.cuda)
            if b == jb:
                self.timer.close(self._prefetch_span, "prefetch", "upload", self.prefetch,
                                 self._step, j, 12 * (jb - ja))
            self._fetched[k] = s.record(self.prefetch)  # this piece of j is on the GPU
        self.bytes_h2d += 12 * (b - a)

    def _kept(self, j: int) -> torch.Tensor:
        at = self._keep_at[j]
        return self.keep[at:at + self._size(j)]

    def update_on_gpu(self, p, m, v, kept, scratch, out, segments, wd, hyper, step_t) -> None:
        """AdamW on a GPU-side subgroup from its kept gradients (upcast into ``scratch`` under
        bf16), then its compute weights ``out`` from the new p."""
        g = kept if scratch is None else scratch[:kept.numel()].copy_(kept)
        adamw(p, g, m, v, segments, wd, hyper, step_t)
        out.copy_(p)  # the next forward's weights, downcast on the GPU

    def _skip_step(self, *landed) -> bool:
        """fp16 loss scaling: skip the update and halve the scale on inf / nan gradients."""
        for event in landed:
            if event is not None:
                event.synchronize()  # found_inf is written on the offload and compute streams
        if float(self._found_inf.sum()) > 0:
            self.scale, self._good_steps = self.scale / 2, 0
        else:
            self._good_steps += 1
            if self._good_steps % 2000 == 0:
                self.scale *= 2
        self._inv_scale.fill_(1.0 / self.scale)
        return self._good_steps == 0

    # --- timing -----------------------------------------------------------------------------
    def _mark(self, stream):
        """A timing mark: a CUDA event on ``stream``, or the host clock on a CPU."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)  # marks where the stream's enqueued work ends, for timing only
        return event

    def _resolve_clock(self, wait: bool = False) -> None:
        """Turn finished update phases into seconds (never blocks unless ``wait``)."""
        while self._clock:
            start, ends, cpu_end = self._clock[0]
            if self.cuda:
                if not wait and not all(e.query() for e in (start, *ends)):
                    return
                for e in ends:
                    e.synchronize()  # only with wait (end of run); otherwise already complete
                t_start = self._origin_host + self._origin.elapsed_time(start) / 1e3
                gpu_end = max(start.elapsed_time(e) for e in ends) / 1e3
                seconds = max(gpu_end, cpu_end - t_start)
            else:
                seconds = cpu_end - start
            self._clock.popleft()
            self.update_seconds.append(seconds)
            timed = self.update_seconds[1:] or self.update_seconds  # the first step warms up
            self.bus.publish(InfoEvent("fo_update_measured_s", sum(timed) / len(timed)))

    # --- engine protocol --------------------------------------------------------------------
    def flush(self) -> None:
        """Nothing is pending between steps: each step's update is enqueued inside it."""

    def evaluate(self, dev, batch_size: int, total: Total | None = None) -> dict[str, float]:
        """The objective's metrics on ``dev`` with the current compute weights."""
        return evaluate(self.objective, self.adapter, dev, self.device, self.cfg.amp, batch_size,
                        total=total)

    def sync(self) -> None:
        """Wait for every copy and kernel (outside steps: before reading host buffers); the
        finished update phases land in ``update_seconds``."""
        if self.cuda:
            torch.cuda.synchronize(self.device)  # outside steps only: host buffers are read next
        self._resolve_clock()

    def _home_residents(self) -> None:
        if self.res_p is not None:
            self.p32[self.schedule.resident.start * self.sub:].copy_(self.res_p)

    def state_flats(self) -> list[torch.Tensor]:
        """Every group's fp32 master weights in canonical order (host tensors)."""
        self.sync()
        self._home_residents()
        return [self.p32[o:o + lay.numel] for lay, o in zip(self.layouts, self.offsets)]

    def base_flats(self) -> Sequence[torch.Tensor]:
        """The frozen base groups' weights as fp32, one at a time (peft runs; else empty)."""
        return base_values(self.frozen)

    def load_state_flats(self, flats: list[torch.Tensor]) -> None:
        """Load fp32 weights (Adam's m and v are kept) into the masters and the compute weights."""
        self.sync()
        for lay, o, flat in zip(self.layouts, self.offsets, flats):
            self.p32[o:o + lay.numel].copy_(flat)
            self.w[o:o + lay.numel].copy_(self.p32[o:o + lay.numel])
        if self.res_p is not None:
            self.res_p.copy_(self.p32[self.schedule.resident.start * self.sub:])

    def group_layouts(self) -> list[GroupLayout]:
        return list(self.layouts)

    def grad_flats(self) -> list[torch.Tensor]:
        """The last step's fp32 gradients per group, on the host (diagnostics and tests)."""
        self.sync()
        full = torch.empty(self.numel)
        for j in range(self.n_sub):
            a, b = self.bounds(j)
            full[a:b] = self._kept(j).float().cpu() if j in self._keep_at else self.g32[a:b]
        return [full[o:o + lay.numel] for lay, o in zip(self.layouts, self.offsets)]

    def gpu_param_bytes(self) -> int:
        """Compute weights, kept gradients, slots, resident (p, m, v) and a frozen base on
        the GPU."""
        if not self.cuda:
            return 0
        tensors = [self.w, self.keep, self.res_p, self.res_m, self.res_v, self._res_g,
                   self.host_side.slot, *(t for slot in self.slots for t in slot),
                   *(g.flat for g in self.frozen)]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def close(self) -> None:
        """Drain copies, the update worker and timing events, drop the hooks, unregister host
        memory."""
        self.sync()
        self.host_side.close()
        self.timer.poll(wait=True)
        self._resolve_clock(wait=True)
        self._home_residents()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.host.release()


def _within(segments: list[tuple[int, int, bool]], lo: int, hi: int) -> list[tuple[int, int, bool]]:
    """A subgroup's (lo, hi, decayed) runs cut to its elements [lo, hi), relative to lo."""
    return [(max(a, lo) - lo, min(b, hi) - lo, d) for a, b, d in segments if min(b, hi) > max(a, lo)]


def _gather(parts: list[torch.Tensor], lo: int, hi: int, out: torch.Tensor,
            non_blocking: bool = False) -> None:
    """``out`` = elements [lo, hi) of the concatenation of ``parts`` (no concatenated copy),
    converted to ``out``'s dtype."""
    pos = 0
    for t in parts:
        a, b = max(lo, pos), min(hi, pos + t.numel())
        if b > a:
            out[a - lo:b - lo].copy_(t.reshape(-1)[a - pos:b - pos], non_blocking=non_blocking)
        pos += t.numel()
        if pos >= hi:
            return
