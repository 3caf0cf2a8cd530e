"""Auto-tune: the planner proposes settings that fit, short trial runs measure the best few,
the fastest is written as a TOML config (a ``[run]`` table ``--config`` loads).

    result = tune(RunConfig(model="opt-13b", device="cuda", amp="bf16"), "runs/tune", gpu="24gb")
    # runs/tune/<candidate>/ per trial, runs/tune/sweep.json, runs/tune/best.toml

The candidates are ``plan.fit.suggest``'s zo-offload settings (codec / master x resident
blocks) within the GPU budget, best predicted tokens/s first; the top ``top`` run for
``trial_steps`` steps each through the sweep machinery (so they are normal run directories,
refused if they cannot fit, stoppable), with one dev example evaluated and, on a GPU, the
budget as ``gpu_mem_limit_gb``. The winner is the fastest measured run, which need not be the
planner's first choice: the report shows predicted against measured for each. Trials whose
speeds the noise cannot tell apart (``telemetry.noise``) are no winner over each other: among
them the planner's first choice is kept, and ``best.toml`` says so. Tune refuses a CPU run: its
timings there rank the load of the host, not the settings.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from workbench.calibrate.machine import check_fits_here
from workbench.config import ConfigError, RunConfig
from workbench.models.shape import shape_of
from workbench.plan.fit import suggest
from workbench.plan.planner import GiB
from workbench.recipes.sweep import Point, Sweep

TOML_NAME = "best.toml"
KNOBS = ("codec", "master", "resident_blocks")


@dataclass
class TuneResult:
    """``sweep``: the trials; ``best``: the fastest finished trial (None if none finished);
    ``config``: its settings at the user's run length; ``toml``: where they were written."""

    sweep: Sweep
    best: Point | None
    config: RunConfig | None
    toml: Path | None


def gpu_problems(cfg: RunConfig) -> list[str]:
    """Why tune cannot run ``cfg`` here: it needs a CUDA GPU ([] when it has one)."""
    import torch

    if cfg.device == "cuda" and torch.cuda.is_available():
        return []
    where = "this machine has no CUDA GPU" if not torch.cuda.is_available() else "set device=cuda"
    return [f"tune: needs a CUDA GPU ({where}): it times trial runs to rank the GPU settings "
            "codec, master and resident_blocks; on a CPU the timings rank the host's load"]


