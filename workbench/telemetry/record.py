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
import os
import threading
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from workbench.engine.events import OpEvent
from workbench.telemetry.values import json_safe

EVENT_FIELDS = [f.name for f in fields(OpEvent)]


class RecordError(ValueError):
    """A run directory file that cannot be read (truncated, damaged, not ours)."""


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
    param_digest: str = ""  # engine.groups.digest of the trainable weights (64 hex digits)
    param_norm: float = float("nan")
    status: str = "new"  # new | running | done | stopped | failed | diverged
    error: str = ""  # one line: why the run failed, diverged or stopped
    base_digest: str = ""  # adapter runs: the same digest of the frozen base (never trained)
    path: str = ""  # its run directory, where it has one (not saved: the directory is where)
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
                             self.param_digest, self.param_norm, self.status, self.error,
                             self.base_digest, self.path)

    # --- persistence ------------------------------------------------------------------------
    def run_json(self) -> dict[str, Any]:
        return {"config": self.config, "environment": self.environment, "steps": self.steps,
                "evals": self.evals, "summary": self.summary, "info": self.info,
                "param_digest": self.param_digest, "param_norm": json_safe(self.param_norm),
                "status": self.status, "error": self.error, "base_digest": self.base_digest}

    def save(self, run_dir: str | Path, on_error=None) -> Path:
        """Write run.json, then events.json.gz and samples.json.gz, under ``run_dir``.

        run.json comes first, so a later artefact's failure never costs it. ``on_error(name,
        exc)``, if given, is told of an artefact (not run.json) that could not be written, and
        the save goes on; without it the error is raised."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        snap = self.snapshot()
        write_json(run_dir / "run.json", snap.run_json())
        columns = {k: [getattr(e, k) for e in snap.events] for k in EVENT_FIELDS}
        keys = sorted({k for s in snap.samples for k in s})
        for name, blob in (("events.json.gz", {"events": columns, "step_ops": snap.step_ops}),
                           ("samples.json.gz", {k: [json_safe(s.get(k, math.nan))
                                                    for s in snap.samples] for k in keys})):
            try:
                _write_gz(run_dir / name, blob)
            except OSError as e:
                if on_error is None:
                    raise
                on_error(name, e)
        return run_dir

    @classmethod
    def load(cls, run_dir: str | Path, telemetry: bool = True) -> "RunRecord":
        """The record a run directory holds (the same object the live view draws); without
        ``telemetry``, run.json alone (no events or samples).

        Raises:
            FileNotFoundError: no run.json. RecordError: a file is truncated or damaged."""
        run_dir = Path(run_dir)
        path = run_dir / "run.json"
        if not path.is_file():
            raise FileNotFoundError(f"{run_dir} is not a run directory (no run.json)")
        data = _read(path, lambda: json.loads(path.read_text(encoding="utf-8")))
        if not isinstance(data, dict):
            raise RecordError(f"{path} is not a run record (a JSON object)")
        rec = cls(**_fields(path, data), path=str(run_dir))
        ev, sm = run_dir / "events.json.gz", run_dir / "samples.json.gz"
        if telemetry and ev.is_file():
            def events():
                blob = _read_gz(ev)
                cols = blob["events"]
                return ([OpEvent(*row) for row in zip(*(cols[k] for k in EVENT_FIELDS))],
                        blob.get("step_ops", []))
            rec.events, rec.step_ops = _read(ev, events)
        if telemetry and sm.is_file():
            def samples():
                cols = _read_gz(sm)
                n = max((len(v) for v in cols.values()), default=0)
                return [{k: _nan(v[i]) for k, v in cols.items()} for i in range(n)]
            rec.samples = _read(sm, samples)
        return rec


#: run.json's keys: (the type its value must have, the value a null or a missing key reads as).
SHAPES: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "config": (dict, {}), "environment": (dict, {}), "steps": (list, []), "evals": (list, []),
    "info": (dict, {}), "summary": (dict, {}), "param_digest": (str, ""),
    "param_norm": ((int, float), None), "status": (str, "done"), "error": (str, ""),
    "base_digest": (str, "")}


def _fields(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """RunRecord's fields from run.json: a null or missing key reads as empty (a record with
    holes renders with what is there); a value of the wrong type is one RecordError line."""
    out: dict[str, Any] = {}
    for key, (kind, empty) in SHAPES.items():
        value = data.get(key)
        if value is None:
            value = type(empty)() if isinstance(empty, (dict, list)) else empty
        elif isinstance(value, bool) or not isinstance(value, kind):
            raise RecordError(f"{path} is not a run record ({key!r} is "
                              f"{type(value).__name__}, not {_kind_name(kind)})")
        out[key] = value
    for key in ("steps", "evals"):
        bad = next((i for i, row in enumerate(out[key]) if not isinstance(row, dict)
                    or not isinstance(row.get("step"), int)), None)
        if bad is not None:
            raise RecordError(f"{path} is not a run record ({key}[{bad}] is not a row with a "
                              "whole-number step)")
    out["param_norm"] = _nan(out["param_norm"])
    # summary figures are numbers (or null, or a dict of dev metrics): anything else is a hole
    out["summary"] = {k: v for k, v in out["summary"].items()
                      if v is None or isinstance(v, (int, float, dict)) and not isinstance(v, bool)}
    return out


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {dict: "an object", list: "a list", str: "text", int: "a number", float: "a number"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds))


def _read(path: Path, parse):
    """``parse()``, with any sign of a truncated or damaged file as one RecordError line."""
    try:
        return parse()
    except (OSError, EOFError, UnicodeDecodeError, ValueError, KeyError, TypeError,
            AttributeError) as e:  # gzip.BadGzipFile is an OSError, JSONDecodeError a ValueError
        raise RecordError(f"{path} cannot be read: truncated or damaged ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else 'no detail'})") from None


def _nan(x: Any) -> float:
    return math.nan if x is None else float(x)


def write_json(path: Path, obj: Any) -> None:
    """Replace ``path`` atomically: a temp file, fsync, rename. Non-finite numbers become null.
    Readers see the old file or the new one, never a torn one; a failed write leaves no temp."""
    text = json.dumps(json_safe(obj), indent=1, default=_json_default, allow_nan=False)
    _atomic(path, lambda fh: fh.write(text.encode("utf-8")))


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (temp file, fsync, rename)."""
    _atomic(path, lambda fh: fh.write(data))


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())  # the bytes are on disk before the name points at them
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _json_default(o: Any) -> Any:
    if hasattr(o, "__dataclass_fields__"):
        return json_safe(asdict(o))
    return str(o)


def _write_gz(path: Path, obj: Any) -> None:
    text = json.dumps(json_safe(obj), separators=(",", ":"), default=_json_default)
    _atomic(path, lambda fh: fh.write(gzip.compress(text.encode("utf-8"), compresslevel=6)))


def _read_gz(path: Path) -> Any:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)
