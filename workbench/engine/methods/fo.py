"""First-order fine-tuning: backprop and torch's AdamW, the whole model on one device.

The baseline the offloaded first-order engine is measured against. Weights live in the same flat
fp32 group buffers as the ZO engines (so ``state_flats`` and the run digest mean the same
thing), every group has a flat gradient buffer of the same layout that autograd accumulates
into, and the loss is the ZO engines' prompt loss over embed -> blocks -> head, so losses are
comparable across methods. Weight decay is AdamW's decoupled decay on the first ``n_decay``
elements of each group (the matrices), as in the ZO engines: each group is handed to the
optimizer as two tensors, its decayed prefix and the rest, in two parameter groups. With
``peft=lora`` the groups are the adapters (``engine/peft.py``); the frozen base is bound as
plain tensors that never require grad, so backprop reaches only the adapters.
"""
from __future__ import annotations

import torch
from torch import nn

from workbench.config import ConfigError, RunConfig, checkpoint_problem
from workbench.data.batches import Batch
from workbench.engine.checkpoint import Snapshot
from workbench.engine.events import EMBED, HEAD, EventBus
from workbench.engine.groups import GroupLayout
from workbench.engine.objective import Objective, head_loss
from workbench.engine.precision import autocast
from workbench.engine.protocol import StepOutput, held
from workbench.engine.timing import OpTimer
from workbench.engine.whole import WholeWeights
from workbench.models.adapter import BlockAdapter


def trainable_params(layout: GroupLayout, flat: torch.Tensor,
                     grad: torch.Tensor | None = None) -> list[nn.Parameter]:
    """Leaf parameters viewing ``flat`` that require grad, bound into the model; with ``grad``
    (a flat buffer of the same layout) each ``.grad`` is its view, so autograd accumulates in
    place there."""
    params = [nn.Parameter(v, requires_grad=True) for v in layout.views(flat)]
    if grad is not None:
        for p, g in zip(params, layout.views(grad)):
            p.grad = g
    layout.bind(params)
    return params


def prompt_loss(adapter: BlockAdapter, objective: Objective, batch: Batch, timer: OpTimer,
                step: int, stream) -> torch.Tensor:
    """The objective's loss through embed -> blocks -> head, each part timed as a "forward"
    span."""
    with timer.span("forward", "compute", stream, step, EMBED):
        hidden, ctx = adapter.embed(batch)
    for i, block in enumerate(adapter.blocks):
        with timer.span("forward", "compute", stream, step, i):
            hidden = adapter.run_block(block, hidden, ctx)
    with timer.span("forward", "compute", stream, step, HEAD):
        return head_loss(objective, adapter, hidden, batch)


def checkpoint_refusal(cfg: RunConfig) -> ConfigError:
    return ConfigError([checkpoint_problem(cfg.method)])


def refuse_unsupported(cfg: RunConfig, device: torch.device) -> None:
    """What a first-order engine refuses before any work: fp16 on a CPU (its loss scaler needs
    CUDA). Checkpoints are refused with the config (``config.checkpoint_problem``)."""
    if cfg.amp == "fp16" and device.type != "cuda":
        raise ValueError("amp: fp16 first-order training needs a GPU loss scaler; use amp=bf16 "
                         "or off on the CPU")


class FOEngine:
    """Args:
        model: a model skeleton (meta weights are fine) from ``build_skeleton``.
        source: where weights come from.
        cfg: the run config (amp, seed, adam_beta1/2, adam_eps, telemetry).
        device: the one device weights, gradients and optimizer state live on.
        bus: where operation events go.

    Raises:
        ValueError: amp=fp16 on a CPU (a loss scaler needs CUDA).
        ConfigError: checkpoint_every > 0 (its checkpoints would have to carry the AdamW
            moments, which the format does not hold: refused when built, before any work,
            rather than resumed without them).
    """

    def __init__(self, model, source, cfg: RunConfig, device: torch.device, bus: EventBus,
                 objective: Objective | None = None):
        refuse_unsupported(cfg, device)
        self.cuda = device.type == "cuda"
        # peft=lora: only the adapters train; the base (``frozen``) never requires grad
        self.cfg, self.device = cfg, device
        self.reduce = None  # data parallel is refused for first-order methods (``distributed``)
        self.weights = WholeWeights(model, source, cfg, device, objective)
        self.grads = [torch.zeros_like(g.flat) for g in self.weights.groups]
        for group, grad in zip(self.weights.groups, self.grads):
            trainable_params(group.layout, group.flat, grad)
        decay, rest = [], []
        for group, grad in zip(self.weights.groups, self.grads):
            n, k = group.layout.numel, group.layout.n_decay
            for lo, hi, bucket in ((0, k, decay), (k, n, rest)):
                if hi > lo:
                    t = group.flat[lo:hi]  # a leaf view: the optimizer updates the buffer in place
                    t.grad = grad[lo:hi]
                    bucket.append(t)
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": rest, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
            fused=True if self.cuda else None)
        self.scaler = torch.amp.GradScaler("cuda") if cfg.amp == "fp16" else None
        self.timer = OpTimer(device, bus, cfg.telemetry)
        self.bytes_h2d = self.bytes_d2h = 0

    # --- the holder's part of the contract --------------------------------------------------
    adapter = property(lambda self: self.weights.adapter)
    objective = property(lambda self: self.weights.objective)
    groups = property(lambda self: self.weights.groups)  # the trained groups, as held
    frozen = property(lambda self: self.weights.frozen)  # a peft run's base, as loaded
    flush = held(WholeWeights.flush)
    evaluate = held(WholeWeights.evaluate)
    state_flats = held(WholeWeights.state_flats)
    base_flats = held(WholeWeights.base_flats)
    load_state_flats = held(WholeWeights.load_state_flats)
    group_layouts = held(WholeWeights.group_layouts)

    def snapshot(self, next_step: int):
        raise checkpoint_refusal(self.cfg)  # (refused with the config before any work)

    def restore(self, snap: Snapshot) -> None:
        raise checkpoint_refusal(self.cfg)

    # --- training ---------------------------------------------------------------------------
    def step(self, batch: Batch, step: int, lr: float, wd: float) -> StepOutput:
        """One AdamW step on the batch's prompt loss; returns the loss (0-d device tensor)."""
        stream = torch.cuda.current_stream(self.device) if self.cuda else None
        for grad in self.grads:
            grad.zero_()
        decay, rest = self.opt.param_groups
        decay["lr"] = rest["lr"] = lr
        decay["weight_decay"] = wd
        with autocast(self.device, self.cfg.amp):
            loss = prompt_loss(self.adapter, self.objective, batch, self.timer, step, stream)
        with self.timer.span("backward", "compute", stream, step, EMBED):
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        with self.timer.span("update", "compute", stream, step, EMBED):
            if self.scaler:
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                self.opt.step()
        self.timer.poll()
        return StepOutput(loss.detach(), forward_passes=1)  # and a backward, not counted

    def grad_flats(self) -> list[torch.Tensor]:
        """The last step's fp32 gradients per group (device tensors, valid until the next step)."""
        return list(self.grads)

    def gpu_param_bytes(self) -> int:
        """Weights, gradients and Adam's m and v on the GPU: 16 bytes per trained parameter,
        plus a frozen base as held."""
        frozen = sum(g.flat.numel() * g.flat.element_size() for g in self.weights.frozen)
        return 16 * sum(g.layout.numel for g in self.weights.groups) + frozen if self.cuda else 0

    def close(self) -> None:
        self.timer.poll(wait=True)
