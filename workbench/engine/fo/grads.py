"""fo-offload's gradient flush: each gradient to the side that updates its subgroup, while the
backward pass goes on.

As a group's gradients complete (post-accumulate-grad hooks, on the autograd thread), the parts
of GPU-updated subgroups are copied aside into the kept buffer (``Kept``) on the compute stream,
and the parts of CPU-updated subgroups go down to the host's ``g`` on the offload stream: as
they are (fp32, or bf16 for the one-pass CPU AdamW), or upcast to fp32 a ``CHUNK`` at a time
through two staging buffers. A CPU subgroup whose pieces
are all down is ``ready``: with no loss scaling it is handed to the host side at once (``submit``),
so its update overlaps the rest of the backward pass. Backward writes gradients faster than the
link carries them: at most ``QUEUE_BYTES`` of them wait for it, then backward waits too. fp16
loss scaling (``LossScale``) unscales on the way and notes inf / nan on both streams; the step
is then decided after backward.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from workbench.engine.fo.flat import FlatParams
from workbench.engine.fo.spans import PhaseTimer
from workbench.engine.device.streams import Streams
from workbench.plan import placement
from workbench.plan.fo_memory import QUEUE_BYTES
from workbench.plan.placement import Schedule


@dataclass(frozen=True)
class Kept:
    """Where the gradients of GPU-updated subgroups are kept for their update: ``buffer``
    (compute dtype, on the device) and ``at`` (subgroup -> its offset in it)."""

    buffer: torch.Tensor
    at: dict[int, int]

    def of(self, j: int, n: int) -> torch.Tensor:
        """Subgroup j's n kept gradients."""
        return self.buffer[self.at[j]:self.at[j] + n]


class LossScale:
    """fp16's dynamic loss scale (1.0, inactive, otherwise): the scale, the inf / nan flags
    written on the offload and compute streams, and the skip-and-halve rule."""

    def __init__(self, amp: str, device: torch.device):
        self.scale, self._good_steps = (2.0 ** 16 if amp == "fp16" else 1.0), 0
        self.found_inf = torch.zeros(2, device=device)  # [offload stream, compute stream]
        self.inv_scale = torch.full((), 1.0 / self.scale, device=device)

    @property
    def active(self) -> bool:
        return self.scale != 1.0

    def reset(self) -> None:
        """A new step: no inf / nan seen yet."""
        self.found_inf.zero_()

    def skip(self, *landed) -> bool:
        """After backward: skip the update and halve the scale on inf / nan gradients (double
        it after 2000 good steps). ``landed``: the streams' events the flags are final after."""
        for event in landed:
            if event is not None:
                event.synchronize()  # found_inf is written on the offload and compute streams
        if float(self.found_inf.sum()) > 0:
            self.scale, self._good_steps = self.scale / 2, 0
        else:
            self._good_steps += 1
            if self._good_steps % 2000 == 0:
                self.scale *= 2
        self.inv_scale.fill_(1.0 / self.scale)
        return self._good_steps == 0


