"""A visit's ZO operations recorded, then computed from a half-precision master on demand.

A compute-dtype slot (``stream/compute_slots.py``) keeps a streamed block's bf16 / fp16 master
as it came up; nothing fp32 of the block lives on the device. ``step.py`` issues its usual
operations (the pending update, each perturbation, the restore) through a ``Chain`` instead of
on an fp32 buffer: the chain only records them. When the block's forward pass is about to run,
``fill_form`` computes, from the master, the fp32 value the fp32-slot path would hold at that
point and writes the forward's form (matrices in the compute dtype, rounded as autocast rounds
them; the rest fp32); after the block's last pass, ``write_master`` computes the final value and
rounds it into the master as the SR transfer's encode would. So a run with these slots is the fp32-slot
run bit for bit, in about a third of the device memory and traffic per block.

Backends: the chain kernel (``chain_kernel.py``: CUDA, rng=philox), or, elsewhere, the very
``ZOOps`` calls the fp32 path makes, replayed on a temporary fp32 copy. Only the sgd rule
records (``config.compute_slots`` refuses the others).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.engine import kernels
from workbench.engine.codecs.frozen_form import FrozenForm
from workbench.engine.codecs.wire import SR_KEY, get_codec
from workbench.engine.groups import GroupLayout
from workbench.engine.zo.perturb import PendingUpdate, ZOOps

#: One recorded operation: ("update", PendingUpdate) or ("perturb", seed, scale).
Op = tuple


@dataclass
class Chain:
    """The operations of one visit of one block (an ``ApplyUpdate`` too: a pending update
    handed to it is recorded). ``version`` counts them."""

    base: ZOOps
    ops_list: list[Op] = field(default_factory=list)

    @property
    def ops(self) -> "ChainOps":
        return ChainOps(self)

    @property
    def version(self) -> int:
        return len(self.ops_list)

    def __call__(self, flat: torch.Tensor, layout: GroupLayout, upd: PendingUpdate) -> None:
        self.ops.update(flat, layout, upd)


class ChainOps:
    """``ZOOps``'s interface as ``step.py`` uses it, recording into a ``Chain``."""

    def __init__(self, chain: Chain):
        self.chain, self.one = chain, chain.base.one

    def update(self, x, layout, upd: PendingUpdate, state=None) -> None:
        if upd.rule != "sgd" or state is not None:
            raise ValueError(f"slot_dtype=compute: zo_optimizer={upd.rule} is not recorded "
                             "(use slot_dtype=fp32)")
        self.chain.ops_list.append(("update", upd))

    def perturb(self, x, layout, seed: int, scale: float, out=None) -> None:
        self.chain.ops_list.append(("perturb", seed, scale))

    def update_perturb(self, x, layout, upd, seed: int, scale: float, out=None,
                       state=None) -> None:
        if upd is not None:
            self.update(x, layout, upd, state)
        self.perturb(x, layout, seed, scale)


def replay_fp32(base: ZOOps, master: torch.Tensor, layout: GroupLayout,
                ops: list[Op]) -> torch.Tensor:
    """The fp32-slot path's value after ``ops``: the master widened, then each operation as
    ``ZOOps`` runs it (the torch path; a new (n,) fp32 tensor)."""
    x = master.float()
    for op in ops:
        if op[0] == "update":
            base.update(x, layout, op[1])
        else:
            base.perturb(x, layout, op[1], op[2])
    return x


