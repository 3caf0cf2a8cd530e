"""First-order training with interleaved offloaded optimizer states (Deep Optimizer States).

Where things live (``flat.py``). The host holds, page-locked, the fp32 master weights p, Adam's m
and v and the gradients of all parameters (fp32, or bf16 for the one-pass CPU AdamW,
``adamw16.py``; 16, 14 or with bf16 moments 12 bytes per parameter), one buffer each over the
canonically ordered, concatenated parameter groups, cut into ``subgroup_size`` subgroups. The GPU
holds the compute weights w (bf16 under amp=bf16, else fp32) the forward and backward passes read,
and, for the placement (``plan/placement.py``: which subgroups are updated on which side), the
gradients of GPU-updated subgroups, ``N_SLOTS`` slots of up to ``SLOT_PIECE`` elements, and the (p,
m, v) of the static resident share (``gpu_resident_ratio``, the last subgroups, TwinFlow-style).

A step. Forward and backward on w; the first interleaved subgroups' (p, m, v) are prefetched into
their slots meanwhile (``gpu.py``). As each group's gradients complete, the gradient flush
(``grads.py``) keeps the GPU-updated parts and sends the CPU-updated parts to the host; a CPU
subgroup whose gradients are all on their way goes to the host worker (``host.py``), which updates
it (``cpu_adamw``: torch's fused AdamW or the one-pass kernel) as soon as they land, while backward
goes on, and sends the result up into w. After backward the GPU side updates its subgroups
(``gpu.py``). The next forward waits for the last upload. Every GPU-side dependency is an event;
the host blocks only where it must read or reuse host memory a copy still writes or reads, and at
the end of the step for the worker. On a CPU-only machine both sides run on the CPU and the streams
are no-ops, so the schedule is tested in CI. ``timeline.py`` times each step's update phase.

The timeline. Per subgroup and step: ``grad-d2h`` (offload), ``cpu-wait`` / ``cpu-update`` /
``downcast`` / ``upload-weights`` (the CPU side), ``prefetch`` / ``gpu-update`` / ``flush-out``
(the GPU side), and one ``gpu-wait`` per step (the compute stream waiting for the CPU side).

Placement. The engine places its subgroups with the rates it is given a way to measure
(``measure``: ``calibrate/fo.py`` times this engine's own parts), the model of
``plan/placement.py``, and, under update_stride=auto, one timed step per candidate
(``trial.py``). subgroup_size=auto (the default) proposes sizes (``plan/auto.py``): the strides
are tried at the first, then the best of them at each other size; between trial steps the flat
range is only re-cut (``FlatParams.recut``), no buffer moves.

Adapters (``peft=lora``): the range above is the adapter groups only (their p, m, v and
gradients on the host, their compute weights in w); the frozen base is held on the device as
``engine/peft.py`` builds it for every whole-model engine, never updated and never moved: the
adapters are what an optimizer state would be offloaded for, and they are small.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from functools import partial

import torch

from workbench.config import RunConfig, Stride
from workbench.data.batches import Batch
from workbench.engine.events import EMBED, EventBus, InfoEvent
from workbench.engine.fo import adamw16, trial
from workbench.engine.fo.adamw import AdamW
from workbench.engine.fo.flat import FlatParams
from workbench.engine.fo.gpu import GpuUpdates, host_grads
from workbench.engine.checkpoint import Snapshot
from workbench.engine.fo.grads import GradFlush, LossScale
from workbench.engine.fo.host import HostUpdates, default_threads
from workbench.engine.fo.parts import FOParts, Measure
from workbench.engine.fo.moments import DTYPES
from workbench.engine.methods.fo import (checkpoint_refusal, prompt_loss, refuse_unsupported,
                                          trainable_params)
from workbench.engine.fo.spans import PhaseTimer
from workbench.engine.fo.timeline import UpdateClock
from workbench.engine.groups import GroupLayout, adapter_layouts, build_layouts, move_buffers
from workbench.engine.objective import Objective, Total, evaluate, objective_for
from workbench.engine.peft import base_values, block_adapter, frozen_groups
from workbench.engine.precision import autocast
from workbench.engine.protocol import StepOutput
from workbench.engine.device.pinned import HostMemory
from workbench.engine.device.streams import Streams
from workbench.engine.timing import OpTimer
from workbench.models.lora import LoRAInit
from workbench.plan import auto, dma, placement
from workbench.plan.placement import Candidate, Placement


class FOOffloadEngine:
    """Args:
        model, source, device, bus: as ``FOEngine``.
        cfg: the run config; besides the FO knobs (amp, adam_*), ``subgroup_size`` ("auto": the
            sizes of ``plan/auto.py``, tried with the stride), ``update_stride`` ("auto": the
            model's candidates, one timed step each, the fastest kept: ``trial.py``),
            ``gpu_resident_ratio`` and ``update_threads``.
        measure: measures the rates the placement is made from (``calibrate/fo.py``).
        objective: what the loss is (default: ``cfg``'s, built without a tokenizer).

    Attributes beyond the engine protocol: ``flat``, ``placement`` (the current one: schedule,
    split, downcast site, prediction), ``calibration`` (measured rates by name), ``proposals``
    (the model's inputs, refitted to the trial's steps: ``perf``, ``contention``), ``clock``
    (its ``seconds``: each step's update phase since the last placement, from backward's end
    on the GPU to the last update work on either side).
    """

    def __init__(self, model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                 measure: Measure, objective: Objective | None = None):
        refuse_unsupported(cfg, device)
        self.cfg, self.device, self.bus, self.reduce = cfg, device, bus, None  # no data parallel
        self.cuda = device.type == "cuda"
        wdtype = torch.bfloat16 if cfg.amp == "bf16" else torch.float32
        self.word = 2 if wdtype == torch.bfloat16 else 4
        self.adapter = block_adapter(model, cfg)
        self.objective = objective or objective_for(cfg, model.config.vocab_size)
        if cfg.peft == "lora":  # AdamW over the adapters only; the frozen base stays put
            self.frozen = frozen_groups(self.adapter, source, cfg, device)
            layouts, source = adapter_layouts(self.adapter), LoRAInit()
        else:
            embed, blocks, head = build_layouts(self.adapter)
            self.frozen, layouts = [], [embed, *blocks, head]
        self.memory = HostMemory(self.cuda)
        numel = sum(lay.numel for lay in layouts)
        self.sizes = (auto.subgroup_sizes(numel, self.cuda) if cfg.subgroup_size == "auto"
                      else (cfg.subgroup_size,))
        one_pass, self.cpu_adamw = adamw16.choose(cfg.cpu_adamw, cfg.amp, cfg.adam_state_dtype)
        self.flat = FlatParams(layouts, self.sizes[0], device, wdtype, self.memory,
                               DTYPES[cfg.adam_state_dtype], wdtype if one_pass else torch.float32)
        self.flat.materialise(source, cfg.seed)
        params = [trainable_params(lay, view) for lay, view in
                  zip(layouts, self.flat.per_group(self.flat.w))]
        move_buffers([model], device)
        self.streams = Streams(device, overlap=True)
        self.timer = OpTimer(device, bus, cfg.telemetry)
        # The parts' spans, merged per phase above SPAN_LIMIT subgroups (``spans.py``).
        self.spans = PhaseTimer(self.timer, bus)
        self.clock = UpdateClock(self.timer, bus)
        self.adam_step = 0
        self._step_dev, self._step_cpu = torch.zeros((), device=device), torch.zeros(())
        self.loss_scale = LossScale(cfg.amp, device)
        self.host = HostUpdates(self.flat, self.streams, self.spans, bus, self.memory,
                                cfg.update_threads or default_threads(self.cuda), cfg.seed,
                                min(max(self.sizes), numel), one_pass)
        self.grads = GradFlush(self.flat, params, self.streams, self.spans, self.loss_scale,
                               self.host.submit)
        # the GPU side's own streams: prefetches, and flush-outs not queued behind gradient D2H
        self._prefetch, self._evict = ((torch.cuda.Stream(device), torch.cuda.Stream(device))
                                       if self.cuda else (None, None))
        self.gpu: GpuUpdates | None = None
        self._moved = [0, 0]  # bytes the GPU sides of earlier placements moved: up, down
        self.parts = FOParts(self.flat, self.grads, self.host, self.streams, cfg)
        self.calibration = measure(self.parts)
        self.bus.publish(InfoEvent("fo_calibration",
                                   {k: r.as_dict() for k, r in self.calibration.items()}))
        perf = placement.inputs(self.calibration, self.word,  # with a flushed gradient's bytes
                                placement.state_words(cfg.adam_state_dtype), self.flat.g.itemsize)
        # the CPU update under the step's DMA (``plan/dma.py``; None: predictions ignore it)
        contention = dma.of_rates(self.calibration)
        bus.publish(InfoEvent("fo_contention", contention.as_dict() if contention
                              else {"note": dma.NOTE}))
        rr, cal = cfg.gpu_resident_ratio, self.calibration
        # The model's inputs, refitted to the trial's steps (``trial.Proposals.observe``).
        self.proposals = trial.Proposals(perf, self.flat.numel, self.word, self.sizes, cfg,
                                         device, bus, contention, perf.grad_bytes * cal["Bd"].per_s,
                                         cal["Xd"].per_s if "Xd" in cal else None)
        self._marks = None  # timing marks around a trial step's forward and backward
        tries = (self.proposals.first(self.candidates(rr)) if cfg.update_stride == "auto"
                 else [self.proposals.candidate(cfg.update_stride, None, self.flat.sub)])
        more = self.proposals.more_to_try
        self._trial = (trial.ScheduleTrial(tries, trial.WARMUP,
                                           then=self.proposals.more if more else None)
                       if len(tries) > 1 or more else None)
        self._next: Candidate | None = None  # the placement the next step begins with
        if self._trial is not None:
            first = self._trial.current
            self.reschedule(first.stride, first.resident, first.cpu_downcast, first.size)
        else:
            self.reschedule(cfg.update_stride, rr)

    # --- placement --------------------------------------------------------------------------
    def plan(self, update_stride: Stride, resident_ratio: float,
             cpu_downcast: bool | None = None) -> Placement:
        """The placement ``reschedule`` would make, without making it (``plan/dma.py``)."""
        return self.proposals.place(update_stride, resident_ratio, cpu_downcast, self.flat.sub)

    perf = property(lambda self: self.proposals.perf)  # the model's inputs, as refitted
    contention = property(lambda self: self.proposals.contention)  # the same

    def candidates(self, resident_ratio: float) -> list[Candidate]:
        """What "auto" tries (``trial.py``; ``placement.candidates``)."""
        m = self.proposals
        return dma.candidates(m.perf, self.flat.groups, resident_ratio, m.contention, m.bwd)

    def reschedule(self, update_stride: Stride, resident_ratio: float,
                   cpu_downcast: bool | None = None, size: int | None = None) -> Placement:
        """(Re)place subgroups: "auto" or a stride, the resident share, where 16-bit weights
        are downcast (None: the site the model predicts faster) and, given, a new subgroup
        size. Moves resident state between host and GPU; waits for all pending work (call
        between steps)."""
        self.sync()
        if self.gpu is not None:  # bring the old residents' state home, then free its buffers
            self.gpu.home()  # before the new placement's are allocated (memory caps)
            self._moved = [self._moved[0] + self.gpu.bytes_h2d,
                           self._moved[1] + self.gpu.bytes_d2h]
            self.gpu = None
        self.host.release()  # its GPU upload slot too
        if self.cuda:  # the old placement's blocks back to the device: a larger resident share
            torch.cuda.empty_cache()  # must not fail on the cache's fragments (9.6 GB at 6.7b)
        if size is not None and size != self.flat.sub:
            self.flat.recut(size)
        self.spans.place(self.flat.groups.count)
        self.resident_ratio = resident_ratio
        placed = self.placement = self.plan(update_stride, resident_ratio, cpu_downcast)
        s = placed.schedule
        self.gpu = GpuUpdates(self.flat, s, self.streams, self.spans, self._prefetch,
                              self._evict, self.cfg.seed)
        self.host.place(placed.cpu_downcast)
        self.grads.route(s, self.gpu.kept)
        k = placed.balance
        t_cpu, t_gpu = dma.sides(placed, self.flat.numel, self.proposals.contention)
        self.bus.publish(InfoEvent("fo_stride", s.stride))
        self.bus.publish(InfoEvent("fo_perf_inputs", {
            **self.proposals.perf.as_dict(), "k": k if math.isfinite(k) else None,
            "subgroups": self.flat.groups.count, "subgroup_size": self.flat.sub,
            "gpu_subgroups": len(s.gpu), "resident_subgroups": len(s.resident),
            "cpu_subgroups": len(s.cpu), "gpu_resident_ratio": self.resident_ratio,
            "downcast": "cpu" if placed.cpu_downcast else "gpu" if self.word == 2 else "none",
            "update_threads": self.host.threads, "cpu_adamw": self.cpu_adamw,
            "predicted_cpu_s": t_cpu, "predicted_gpu_s": t_gpu,
            "spread": {name: r.spread for name, r in self.calibration.items()}}))
        self.bus.publish(InfoEvent("fo_update_predicted_s", placed.predicted_s))
        self.clock.reset()
        return placed

    @property
    def bytes_h2d(self) -> int:
        """Bytes up the link so far: prefetches and the host side's uploads."""
        return self._moved[0] + self.gpu.bytes_h2d + self.host.bytes_h2d

    @property
    def bytes_d2h(self) -> int:
        """Bytes down the link so far: gradients and flush-outs."""
        return self._moved[1] + self.grads.bytes_d2h + self.gpu.bytes_d2h

    # --- a step -----------------------------------------------------------------------------
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One AdamW step on the batch's prompt loss; returns the loss (0-d device tensor).
        While "auto" tries its candidates (``trial.py``) the step is timed whole, and the next
        one (or the winner) is placed as the next step begins (gradients and state read as
        this step's placement left them until then)."""
        nxt, self._next = self._next, None
        now = self.placement
        while nxt is not None and nxt.key != (now.schedule.stride, now.cpu_downcast,
                                              self.flat.sub, self.resident_ratio):
            over = self._trial is not None and not self.proposals.fits(nxt)  # by the first
            try:  # step's peak, over the cap: skipped and listed, as one that runs out of memory
                if not over:
                    self.reschedule(nxt.stride, nxt.resident, nxt.cpu_downcast, nxt.size)
                    break
            except torch.OutOfMemoryError:
                if self._trial is None:
                    raise
            self.bus.publish(InfoEvent("fo_trial_skipped", nxt.key))
            nxt = self._trial.skip(over_cap=over)
        if self._trial is not None and self._trial.done:  # the last candidates were skipped:
            self._end_trial()  # the winner is placed (above), and no more steps are trials
        if self._trial is None:
            return self._train_step(batch, step, lr, wd)
        self.sync()  # a trial step is timed whole: nothing of the one before still running ...
        t0, timed = time.perf_counter(), len(self.clock.seconds)
        out = self._train_step(batch, step, lr, wd)
        self.sync()  # ... up to its last copy, its update phase resolved (none: skipped, fp16)
        update = self.clock.seconds[-1] if len(self.clock.seconds) > timed else None
        self.proposals.measured(self._trial.current)  # under a cap: what the others add to
        if self._trial.steps:  # the model refitted to this step (not the first: it warms up)
            f0, b0, b1 = (self.timer.at(m) for m in self._marks)
            self.proposals.observe(self.placement, self.host.busy, b0 - f0, b1 - b0)
        fresh = partial(self.candidates, self.resident_ratio)  # the model's, after the warm-up
        self._next = trial.after_step(self._trial, self.proposals, time.perf_counter() - t0,
                                      update, fresh if self.cfg.update_stride == "auto" else None)
        if self._trial.done:
            self._end_trial()
        return out

    def _end_trial(self) -> None:  # what the trial tried and kept goes into the run record
        self.bus.publish(InfoEvent("fo_trial", {**self._trial.summary(),
                                                "model": self.proposals.fitted()}))
        self._trial = None

    @property
    def trying(self) -> bool:
        """True while "auto" still times its candidates (the winner is placed a step after)."""
        return self._trial is not None

    def _train_step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        self.clock.resolve()
        compute, scale = self.streams.compute, self.loss_scale
        # Loss scaling (fp16) decides whether to skip only once every gradient is in: then the
        # CPU side starts after backward; otherwise each CPU subgroup as its gradients land.
        early = not scale.active
        self.grads.begin(step, early)
        if early:
            self._begin_update(step, lr, wd)
        else:
            scale.reset()
        self.gpu.begin(step)
        f0 = self.timer.mark(compute)  # read after a trial step's sync (``step``)
        with autocast(self.device, self.cfg.amp):
            loss = prompt_loss(self.adapter, self.objective, batch, self.timer, step, compute)
        b0 = self.timer.mark(compute)
        with self.timer.span("backward", "compute", compute, step, EMBED):
            (loss * scale.scale if scale.active else loss).backward()
        self._marks = (f0, b0, self.timer.mark(compute))
        self.grads.end()
        self._update(step, lr, wd, early)
        self.timer.poll()
        return StepOutput(loss.detach(), forward_passes=1)  # and a backward, not counted

    def _begin_update(self, step: int, lr: float, wd: float) -> None:
        self.adam_step += 1
        self._step_dev.fill_(self.adam_step)
        self._step_cpu.fill_(self.adam_step)
        cfg = self.cfg
        self._opt = AdamW(lr, wd, cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps)
        self.host.begin(step, self._opt, self._step_cpu, self.adam_step)

    def _update(self, step: int, lr: float, wd: float, early: bool) -> None:
        s = self.streams
        start = self.clock.start(s.compute)  # the backward pass has been enqueued up to here
        if not early:
            if self.loss_scale.skip(s.record(s.offload), s.record(s.compute)):
                return
            self._begin_update(step, lr, wd)
            for j, ready in self.grads.ready.items():  # in the order their gradients landed
                self.host.submit(j, ready)
        self.gpu.run(step, self._opt, self._step_dev, self.adam_step)
        if self.cuda:
            self.host.finish()  # the host waits for the worker to enqueue every upload
            with self.timer.span("gpu-wait", "wait", s.compute, step, EMBED):
                s.wait(s.compute, s.record(s.upload))  # the next forward reads uploaded weights
        else:
            with self.timer.span("gpu-wait", "wait", None, step, EMBED):
                self.host.finish()  # this thread (the "GPU") waits for the CPU side
        self.spans.flush()  # this step's merged phases, if any
        self.clock.stop(start, [s.compute, s.offload, s.upload, self._evict])
        self.clock.resolve()

    # --- engine protocol --------------------------------------------------------------------
    def flush(self) -> None:
        """Nothing is pending between steps: each step's update is enqueued inside it."""

    def evaluate(self, dev, batch_size: int, total: Total | None = None) -> dict[str, float]:
        """The objective's metrics on ``dev`` with the current compute weights."""
        return evaluate(self.objective, self.adapter, dev, self.device, self.cfg.amp, batch_size,
                        total=total)

    def sync(self) -> None:
        """Wait for every copy and kernel (outside steps: before reading host buffers); the
        finished update phases land in ``clock.seconds``."""
        if self.cuda:
            torch.cuda.synchronize(self.device)  # outside steps only: host buffers are read next
        self.clock.resolve()

    def state_flats(self) -> list[torch.Tensor]:
        """Every group's fp32 master weights in canonical order (host tensors)."""
        self.sync()
        self.gpu.home()
        return self.flat.per_group(self.flat.p32)

    def base_flats(self) -> Sequence[torch.Tensor]:
        """The frozen base groups' weights as fp32, one at a time (peft runs; else empty)."""
        return base_values(self.frozen)

    def load_state_flats(self, flats: list[torch.Tensor]) -> None:
        """Load fp32 weights (Adam's m and v are kept) into the masters and the compute weights."""
        self.sync()
        self.flat.load(flats)
        self.gpu.load()

    def group_layouts(self) -> list[GroupLayout]:
        return list(self.flat.layouts)

    def snapshot(self, next_step: int):
        raise checkpoint_refusal(self.cfg)  # (refused with the config before any work)

    def restore(self, snap: Snapshot) -> None:
        raise checkpoint_refusal(self.cfg)

    def grad_flats(self) -> list[torch.Tensor]:
        """The last step's fp32 gradients per group, on the host (diagnostics and tests)."""
        self.sync()  # the copies of the last step's gradients have landed
        return host_grads(self.flat, self.gpu)

    def gpu_param_bytes(self) -> int:
        """Compute weights, kept gradients, slots, resident (p, m, v) and a frozen base on
        the GPU."""
        if not self.cuda:
            return 0
        tensors = [self.flat.w, *self.gpu.buffers(), *self.host.buffers(),
                   *(g.flat for g in self.frozen)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def close(self) -> None:
        """Drain copies, the update worker and timing events, drop the hooks, unregister host
        memory."""
        self.sync()
        self.host.close()
        self.timer.poll(wait=True)
        self.clock.resolve(wait=True)
        if self.gpu is not None:  # None: a placement failed half-way (its error is raised)
            self.gpu.home()
        self.grads.close()
        self.memory.release()
