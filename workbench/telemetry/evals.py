"""The objectives' dev metrics as every view names them: the CLI summary and ``compare``, the
HTML report, the dashboard's loss panel and header.

A run records each eval's metrics in ``run.json`` (``evals[i].metrics``: classify accuracy and
loss; completion loss, perplexity, exact_match and token_f1; lm loss and perplexity; see
``data/objectives.py``). Runs saved before objectives existed hold ``accuracy`` and ``loss`` beside
each eval only; ``metrics_of`` reads both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # names only: the CLI reads these without loading torch
    from workbench.telemetry.record import RunRecord


@dataclass(frozen=True)
class EvalMetric:
    """``key`` in ``evals[i].metrics``; ``label`` as views name it; ``fmt`` in tables;
    ``fraction``: a share in [0, 1] (plotted in %); else in the loss's units (nats per token or
    per example, or their exponential)."""

    key: str
    label: str
    fmt: str
    fraction: bool


EVAL_METRICS = (EvalMetric("accuracy", "dev accuracy", "{:.3f}", True),
                EvalMetric("loss", "dev loss", "{:.4f}", False),
                EvalMetric("perplexity", "dev perplexity", "{:.3f}", False),
                EvalMetric("exact_match", "dev exact match", "{:.3f}", True),
                EvalMetric("token_f1", "dev token F1", "{:.3f}", True))
BY_KEY = {m.key: m for m in EVAL_METRICS}
#: The metric that says whether an objective's run learned its task (the dashboard plots it).
MAIN = {"classify": "accuracy", "completion": "exact_match", "lm": "loss"}


def metrics_of(ev: dict[str, Any]) -> dict[str, float]:
    """One eval's metrics (an ``evals`` entry of run.json or a live record)."""
    if ev.get("metrics"):
        return ev["metrics"]
    return {k: ev[k] for k in ("accuracy", "loss") if ev.get(k) is not None}


def eval_value(rec: RunRecord, key: str, when: str) -> float | None:
    """Metric ``key`` at the run's first (``when="start"``) or last (``"end"``) eval; None
    where the run has no such eval or metric."""
    if not rec.evals:
        return None
    return metrics_of(rec.evals[0 if when == "start" else -1]).get(key)


def recorded(recs: Sequence[RunRecord]) -> list[EvalMetric]:
    """The metrics (in ``EVAL_METRICS`` order) that some run's last eval holds."""
    return [m for m in EVAL_METRICS if any(eval_value(r, m.key, "end") is not None for r in recs)]


def main_metric(config: dict[str, Any]) -> EvalMetric:
    """The headline dev metric of a run's objective (``MAIN``; runs saved before objectives
    existed were classify runs)."""
    return BY_KEY[MAIN.get(config.get("objective", "classify"), "accuracy")]


def eval_rows(recs: Sequence[RunRecord]) -> list[tuple[str, str, str, str]]:
    """Summary-table rows of the runs' dev metrics, start and end of each metric some run
    recorded: (label, key, ``"start"`` or ``"end"``, format)."""
    return [(f"{m.label} {when}", m.key, when, m.fmt) for m in recorded(recs)
            for when in ("start", "end")]