class GradFlush:
    """Args:
        flat: the parameters (their host gradients ``g``, layouts and subgroups).
        params: each group's leaf parameters, in ``flat.layouts`` order (hooks go on them).
        streams, timer: the engine's (``grad-d2h`` spans on the offload stream).
        loss: the loss scale.
        submit: hands a ready CPU subgroup and its D2H event to the host side.

    Attributes: ``ready`` (CPU subgroup -> its gradients' D2H event, this step, in landing
    order), ``bytes_d2h`` (sent down so far), ``upcast`` (the fp32 staging buffers; None where
    gradients go down as they are).
    """

    def __init__(self, flat: FlatParams, params: list[list[torch.nn.Parameter]],
                 streams: Streams, timer: PhaseTimer, loss: LossScale,
                 submit: Callable[[int, object], None]):
        self.flat, self.params, self.streams, self.timer = flat, params, streams, timer
        self.loss, self.submit = loss, submit
        self.device, self.cuda = flat.device, flat.device.type == "cuda"
        self.upcast = (None if flat.gdtype == flat.wdtype else
                       [torch.empty(min(placement.CHUNK, flat.numel), device=flat.device)
                        for _ in range(2)])
        self._turn = 0
        self.bytes_d2h = 0
        self._queue: deque[tuple[object, int]] = deque()  # (D2H read event, bytes) in order
        self._queued = 0
        self.waits = 0  # times backward waited for the link (``_bound_queue``)
        self.ready: dict[int, object] = {}
        self._hooks = [p.register_post_accumulate_grad_hook(partial(self._on_grad, gi, ei))
                       for gi, ps in enumerate(params) for ei, p in enumerate(ps)]

    def route(self, schedule: Schedule, kept: Kept) -> None:
        """A new placement: which pieces of each group go down, which are kept, and where."""
        self.kept = kept
        cpu = set(schedule.cpu)
        self._routes = [self._route(gi, cpu) for gi in range(len(self.flat.layouts))]

    def begin(self, step: int, early: bool) -> None:
        """A new step's backward pass; ``early``: submit CPU subgroups as they land."""
        self._step, self._early = step, early
        self._grads = [[None] * len(ps) for ps in self.params]
        self._left = [len(ps) for ps in self.params]
        self._waiting = {}  # CPU subgroup -> host pieces still to be flushed
        for _, _, touches in self._routes:
            for j, c in touches.items():
                self._waiting[j] = self._waiting.get(j, 0) + c
        self.ready = {}
        self._queue.clear()  # the last step's copies are down: its host side waited for each
        self._queued = 0

    def end(self) -> None:
        """After backward: flush the groups with parameters that got no gradient."""
        for gi, left in enumerate(self._left):
            if left > 0 and self.flat.layouts[gi].numel:
                self._flush_group(gi)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _route(self, gi: int, cpu: set[int]) -> tuple[list, list, dict]:
        """Group gi's gradient routing, ranges relative to the group: host pieces (lo, hi, j),
        one per CPU subgroup j it overlaps; kept pieces (lo, hi, keep offset); and how many
        host pieces each CPU subgroup gets from it."""
        f = self.flat
        o, n, sub = f.offsets[gi], f.layouts[gi].numel, f.sub
        host, kept, touches = [], [], {}
        for j in range(o // sub, -(-(o + n) // sub) if n else o // sub):
            a, b = f.bounds(j)
            lo, hi = max(a, o) - o, min(b, o + n) - o
            if hi <= lo:
                continue
            if j in cpu:
                touches[j] = touches.get(j, 0) + 1
                host.append((lo, hi, j))
            else:
                kept.append((lo, hi, self.kept.at[j] + (lo + o - a)))
        return host, kept, touches

    def _on_grad(self, gi: int, ei: int, param: torch.Tensor) -> None:
        """Post-accumulate-grad hook (on the autograd thread): take the gradient; flush the
        group once all its parameters have one."""
        self._grads[gi][ei], param.grad = param.grad, None
        self._left[gi] -= 1
        if self._left[gi] == 0:
            self._flush_group(gi)

    def _flush_group(self, gi: int) -> None:
        s, lay, loss, keep = self.streams, self.flat.layouts[gi], self.loss, self.kept.buffer
        grads = [g if g is not None else torch.zeros(e.shape, dtype=self.flat.wdtype,
                                                     device=self.device)
                 for g, e in zip(self._grads[gi], lay.entries)]
        self._grads[gi], self._left[gi] = [], -1  # flushed
        host, kept, _ = self._routes[gi]
        for lo, hi, at in kept:  # on the compute stream, where backward wrote them
            gather(grads, lo, hi, keep[at:at + hi - lo])
        if kept and loss.active:  # fp32 grads of a scaled loss: unscale, note inf / nan
            torch._amp_foreach_non_finite_check_and_unscale_(
                [keep[at:at + hi - lo] for lo, hi, at in kept], loss.found_inf[1],
                loss.inv_scale)
        if not host:
            return
        o = self.flat.offsets[gi]
        # The grads are complete where backward has got to on its (compute) stream.
        produced = s.record(torch.cuda.current_stream(self.device) if self.cuda else None)
        with s.on(s.offload):
            s.wait(s.offload, produced)  # the backward kernels that wrote these grads must finish
            if loss.active:  # in place: the kept parts were copied aside already
                torch._amp_foreach_non_finite_check_and_unscale_(grads, loss.found_inf[0],
                                                                 loss.inv_scale)
            for lo, hi, j in host:
                nbytes = (hi - lo) * self.flat.g.element_size()
                with self.timer.span("grad-d2h", "offload", s.offload, self._step, j, nbytes):
                    self.grads_down(grads, lo, hi, o + lo)
                done = s.record(s.offload)  # j's piece is on the host after this
                self.bytes_d2h += nbytes
                self._waiting[j] -= 1
                if self._waiting[j] == 0:
                    self.ready[j] = done
                    if self._early:
                        self.submit(j, done)
        if self.cuda:
            for g in grads:
                g.record_stream(s.offload)  # allocated on the compute stream, read on this one
            self._bound_queue(done, sum(g.numel() * g.element_size() for g in grads))

    def _bound_queue(self, read: object, nbytes: int) -> None:
        """Gradients whose D2H is queued hold their GPU memory until the offload stream has
        read them (``read``), and backward writes them faster than the link carries them: past
        ``QUEUE_BYTES`` queued (``plan/fo_memory.py``), the autograd thread waits for the
        oldest, so the queue never takes more GPU memory than the planner counts."""
        self._queue.append((read, nbytes))
        self._queued += nbytes
        while self._queued > QUEUE_BYTES and len(self._queue) > 1:
            event, n = self._queue.popleft()
            event.synchronize()  # backward waits for the link: those gradients are down
            self._queued -= n
            self.waits += 1

    def grads_down(self, parts: list[torch.Tensor], lo: int, hi: int, at: int) -> None:
        """Elements [lo, hi) of the concatenated gradients ``parts`` (compute dtype, on the
        device; no concatenated copy is made) into ``g[at:]`` on the offload stream. fp32, and
        16-bit into a 16-bit ``g`` (the one-pass CPU AdamW widens it), go down as they are. 16-bit
        into an fp32 ``g`` is upcast a ``CHUNK`` at a time into the two staging
        buffers in turn: the stream's order makes each upcast wait for the copy that last read
        its buffer, so the GPU memory this takes does not grow with the gradients queued
        behind the link (an fp32 temporary per chunk did: 4 B per queued parameter)."""
        g = self.flat.g
        if self.upcast is None:
            gather(parts, lo, hi, g[at:at + hi - lo], non_blocking=self.cuda)
            return
        for c in range(lo, hi, placement.CHUNK):
            e = min(c + placement.CHUNK, hi)
            buf = self.upcast[self._turn][:e - c]
            self._turn ^= 1
            gather(parts, c, e, buf)
            g[at + c - lo:at + e - lo].copy_(buf, non_blocking=self.cuda)


def gather(parts: list[torch.Tensor], lo: int, hi: int, out: torch.Tensor,
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
