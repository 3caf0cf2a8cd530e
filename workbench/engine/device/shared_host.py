"""One host copy of the streamed blocks per node under data parallel.

Every rank applies the identical update to every block (same seed, same averaged losses), so
the ranks of one host need one copy of the blocks' host storage between them, not one each.
Local rank 0 (the writer) creates each block's storage as a file in ``/dev/shm`` mapped
``MAP_SHARED`` and is the only rank that writes a block back after its update; the other ranks
(readers) map the same pages and only upload from them.

The hand-off is two counters per block in a shared table, one row per local rank:
  row 0, ``written[i]``: write-back passes whose result for block i has landed in host memory;
  row r, ``read[r][i]``: write-back passes for which reader r's upload of block i has landed.
Before uploading block i in write-back pass p, a reader waits for ``written[i] >= p - 1`` (the
previous pass's update is in place, whole); before writing block i back in pass p, the writer
waits for every ``read[r][i] >= p`` (nobody still needs the old values). A counter moves only
after the copy it stands for has landed (a CUDA event, waited on by a helper thread, so the
training thread never waits for its own copies). Ranks run in lock step (the step's losses are
all-reduced), so the waits are short: they only bite if one rank falls behind.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

POLL_S = 2e-5  # spin interval of a wait on another rank's counter
TIMEOUT_S = 600.0  # a rank that never moves its counter has died: stop with an error


class NodeShare:
    """Args:
        token: a name shared by the ranks of one run (the same on every rank).
        local_rank, local_world: this rank's place among the ranks of its host.
        barrier: waits for every rank of this host (setup and resume only).
        root: where the shared files live (a tmpfs: ``/dev/shm``).

    Attributes: ``writer`` (local rank 0), ``created_bytes`` / ``mapped_bytes`` (host storage
    this rank created, or mapped from the writer), ``passes`` (write-back passes so far).
    """

    def __init__(self, token: str, local_rank: int, local_world: int,
                 barrier: Callable[[], None], root: str = "/dev/shm"):
        self.prefix = os.path.join(root, f"wb-{token}")
        self.rank, self.world, self.barrier = local_rank, local_world, barrier
        self.writer = local_rank == 0
        self.created_bytes = self.mapped_bytes = 0
        self.passes = 0
        self.handoff = True  # tests: off shows that a reader can see a half-written block
        self._next = 0  # blocks mapped so far
        self._files: list[str] = []
        self._counts: torch.Tensor | None = None
        self._marker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="share-flags")

    # --- setup ------------------------------------------------------------------------------
    def _map(self, name: str, numel: int, dtype: torch.dtype, block: bool = True) -> torch.Tensor:
        path = f"{self.prefix}-{name}"
        if not self.writer and not os.path.exists(path):
            raise RuntimeError(f"host_share: {path} is missing; local rank 0 did not create it "
                               "(are the ranks of this host one run?)")
        if self.writer:  # a file past the tmpfs's size would fault (SIGBUS) when written
            st = os.statvfs(os.path.dirname(path))
            need, free = numel * torch.empty((), dtype=dtype).element_size(), \
                st.f_bavail * st.f_frsize
            if need > free:
                raise RuntimeError(f"host_share: {os.path.dirname(path)} has "
                                   f"{free / 2**30:.1f} GiB free, the next block needs "
                                   f"{need / 2**30:.2f} GiB; enlarge it (a container's "
                                   "--shm-size) or set host_share=false")
        t = torch.from_file(path, shared=True, size=numel, dtype=dtype)
        self._files.append(path)
        nbytes = numel * t.element_size() * block  # block storage, not the counter table
        if self.writer:
            self.created_bytes += nbytes
        else:
            self.mapped_bytes += nbytes
        return t

    def start(self, n_blocks: int) -> None:
        """The counter table (writer first; the others map it after the barrier)."""
        if self.writer:
            self._counts = self._map("counts", self.world * n_blocks, torch.int64, False)
            self._counts.zero_()
        self.barrier()  # the table exists before anyone maps it
        if not self.writer:
            self._counts = self._map("counts", self.world * n_blocks, torch.int64, False)
        self._counts = self._counts.view(self.world, n_blocks)

    def storage(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The next streamed block's host storage (blocks in order): the writer creates it
        and fills it; a reader maps it, only after ``filled`` (the writer has written)."""
        self._next += 1
        return self._map(f"block{self._next - 1}", numel, dtype)

    def filled(self) -> None:
        """The writer's initial weights are all in place: readers may map them now."""
        self.barrier()

    def mapped(self) -> None:
        """Every rank has mapped every file: unlink them (the mappings stay), so nothing is
        left in /dev/shm whatever happens to the run from here on."""
        self.barrier()
        if self.writer:
            for path in self._files:
                os.unlink(path)
            self._files.clear()

    # --- the hand-off -----------------------------------------------------------------------
    def begin_pass(self, write_back: bool) -> None:
        if write_back:
            self.passes += 1

    def before_upload(self, block: int, write_back: bool) -> None:
        """Readers: the last write-back pass's update of ``block`` has landed, whole."""
        if self.writer or not self.handoff:
            return
        need = self.passes - 1 if write_back else self.passes
        self._wait(lambda: int(self._counts[0, block]) >= need, f"block {block}: the writer")

    def after_upload(self, block: int, landed: torch.cuda.Event | None) -> None:
        """Readers: this pass's upload of ``block`` has landed (the writer may overwrite it)."""
        if not self.writer:
            self._mark(self.rank, block, self.passes, landed)

    def before_write(self, block: int) -> None:
        """Writer: every reader has uploaded this pass's input of ``block``."""
        if self.handoff:
            self._wait(lambda: bool((self._counts[1:, block] >= self.passes).all()),
                       f"block {block}: a reader")

    def after_write(self, block: int, landed: torch.cuda.Event | None) -> None:
        self._mark(0, block, self.passes, landed)

    def settled(self, n_blocks: int) -> None:
        """Readers, outside steps: every block's last write-back has landed (before reading
        the host copy: a digest check, the save)."""
        for block in range(n_blocks):
            self.before_upload(block, write_back=False)

    def _mark(self, row: int, block: int, value: int, landed) -> None:
        def store() -> None:
            if landed is not None:
                landed.synchronize()  # flag thread only: the copy has landed in host memory
            self._counts[row, block] = value

        if landed is None:
            store()
        else:
            self._marker.submit(store)

    def _wait(self, ready: Callable[[], bool], who: str) -> None:
        t0 = time.monotonic()
        while not ready():
            if time.monotonic() - t0 > TIMEOUT_S:
                raise RuntimeError(f"host_share: {who} did not move on for {TIMEOUT_S:.0f} s "
                                   "(another rank of this host has died or hangs)")
            time.sleep(POLL_S)

    def close(self) -> None:
        self._marker.shutdown(wait=True)
        if self.writer:  # setup failed before the unlink: leave nothing behind
            for path in self._files:
                if os.path.exists(path):
                    os.unlink(path)


class Unshared:
    """The hand-off of a rank with its own host copy (no data parallel, or host_share=false):
    the scheduler calls the same hooks as on a ``NodeShare`` and nothing waits. It is the
    writer of every block and maps nothing."""

    writer = True
    created_bytes = mapped_bytes = 0

    def start(self, n_blocks: int) -> None:
        pass

    def filled(self) -> None:
        pass

    def mapped(self) -> None:
        pass

    def barrier(self) -> None:
        pass

    def begin_pass(self, write_back: bool) -> None:
        pass

    def before_upload(self, block: int, write_back: bool) -> None:
        pass

    def after_upload(self, block: int, landed) -> None:
        pass

    def before_write(self, block: int) -> None:
        pass

    def after_write(self, block: int, landed) -> None:
        pass

    def settled(self, n_blocks: int) -> None:
        pass

    def close(self) -> None:
        pass