class Tables:
    """The chain kernel's op tables for a list of operations, built once per distinct list:
    every block of a step records the same few (one per pass, and the last)."""

    KEEP = 16  # lists kept: a step's, at any queries the config allows

    def __init__(self, device: torch.device):
        self.device, self._built = device, {}

    def get(self, ops: list[Op], one: torch.Tensor) -> tuple:
        key = tuple((op[0], op[1].seed, id(op[1].g), op[1].lr, op[1].wd) if op[0] == "update"
                    else op for op in ops)
        if key not in self._built:
            if len(self._built) >= self.KEEP:
                self._built.clear()  # a new step's lists: every launch that read the old
                # ones is on the stream these are built on (the compute stream), so ordered
            self._built[key] = self._build(ops, one)
        return self._built[key]

    def _build(self, ops: list[Op], one: torch.Tensor) -> tuple:
        gs, seeds, starts, a, wd, gi = [one.reshape(1)], [], [], [], [], []
        for op in ops:
            if op[0] == "update":  # its g stays on the device: never read on the host
                at = sum(t.numel() for t in gs)
                gs.append(op[1].g.reshape(-1).float())
                parts = [(s, -op[1].lr, w, at + j) for j, (s, _, w) in enumerate(op[1].parts())]
            else:
                parts = [(op[1], op[2], 0.0, -1)]
            for s, aj, wj, j in parts:
                if not seeds or seeds[-1] != s:
                    seeds.append(s)
                    starts.append(len(a))
                a.append(aj)
                wd.append(wj)
                gi.append(j)
        starts.append(len(a))
        host = [torch.tensor(seeds, dtype=torch.int64), torch.tensor(starts, dtype=torch.int64),
                torch.tensor(a, dtype=torch.float32), torch.tensor(wd, dtype=torch.float32),
                torch.tensor(gi, dtype=torch.int32)]
        # a pinned copy goes up without blocking the host; the tables stay referenced (and so
        # allocated) until the next list replaces them, after every launch that reads them
        # (on a CPU device, the Triton interpreter's tests, the tables are used as they are)
        tables = tuple(t.pin_memory().to(self.device, non_blocking=True)
                       if self.device.type == "cuda" else t for t in host)
        return torch.cat(gs), tables, len(seeds)


class ChainRunner:
    """Computes a chain's values from a half-precision master, on its device."""

    def __init__(self, base: ZOOps, codec: str, sr: bool, compute: torch.dtype):
        self.base, self.codec, self.sr, self.compute = base, get_codec(codec), sr, compute
        self.kernel = (kernels.load("zo.chain_kernel", "slot_dtype=compute")
                       if base.kernels is not None else None)
        self.tables = Tables(base.device)

    def fill_form(self, master: torch.Tensor, layout: GroupLayout, ops: list[Op],
                  form: FrozenForm, buf: torch.Tensor) -> None:
        """``buf`` (the form's bytes) <- the block as the forward pass after ``ops`` sees it."""
        mats, tail = form.parts(buf)
        if self.kernel is None:
            x = replay_fp32(self.base, master, layout, ops)
            mats.copy_(x[:form.n_mat])
            tail.copy_(x[form.n_mat:])
            return
        g, tables, n_groups = self.tables.get(ops, self.base.one)
        self.kernel.launch(master, mats, tail, g, tables, n_groups, form.n_mat, layout.n_decay,
                           layout.gid, self.kernel.FORM)

    def fill_spans(self, master: torch.Tensor, layout: GroupLayout, ops: list[Op],
                   spans: list[tuple[torch.Tensor, int, torch.Tensor]]) -> None:
        """Each span's fp32 values after ``ops`` (a streamed embedding's rows:
        ``stream/embed_rows.py``): for (starts (S,) int64, length, out (S x length,) fp32), out
        <- elements [start, start + length) of each start, as the fp32 slot would hold them."""
        if self.kernel is None:
            x = replay_fp32(self.base, master, layout, ops)
            for starts, length, out in spans:
                if starts.numel() == 1:  # one whole entry (as fill_form's: no index tensor)
                    lo = int(starts[0])
                    out.copy_(x[lo:lo + length])
                    continue
                idx = starts[:, None] + torch.arange(length, device=starts.device)
                out.copy_(x[idx.reshape(-1)])
            return
        g, tables, n_groups = self.tables.get(ops, self.base.one)
        for starts, length, out in spans:
            self.kernel.launch_spans(master, out, starts, length, g, tables, n_groups,
                                     layout.n_decay, layout.gid)

    def write_master(self, master: torch.Tensor, layout: GroupLayout, ops: list[Op],
                     sr_seed: int) -> None:
        """``master`` (n,) bf16 / fp16 <- the value after ``ops``, rounded stochastically
        with ``sr_seed`` (compressed-sr) or to nearest, as ``SRTransfer.offload`` encodes."""
        if not ops:
            return  # the master's own values: both roundings keep them
        if self.kernel is None:
            x = replay_fp32(self.base, master, layout, ops)
            self.codec.encode(x, master.view(torch.uint8), sr_seed=sr_seed if self.sr else None)
            return
        g, tables, n_groups = self.tables.get(ops, self.base.one)
        mats = torch.empty(0, dtype=self.compute, device=master.device)  # unused here
        self.kernel.launch(master, mats, mats.float(), g, tables, n_groups, 0, layout.n_decay,
                           layout.gid, self.kernel.SR if self.sr else self.kernel.NEAREST,
                           sr_seed, SR_KEY)
