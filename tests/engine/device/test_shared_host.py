"""The node's one host copy (``engine/device/shared_host.py``): the hand-off between the writer (local
rank 0) and the readers, with real processes (torch.multiprocessing, gloo) on the CPU.

The writer writes each pass's block in two halves with a pause between (a slow write-back);
a reader that uploads while a block is half written sees its halves from two passes. With the
hand-off no reader ever does; without it (``handoff = False``) one does, so the check can fail.
"""
from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workbench.engine.device.shared_host import NodeShare

N_BLOCKS, NUMEL, PASSES = 3, 4096, 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, token: str, handoff: bool, root: str, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        share = NodeShare(token, rank, world, dist.barrier, root=root)
        share.handoff = handoff
        share.start(N_BLOCKS)
        blocks = [share.storage(NUMEL, torch.float32) if rank == 0 else None
                  for _ in range(N_BLOCKS)]
        if rank == 0:
            for b in blocks:
                b.fill_(0.0)  # pass 0's values
        share.filled()
        if rank:
            blocks = [share.storage(NUMEL, torch.float32) for _ in range(N_BLOCKS)]
        share.mapped()
        torn = 0
        for p in range(1, PASSES + 1):  # one write-back pass: read every block, write it back
            share.begin_pass(write_back=True)
            for i, block in enumerate(blocks):
                share.before_upload(i, write_back=True)
                seen = block.clone()  # the "upload"
                share.after_upload(i, None)
                if rank:
                    if rank == 1:
                        time.sleep(0.03)  # a slow reader: the writer runs ahead without the wait
                    torn += int(seen.min() != seen.max() or seen[0] != p - 1)
                    continue
                share.before_write(i)
                block[:NUMEL // 2] = p  # the write-back, slow: half, pause, half
                time.sleep(0.01)
                block[NUMEL // 2:] = p
                share.after_write(i, None)
        if rank:
            share.settled(N_BLOCKS)
            torn += int(any(b.min() != PASSES or b.max() != PASSES for b in blocks))
        out[rank] = torn
        files = [f for f in os.listdir(root) if f.startswith(f"wb-{token}")]
        share.close()
        out[world + rank] = len(files)
    finally:
        dist.destroy_process_group()


def _run(world: int, handoff: bool, tmp_path) -> list[int]:
    out = mp.get_context("spawn").Array("i", 2 * world)
    mp.spawn(_worker, args=(world, _free_port(), f"t{os.getpid()}{handoff}", handoff,
                            str(tmp_path), out), nprocs=world, join=True)
    return list(out)


@pytest.mark.parametrize("world", [2, 4])
def test_readers_never_see_a_half_written_block(world, tmp_path):
    out = _run(world, handoff=True, tmp_path=tmp_path)
    assert out[:world] == [0] * world  # every read whole, from the pass before
    assert out[world:] == [0] * world  # the files were unlinked once every rank had mapped them
    assert not list(tmp_path.iterdir())


def test_without_the_handoff_a_reader_sees_one(tmp_path):
    """The same run with the waits off: the check above catches the torn or stale reads."""
    out = _run(2, handoff=False, tmp_path=tmp_path)
    assert out[1] > 0


def test_a_full_tmpfs_is_refused_before_writing(tmp_path, monkeypatch):
    """A block that would not fit the tmpfs is one clear error, not a SIGBUS mid-write."""
    share = NodeShare("full", 0, 2, lambda: None, root=str(tmp_path))

    class Full:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(os, "statvfs", lambda path: Full)
    with pytest.raises(RuntimeError, match=r"host_share: .* GiB free.*host_share=false"):
        share.storage(1 << 20, torch.float32)
    share.close()
    assert not list(tmp_path.iterdir())
