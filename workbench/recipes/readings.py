"""What a run reads off the machine and sums up at its end: GPU memory (now, before the run),
the summary run.json holds, the progress bar."""
from __future__ import annotations

import gc
import math
import time
from typing import Any

import torch

from workbench.engine.groups import digest, fingerprint
from workbench.telemetry.health import health
from workbench.telemetry.noise import noise
from workbench.telemetry.record import RunRecord
from workbench.telemetry.sampler import gpu_memory_used
from workbench.telemetry.steady import throughput


def memory(device: torch.device) -> tuple[int, int, int]:
    """(allocated, reserved, peak allocated) bytes on ``device`` (zeros off the GPU)."""
    if device.type != "cuda":
        return 0, 0, 0
    return (torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device),
            torch.cuda.max_memory_allocated(device))


def gpu_baseline(device: torch.device) -> dict[str, float]:
    """GPU memory in use before a run builds anything (bytes): NVML's reading (this process's
    CUDA context, other processes) and torch's allocated memory (what the caller holds). The
    figures draw the run's own memory above them. An earlier run of this process is collected
    and its cached blocks returned first."""
    if device.type != "cuda":
        return {}
    gc.collect()  # an earlier run's engine, unreachable but held in a reference cycle
    torch.cuda.synchronize(device)  # setup only: the CUDA context exists before the reading
    torch.cuda.empty_cache()
    return {"gpu mem used before run (bytes)": gpu_memory_used(device.index or 0),
            "torch allocated before run (bytes)": float(torch.cuda.memory_allocated(device))}


def record_digests(rec: RunRecord, engine) -> None:
    """The run's ``param_digest`` and ``param_norm`` (an adapter run's frozen base too, as
    ``base_digest``) and the seconds they took, one group decoded at a time."""
    began = time.perf_counter()
    found = fingerprint(engine.state_flats())
    with rec.lock:
        rec.param_digest, rec.param_norm = found
    base = engine.base_flats()  # adapter runs: the frozen base, a group at a time
    if base:
        base_digest = digest(base)
        with rec.lock:
            rec.base_digest = base_digest
    with rec.lock:  # seconds the end-of-run digests took (largest runs: minutes)
        rec.info["digest_seconds"] = time.perf_counter() - began


def merge_ranks(rec: RunRecord, dist, engine, device: torch.device, dev_data) -> None:
    """Under torchrun: every rank's own view (digest, summary, step times, its dev share, its
    host memory) gathered into rank 0's record."""
    mine = {"rank": dist.rank, "device": str(device),
            "param_digest": rec.param_digest, "summary": rec.summary,
            "step_seconds": [s["seconds"] for s in rec.steps],
            "dev_examples": len(dist.dev_share(dev_data or [])),  # its share
            "host": getattr(engine, "host_report", dict)()}
    ranks = dist.gather(mine)
    with rec.lock:
        rec.info["ranks"] = ranks
        rec.info["world_size"] = dist.world


def summary(rec: RunRecord, engine, device: torch.device) -> dict[str, Any]:
    """run.json's ``summary``: throughput, memory, the end loss, timings, noise, health."""
    steps = rec.steps
    tail = steps[-max(1, len(steps) // 10):] if steps else []
    losses = [s["loss"] for s in tail if s["loss"] is not None]
    n = max(len(steps), 1)
    out: dict[str, Any] = {
        "steps": len(steps),
        **throughput(steps),  # tokens_per_s, step_seconds: steady steps (telemetry/steady.py)
        # the run's own: what the process held before it is not counted
        "peak_gpu_mem_bytes": max(memory(device)[2] - int(
            rec.environment.get("torch allocated before run (bytes)") or 0), 0),
        "gpu_param_bytes": engine.gpu_param_bytes(),
        "final_loss": sum(losses) / len(losses) if losses else math.nan,
        "bytes_h2d": sum(s.get("bytes_h2d", 0) for s in steps) // n,
        "bytes_d2h": sum(s.get("bytes_d2h", 0) for s in steps) // n,
        "build_seconds": rec.info.get("build_seconds"),
        "warmup_seconds": rec.info.get("warmup_seconds"),
        "digest_seconds": rec.info.get("digest_seconds"),  # None: the digest was skipped
        "noise": noise(rec),  # step spread, other processes' CPU, load (telemetry/noise.py)
        "health": health(rec).to_dict(),  # learning health with its evidence
    }
    if rec.evals:
        out["eval_accuracy"] = rec.evals[-1]["accuracy"]
        out["eval_accuracy_start"] = rec.evals[0]["accuracy"]
        out["eval"] = rec.evals[-1].get("metrics", {})
        out["eval_start"] = rec.evals[0].get("metrics", {})
    return out


def progress(total: int, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", leave=False)
