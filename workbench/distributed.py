"""Data-parallel ZO over torch.distributed (NCCL on GPUs, gloo on CPUs).

Started by torchrun (``torchrun --nproc_per_node N -m workbench run ...``; across nodes add
``--nnodes``, ``--node_rank`` and ``--rdzv_endpoint``). Every rank streams the model, takes its
slice of the global batch, and uses the same step seed; the only thing on the wire each step is
two scalars (the shard losses, averaged with one all-reduce). Parameters stay identical on every
rank without ever being broadcast; a cheap digest is compared every ``digest_check_every`` steps
to prove it. With ``host_share`` (the default) the ranks of one host keep one host copy of the
streamed blocks between them (``engine/device/shared_host.py``): host memory per node is one model
whatever the number of GPUs.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from workbench.config import ZO_METHODS, ConfigError, RunConfig
from workbench.engine.groups import digest, flats_or_readers
from workbench.engine.device.shared_host import NodeShare


@dataclass
class DistContext:
    rank: int
    world: int
    local_rank: int
    parallel = True  # more than one process: the recipe votes on stops and merges the ranks

    @property
    def main(self) -> bool:
        return self.rank == 0

    def device(self, cfg: RunConfig) -> torch.device:
        if cfg.device == "cuda":
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def shard(self, batch):
        """This rank's examples of the global batch (equal slices; ``data/shard.py``)."""
        from workbench.data.shard import shard

        return shard(batch, self.rank, self.world)

    def dev_share(self, dev):
        """This rank's examples of the dev set (contiguous; ``data/shard.py::DevShare``)."""
        from workbench.data.shard import DevShare

        return DevShare(dev, self.rank, self.world)

    def mean(self, scalars: torch.Tensor) -> torch.Tensor:
        """Average a small tensor of scalars over ranks (the step's only communication)."""
        out = scalars.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out / self.world

    def node_share(self, cfg: RunConfig) -> NodeShare | None:
        """The streamed blocks' one host copy for this host's ranks (``host_share``), or None
        (the knob is off, or the method streams nothing). Every rank calls this, in order."""
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        if not cfg.host_share or not cfg.streaming or local_world == 1:
            return None
        if local_world == self.world:
            group = None  # one host: the default group
        else:  # torchrun numbers the ranks of a host consecutively
            group, _ = dist.new_subgroups(group_size=local_world)
        token = [uuid.uuid4().hex[:12] if self.rank == 0 else None]
        dist.broadcast_object_list(token, src=0)
        return NodeShare(token[0], self.local_rank, local_world,
                         lambda: dist.barrier(group=group))

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        """Each value summed over ranks (outside steps: eval counts)."""
        out = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.tolist()  # a sync, once per eval: the host needs the totals

    def gather(self, obj):
        """Every rank's ``obj`` (outside steps: digests, per-rank timings)."""
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def totals(self, device: torch.device):
        """How an eval's counts are summed over ranks (``engine.evaluate``'s ``total``)."""
        return lambda values: self.sum(values, device)

    def stop_vote(self, device: torch.device) -> StopVote:
        return StopVote(self, device)

    def check_in_sync(self, flats: Callable[[], Iterable[torch.Tensor]], step: int) -> None:
        """``check_in_sync`` of the parameters ``flats()`` yields."""
        check_in_sync(self, flats(), step)

    def shutdown(self) -> None:
        shutdown()


class SingleProcess:
    """Data parallel's single-process form: the same questions as ``DistContext``, each answered
    by doing nothing (the whole batch, the whole dev set, no vote, no all-reduce), so the recipe
    asks them without asking first whether it runs under torchrun."""

    rank, world, local_rank = 0, 1, 0
    main = True
    parallel = False

    def device(self, cfg: RunConfig) -> torch.device:
        return torch.device(cfg.device)

    def shard(self, batch):
        return batch

    def dev_share(self, dev):
        return dev

    def node_share(self, cfg: RunConfig) -> None:
        return None

    def gather(self, obj) -> list:
        return [obj]

    def totals(self, device: torch.device) -> None:
        return None  # the engine counts its own dev set

    def stop_vote(self, device: torch.device) -> None:
        return None  # a stop request ends the loop at once

    def check_in_sync(self, flats: Callable[[], Iterable[torch.Tensor]], step: int) -> None:
        pass  # one copy of the parameters: nothing to compare

    def shutdown(self) -> None:
        pass


def data_parallel(cfg: RunConfig) -> DistContext | SingleProcess:
    """``from_env``'s context under torchrun, else the single process's (does nothing)."""
    return from_env(cfg) or SingleProcess()


