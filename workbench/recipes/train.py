"""The training recipe: setup -> train -> save -> cleanup, shared by the CLI and the notebooks.

It composes the pieces (data, model skeleton, engine, telemetry) and owns the loop. Everything
that must be undone when the run ends is entered into one ``ExitStack`` as it is set up, and
``cleanup`` leaves them in reverse order: the run directory (``runs/session.py``) and the
trackers (``runs/tracking.py``), each a bus subscriber with one setup and one teardown; the
engine, the checkpoint writer, the sampler; data parallel (``distributed.data_parallel``: its
single-process form does nothing, so the loop never asks whether it runs under torchrun).
Beside it: the steps in flight and their publication (``publish.py``), the machine's readings
and the end-of-run summary (``readings.py``).
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

import torch

from workbench import distributed
from workbench.calibrate.fo import measure
from workbench.config import ConfigError, RunConfig
from workbench.data.sizes import data_sizes
from workbench.data.task import build_task
from workbench.engine import build_engine
from workbench.engine.checkpoint import AsyncCheckpointer
from workbench.engine.events import EvalEvent, EventBus, InfoEvent
from workbench.engine.warmup import warm_kernels
from workbench.models.build import build_skeleton
from workbench.plan.memory import EVAL_ROWS
from workbench.recipes.prepare import prepare_run
from workbench.recipes.publish import RUN_AHEAD, Publisher, marker
from workbench.recipes.readings import (gpu_baseline, merge_ranks, progress, record_digests,
                                        summary)
from workbench.runs import threads
from workbench.runs.final_weights import write_final
from workbench.runs.guard import RunGuard, guard_run
from workbench.runs.limits import cap_gpu_memory
from workbench.runs.outcome import outcome_line, record_end
from workbench.runs.prefetch import BatchPrefetch
from workbench.runs.resumption import Resumption
from workbench.runs.rundir import WRITE_EVERY_S, RunDir
from workbench.runs.session import RunSession
from workbench.runs.tracking import Tracking
from workbench.telemetry.collector import Collector
from workbench.telemetry.environment import environment, load_average
from workbench.telemetry.record import RunRecord
from workbench.telemetry.sampler import Sampler


class TrainRecipe:
    """Args:
        cfg: the run.
        out_dir: run directory to write (None: keep the record in memory only).
        bus: event bus to publish on (a fresh one by default); the UI subscribes to it.
        progress: show a tqdm progress bar.
        overwrite: replace a run ``out_dir`` already holds (else that is refused).
        force: start even when the planner says the run cannot fit.
    """

    def __init__(self, cfg: RunConfig, out_dir: str | Path | None = None,
                 bus: EventBus | None = None, progress: bool = True, *,
                 overwrite: bool = False, force: bool = False):
        self.cfg, self.progress = cfg, progress
        self.overwrite, self.force = overwrite, force
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.bus = bus or EventBus()
        self.record = RunRecord(config=cfg.to_dict(), status="new",
                                path=str(self.out_dir) if self.out_dir is not None else "")
        self.collector = Collector(self.record, cfg.keep_steps)
        self._held = ExitStack()  # what ``cleanup`` undoes, in reverse order of setting up
        self._held.callback(self.bus.subscribe(self.collector))
        self.stop_event = threading.Event()
        self.stop_reason = ""  # what set stop_event, for the record ("SIGINT", ...)
        self.training = False  # inside the step loop (a stop request ends it cleanly)
        self.live: dict[str, float] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
        self.engine: Any = None
        self.sampler: Sampler | None = None
        self.checkpointer: AsyncCheckpointer | None = None
        self.rundir: RunDir | None = None
        self.session: RunSession | None = None  # the run directory, claimed (``prepare``)
        self.tracking: Tracking | None = None  # report_to's trackers (``prepare``)
        self.step = 0
        # data parallel under torchrun (``prepare``); until then, and in one process, nothing
        self.dist: distributed.DistContext | distributed.SingleProcess = \
            distributed.SingleProcess()
        self.checkpoint_root: Path | None = None
        self.vote: distributed.StopVote | None = None  # under torchrun
        self.publish: Publisher | None = None  # publishes steps as they land (``setup``)
        self.guard: RunGuard | None = None  # divergence and failing checkpoint writes
        self.tokenizer = self.task = None  # read in ``prepare`` (but synthetic data)
        #: Called once ``prepare``'s checks passed (the CLI's busy-host note: after them, so a
        #: refused run says only why).
        self.on_prepared: Callable[[], None] | None = None
        self._prepared = False
        self.resumption: Resumption | None = None  # a resumed run's way back (``prepare``)
        self.identity: dict[str, Any] | None = None  # the run's, in every checkpoint

    # --- setup ------------------------------------------------------------------------------
    def prepare(self, resume: bool = False) -> "TrainRecipe":
        """Every check that needs no model, then the claim of the run directory
        (``prepare.py``): refusals (ConfigError) come before anything big is allocated or
        anything on disk changes; then the trackers start and run.json says ``running``."""
        if not self._prepared:
            prepare_run(self, resume)
            self._prepared = True
        return self

    def setup(self, resume: bool = False) -> "TrainRecipe":
        """``prepare``, then load data, build the model and engine, start sampling; with
        ``resume``, continue from the newest usable checkpoint."""
        self.prepare(resume)
        if self.on_prepared is not None:
            self.on_prepared()
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self.device = self.dist.device(cfg)
        cap_gpu_memory(cfg, self.device)
        before = gpu_baseline(self.device)  # what the process held before this run
        model, source = build_skeleton(cfg.model)
        if cfg.data == "synthetic":  # its token ids sized by the model built (read data: prepare)
            self.task = build_task(cfg, None, model.config.vocab_size)
        self.train_data, self.dev_data = self.task.train, self.task.dev
        t = time.perf_counter()
        try:
            self.engine = build_engine(model, source, cfg, self.device, self.bus,
                                       self.dist.node_share(cfg), objective=self.task.objective,
                                       measure=measure)
        except ConfigError:  # refused before any step: a fresh run leaves nothing behind
            if self.session is not None and not resume:
                self.tracking.discard()
                self.session.refuse()
            raise
        self._held.callback(self._close_engine)
        self.vote = self.dist.stop_vote(self.device)
        if self.vote is not None:
            self.engine.reduce = self.vote.reduce
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # setup only: build time includes the GPU's work
        self.bus.publish(InfoEvent("build_seconds", time.perf_counter() - t))
        t = time.perf_counter()
        warm_kernels(self.engine)  # compile time is paid here, not in the first steps
        self.bus.publish(InfoEvent("warmup_seconds", time.perf_counter() - t))
        self.checkpointer, self.guard = guard_run(
            cfg, self.checkpoint_root if self.dist.main else None, self.engine.timer,
            self.identity, self.bus, self.stop_event)
        if self.checkpointer is not None:
            self._held.callback(self.checkpointer.close)
        self.publish = Publisher(self.engine, self.guard, self.bus, self.record, self.device,
                                 voting=self.vote is not None)
        if resume:
            self.step = self.resumption.load(self.engine, self.record, self.rundir, self.bus)
        self.sampler = Sampler(hz=cfg.sample_hz, t0=self.engine.timer.t0,
                               device_index=self.device.index or 0, on_sample=self._on_sample)
        self.record.environment = {**environment(cfg.device, self.sampler.static_info()),
                                   **before, "torch threads (why)": threads.REASON,
                                   **data_sizes(self.train_data, self.dev_data)}
        self.sampler.start()
        self._held.callback(self.sampler.stop)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def _on_sample(self, sample: dict[str, float]) -> None:
        with self.record.lock:
            self.record.samples.append(sample)

    # --- train ------------------------------------------------------------------------------
    def set_live(self, **values: float) -> None:
        """Change live knobs (lr, weight_decay); they apply from the next step."""
        unknown = set(values) - set(self.live)
        if unknown:
            raise ValueError(f"{', '.join(sorted(unknown))}: not changeable during a run "
                             f"(live knobs: {', '.join(self.live)})")
        self.live.update(values)

    def train(self) -> RunRecord:
        """Run steps until ``cfg.steps`` or ``stop_event``; evaluates at start and end. Ends as
        done, stopped, diverged (a non-finite loss or projected gradient, seen when its step is
        published: no extra sync) or failed (checkpoint writes failing in a row)."""
        cfg, engine, rec = self.cfg, self.engine, self.record
        rec.status = "running"
        if self.dev_data is not None and self.step == 0 and not self._evaluated():
            self.evaluate()
        inflight: deque = deque()
        mark = marker(self.device)
        bar = progress(cfg.steps, self.step) if self.progress else None
        self.training = True
        batches = BatchPrefetch(self.device, self._host_batch)
        while self.step < min(cfg.steps, self.publish.stop_at) and not self._stopping():
            t = self.step
            batch, tokens = batches.get(t, ahead=t + 1 < min(cfg.steps, self.publish.stop_at))
            lr, wd = self.live["lr"], self.live["weight_decay"]
            moved = engine.bytes_h2d, engine.bytes_d2h
            out = engine.step(batch, t, lr, wd)
            end = marker(self.device)
            moved = (engine.bytes_h2d - moved[0], engine.bytes_d2h - moved[1])
            inflight.append(self.publish.in_flight(t, out, tokens, lr, wd, mark, end, moved,
                                                   self.vote))
            mark = end
            self.step += 1
            if cfg.digest_check_every and self.step % cfg.digest_check_every == 0:
                self.dist.check_in_sync(engine.state_flats, self.step)
            self.guard.writes()
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                self.publish(inflight, block=True, bar=bar, drain=True)
                if self.guard.diverged_at is None:
                    self.evaluate()  # before the checkpoint: it holds the state after the eval
                mark = marker(self.device)  # the next step's time starts after the eval
            if (self.checkpointer is not None and cfg.checkpoint_every
                    and self.step % cfg.checkpoint_every == 0 and self.step < cfg.steps
                    and self.guard.diverged_at is None):
                self._checkpoint()
                self._write_record(every_s=1.0)
            # Bound run-ahead to two steps: the host waits here, between steps, if it must.
            self.publish(inflight, block=len(inflight) > RUN_AHEAD, bar=bar)
            self._write_record(every_s=WRITE_EVERY_S)
        self.training = False
        if self.guard.diverged_at is None:
            self.publish(inflight, block=True, bar=bar, drain=True)
        if self.checkpointer is not None and cfg.checkpoint_every and self.guard.healthy:
            self.checkpointer.wait()
            self.checkpointer.verified = self.step  # every step so far was published finite
            # The final state, its update still pending, so a longer run continues exactly as a
            # straight one (applying it now would add a rounding under master=compressed-sr).
            self._checkpoint()
            self.checkpointer.wait()
            self.guard.writes()
        engine.flush()
        if bar is not None:
            bar.close()
        stopped = self.step < cfg.steps
        early = stopped and (self.stop_reason or self.guard.failure or self.dist.parallel)
        if (self.dev_data is not None and self.guard.diverged_at is None and not early
                and not self._evaluated()):
            self.evaluate()  # also after a panel's Stop; not after a signal or a failure
        rec.status, rec.error = self.guard.outcome(stopped)
        if rec.status == "stopped":
            rec.info["stopped"] = f"by {self.stop_reason or 'request'} after step {self.step}"
        return rec

    def _host_batch(self, t: int):
        """Step t's batch on the host (this rank's shard under torchrun) and its token count,
        the global batch's on every rank."""
        batch = self.train_data.batch_for_step(t, self.cfg.batch_size, self.cfg.seed)
        tokens = batch.tokens
        return self.dist.shard(batch), tokens

    def _stopping(self) -> bool:
        """A stop request ends the loop now; under torchrun it is a request only, voted on with
        each step's all-reduce, and every rank stops after the same step (``publish.stop_at``)."""
        if self.vote is None:
            return self.stop_event.is_set()
        self.vote.request = self.stop_event.is_set()
        return False

    def _evaluated(self) -> bool:
        """An eval at this step is recorded already (a resumed run does not repeat it)."""
        return any(e["step"] == self.step for e in self.record.evals)

    def _checkpoint(self) -> None:
        """Hand a snapshot to the background writer; skip it if the last is still writing."""
        if self.checkpointer.busy:
            self.checkpointer.skipped += 1
            self.bus.publish(InfoEvent("checkpoints_skipped", self.checkpointer.skipped))
            return
        self.checkpointer.submit(self.engine.snapshot(self.step))

    def _write_record(self, every_s: float) -> None:
        """run.json as it stands (``RunSession.write``: a failure is reported, not fatal)."""
        if self.session is not None:
            self.session.write(every_s)

    def evaluate(self) -> dict[str, float]:
        """The objective's dev metrics with the current weights; publishes an EvalEvent. Under
        torchrun every rank scores its share of the dev set and the sums are all-reduced; every
        rank calls the engine's eval, so each applies the same pending update (stays identical)."""
        dev, total = self.dist.dev_share(self.dev_data), self.dist.totals(self.device)
        metrics = self.engine.evaluate(dev, max(self.cfg.batch_size, EVAL_ROWS), total)
        self.bus.publish(EvalEvent(self.step, metrics.get("accuracy"), metrics["loss"],
                                   len(self.dev_data), metrics))
        return metrics

    # --- save -------------------------------------------------------------------------------
    def save(self, digest_params: bool = True) -> RunRecord:
        """End sampling; summary, parameter digest and the run directory (if any). Speed
        benchmarks pass ``digest_params=False``: the digest decodes and reads every weight once
        (``benchmarks/digest_speed.py`` times it)."""
        rec = self.record
        if self.sampler is not None:
            self.sampler.stop()  # the samples saved are all the samples there will be
        self.engine.flush()
        self.collector.flush()
        if digest_params:  # one group decoded at a time: the host never holds a 2nd model
            record_digests(rec, self.engine)
        with rec.lock:
            rec.info["load average at end"] = load_average()  # noise: the host, start to end
            rec.summary = summary(rec, self.engine, self.device)
        if self.out_dir is not None and self.cfg.save_final and rec.status in ("done", "stopped"):
            write_final(self.engine, self.cfg, self.out_dir, self.step, rec)  # RUN_DIR/weights
        if self.dist.parallel:  # every rank's own view, merged into rank 0's record
            merge_ranks(rec, self.dist, self.engine, self.device, self.dev_data)
        if self.session is not None:
            self.session.save()  # run.json, trace.json; the journal folded in
        return rec

    def fail(self, error: BaseException) -> None:
        """Record how the run ended by ``error``: stopped (a signal), failed otherwise, with one
        line; run.json is rewritten when this process holds the run directory."""
        if record_end(self.record, self.cfg, error, self.step):
            self._write_record(every_s=0.0)

    def cleanup(self) -> None:
        """Release everything; a run left unfinished by an exception is recorded as such."""
        error = sys.exc_info()[1]
        if error is not None and self.record.status in ("new", "running"):
            self.fail(error)
        self._held.close()  # sampler, checkpoints, engine, trackers, run directory, ...

    def _close_engine(self) -> None:
        self.engine.close()
        if self.device.type == "cuda":  # a next run in this process starts clean
            torch.cuda.empty_cache()

    def run(self, resume: bool = False) -> RunRecord:
        """Set up, train, save and clean up; returns the record."""
        try:
            self.setup(resume=resume)
            self.train()
            return self.save()
        except BaseException as e:
            self.fail(e)
            raise
        finally:
            self.cleanup()

    def where_recorded(self) -> str:
        """Where the details of a failure are (``RunSession.where_recorded``)."""
        if self.session is None:
            return "not recorded (no run directory)"
        return self.session.where_recorded()

    def outcome(self) -> str:
        """One line saying how the run ended (the CLI prints it, the panel shows it)."""
        return outcome_line(self.record, self.out_dir, self.checkpoint_root)


def run(cfg: RunConfig, out_dir: str | Path | None = None, bus: EventBus | None = None,
        progress: bool = True, resume: bool = False, *, overwrite: bool = False,
        force: bool = False, stop_event: threading.Event | None = None) -> RunRecord:
    """Set up, train, save and clean up one run; returns its record.

    Args:
        resume: continue ``out_dir``'s run from its newest usable checkpoint.
        overwrite: replace the run ``out_dir`` holds (else a directory holding one is refused).
        force: run even when the planner says it cannot fit.
        stop_event: setting it ends the run after the current step (a sweep shares one across
            its runs).
    Raises:
        ConfigError: bad settings, data, model folder, directory or fit; nothing was written.
    """
    recipe = TrainRecipe(cfg, out_dir, bus, progress, overwrite=overwrite, force=force)
    if stop_event is not None:
        recipe.stop_event = stop_event
    return recipe.run(resume)
