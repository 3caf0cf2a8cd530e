"""Parameter groups: the embedding, each transformer block and the head, each one flat fp32 buffer.

A group is the unit the engines move, perturb and update. Its layout is canonical (decayed
matrices first, then biases and norm weights, each in module order), so one kernel launch covers
a group, weight decay is "the first ``n_decay`` elements", and a perturbation element is named by
(group id, offset) wherever the group sits. Modules see a group through views bound into their
``_parameters`` slots (all owners of a tied weight at once); binding is reversible and touches
only this model instance.
"""
from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import numpy as np
import torch
from torch import nn

from workbench.models.adapter import BlockAdapter
from workbench.models.build import group_id
from workbench.models.lora import checkpoint_name, is_adapter
from workbench.plan.memory import FINGERPRINT_THREADS


@dataclass(frozen=True)
class Entry:
    """One parameter inside a group: its name, owners (module, slot) and place in the buffer."""

    name: str
    owners: tuple[tuple[nn.Module, str], ...]
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass
class GroupLayout:
    """Where each parameter of a group sits in its flat buffer (units: elements)."""

    name: str
    entries: list[Entry]
    numel: int
    n_decay: int  # elements [0, n_decay) get weight decay
    gid: int = field(init=False)
    _signature: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.gid = group_id(self.name)
        # built once: the offload engine looks it up for every streamed block of every step
        self._signature = tuple((e.shape, e.offset) for e in self.entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the group in fp32."""
        return 4 * self.numel

    def signature(self) -> tuple:
        """Shapes and offsets of the entries: layouts with one signature can share views."""
        return self._signature

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [flat[e.offset:e.offset + e.numel].view(e.shape) for e in self.entries]

    def named_views(self, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        return [(e.name, v) for e, v in zip(self.entries, self.views(flat))]

    def make_params(self, flat: torch.Tensor) -> list[nn.Parameter]:
        """Parameter objects viewing ``flat`` (cache them: building one costs microseconds)."""
        return [nn.Parameter(v, requires_grad=False) for v in self.views(flat)]

    def bind(self, params: list[nn.Parameter]) -> None:
        """Point every owner of every entry at ``params`` (same order as ``entries``)."""
        for entry, p in zip(self.entries, params):
            for module, slot in entry.owners:
                module._parameters[slot] = p


def release(layout: GroupLayout) -> None:
    """Point the owners at empty meta tensors, so the model no longer holds the group's memory
    (engines call this on close: a notebook runs many jobs in one process)."""
    layout.bind([nn.Parameter(torch.empty(e.shape, device="meta"), requires_grad=False)
                 for e in layout.entries])


def build_layouts(adapter: BlockAdapter) -> tuple[GroupLayout, list[GroupLayout], GroupLayout]:
    """Layouts of (embedding, blocks, head) over the model's own weights (adapter weights, if
    any, are ``adapter_layouts``'). A weight tied between embedding and head is in the
    embedding group only; binding it there rebinds the head's alias too."""
    layout = _layout_builder(adapter, adapters=False)
    embed = layout("embed", adapter.embed_modules)
    blocks = [layout(f"block.{i}", [b]) for i, b in enumerate(adapter.blocks)]
    head = layout("head", adapter.head_modules)
    return embed, blocks, head


def adapter_layouts(adapter: BlockAdapter) -> list[GroupLayout]:
    """One group per block of its adapter weights (LoRA A and B of its target modules), named
    ``block.{i}.lora``: the trainable groups of a peft run, in block order."""
    layout = _layout_builder(adapter, adapters=True)
    return [layout(f"block.{i}.lora", [b]) for i, b in enumerate(adapter.blocks)]


def _layout_builder(adapter: BlockAdapter, adapters: bool):
    """``layout(name, modules)``: the layout of the modules' parameters that are adapter
    weights (``adapters``) or are not, each parameter in one group only."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    names: dict[int, str] = {}
    for mod_name, module in adapter.model.named_modules():
        for slot, p in module._parameters.items():
            if p is None:
                continue
            owners.setdefault(id(p), []).append((module, slot))
            names.setdefault(id(p), checkpoint_name(f"{mod_name}.{slot}" if mod_name else slot))
    seen: set[int] = set()

    def layout(name: str, modules: list[nn.Module]) -> GroupLayout:
        params: list[nn.Parameter] = []
        for module in modules:
            for p in module.parameters():
                if id(p) not in seen and is_adapter(names[id(p)]) == adapters:
                    seen.add(id(p))
                    params.append(p)
        # Matrices first so weight decay covers one prefix; biases and norms after.
        ordered = [p for p in params if p.dim() >= 2] + [p for p in params if p.dim() < 2]
        entries, offset = [], 0
        for p in ordered:
            entries.append(Entry(names[id(p)], tuple(owners[id(p)]), tuple(p.shape), offset,
                                 p.numel()))
            offset += p.numel()
        n_decay = sum(p.numel() for p in ordered if p.dim() >= 2)
        return GroupLayout(name, entries, offset, n_decay)

    return layout


def tied_with_embed(embed: GroupLayout, head_modules: list[nn.Module]) -> bool:
    """True when a head module owns a weight of the embedding group (tied LM head)."""
    heads = {id(m) for m in head_modules}
    return any(id(module) in heads for e in embed.entries for module, _ in e.owners)


def move_buffers(modules: list[nn.Module], device: torch.device) -> None:
    """Non-parameter buffers (e.g. rotary tables) live on the compute device for good."""
    for module in modules:
        for sub in module.modules():
            for name, buf in sub._buffers.items():
                if buf is not None and buf.device != device:
                    sub._buffers[name] = (torch.empty_like(buf, device=device) if buf.is_meta
                                          else buf.to(device))


#: Elements per hashed piece (64 MiB of fp32). ``param_digest`` is defined over pieces of this
#: size, so it does not depend on how many threads hash them: changing it changes every digest.
PIECE = 1 << 24
#: Threads that hash and square pieces at most (``fingerprint``; fewer where fewer cores).
MAX_THREADS = FINGERPRINT_THREADS


class PieceReader(Protocol):
    """A group's fp32 values read a range at a time, never the whole group at once (a frozen
    block decoded from its host bytes straight into ``fingerprint``'s piece buffers)."""

    numel: int

    def read(self, lo: int, hi: int, out: torch.Tensor) -> None:
        """Elements [lo, hi) as fp32 into ``out`` ((hi - lo,), CPU); lo is a multiple of
        ``PIECE``. Threads call it at once for different ranges."""

    def sample(self, stride: int) -> torch.Tensor:
        """Every ``stride``-th fp32 value from element 0 (a new (ceil(numel / stride),)
        tensor): the ranks' cheap in-sync check."""


def sample_by_pieces(reader: PieceReader, stride: int) -> torch.Tensor:
    """``PieceReader.sample`` for any reader: each piece read into one reused buffer and its
    elements at multiples of ``stride`` kept (the group is decoded, never held whole)."""
    out = torch.empty(-(-reader.numel // stride))
    buf = torch.empty(min(PIECE, reader.numel))
    for lo in range(0, reader.numel, PIECE):
        hi = min(reader.numel, lo + PIECE)
        reader.read(lo, hi, buf[:hi - lo])
        first = -lo % stride  # the piece's first element at a multiple of stride
        picked = buf[first:hi - lo:stride]
        out[(lo + first) // stride:(lo + first) // stride + picked.numel()] = picked
    return out


class LazyFlats(Sequence[torch.Tensor]):
    """``n`` groups made one at a time by ``get(i)`` (a streamed block decoded to fp32, a
    checkpoint group read from disk): iterating holds one group at once, never the model.
    ``reader(i)``, where given, may return a ``PieceReader`` for group i (else None):
    ``fingerprint`` then reads that group a piece at a time instead of calling ``get(i)``."""

    def __init__(self, n: int, get: Callable[[int], torch.Tensor],
                 reader: Callable[[int], PieceReader | None] | None = None):
        self._n, self._get, self.reader = n, get, reader or (lambda i: None)

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[torch.Tensor]:
        for i in range(self._n):
            yield self._get(i)  # bound to no local here: the caller's drop frees it

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            picked = range(self._n)[i]
            return LazyFlats(len(picked), lambda k: self._get(picked[k]),
                             lambda k: self.reader(picked[k]))
        if not -self._n <= i < self._n:
            raise IndexError(f"group {i} of {self._n}")
        return self._get(i % self._n)


def _host_fp32(flat: torch.Tensor) -> torch.Tensor:
    """The group as a contiguous fp32 CPU tensor: no copy when it already is one."""
    return flat.detach().to("cpu", torch.float32).contiguous()


def default_threads() -> int:
    """Threads for ``fingerprint``: the cores this process may run on, at most ``MAX_THREADS``."""
    return max(1, min(MAX_THREADS, len(os.sched_getaffinity(0))))


def digest(flats: Iterable[torch.Tensor], threads: int | None = None) -> str:
    """The run's ``param_digest``: SHA-256 over the concatenated SHA-256 digests (32 bytes
    each) of the ``PIECE``-element pieces of each group's fp32 bytes, groups in canonical
    order, each group's pieces from its start (the last one shorter). 64 hex digits; the same
    for any ``threads``."""
    return fingerprint(flats, with_norm=False, threads=threads)[0]


def norm(flats: Iterable[torch.Tensor], threads: int | None = None) -> float:
    """L2 norm of all trainable parameters (the run's ``param_norm``): fp64 sums of squares
    per piece, added in piece order."""
    return fingerprint(flats, hash_bytes=False, threads=threads)[1]


def fingerprint(flats: Iterable[torch.Tensor], hash_bytes: bool = True, with_norm: bool = True,
                threads: int | None = None) -> tuple[str, float]:
    """(digest, norm) in one pass over ``flats`` (see ``digest`` and ``norm``). Each group is
    decoded, its pieces hashed and squared by ``threads`` threads (default
    ``default_threads()``) straight from its memory (no bytes copy), and dropped before the
    next group is decoded: the host holds one group's fp32 and ``threads * SCRATCH_BYTES``
    (``plan/memory.py``).
    A group a ``LazyFlats`` has a ``PieceReader`` for is never decoded whole: each thread reads
    a piece into a buffer of its own (reused from group to group), hashes it, and takes the next.
    The threads run torch single-threaded: they are the parallelism, and OpenMP teams inside
    every thread's decode would oversubscribe the cores."""
    root, total = hashlib.sha256(), 0.0
    threads = threads or default_threads()
    bufs: list[np.ndarray] = []  # piece buffers of readers' groups, one per busy thread
    caller = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(threads, initializer=torch.set_num_threads,
                                initargs=(1,)) as pool:
            for flat in flats_or_readers(flats):
                found = (_hash_group(flat, pool, threads, hash_bytes, with_norm)
                         if isinstance(flat, torch.Tensor) else
                         _read_pieces(flat, pool, bufs, threads, hash_bytes, with_norm))
                del flat
                for piece_digest, squares in found:  # in piece order, whichever thread made it
                    root.update(piece_digest)
                    total += squares
    finally:
        # A worker's set_num_threads also sets the count threads started later begin with;
        # this thread's own team is untouched, and later threads get the caller's count again.
        torch.set_num_threads(caller)
    return root.hexdigest(), total ** 0.5


def flats_or_readers(flats: Iterable[torch.Tensor]) -> Iterator[torch.Tensor | PieceReader]:
    """Each group as its ``PieceReader`` where a ``LazyFlats`` has one (its tensor is then
    never made), else its tensor."""
    if not isinstance(flats, LazyFlats):
        yield from flats
        return
    for i in range(len(flats)):
        reader = flats.reader(i)
        yield flats[i] if reader is None else reader


def _hash_group(flat: torch.Tensor, pool: ThreadPoolExecutor, threads: int, hash_bytes: bool,
                with_norm: bool) -> list[tuple[bytes, float]]:
    """(digest, squares) of each piece of a whole group, the pieces shared out to the pool."""
    host = _host_fp32(flat).reshape(-1).numpy()
    pieces = [host[i:i + PIECE] for i in range(0, host.size, PIECE)]  # views
    del flat, host  # the views in ``pieces`` are now the group's only owner
    found = _share_out(pool, threads, len(pieces), partial(_pieces, pieces, hash_bytes, with_norm))
    # A task keeps ``pieces`` (the list) alive a moment after its result is in; emptying it
    # frees the decoded group now, before the next is made.
    pieces.clear()
    return found


def _read_pieces(reader: PieceReader, pool: ThreadPoolExecutor, bufs: list[np.ndarray],
                 threads: int, hash_bytes: bool, with_norm: bool) -> list[tuple[bytes, float]]:
    """(digest, squares) of each piece of a reader's group: each task reads the next piece into
    a buffer taken from ``bufs`` and hashes it. Host memory: one ``PIECE`` buffer per thread
    that ran (returned to ``bufs`` for the next group)."""
    return _share_out(pool, threads, -(-reader.numel // PIECE),
                      partial(_read_and_hash, reader, bufs, hash_bytes, with_norm))


def _share_out(pool: ThreadPoolExecutor, threads: int, count: int,
               work: Callable[[Iterator[int], list], None]) -> list[tuple[bytes, float]]:
    """``count`` pieces' (digest, squares), in piece order: up to ``threads`` tasks run
    ``work(ticket, found)``, each taking piece numbers from the shared ``ticket``."""
    found: list[tuple[bytes, float]] = [(b"", 0.0)] * count
    ticket = itertools.count()
    for task in [pool.submit(work, ticket, found) for _ in range(min(threads, count))]:
        task.result()  # raises what the thread raised
    return found


def _read_and_hash(reader: PieceReader, bufs: list[np.ndarray], hash_bytes: bool,
                   with_norm: bool, ticket: Iterator[int], found: list[tuple[bytes, float]]) -> None:
    """One thread's share of a reader's group: pieces by ``ticket`` number (shared by the
    threads), each read into this thread's buffer and fingerprinted into ``found[k]``."""
    buf = bufs.pop() if bufs else np.empty(PIECE, dtype=np.float32)  # list.pop/append: atomic
    try:
        while (k := next(ticket)) * PIECE < reader.numel:
            lo, hi = k * PIECE, min(reader.numel, (k + 1) * PIECE)
            piece = buf[:hi - lo]
            reader.read(lo, hi, torch.from_numpy(piece))
            found[k] = _fingerprint_piece(piece, hash_bytes, with_norm)
    finally:
        bufs.append(buf)


def _pieces(pieces: list[np.ndarray], hash_bytes: bool, with_norm: bool, ticket: Iterator[int],
            found: list[tuple[bytes, float]]) -> None:
    """One thread's share: takes the next piece number from ``ticket`` (shared by the threads)
    until none is left, and puts (SHA-256 digest, fp64 sum of squares) of piece k at
    ``found[k]``. Both release the GIL (hashlib on large buffers, einsum on plain numbers); the
    cast to fp64 goes through einsum's small buffers (``plan.memory.SCRATCH_BYTES``)."""
    while (k := next(ticket)) < len(pieces):
        found[k] = _fingerprint_piece(pieces[k], hash_bytes, with_norm)


def _fingerprint_piece(piece: np.ndarray, hash_bytes: bool, with_norm: bool) -> tuple[bytes, float]:
    """(SHA-256 digest, fp64 sum of squares) of one piece; both release the GIL."""
    return (hashlib.sha256(piece).digest() if hash_bytes else b"",
            float(np.einsum("i,i->", piece, piece, dtype=np.float64)) if with_norm else 0.0)