class StopVote:
    """Every rank stops after the same step. The step's all-reduce (its only communication)
    carries one more scalar, this rank's stop request (a signal, a failing disk); the agreed
    value travels to the host with the step's losses and is read when the step is published,
    so voting adds neither a message nor a sync."""

    def __init__(self, ctx: DistContext, device: torch.device):
        self.ctx, self.request = ctx, False
        self._flags = (torch.zeros(1, device=device), torch.ones(1, device=device))
        self.agreed = self._flags[0][0]  # the last step's vote: > 0 when any rank asked

    def reduce(self, scalars: torch.Tensor) -> torch.Tensor:
        """``ctx.mean`` of ``scalars`` (bit-identical), with the vote riding along."""
        flag = self._flags[self.request].to(scalars.dtype)
        out = self.ctx.mean(torch.cat([scalars.reshape(-1), flag]))
        self.agreed = out[-1]
        return out[:-1].reshape(scalars.shape)


def from_env(cfg: RunConfig) -> DistContext | None:
    """A context when started by torchrun with more than one process, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    if cfg.method not in ZO_METHODS:
        raise ConfigError([f"method: {cfg.method} has no data-parallel mode; use mezo, "
                           "zo-offload or forward-grad under torchrun"])
    if cfg.host_share and cfg.method != "mezo" and cfg.codec != "fp32" and cfg.master == "fp32":
        raise ConfigError([f"host_share: master=fp32 with codec={cfg.codec} keeps a host master "
                           "per rank (a host thread updates it); use master=compressed-sr, or "
                           "host_share=false"])
    if cfg.batch_size % world:
        raise ConfigError([f"batch_size: {cfg.batch_size} does not divide evenly among {world} "
                           f"ranks; use a multiple of {world}"])
    if cfg.device == "cuda" and torch.cuda.is_available():  # collectives before setup's
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # on this rank's GPU
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo")
    return DistContext(dist.get_rank(), dist.get_world_size(),
                       int(os.environ.get("LOCAL_RANK", "0")))


class PeerFailed(RuntimeError):
    """Another rank failed before the run started (not a refusal): this one stops too."""


def agree(ctx: DistContext | None, error: BaseException | None, payload: Any,
          refusals: tuple[type, ...]) -> Any:
    """Every rank's outcome of its checks, shared before any other collective, so that a rank
    that refuses never leaves the others waiting in one. Returns rank 0's ``payload``.

    Args:
        error: what this rank's checks raised (None: they passed).
        refusals: the error types that are refusals (one line, exit status 2).
    Raises:
        ConfigError: on every rank, with the same lines, when any rank refused (the lowest
            such rank's).
        PeerFailed: another rank failed otherwise (this rank's own error is raised as is).
    """
    if ctx is None:
        if error is not None:
            raise error
        return payload
    mine = None if error is None else (isinstance(error, refusals), _lines(error))
    out: list = [None] * ctx.world
    dist.all_gather_object(out, (mine, payload if ctx.main else None))
    failed = [(rank, m) for rank, (m, _) in enumerate(out) if m is not None]
    if not failed:
        return out[0][1]
    refused = [(rank, lines) for rank, (is_refusal, lines) in failed if is_refusal]
    if refused:
        raise ConfigError(refused[0][1]) from None
    if error is not None:
        raise error
    rank, (_, lines) = failed[0]
    raise PeerFailed(f"rank {rank} failed before the run started: {lines[0]}")


def _lines(error: BaseException) -> list[str]:
    if isinstance(error, ConfigError):
        return list(error.problems)
    return [str(error).splitlines()[0] if str(error) else type(error).__name__]


def quick_digest(flats: Iterable[torch.Tensor], stride: int = 1021) -> str:
    """``groups.digest`` of every ``stride``-th element of each group: cheap enough to run
    during training, and any divergence between ranks (a different g moves every element) shows.
    One group at a time: the strided copy is made before the decoded group is dropped."""
    return digest(_strided(flats, stride))


def _strided(flats: Iterable[torch.Tensor], stride: int) -> Iterator[torch.Tensor]:
    """Each group's every ``stride``-th value. A group a ``LazyFlats`` can read by piece is
    sampled without decoding it whole: decoding every bf16 block of opt-6.7b to fp32 for this
    check stalled data-parallel bf16-SR runs for ~14 s at each ``digest_check_every``."""
    for flat in flats_or_readers(flats):
        part = flat[::stride].clone() if isinstance(flat, torch.Tensor) else flat.sample(stride)
        del flat  # drop the decoded group before the next is made
        yield part


def check_in_sync(ctx: DistContext, flats: Iterable[torch.Tensor], step: int) -> None:
    """Stop with a clear error if the ranks' parameters ever differ."""
    digests = ctx.gather(quick_digest(flats))
    if len(set(digests)) > 1:
        raise RuntimeError(f"ranks diverged at step {step}: parameter digests differ "
                           f"({', '.join(d[:12] for d in digests)}); the ranks' data, seeds "
                           "or software are not identical")


def shutdown() -> None:
    if dist.is_initialized():
        dist.barrier()  # nobody leaves while another rank still gathers
        dist.destroy_process_group()
