"""Sweeps: a grid of settings, each point a normal run directory, what cannot fit refused.

    sweep = Sweep.grid(base_cfg, {"overlap": [True, False], "prefetch_depth": [1, 2]}, "runs/s")
    sweep.run()            # runs/s/overlap-true_prefetch_depth-1/, ... and runs/s/sweep.json

Every point goes through the training recipe (``train.run``), so each is a run directory like
any other (``compare``, ``report`` and ``RunRecord.load`` read it). Before anything runs, each
point is checked: settings the config refuses (``master=compressed-sr`` with ``codec=fp32``)
and runs the planner says cannot fit (``calibrate.machine.check_fits_here``, with its estimate)
are refused with the reason; the others run one after the other. ``sweep.json`` records every
point's status, the planner's prediction and what was measured, after each change, so the CLI, the
notebook widget and the report read one file. A sweep can be stopped at any time
(``stop()``: the current run ends after its step and is saved as stopped; the rest are
skipped).

A sweep folder has the lifecycle of a run directory: ``sweep.lock`` (``lockfile``) keeps a
second sweep out while one runs; a folder holding a sweep is refused before any work, unless
``resume`` (the same grid: finished points are reused, a stopped, failed or interrupted one
continues from its checkpoint, the rest run) or ``overwrite`` (the old sweep's points, manifest
and report are removed, nothing else). A point folder holding anything but the sweep's own run
is never replaced.
"""
from __future__ import annotations

import itertools
import json
import math
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from workbench.calibrate.machine import check_fits_here
from workbench.config import ConfigError, RunConfig, check_environment, parse_value
from workbench.config.checks import value_problems
from workbench.engine.events import EventBus, StepEvent
from workbench.runs.sweep_folder import (MANIFEST, SweepError, check_sweep_folder, claim,
                                            load_manifest, release)
from workbench.telemetry import noise, ranking
from workbench.telemetry.evals import main_metric
from workbench.telemetry.naming import value_text
from workbench.telemetry.record import RunRecord, write_json
from workbench.telemetry.values import finite_or_none, num
from workbench.telemetry.verdict import verdict

#: States a point ends in; "reused": finished in an earlier sweep into the same folder.
FINISHED = ("done", "stopped", "reused")


@dataclass
class Point:
    """One setting of the grid.

    Attributes:
        name: "knob=value knob=value", as the tables show it.
        changes: knob -> value over the base settings.
        dir: its run directory.
        status: pending | running | done | stopped | failed | refused | skipped | reused.
        reason: why it was refused, failed or skipped.
        predicted: the planner's ``tokens_per_s``, ``peak_gpu_mem_bytes``, ``step_seconds``.
        measured: ``measured(rec)``: speed, memory, losses, dev metrics, health, timing
            noise and the bottleneck ``verdict``.
    """

    name: str
    changes: dict[str, Any]
    dir: Path
    cfg: RunConfig | None = None
    status: str = "pending"
    reason: str = ""
    predicted: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)
    resume: bool = False  # its folder holds its own unfinished run: continue it

    def to_json(self, root: Path) -> dict[str, Any]:
        return {"name": self.name, "changes": self.changes, "dir": _rel(self.dir, root),
                "status": self.status, "reason": self.reason, "predicted": self.predicted,
                "measured": self.measured}