def budget_bytes(cfg: RunConfig, gpu: str | None, budget_gb: float | None) -> int | None:
    """The GPU memory the trials may use (bytes, NVML level): ``budget_gb`` GiB, else the
    table GPU's memory, else this machine's free memory; None on a CPU run."""
    if cfg.device != "cuda":
        return None
    if budget_gb is not None:
        return int(budget_gb * GiB)
    if gpu is not None:
        from workbench.plan.rates import gpu_profile

        try:
            return int(gpu_profile(gpu)["gpu_mem_total_bytes"])
        except ValueError as e:
            raise ConfigError([str(e)]) from None
    import torch

    return int(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else None


def propose(cfg: RunConfig, gpu: str | None = None, budget: int | None = None,
            top: int = 3) -> list[dict[str, Any]]:
    """The planner's ``top`` settings (knob -> value) that fit ``budget`` and the host, best
    predicted tokens/s first.

    Raises:
        ConfigError: nothing fits (the message says the budget).
    """
    shape = shape_of(cfg.model)
    rows = suggest(cfg, budget if budget is not None else 2 ** 62, gpu, None, device=cfg.device,
                   shape=shape)
    # tune measures the codec / master / resident_blocks space at the run's own slots and ends
    rows = [r for r in rows if r["fits_host"] and r["stream_embeddings"] == cfg.stream_embeddings
            and r["block_slots"] == cfg.block_slots]
    if not rows:
        where = f"{budget / GiB:.1f} GiB of GPU memory" if budget else "this host's memory"
        raise ConfigError([f"tune: no zo-offload setting of {cfg.model} fits {where}"])
    layers = shape.num_layers
    out: list[dict[str, Any]] = []
    for r in rows:
        if r["resident_blocks"] >= layers:  # nothing streams: the transfer format is moot
            r = {**r, "codec": "fp32", "master": "fp32"}
        changes = {k: r[k] for k in KNOBS}
        if changes not in out:
            out.append(changes)
    return out[:top]


def tune(cfg: RunConfig, out_dir: str | Path, gpu: str | None = None,
         budget_gb: float | None = None, top: int = 3, trial_steps: int = 6,
         progress: bool = False, on_update: Callable[[Sweep, Point], None] | None = None,
         start: Callable[[Sweep], None] | None = None) -> TuneResult:
    """Propose, measure, write the fastest as ``out_dir/best.toml``.

    Args:
        cfg: the run to tune (its model, data, batch, amp, ...; ``steps`` is the length the
            TOML keeps, trials run ``trial_steps``).
        gpu: a planner GPU table name (``24gb``, ``h100``, ...): its memory is the budget and
            its rates rank the candidates; None: this machine.
        budget_gb: GPU memory budget in GiB (overrides ``gpu``'s).
        top: how many candidates to measure.
        trial_steps: steps per trial (the first is warm-up and not counted).
        start: called with the trials' ``Sweep`` before they run (the widget keeps it to stop).

    Raises:
        ConfigError: bad arguments, or nothing fits.
        SweepError: ``out_dir`` holds other runs.
    """
    problems = []
    if top < 1:
        problems.append(f"top: {top} is below 1 (candidates to measure)")
    if trial_steps < 2:
        problems.append(f"trial_steps: {trial_steps} is below 2 (the first step is warm-up)")
    if budget_gb is not None and not budget_gb > 0:
        problems.append(f"budget_gb: {budget_gb} is not a positive number of GiB")
    problems += gpu_problems(cfg)
    if problems:
        raise ConfigError(problems)
    budget = budget_bytes(cfg, gpu, budget_gb)
    candidates = propose(cfg, gpu, budget, top)
    capped = budget / GiB if budget is not None and (gpu or budget_gb) else 0.0
    capped = capped if cfg.device == "cuda" else 0.0  # the cap is a GPU's (a CPU run: none)
    final = cfg.replace(method="zo-offload", gpu_mem_limit_gb=round(capped, 3))
    trial = final.replace(steps=trial_steps, eval_samples=1, checkpoint_every=0)
    sweep = Sweep(trial, candidates, out_dir, kind="tune",
                  fits=lambda c: check_fits_here(c, gpu=gpu), rank_by="tokens_per_s")
    sweep.extra = {"gpu": gpu, "budget_bytes": budget, "trial_steps": trial_steps}
    if start is not None:
        start(sweep)
    sweep.run(progress=progress, on_update=on_update)
    done = [p for p in sweep.finished() if p.status in ("done", "reused")]
    if not done:
        sweep.save()
        return TuneResult(sweep, None, None, None)
    best, tied = pick(sweep, done)
    best_cfg = final.replace(**best.changes)
    path = Path(out_dir) / TOML_NAME
    tps, want = best.measured.get("tokens_per_s"), best.predicted.get("tokens_per_s")
    why = (f"the fastest of {len(sweep.finished())} trials" if len(tied) < 2 else
           f"{len(tied)} trials within noise of the fastest ({', '.join(p.name for p in tied)}): "
           "no winner among them; this is the planner's first choice of those")
    path.write_text(config_toml(best_cfg, [
        f"written by python -m workbench tune on {_dt.date.today().isoformat()}: {why}",
        f"measured {_num_text(tps)} tokens/s over {trial_steps} steps; planner predicted "
        f"{_num_text(want)}" + (f" (for gpu={gpu})" if gpu else ""),
        f"trials and report: {Path(out_dir).resolve()}"]))
    sweep.extra.update(best=best.name, toml=TOML_NAME,
                       within_noise=[p.name for p in tied] if len(tied) > 1 else [])
    sweep.save()
    return TuneResult(sweep, best, best_cfg, path)


def pick(sweep: Sweep, done: list[Point]) -> tuple[Point, list[Point]]:
    """The trial to keep, and the trials within noise of the fastest (itself included): one
    of those is no faster than the others, so the planner's first choice among them (the
    earliest candidate) is kept rather than the one the noise put first."""
    fastest = done[0]  # ``finished()`` ranks by tokens/s
    tied = [p for p in done if p is fastest or sweep.rank.within(fastest.measured, p.measured)]
    return min(tied, key=sweep.points.index), tied


def config_toml(cfg: RunConfig, comments: list[str] = ()) -> str:
    """Every setting of ``cfg`` as a ``[run]`` table (``load_config`` reads it back equal)."""
    lines = [f"# {c}" for c in comments] + ["[run]"]
    for f in fields(RunConfig):
        lines.append(f"{f.name} = {_toml_value(getattr(cfg, f.name))}")
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v} has no TOML form in a config")
        text = repr(v)
        return text if any(c in text for c in ".en") else text + ".0"
    return json.dumps(str(v))  # a TOML basic string: JSON's escapes are TOML's


def _num_text(v: Any) -> str:
    return f"{v:,.0f}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"
