"""The planner's best next knob for a run: one change and its predicted gain in tokens/s.

Pure arithmetic over the run's config and environment (``plan.planner.plan``; no model is built),
so it can be shown beside the bottleneck verdict in the live dashboard, ``compare`` and the
report. Gains are ratios of the planner's predictions (the changed run against the run as it
is), so a planner that is off by a constant factor on this machine still ranks knobs right.
Only changes the planner says fit the run's GPU (its table entry, matched by name) and host
are offered.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from workbench.config import STREAMING_METHODS, ConfigError, RunConfig
from workbench.models.shape import shape_of
from workbench.plan.planner import plan
from workbench.telemetry.record import RunRecord

#: Below this predicted ratio a change is not worth a run.
MIN_GAIN = 1.05
#: Transfer formats the planner compares, as (codec, master) pairs.
CODECS = (("fp32", "fp32"), ("bf16", "compressed-sr"), ("fp16", "compressed-sr"),
          ("bf16", "fp32"), ("fp8-e4m3", "fp32"))
#: NVML device names -> the planner's GPU table (``calibration.GPUS``), first match wins.
GPU_NAMES = (("h200", "h200"), ("h100", "h100"), ("a100-sxm4-40gb", "a100-40gb"),
             ("a100-pcie-40gb", "a100-40gb"), ("a100", "a100-80gb"), ("4090", "rtx-4090"))


@dataclass(frozen=True)
class Advice:
    """``changes``: knob -> value ({} when nothing helps); ``gain``: predicted tokens/s ratio
    (NaN when there is no prediction); ``text``: one line for the UI."""

    changes: dict[str, Any] = field(default_factory=dict)
    gain: float = math.nan
    text: str = ""


def run_config(rec: RunRecord) -> RunConfig:
    """The record's config as a ``RunConfig`` (fields this version does not know are dropped).

    Raises:
        ConfigError: the saved settings are no longer valid here (e.g. a model folder is gone).
    """
    return RunConfig.from_saved(rec.config)


def planner_gpu(environment: dict[str, Any]) -> str | None:
    """The planner's table name for the GPU a run saw (None: not in the table)."""
    name = str(environment.get("gpu name") or "").lower().replace(" ", "-")
    return next((key for pattern, key in GPU_NAMES if pattern in name), None)


def candidates(cfg: RunConfig) -> list[dict[str, Any]]:
    """Single changes worth predicting for ``cfg`` (a codec change moves master with it)."""
    out: list[dict[str, Any]] = []
    if cfg.method in STREAMING_METHODS:
        out += [{"codec": c, "master": m} for c, m in CODECS
                if (c, m) != (cfg.codec, cfg.master)]
        layers = shape_of(cfg.model).num_layers
        out += [{"resident_blocks": r} for r in range(cfg.resident_blocks + 1, layers + 1)]
        if cfg.prefetch_depth < 8:
            out.append({"prefetch_depth": cfg.prefetch_depth + 1})
        out += [{k: True} for k in ("overlap", "fused_update", "reuse_buffers")
                if not getattr(cfg, k)]
    if cfg.method in ("mezo", *STREAMING_METHODS) and cfg.rng == "torch":
        out.append({"rng": "philox"})
    if cfg.amp == "off":
        out.append({"amp": "bf16"})
    return out


def next_knob(rec: RunRecord, min_gain: float = MIN_GAIN) -> Advice:
    """The change the planner predicts gains the most tokens/s for ``rec``'s run, if any gains
    at least ``min_gain``x and fits the run's GPU and host."""
    try:
        cfg = run_config(rec)
        gpu = planner_gpu(rec.environment) if cfg.device == "cuda" else None
        ram = rec.environment.get("host ram (bytes)")
        calib = {"host_mem_available_bytes": int(ram)} if ram else None
        shape = shape_of(cfg.model)
        base = plan(cfg, gpu, calib, shape=shape)
    except (ConfigError, OSError, KeyError, ValueError) as e:
        return Advice(text=f"no planner advice ({type(e).__name__}: {e})")
    best: tuple[float, dict[str, Any]] = (0.0, {})
    for change in candidates(cfg):
        try:
            p = plan(cfg.replace(**change), gpu, calib, shape=shape)
        except ConfigError:
            continue  # a combination the config refuses (e.g. too many resident blocks)
        gain = p.tokens_per_s / base.tokens_per_s if base.tokens_per_s > 0 else math.nan
        if p.fits_gpu and p.fits_host and gain > best[0] + 1e-9:
            best = (gain, change)
    gain, change = best
    if not change or not gain >= min_gain:
        text = (f"no single knob predicted to gain {min_gain - 1:.0%} or more"
                if cfg.device == "cuda" else "none on a CPU (its knobs tune a GPU's transfers)")
        return Advice(gain=gain if change else math.nan, text=text)
    knobs = " ".join(f"{k}={_text(v)}" for k, v in change.items())
    return Advice(change, gain, f"{knobs}: predicted {gain:.2f}x tokens/s")


def _text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)