def parse_sweeps(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["overlap=true,false", "prefetch_depth=1,2"]`` -> ``{"overlap": [True, False], ...}``.

    Raises:
        SweepError: every malformed item, unknown knob, bad value or repeated knob, at once.
    """
    axes: dict[str, list[Any]] = {}
    problems: list[str] = []
    for item in items:
        if "=" not in item:
            problems.append(f"--sweep {item!r}: expected KNOB=V1,V2,...")
            continue
        knob, values = (part.strip() for part in item.split("=", 1))
        texts = [v.strip() for v in values.split(",") if v.strip()]
        if knob in axes:
            problems.append(f"--sweep {knob}: given twice; list every value once, comma-separated")
            continue
        if not texts:
            problems.append(f"--sweep {knob}: no values (expected {knob}=V1,V2,...)")
            continue
        try:
            parsed = [parse_value(knob, t) for t in texts]
        except ConfigError as e:
            problems += [f"--sweep {p}" for p in e.problems]
            continue
        bad = [f"--sweep {p}" for v in parsed for p in value_problems(knob, v)]
        if bad:  # a value no point may take: the grid is refused before any point runs
            problems += bad
            continue
        if len(set(map(repr, parsed))) != len(parsed):
            problems.append(f"--sweep {knob}: a value is listed twice ({values})")
            continue
        axes[knob] = parsed
    if not axes and not problems:
        problems.append("--sweep: at least one KNOB=V1,V2,... is needed")
    if problems:
        raise SweepError(problems)
    return axes


def point_name(changes: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={_text(v)}" for k, v in changes.items()) or "base"


def folder_name(changes: Mapping[str, Any]) -> str:
    """A file-system-safe folder for a point: ``overlap-false_prefetch_depth-2``."""
    text = "_".join(f"{k}-{_text(v)}" for k, v in changes.items()) or "base"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)


class Sweep:
    """Args:
        base: settings shared by every point.
        points: each point's changes over ``base``, in run order.
        out_dir: the sweep's folder (a run directory per point, and ``sweep.json``).
        axes: the grid's knobs and values, when the points are a grid (for the report).
        kind: "sweep" or "tune" (written to the manifest).
        fits: the fit check (default ``calibrate.machine.check_fits_here``); raises
            ``ConfigError`` to refuse.
        rank_by: what ranks the finished points (``telemetry.ranking``: tokens_per_s, loss,
            dev.<metric>); default the objective's main dev metric when there is dev data,
            else tokens_per_s.

        resume: ``out_dir`` holds this sweep (same settings): finish it.
        overwrite: ``out_dir`` holds a sweep: replace it (when the run starts).

    Raises:
        SweepError: ``out_dir`` holds a sweep (and neither ``resume`` nor ``overwrite``), or
            one in progress, or ``resume`` with other settings; a point's folder holds a
            different run, or files that are not a run.
    """

    def __init__(self, base: RunConfig, points: Sequence[Mapping[str, Any]],
                 out_dir: str | Path, axes: Mapping[str, list[Any]] | None = None,
                 kind: str = "sweep", fits: Callable[[RunConfig], Any] = check_fits_here, *,
                 resume: bool = False, overwrite: bool = False, rank_by: str | None = None):
        self.base, self.out_dir, self.kind = base, Path(out_dir), kind
        self.resume, self.overwrite = resume, overwrite
        self.rank = ranking.parse_rank_by(rank_by or ranking.default_rank_by(base.to_dict()))
        self.axes = dict(axes or {})
        self.extra: dict[str, Any] = {}  # written to the manifest as is (e.g. tune's winner)
        self.stop_event = threading.Event()
        self.status = "new"
        self.current: Point | None = None
        self._lock = threading.Lock()  # the manifest is written from the sweep's thread only
        self.points: list[Point] = []
        taken: set[str] = set()
        for changes in points:
            folder, n = folder_name(changes), 1
            while folder in taken:
                n += 1
                folder = f"{folder_name(changes)}-{n}"
            taken.add(folder)
            self.points.append(Point(point_name(changes), dict(changes), self.out_dir / folder))
        self._fd: int | None = None  # sweep.lock, held while the sweep runs
        self.replaced = check_sweep_folder(self)  # under ``overwrite``: the old sweep's points
        problems = []
        for p in self.points:
            self._check(p, fits)
            problems += self._check_folder(p)
        if problems:
            raise SweepError(problems)

    @classmethod
    def grid(cls, base: RunConfig, axes: Mapping[str, list[Any]], out_dir: str | Path,
             **kwargs: Any) -> "Sweep":
        """Every combination of ``axes`` (the first knob varies slowest)."""
        keys = list(axes)
        points = [dict(zip(keys, values)) for values in itertools.product(*axes.values())]
        return cls(base, points, out_dir, axes=axes, **kwargs)

    # --- checks before any work -------------------------------------------------------------
    def _check(self, p: Point, fits: Callable[[RunConfig], Any]) -> None:
        try:
            p.cfg = self.base.replace(**p.changes)
            check_environment(p.cfg)  # e.g. device=cuda on a machine without one
            plan = fits(p.cfg)
        except ConfigError as e:  # PlanError is one: it carries the estimate and a knob
            p.status, p.reason = "refused", "; ".join(e.problems)
            return
        p.predicted = {k: finite_or_none(getattr(plan, k, math.nan)) for k in
                       ("tokens_per_s", "step_seconds", "peak_gpu_mem_bytes")}

    def _check_folder(self, p: Point) -> list[str]:
        """Reuse a finished run with the same settings; under ``resume``, continue an
        unfinished one; refuse anything else in the way."""
        if not p.dir.exists() or p.dir in self.replaced:
            return []
        if not (p.dir / "run.json").is_file():
            if any(q.name != "run.lock" for q in p.dir.iterdir()):
                return [f"{p.dir}: exists and is not a run directory; remove it or choose "
                        "another --out"]
            return []  # empty, or a lock a start that failed at once left
        old = RunRecord.load(p.dir, telemetry=False)
        same = p.cfg is not None and old.config == p.cfg.to_dict()
        if same and old.status == "done":
            p.status = "reused"
            p.measured = measured(RunRecord.load(p.dir))  # with its events: the bound needs them
            return []
        if same and self.resume:
            p.resume = True  # stopped, failed, or killed while running: go on from there
            return []
        why = f"status {old.status}" if same else "different settings"
        return [f"{p.dir}: holds another run ({why}); it is never replaced: remove it or "
                "choose another --out"]

    # --- running ----------------------------------------------------------------------------
    @property
    def runnable(self) -> list[Point]:
        return [p for p in self.points if p.status == "pending"]

    def run(self, progress: bool = False,
            on_update: Callable[["Sweep", Point], None] | None = None,
            on_step: Callable[[Point, StepEvent], None] | None = None) -> list[Point]:
        """Run every pending point in order; returns the points.

        Args:
            progress: a progress bar per run.
            on_update: called (on this thread) when a point starts and when it ends.
            on_step: called with each finished step of the running point.
        A point that fails is recorded as failed with its error and the sweep goes on; Ctrl-C
        (KeyboardInterrupt) stops the sweep like ``stop()`` and is raised again after the
        manifest is written.
        """
        from workbench.recipes.train import run as train_run

        self._fd = claim(self)
        self.status = "running"
        try:
            self.save()
            for p in self.points:
                if p.status != "pending":
                    continue
                if self.stop_event.is_set():
                    p.status, p.reason = "skipped", "the sweep was stopped"
                    continue
                bus = EventBus()
                if on_step is not None:
                    bus.subscribe(lambda e, p=p: on_step(p, e) if isinstance(e, StepEvent)
                                  else None)
                self.current, p.status = p, "running"
                self._changed(p, on_update)
                try:
                    rec = train_run(p.cfg, p.dir, bus=bus, progress=progress,
                                    stop_event=self.stop_event, resume=p.resume)
                    p.status, p.measured = rec.status, measured(rec)
                except Exception as e:  # one broken point must not lose the others
                    p.status, p.reason = "failed", f"{type(e).__name__}: {e}"
                self.current = None
                self._changed(p, on_update)
            self.status = "stopped" if self.stop_event.is_set() else "done"
        except BaseException:  # Ctrl-C: what ran is saved; the rest is marked
            for p in self.points:
                if p.status in ("pending", "running"):
                    p.status, p.reason = "skipped", "interrupted"
            self.status = "stopped"
            raise
        finally:
            self.current = None
            try:
                self.save()
            finally:
                self._fd = release(self, self._fd)
        return self.points

    def stop(self) -> None:
        """Stop after the current run's step (it is saved as stopped); skip the rest."""
        self.stop_event.set()

    def _changed(self, p: Point, on_update: Callable[["Sweep", Point], None] | None) -> None:
        self.save()
        if on_update is not None:
            on_update(self, p)

    # --- results ----------------------------------------------------------------------------
    def finished(self) -> list[Point]:
        """Finished points, best first by ``rank`` (ties: the faster first)."""
        done = [p for p in self.points if p.status in FINISHED]
        return ranking.ranked(done, self.rank, lambda p: p.measured)

    def records(self) -> list[RunRecord]:
        """The finished runs' records, best first, each named after its point."""
        out = []
        for p in self.finished():
            rec = RunRecord.load(p.dir)
            rec.info["name"] = p.name
            out.append(rec)
        return out

    def save(self) -> Path:
        """Write ``sweep.json`` (atomically)."""
        with self._lock:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            path = self.out_dir / MANIFEST
            write_json(path, {"kind": self.kind, "status": self.status,
                               "rank_by": self.rank.key,
                               "base": self.base.to_dict(), "axes": self.axes,
                               "extra": self.extra,
                               "points": [p.to_json(self.out_dir) for p in self.points]})
            return path

    def table(self) -> str:
        """The points as text: finished ones best first by ``rank``, with loss and the dev
        metric beside speed, each marked against the first ("best", "within noise" of it, or
        "" when worse beyond the noise); then the rest with their reason."""
        done = self.finished()
        main = main_metric(self.base.to_dict())
        own = self.rank.own_column(main.key)  # ranked by a dev metric shown nowhere else
        rows = [("point", "status", "tokens/s", "step s", "peak GPU GB", "final loss",
                 main.label, *([self.rank.label] if own else []), "health", "predicted tok/s",
                 "bound", "vs first")]
        fastest = max(done, key=lambda p: num(p.measured.get("tokens_per_s")), default=None)
        for i, p in enumerate(done):
            m = p.measured
            tps = num(m.get("tokens_per_s"))
            top = fastest.measured if fastest is not None else {}
            best = num(top.get("tokens_per_s"))
            ratio = ""  # to the fastest, "within noise" where the step spreads cover it
            if best > 0 and math.isfinite(tps) and p is fastest:
                ratio = " (1.00x)"  # the fastest itself: no noise to weigh
            elif best > 0 and math.isfinite(tps):
                ratio = noise.ratio_text(tps / best, top.get("noise") or {},
                                         m.get("noise") or {})
                ratio = f" ({ratio})"
            mark = ("best" if i == 0 else "within noise" if self.rank.within(done[0].measured, m)
                    else "")
            rows.append((p.name, p.status, _fmt(tps, "{:,.0f}") + ratio,
                         _fmt(m.get("step_seconds"), "{:.4f}"),
                         _fmt(num(m.get("peak_gpu_mem_bytes")) / 1e9 or None, "{:.2f}"),
                         _fmt(m.get("final_loss"), "{:.4f}"),
                         _fmt((m.get("dev") or {}).get(main.key), main.fmt),
                         *([_fmt(self.rank.value(m), self.rank.fmt)] if own else []),
                         str(m.get("health") or "-"),
                         _fmt(p.predicted.get("tokens_per_s"), "{:,.0f}"),
                         str(m.get("bound", "-")), mark))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        left = (0, 1, *(i + own for i in (7, 9, 10)))  # text columns, after the metric
        lines = [f"ranked by {self.rank.label} ({'higher' if self.rank.higher else 'lower'} "
                 "first); 'within noise': not told apart from the first"]
        lines += ["  ".join(c.ljust(w) if i in left else c.rjust(w)
                            for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
        lines += [f"{p.name}: {p.status}: {p.reason}" for p in self.points
                  if p.status not in FINISHED]
        return "\n".join(lines)


def measured(rec: RunRecord) -> dict[str, Any]:
    """What the manifest keeps of a finished run (``ranking.measured``) and its bound."""
    out = ranking.measured(rec)
    v = verdict(rec)
    out.update(bound=v.kind, verdict=v.text, steps=len(rec.steps))
    return out


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _text(v: Any) -> str:
    """A value as every view names it (``lr=1e-4``, ``overlap=true``): ``naming.value_text``."""
    return value_text(v)


def _fmt(v: Any, fmt: str) -> str:
    x = num(v)
    return fmt.format(x) if math.isfinite(x) else "-"
