"""How a run ended, in one line: for run.json's ``error``, the terminal and the panel."""
from __future__ import annotations

import traceback
import warnings
from pathlib import Path

import torch

from workbench.config import ConfigError, RunConfig
from workbench.engine.checkpoint import complete_checkpoints
from workbench.runs.rundir import RunWarning
from workbench.telemetry.record import RunRecord


def error_line(cfg: RunConfig, error: BaseException, step: int) -> str:
    """One line for an exception that ended a run."""
    if isinstance(error, torch.OutOfMemoryError):
        return out_of_memory_line(cfg, error)
    if isinstance(error, ConfigError):
        return "; ".join(error.problems)
    if isinstance(error, OSError) and error.strerror:  # a full or read-only disk, ...
        return f"{os_error(error)} (at step {step})"
    return f"{type(error).__name__} at step {step}: {_first_line(error, 300)}"


def out_of_memory_line(cfg: RunConfig, error: BaseException) -> str:
    """One line for a torch.OutOfMemoryError, naming the knob that set the limit."""
    first = _first_line(error, 160) or "out of memory"
    if cfg.gpu_mem_limit_gb > 0:
        return (f"gpu_mem_limit_gb: the run needed more GPU memory than its "
                f"{cfg.gpu_mem_limit_gb:g} GB cap ({first}); raise gpu_mem_limit_gb (0 = the "
                "whole GPU) or see what fits with python -m workbench plan")
    return (f"out of GPU memory ({first}); python -m workbench plan shows what fits (a smaller "
            "batch_size, method=zo-offload, fewer resident_blocks)")


def os_error(e: BaseException) -> str:
    """``No space left on device: /path`` rather than a repr."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror + (f": {e.filename}" if e.filename else "")
    return f"{type(e).__name__}: {e}"


def artefact_failed(name: str, error: OSError) -> None:
    warnings.warn(f"{name} not written ({os_error(error)}); run.json is complete", RunWarning)


def outcome_line(rec: RunRecord, out_dir: Path | None, checkpoint_root: Path | None) -> str:
    """How ``rec`` ended: done / stopped (and how to go on) / failed / diverged, and why."""
    where = f"run directory {out_dir}" if out_dir else ""
    if rec.status in ("failed", "diverged"):  # a diverged run's error says so itself
        return (f"{'failed: ' if rec.status == 'failed' else ''}{rec.error}"
                + (f"; {where}" if where else ""))
    if rec.status == "stopped":
        kept = complete_checkpoints(checkpoint_root) if checkpoint_root is not None else []
        resume = (f"checkpoint {kept[-1].name} kept; continue with: python -m workbench run "
                  f"--resume {out_dir}" if kept and out_dir else
                  "no checkpoint (checkpoint_every=0): a resume starts again from step 0")
        return f"stopped {rec.info.get('stopped', '')}; {resume}"
    return f"{rec.status}: {len(rec.steps)} steps" + (f", {where}" if where else "")


def _first_line(error: BaseException, width: int) -> str:
    line = (str(error).strip().splitlines() or [""])[0]
    return line if len(line) <= width else line[:width - 3] + "..."


def record_end(rec: RunRecord, cfg: RunConfig, error: BaseException, step: int) -> bool:
    """Record in ``rec`` how the run ended by ``error``: stopped (a signal), failed otherwise,
    with one line. False: it had ended already with its own error (left as it is)."""
    if rec.status in ("done", "stopped", "failed", "diverged") and rec.error:
        return False
    if isinstance(error, KeyboardInterrupt):
        rec.status = "stopped"
        # a plain KeyboardInterrupt (Ctrl-C outside graceful_stop) names no signal
        rec.info["stopped"] = f"by {str(error) or 'SIGINT'} at step {step}"
    else:
        rec.status, rec.error = "failed", error_line(cfg, error, step)
        if not isinstance(error, ConfigError):
            rec.info["traceback"] = "".join(traceback.format_exception(error))
    return True
