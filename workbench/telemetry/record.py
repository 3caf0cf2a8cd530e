"""The run record: what a run did, live or reloaded from its directory.

One object feeds the live dashboard, the saved run directory and the exported report, so all
three are drawn by the same code. A run directory holds:
    run.json         config, environment, steps, evals, summary, digest (human-readable)
    events.json.gz   per-operation stream events, columnar
    samples.json.gz  NVML / host samples, columnar
    trace.json       Chrome trace for Perfetto (written by ``telemetry.trace``)
"""
from __future__ import annotations

import gzip
import json
import math
import threading
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from workbench.engine.events import OpEvent

EVENT_FIELDS = [f.name for f in fields(OpEvent)]


@dataclass
class RunRecord:
    """Everything recorded about one run. Lists grow while the run is live; readers take
    ``lock`` (or use ``snapshot``) to get a consistent view."""

    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    events: list[OpEvent] = field(default_factory=list)
    step_ops: list[dict[str, Any]] = field(default_factory=list)  # per-step op totals (all steps)
    samples: list[dict[str, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    param_digest: str = ""
    param_norm: float = float("nan")
    status: str = "new"  # new | running | done | stopped | failed
    base_digest: str = ""  # adapter runs: SHA-256 of the frozen base (unchanged by training)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    @property
    def name(self) -> str:
        c = self.config
        return self.info.get("name") or f"{c.get('method', '?')} {c.get('model', '?')}"

    def snapshot(self) -> "RunRecord":
        """A copy safe to read while the run goes on."""
        with self.lock:
            return RunRecord(dict(self.config), dict(self.environment), list(self.steps),
                             list(self.evals), list(self.events), list(self.step_ops),
                             list(self.samples), dict(self.info), dict(self.summary),
                             self.param_digest, self.param_norm, self.status,
                             self.base_digest)

    # --- persistence ------------------------------------------------------------------------
    def run_json(self) -> dict[str, Any]:
        return {"config": self.config, "environment": self.environment, "steps": self.steps,
                "evals": self.evals, "summary": self.summary, "info": self.info,
                "param_digest": self.param_digest, "param_norm": _finite(self.param_norm),
                "status": self.status, "base_digest": self.base_digest}

    def save(self, run_dir: str | Path) -> Path:
        """Write run.json, events.json.gz and samples.json.gz under ``run_dir``."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        snap = self.snapshot()
        _write_json(run_dir / "run.json", snap.run_json())
        columns = {k: [getattr(e, k) for e in snap.events] for k in EVENT_FIELDS}
        _write_gz(run_dir / "events.json.gz", {"events": columns, "step_ops": snap.step_ops})
        keys = sorted({k for s in snap.samples for k in s})
        _write_gz(run_dir / "samples.json.gz",
                  {k: [_finite(s.get(k, math.nan)) for s in snap.samples] for k in keys})
        return run_dir

    @classmethod
    def load(cls, run_dir: str | Path) -> "RunRecord":
        """The record a run directory holds (the same object the live view draws)."""
        run_dir = Path(run_dir)
        path = run_dir / "run.json"
        if not path.is_file():
            raise FileNotFoundError(f"{run_dir} is not a run directory (no run.json)")
        data = json.loads(path.read_text())
        rec = cls(config=data.get("config", {}), environment=data.get("environment", {}),
                  steps=data.get("steps", []), evals=data.get("evals", []),
                  info=data.get("info", {}), summary=data.get("summary", {}),
                  param_digest=data.get("param_digest", ""),
                  param_norm=_nan(data.get("param_norm")), status=data.get("status", "done"),
                  base_digest=data.get("base_digest", ""))
        ev = run_dir / "events.json.gz"
        if ev.is_file():
            blob = _read_gz(ev)
            cols = blob["events"]
            rec.events = [OpEvent(*row) for row in zip(*(cols[k] for k in EVENT_FIELDS))]
            rec.step_ops = blob.get("step_ops", [])
        sm = run_dir / "samples.json.gz"
        if sm.is_file():
            cols = _read_gz(sm)
            n = max((len(v) for v in cols.values()), default=0)
            rec.samples = [{k: _nan(v[i]) for k, v in cols.items()} for i in range(n)]
        return rec


def _finite(x: Any) -> Any:
    """JSON has no NaN: store None."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _nan(x: Any) -> float:
    return math.nan if x is None else float(x)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=_json_default, allow_nan=False))
    tmp.replace(path)


def _json_default(o: Any) -> Any:
    if isinstance(o, float):
        return _finite(o)
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    return str(o)


def _write_gz(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        json.dump(obj, fh, separators=(",", ":"), default=_json_default)
    tmp.replace(path)


def _read_gz(path: Path) -> Any:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)
