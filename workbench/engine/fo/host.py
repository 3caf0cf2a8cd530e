"""The CPU side of fo-offload's update phase: host subgroups updated on a worker thread as their
gradients land, each sent up into the GPU's compute weights right after its update.

Why a thread. The backward pass hands each group's gradients to the host as it completes them
(post-accumulate-grad hooks); a CPU subgroup can be updated as soon as its gradients have
landed, while backward goes on through the earlier blocks. A one-worker pool runs the updates
in the order they were submitted (the order backward completed them) and enqueues each one's
upload at once, so the upload crosses the link while the worker updates the next subgroup.

Threads. torch's fused CPU AdamW runs on the worker's own OpenMP team, of ``threads`` threads
(the caller's thread count is left as it was). The worker reads it back (``threads``) and every
``cpu-update`` span says it.

Kernels. torch's fused AdamW on fp32 gradients, or (``one_pass``) the one-pass kernel of
``adamw16.py`` on the bf16 gradients as backward wrote them; bit-equal results.

Uploads. A 16-bit compute weight is either downcast on the CPU into a pinned staging buffer and
sent up (half the PCIe bytes; one more CPU pass with torch's kernel, none with the one-pass
kernel, which writes it in the same pass), or sent up as the fp32 master into a GPU slot and
downcast there; the placement (``plan/placement.py``) picks. fp32 compute weights go straight
up.

Timing. The worker never publishes: it keeps its spans (host clock, or CUDA events for the
uploads) and ``finish`` hands them over on the training thread.

What it owns: the worker, the pinned 16-bit staging buffers and the GPU upload slot. What it
reads and writes: the flat parameters' host buffers and compute weights (``FlatParams``), on the
engine's streams.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from workbench.engine.events import EventBus, OpEvent
from workbench.engine.fo.adamw import AdamW, OptState, Segment, adamw
from workbench.engine.fo.adamw16 import adamw16
from workbench.engine.fo.flat import FlatParams
from workbench.engine.fo.moments import CPU_CHUNK, HalfMoments, adamw_half
from workbench.engine.device.pinned import HostMemory
from workbench.engine.fo.spans import PhaseTimer
from workbench.engine.device.streams import Streams
from workbench.plan.placement import N_STAGES


def default_threads(cuda: bool) -> int:
    """``update_threads`` = 0: torch's thread count, less one on a GPU run (that core launches
    the backward pass's kernels while the update runs beside it)."""
    n = torch.get_num_threads()
    return max(1, n - 1) if cuda else n


def threads_text(n: int) -> str:
    """How a ``cpu-update`` span states its thread count."""
    return f"{n} thread" + ("s" if n != 1 else "")


