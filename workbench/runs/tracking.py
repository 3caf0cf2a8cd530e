"""``report_to``'s trackers as one subscriber of a run's event bus, with one setup and one
teardown.

    check()     before the run directory is touched: a tracker that could not start is refused
                in one line and nothing on disk has changed (``telemetry.trackers.preflight``);
    __enter__   after the claim: the trackers start (``start_trackers``) and subscribe;
    discard()   a fresh run refused before its first step, or trackers that would not start
                after all: what they made in the run directory is removed (a remote MLflow
                server keeps its run, marked failed);
    __exit__    the queue written, the run's end (the record's status and summary) logged.
A new tracker goes in ``telemetry/trackers.py`` (a sink in ``SINKS``, its preflight there);
nothing here changes.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from workbench.config import ConfigError, RunConfig
from workbench.engine.events import EventBus
from workbench.telemetry.record import RunRecord
from workbench.telemetry.trackers import Trackers, preflight, start_trackers


class Tracking:
    """Args:
        cfg: the run (``cfg.trackers`` names them; none: every step here does nothing).
        run_dir: the run directory (None: this process writes none, e.g. a rank > 0).
        record: the run's record (its status and summary are logged at the end).
        bus: the run's event bus.
    """

    def __init__(self, cfg: RunConfig, run_dir: Path | None, record: RunRecord, bus: EventBus):
        self.cfg, self.run_dir, self.record, self.bus = cfg, run_dir, record, bus
        self.trackers: Trackers | None = None
        self._made: set[Path] = set()  # what the trackers made in the run directory
        self._unsubscribe: Callable[[], None] = lambda: None

    def check(self, main: bool = True) -> None:
        """Refuse (ConfigError, one line each) trackers that would not start; reads only."""
        if not self.cfg.trackers or not main:
            return
        if self.run_dir is None:
            raise ConfigError(["report_to: trackers write into the run directory; give the run "
                               "one (--out)"])
        problems = preflight(self.cfg.trackers, self.run_dir)
        if problems:
            raise ConfigError(problems)

    def __enter__(self) -> Tracking:
        if self.cfg.trackers and self.run_dir is not None:
            before = set(self.run_dir.iterdir())
            try:
                self.trackers = start_trackers(self.cfg, self.run_dir, self.record.name)
            finally:
                self._made = set(self.run_dir.iterdir()) - before
            self._unsubscribe = self.bus.subscribe(self.trackers)
        return self

    def __exit__(self, *exc) -> None:
        if self.trackers is not None:
            self._unsubscribe()
            self.trackers.close(self.record.status, self.record.summary)
            self.trackers = None

    def discard(self) -> None:
        """Close the trackers as failed and remove what they made (the run is withdrawn, or a
        tracker would not start: what the others, or it, had made goes too)."""
        if self.trackers is not None:
            self._unsubscribe()
            self.trackers.close("failed", {})
            self.trackers = None
        for path in self._made:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
