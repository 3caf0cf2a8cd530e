"""Ranking finished runs by a metric the user picks, and which of them the noise cannot tell
from the best.

    --rank-by tokens_per_s      steady throughput, higher first
    --rank-by loss              the final training loss (mean of the last 10% of steps), lower
    --rank-by dev.<metric>      a dev metric at the last eval (dev.accuracy, dev.loss, ...)

Each run is read from its ``measured`` dict (``measured(rec)``: what a sweep's manifest keeps),
so the CLI table, the sweep report and ``tune`` rank from ``sweep.json`` alone. A run is
*within noise* of the best when the difference is inside what the two measurements can tell:
    tokens_per_s   ``telemetry.noise.within`` (the runs' step spread, a busy host)
    loss           two standard errors of the difference of the two tail means
    dev fraction   two standard errors of two proportions over the dev examples
    dev loss / perplexity   under ``DEV_MOVE`` relative (one dev set: no batch noise)
Ties on the ranked metric keep the faster run first.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from workbench.config import ConfigError
from workbench.telemetry import noise
from workbench.telemetry.evals import BY_KEY, main_metric, metrics_of
from workbench.telemetry.health import DEV_MOVE, health
from workbench.telemetry.record import RunRecord
from workbench.telemetry.steady import throughput
from workbench.telemetry.values import num

SPEED, LOSS = "tokens_per_s", "loss"


@dataclass(frozen=True)
class RankBy:
    """``key``: "tokens_per_s", "loss" or "dev.<metric>"; ``higher``: bigger is better."""

    key: str
    label: str
    higher: bool
    fmt: str

    def value(self, m: dict[str, Any]) -> float:
        """The ranked number of a run's ``measured`` dict (NaN when it has none)."""
        if self.key == SPEED:
            return num(m.get("tokens_per_s"))
        if self.key == LOSS:
            return num(m.get("final_loss"))
        return num((m.get("dev") or {}).get(self.key[4:]))

    def own_column(self, main_key: str) -> bool:
        """Whether a table needs a column for this metric: a dev metric other than the
        ``main_key`` one it shows anyway (speed, final loss and the main metric are shown)."""
        return self.key.startswith("dev.") and self.key[4:] != main_key

    def within(self, best: dict[str, Any], other: dict[str, Any]) -> bool:
        """Whether ``other`` cannot be told from ``best`` on this metric."""
        a, b = self.value(best), self.value(other)
        if not (math.isfinite(a) and math.isfinite(b)):
            return False
        if self.key == SPEED:
            return a > 0 and noise.within(b / a, best.get("noise") or {}, other.get("noise") or {})
        if self.key == LOSS:
            se = math.hypot(num(best.get("final_loss_se"), 0.0),
                            num(other.get("final_loss_se"), 0.0))
            return abs(a - b) <= 2 * se
        metric = BY_KEY[self.key[4:]]
        if metric.fraction:
            n = max(min(int(best.get("dev_examples") or 0), int(other.get("dev_examples") or 0)), 1)
            se = math.sqrt(max(a * (1 - a), 1 / n) / n + max(b * (1 - b), 1 / n) / n)
            return abs(a - b) <= 2 * se
        return abs(b - a) <= DEV_MOVE * abs(a)

    def better(self, a: float, b: float) -> bool:
        return a > b if self.higher else a < b


def parse_rank_by(text: str) -> RankBy:
    """``"tokens_per_s"``, ``"loss"`` or ``"dev.<metric>"`` as a ``RankBy``.

    Raises:
        ConfigError: anything else, naming what is allowed.
    """
    if text == SPEED:
        return RankBy(SPEED, "tokens/s (steady)", True, "{:,.0f}")
    if text == LOSS:
        return RankBy(LOSS, "final loss", False, "{:.4f}")
    if text.startswith("dev.") and text[4:] in BY_KEY:
        m = BY_KEY[text[4:]]
        return RankBy(text, m.label, m.fraction, m.fmt)
    raise ConfigError([f"--rank-by: {text!r} is not tokens_per_s, loss or dev.<metric> "
                       f"({', '.join('dev.' + k for k in BY_KEY)})"])


def default_rank_by(config: dict[str, Any]) -> str:
    """The objective's main dev metric when the runs have a dev split, else tokens_per_s."""
    if config.get("data") == "synthetic":
        return SPEED
    return f"dev.{main_metric(config).key}"


def ranked(items: Sequence[Any], by: RankBy, measured=lambda x: x) -> list[Any]:
    """``items`` best first by ``by`` (``measured(item)`` gives each one's measured dict); runs
    without the metric last; ties broken by tokens/s."""
    def key(item):
        m = measured(item)
        v, speed = by.value(m), num(m.get("tokens_per_s"))
        sign = -1 if by.higher else 1
        return (not math.isfinite(v), sign * v if math.isfinite(v) else 0.0,
                -speed if math.isfinite(speed) else 0.0)
    return sorted(items, key=key)


def measured(rec: RunRecord) -> dict[str, Any]:
    """What a sweep keeps of a finished run to rank and show it: its summary's speed, memory
    and losses, the standard error of its final loss, its dev metrics at the first and last
    eval and how many dev examples, its health state and its timing noise."""
    s = rec.summary
    speed = throughput(rec.steps)
    tail = [float(r["loss"]) for r in rec.steps[-max(1, len(rec.steps) // 10):]
            if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])]
    out = {"tokens_per_s": s.get("tokens_per_s", speed["tokens_per_s"]),
           "step_seconds": s.get("step_seconds", speed["step_seconds"]),
           "peak_gpu_mem_bytes": s.get("peak_gpu_mem_bytes"),
           "final_loss": s.get("final_loss", statistics.fmean(tail) if tail else None),
           "final_loss_se": (statistics.stdev(tail) / math.sqrt(len(tail))
                             if len(tail) > 1 else None),
           "dev": metrics_of(rec.evals[-1]) if rec.evals else {},
           "dev_start": metrics_of(rec.evals[0]) if rec.evals else {},
           "dev_examples": rec.evals[-1].get("examples") if rec.evals else None,
           "health": (s.get("health") or {}).get("state") or health(rec).state,
           "noise": noise.of(rec)}
    out["eval_accuracy"] = out["dev"].get("accuracy")  # what older manifests held
    return {k: _clean(v) for k, v in out.items()}


def _clean(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    return None if isinstance(v, float) and not math.isfinite(v) else v