class HostUpdates:
    """Args:
        flat: the parameters whose CPU subgroups this side updates and uploads.
        streams: the engine's streams (uploads go on ``upload``).
        timer, bus: where its spans go (handed over on the training thread, in ``finish``).
        memory: page-locked host memory for the staging buffers.
        threads: OpenMP threads of the CPU AdamW.
        seed: the run's seed (the stochastic rounding of bf16 moments, ``moments.py``).
        stage_size: elements of each staging buffer (the largest subgroup size a trial of
            subgroup_size=auto tries; default the current one).
        one_pass: update with the one-pass kernel (``flat.g`` holds bf16 gradients).

    Attributes: ``threads`` (as the worker sees them), ``bytes_h2d`` (uploaded so far, counted
    at each ``finish``), ``half`` (bf16 moments' scratch and noise; None for fp32 moments),
    ``busy`` (this step's [parameters, seconds] of CPU AdamW: its rate under the step's load,
    which update_stride=auto refits its model to, ``trial.py``).
    """

    def __init__(self, flat: FlatParams, streams: Streams, timer: PhaseTimer, bus: EventBus,
                 memory: HostMemory, threads: int, seed: int = 0,
                 stage_size: int | None = None, one_pass: bool = False):
        self.flat, self.streams, self.timer, self.bus, self.memory = (flat, streams, timer, bus,
                                                                      memory)
        self.cuda, self.one_pass = flat.device.type == "cuda", one_pass
        self.half = (HalfMoments(seed, torch.device("cpu"), min(CPU_CHUNK, flat.sub))
                     if flat.mdtype == torch.bfloat16 else None)
        caller = torch.get_num_threads()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="fo-cpu-update",
                                       initializer=torch.set_num_threads, initargs=(threads,))
        self.threads = self.pool.submit(torch.get_num_threads).result()  # as the worker sees it
        torch.set_num_threads(caller)  # the worker keeps its own team; the process default stays
        self.cpu_downcast = False
        self.stages: list[torch.Tensor] = []
        self.stage_size = stage_size or flat.sub
        self._stage_free: list = []
        self._next = 0
        self.slot: torch.Tensor | None = None
        self._jobs: list[Future] = []
        self._spans: list = []
        self.bytes_h2d = self._uploaded = 0
        self.step, self.opt, self.step_t = -1, None, None
        self.busy = [0, 0.0]

    def place(self, cpu_downcast: bool) -> None:
        """Where 16-bit compute weights are downcast: on the CPU (pinned staging buffers,
        allocated once) or on the GPU (one fp32 slot; the upload stream's order guards it)."""
        sixteen = self.flat.wdtype != torch.float32
        self.cpu_downcast = cpu_downcast and sixteen
        if self.cpu_downcast:
            self.stage(N_STAGES - 1)
        self._stage_free = [None] * N_STAGES
        self.slot = (torch.empty(self.flat.sub, device=self.flat.device)
                     if sixteen and not self.cpu_downcast else None)

    def release(self) -> None:
        """Free the GPU upload slot (before a new placement allocates its buffers)."""
        self.slot = None

    def stage(self, k: int) -> torch.Tensor:
        """Pinned 16-bit staging buffer k (of one subgroup), allocated on first use and kept."""
        while len(self.stages) <= k:
            self.stages.append(self.memory.empty(max(self.stage_size, self.flat.sub),
                                                 self.flat.wdtype))
        return self.stages[k]

    def begin(self, step: int, opt: AdamW, step_t: torch.Tensor, adam_step: int = 0) -> None:
        """This step's AdamW settings, (CPU) step count and Adam step (the rounding of bf16
        moments; before its first ``submit``)."""
        self.step, self.opt, self.step_t = step, opt, step_t
        self.busy = [0, 0.0]  # read after ``finish`` (the worker is idle then)
        if self.half is not None:
            self.half.t = adam_step

    def submit(self, j: int, ready) -> None:
        """Update CPU subgroup j once ``ready`` (its gradients' D2H; None on a CPU) has passed."""
        self._jobs.append(self.pool.submit(self._update, j, ready))

    def finish(self) -> None:
        """Wait (host) until this step's updates are done and their uploads enqueued; publish
        their spans on this thread. Re-raises the first error of a job."""
        jobs, self._jobs = self._jobs, []
        try:
            for job in jobs:
                job.result()
        finally:
            spans, self._spans = self._spans, []
            for s in spans:
                if isinstance(s, OpEvent):
                    self.timer.publish(s)
                else:
                    self.timer.track(*s)
            self.bytes_h2d += self._uploaded
            self._uploaded = 0

    def adamw(self, j: int, out: torch.Tensor | None = None) -> None:
        """AdamW on subgroup j's host state, in this thread; ``out``: as ``update``'s."""
        f = self.flat
        a, b = f.bounds(j)
        self.update(f.state(a, b), f.g[a:b], f.segments[j], self.opt, self.step_t, out, j)

    def update(self, state: OptState, g: torch.Tensor, segments: list[Segment], opt: AdamW,
               step_t: torch.Tensor, out: torch.Tensor | None = None, j: int = 0) -> None:
        """AdamW on host state (n,) from host gradients ``g`` (n,), in this thread, with this
        side's kernel: the one-pass one (``out``, if given, gets the new weights in bf16),
        torch's fused one, or bf16 moments' (``moments.py``; ``j``: the subgroup, for its
        rounding noise)."""
        if self.one_pass:
            adamw16(state, g, out, segments, opt, float(step_t), self.threads)
        elif self.half is None:
            adamw(state, g, segments, opt, step_t)
        else:
            adamw_half(state, g, segments, opt, step_t, self.half, j)

    def run(self, fn, *args):
        """``fn(*args)`` on the worker thread (its thread count), waited for."""
        return self.pool.submit(fn, *args).result()

    def buffers(self) -> list[torch.Tensor]:
        """Its device buffers (the upload slot, when weights are downcast on the GPU)."""
        return [self.slot] if self.slot is not None else []

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    # --- on the worker thread ----------------------------------------------------------------
    def _update(self, j: int, ready) -> None:
        f, s, timer = self.flat, self.streams, self.timer
        a, b = f.bounds(j)
        if ready is not None:
            t0 = timer.now()
            ready.synchronize()  # the CPU reads host gradients the offload stream is writing
            self._host("cpu-wait", "wait", j, t0)
        src, stage = f.p32[a:b], None
        if self.cpu_downcast:
            stage, self._next = self._next, (self._next + 1) % N_STAGES
        fused = stage is not None and self.one_pass  # the kernel writes the 16-bit weights
        if fused:
            self._stage_wait(stage, j)
        t0 = timer.now()
        self.adamw(j, self.stages[stage][:b - a] if fused else None)
        self.busy[0], self.busy[1] = self.busy[0] + b - a, self.busy[1] + timer.now() - t0
        self._host("cpu-update", "cpu", j, t0, ("one-pass, " if self.one_pass else "")
                   + threads_text(self.threads))
        if stage is not None:
            src = self.stages[stage][:b - a]
            if not fused:  # a pass of its own, after the update: the last upload had that long
                self._stage_wait(stage, j)
                t0 = timer.now()
                src.copy_(f.p32[a:b])  # fp32 -> 16-bit on the CPU: half the PCIe bytes
                self._host("downcast", "cpu", j, t0)
        nbytes = (b - a) * src.element_size()
        with s.on(s.upload):
            s.wait(s.upload, ready)  # backward is done reading w[a:b]: ready follows its grads
            t0, begin = timer.now(), self._mark(s.upload)
            if self.slot is not None:
                self.slot[:b - a].copy_(src, non_blocking=self.cuda)  # fp32 up ...
                f.w_out[a:b].copy_(self.slot[:b - a])  # ... downcast on the GPU, in stream order
            else:
                f.w_out[a:b].copy_(src, non_blocking=self.cuda)
            if stage is not None:
                self._stage_free[stage] = s.record(s.upload)  # staging reusable after it
            if begin is None:
                self._host("upload-weights", "upload", j, t0, nbytes=nbytes)
            else:
                self._spans.append(("upload-weights", "upload", self.step, j, nbytes, begin,
                                    self._mark(s.upload)))
        self._uploaded += nbytes

    def _stage_wait(self, k: int, j: int) -> None:
        """Wait until staging buffer k's last upload has read it (before subgroup j's weights
        are written into it); the wait is a ``cpu-wait`` span saying so."""
        if self._stage_free[k] is not None:
            t0 = self.timer.now()
            self._stage_free[k].synchronize()  # its last upload must have read it
            self._host("cpu-wait", "wait", j, t0, "staging buffer")

    def _host(self, op: str, stream: str, j: int, t0: float, detail: str = "",
              nbytes: int = 0) -> None:
        if self.timer.enabled:
            self._spans.append(OpEvent(op, stream, self.step, j, nbytes, t0, self.timer.now(),
                                       detail))

    def _mark(self, stream):
        """Where ``stream``'s enqueued work ends (a timing event; None without CUDA timing)."""
        return self.timer.mark(stream) if self.cuda and self.timer.enabled else None
