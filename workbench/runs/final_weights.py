"""The end-of-run weights (``save_final``): ``RUN_DIR/weights``, what an export reads.

Written after the run's pending update is flushed, in the checkpoint format
(``engine/checkpoint.py``) with one shard per parameter group, the groups taken one at a time
from ``engine.state_flats()`` (a streamed block is decoded only when it is reached), so the
write holds one group in host memory, as the end-of-run digest does (the planner's "save" row).
Like a checkpoint it is written as ``weights.partial`` and renamed when complete. A failed
write (a full disk) is reported as a warning and costs nothing else: ``run.json`` is complete
and any checkpoint stays exportable.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch

from workbench.config import RunConfig
from workbench.engine.checkpoint import Snapshot, write_checkpoint
from workbench.engine.groups import LazyFlats
from workbench.runs.outcome import os_error
from workbench.runs.rundir import RunWarning
from workbench.telemetry.record import RunRecord

FOLDER = "weights"


def write_final(engine, cfg: RunConfig, out_dir: Path, step: int, record: RunRecord) -> None:
    """Write ``engine``'s weights after ``step`` steps to ``out_dir/weights``; on success
    ``record.info["final_weights"]`` says the step and the seconds it took; on a failed write
    (a full disk), the step and the error, which ``export`` quotes."""
    began, flats = time.perf_counter(), engine.state_flats()
    layouts = engine.group_layouts()
    host = LazyFlats(len(layouts), lambda k: flats[k].detach().to("cpu", torch.float32))
    snap = Snapshot(step, host, [lay.name for lay in layouts], None, cfg.to_dict(),
                    [lay.n_decay for lay in layouts])
    try:
        write_checkpoint(out_dir, snap, name=FOLDER, per_group=True)
    except OSError as e:  # recorded, so that export can say why there is nothing to read
        with record.lock:
            record.info["final_weights"] = {"step": step, "error": os_error(e)}
        warnings.warn(f"{FOLDER} not written ({os_error(e)}): export reads a kept checkpoint "
                      "if there is one, else nothing; free space and run again to keep the "
                      "weights (run.json is complete and records this)", RunWarning)
        return
    with record.lock:
        record.info["final_weights"] = {"step": step, "seconds": time.perf_counter() - began}
