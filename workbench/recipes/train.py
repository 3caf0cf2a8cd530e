"""The training recipe: setup -> train -> save -> cleanup, shared by the CLI and the notebooks.

It composes the pieces (data, model skeleton, engine, telemetry) and owns the loop. The loop
never waits for the GPU: each step's losses travel to the host through ``Deferred`` copies and
are published once they have landed. Longer than our usual module: the loop and the run's
lifecycle around it (checks before anything is built, how it ends, what is recorded) read best
in one place; each concept it uses lives beside it (``rundir``, ``resume``, ``guard``,
``outcome``, ``limits``, ``signals``).
"""
from __future__ import annotations

import gc
import math
import shutil
import sys
import threading
import time
import traceback
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench import distributed
from workbench.calibrate.fo import measure
from workbench.calibrate.machine import check_fits_here
from workbench.config import ZO_METHODS, ConfigError, RunConfig, check_environment, trackers
from workbench.data.sources import sst2_folder
from workbench.data.task import build_task
from workbench.engine import build_engine
from workbench.engine.checkpoint import AsyncCheckpointer, StepLog
from workbench.engine.events import EvalEvent, EventBus, InfoEvent, StepEvent
from workbench.engine.groups import digest, fingerprint
from workbench.engine.timing import Deferred
from workbench.engine.warmup import warm_kernels
from workbench.models.build import build_skeleton, check_model_folder
from workbench.models.lora import check_lora_targets
from workbench.models.tokenizer import load_tokenizer
from workbench.plan.memory import EVAL_ROWS
from workbench.plan.planner import preset_of
from workbench.recipes.final_weights import write_final
from workbench.recipes.guard import RunGuard
from workbench.recipes.limits import cap_gpu_memory
from workbench.recipes.prefetch import BatchPrefetch
from workbench.recipes.outcome import artefact_failed, error_line, os_error, outcome_line
from workbench.recipes import threads
from workbench.recipes.identity import accept_data, data_fingerprint, identity, new_run_id
from workbench.recipes.resume import load_resume_checkpoint, plan_resume, resume_roots
from workbench.recipes.rundir import WRITE_EVERY_S, RunDir, RunWarning
from workbench.telemetry.collector import Collector
from workbench.telemetry.environment import environment, load_average
from workbench.telemetry.health import health
from workbench.telemetry.noise import noise
from workbench.telemetry.record import RunRecord
from workbench.telemetry.sampler import Sampler, gpu_memory_used
from workbench.telemetry.steady import throughput
from workbench.telemetry.trackers import start_trackers


RUN_AHEAD = 2  # steps the loop may run ahead of the published ones


@dataclass(frozen=True)
class InFlight:
    """A step the loop has enqueued but not yet published: its number, its scalars on their way
    to the host (loss, g, L+, L-, and under torchrun the stop vote), the tokens of its global
    batch, the live knobs it ran with, its start and end marks (CUDA events, or host seconds),
    the PCIe bytes it moved (up, down) and whether the method has a projected gradient."""

    step: int
    scalars: Deferred
    tokens: int
    lr: float
    wd: float
    begin: Any
    end: Any
    moved: tuple[int, int]
    has_g: bool
    coefs: Deferred | None = None  # the update's coefficients, for a step of several queries
    forward_passes: int | None = None  # as the engine counted them (None: not counted)


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
        self._unsubscribe = self.bus.subscribe(self.collector)
        self.stop_event = threading.Event()
        self.stop_reason = ""  # what set stop_event, for the record ("SIGINT", ...)
        self.training = False  # inside the step loop (a stop request ends it cleanly)
        self.live: dict[str, float] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
        self.engine: Any = None
        self.sampler: Sampler | None = None
        self.checkpointer: AsyncCheckpointer | None = None
        self.rundir: RunDir | None = None
        self.step = 0
        self.dist = None  # set under torchrun (data parallel)
        self.checkpoint_root: Path | None = None
        self.vote: distributed.StopVote | None = None  # under torchrun
        self.stop_at = math.inf  # under torchrun: the step count every rank stops at
        self.guard: RunGuard | None = None  # divergence and failing checkpoint writes
        self.tokenizer = self.task = None  # read in ``prepare`` (but synthetic data)
        self._prepared = False
        self._resume_from: list[str] = []  # checkpoint folders to try, newest first
        self._resume_roots: list[Path] = []  # where they were looked for
        self.record_written = True  # False while the last write of run.json failed
        self.identity: dict[str, Any] | None = None  # the run's, in every checkpoint
        self._unsubscribe_rundir = lambda: None
        self.trackers = None  # report_to's (``telemetry/trackers.py``), from setup on

    # --- setup ------------------------------------------------------------------------------
    def prepare(self, resume: bool = False) -> "TrainRecipe":
        """Every check that needs no model, then the claim of the run directory. Bad settings,
        data or model folders, a run that cannot fit, a directory holding another run or in use
        are refused here (ConfigError), before anything big is allocated or anything on disk
        changes; then run.json says ``running``."""
        if self._prepared:
            return self
        cfg = self.cfg
        check_environment(cfg)
        self.dist = distributed.from_env(cfg)
        main = self.dist is None or self.dist.main
        self.checkpoint_root = self._checkpoint_root()
        if not main:
            self.out_dir = None  # rank 0 writes the run directory and the checkpoints
        previous = None
        if self.out_dir is not None:
            self.rundir = RunDir(self.out_dir, self.checkpoint_root)
            if resume:
                previous = self.rundir.check_resume()
            else:
                self.rundir.check_new(self.overwrite)
        if cfg.data_changed_ok and not resume:
            raise ConfigError(["data_changed_ok: applies to a resumed run only (--resume)"])
        run_id = previous.info.get("run_id") if previous is not None else None
        if resume:
            self._resume_roots = resume_roots(cfg, self.checkpoint_root, self.out_dir, previous)
            self._resume_from = plan_resume(cfg, self._resume_roots, previous, self.dist, run_id)
        if trackers(cfg) and self.out_dir is None and main:
            raise ConfigError(["report_to: trackers write into the run directory; give the run "
                               "one (--out)"])
        check_model_folder(cfg.model)
        check_lora_targets(cfg)
        if not self.force:  # arithmetic only: before the tokenizer, which may need the Hub
            check_fits_here(cfg)
        if cfg.data == "sst2":  # named before the tokenizer, which may try the Hub for a while
            sst2_folder(cfg.resolved_data_dir)
        if cfg.data != "synthetic":  # read and checked before the model is built
            self.tokenizer = load_tokenizer(cfg.model, cfg.resolved_data_dir)
            # the run's one objective: its head chunk sized for the model's vocabulary
            self.task = build_task(cfg, self.tokenizer, preset_of(cfg.model).vocab)
        found = data_fingerprint(cfg, self.task, self.tokenizer)
        info = {"run_id": run_id or new_run_id(), "data_fingerprint": found}
        if resume:
            info.update(accept_data(cfg, previous, self._resume_from, found))
        self.record.info.update(info)
        self.identity = identity(info["run_id"], self.out_dir, cfg, found)
        if self.rundir is not None:
            self.rundir.claim(overwrite=self.overwrite and not resume, new=not resume)
            self._unsubscribe_rundir = self.bus.subscribe(self.rundir)  # history.jsonl
            if previous is not None:  # kept whole until a checkpoint is loaded
                with self.record.lock:
                    self.record.steps, self.record.evals = previous.steps, previous.evals
                    self.record.step_ops = previous.step_ops
            self.record.status = "running"
            self.rundir.start(self.record, fresh=previous is None)
        self._prepared = True
        return self

    def setup(self, resume: bool = False) -> "TrainRecipe":
        """``prepare``, then load data, build the model and engine, start sampling; with
        ``resume``, continue from the newest usable checkpoint."""
        self.prepare(resume)
        cfg = self.cfg
        if trackers(cfg) and self.out_dir is not None:  # report_to, subscribed as the collector
            before = set(self.out_dir.iterdir()) if self.out_dir.is_dir() else set()
            self.trackers = start_trackers(cfg, self.out_dir, self.record.name)
            self._tracker_paths = set(self.out_dir.iterdir()) - before  # what they made here
            self._unsubscribe_trackers = self.bus.subscribe(self.trackers)
        torch.manual_seed(cfg.seed)
        self.device = self.dist.device(cfg) if self.dist else torch.device(cfg.device)
        cap_gpu_memory(cfg, self.device)
        before = _gpu_baseline(self.device)  # what the process held before this run
        model, source = build_skeleton(cfg.model)
        self.train_data, self.dev_data = self._data(model.config.vocab_size)
        t = time.perf_counter()
        share = self.dist.node_share(cfg) if self.dist is not None else None
        try:
            self.engine = build_engine(model, source, cfg, self.device, self.bus, share,
                                       objective=self.task.objective, measure=measure)
        except ConfigError:  # refused before any step: a fresh run leaves nothing behind
            if self.rundir is not None and self.rundir.claimed and not resume:
                self._drop_trackers()
                self.rundir.withdraw()
            raise
        if self.dist is not None:
            self.vote = distributed.StopVote(self.dist, self.device)
            self.engine.reduce = self.vote.reduce
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # setup only: build time includes the GPU's work
        self.bus.publish(InfoEvent("build_seconds", time.perf_counter() - t))
        t = time.perf_counter()
        warm_kernels(self.engine)  # compile time is paid here, not in the first steps
        self.bus.publish(InfoEvent("warmup_seconds", time.perf_counter() - t))
        root = self.checkpoint_root if self.dist is None or self.dist.main else None
        steplog = None
        if root is not None:
            self.checkpointer = AsyncCheckpointer(root, cfg.keep_last, self.bus, self.engine.timer,
                                                  self.identity)
            if cfg.method in ZO_METHODS:
                steplog = StepLog(root)
        self.guard = RunGuard(self.checkpointer, steplog, self.bus, self.stop_event, cfg.seed,
                              cfg.stop_on)
        if resume:
            self._resume()
        self.sampler = Sampler(hz=cfg.sample_hz, t0=self.engine.timer.t0,
                               device_index=self.device.index or 0, on_sample=self._on_sample)
        self.record.environment = {**environment(cfg.device, self.sampler.static_info()),
                                   **before, "torch threads (why)": threads.REASON}
        self.sampler.start()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def _checkpoint_root(self) -> Path | None:
        cfg = self.cfg
        if cfg.checkpoint_dir:
            return Path(cfg.checkpoint_dir).expanduser()
        if self.out_dir is not None:
            return self.out_dir / "checkpoints"
        if cfg.checkpoint_every:
            raise ConfigError(["checkpoint_dir: checkpoint_every needs a place to write; set "
                               "checkpoint_dir or give the run an output directory"])
        return None

    def _resume(self) -> None:
        """Continue from the newest usable checkpoint: its weights, its step, the history
        before it (no step twice)."""
        snap = load_resume_checkpoint(self.engine, self.cfg, self._resume_from,
                                      " or ".join(map(str, self._resume_roots)))
        self.step = start = snap.step if snap is not None else 0
        with self.record.lock:
            self.record.steps = [r for r in self.record.steps if r["step"] < start]
            self.record.evals = [e for e in self.record.evals if e["step"] <= start]
            self.record.step_ops = [r for r in self.record.step_ops if r["step"] < start]
        if self.rundir is not None:
            self.rundir.start_history(self.record.steps, self.record.evals)
            self.rundir.write(self.record)
        self.bus.publish(InfoEvent("resumed_from", f"step-{start:08d}" if snap else None))

    def _data(self, vocab: int):
        """(train, dev) data; ``vocab`` sizes synthetic token ids (read data: in prepare)."""
        if self.cfg.data == "synthetic":
            self.task = build_task(self.cfg, None, vocab)
        return self.task.train, self.task.dev

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
        nan = torch.full((), float("nan"), device=self.device)  # stands in for absent scalars
        mark = self._marker()
        bar = _progress(cfg.steps, self.step) if self.progress else None
        self.training = True
        batches = BatchPrefetch(self.device, self._host_batch)
        while self.step < min(cfg.steps, self.stop_at) and not self._stopping():
            t = self.step
            batch, tokens = batches.get(t, ahead=t + 1 < min(cfg.steps, self.stop_at))
            lr, wd = self.live["lr"], self.live["weight_decay"]
            moved = engine.bytes_h2d, engine.bytes_d2h
            out = engine.step(batch, t, lr, wd)
            end = self._marker()
            moved = (engine.bytes_h2d - moved[0], engine.bytes_d2h - moved[1])
            scalars = [out.loss, *(x if x is not None else nan for x in
                                   (out.projected_grad, out.loss_plus, out.loss_minus))]
            if self.vote is not None:
                scalars.append(self.vote.agreed)  # any rank's stop request, all-reduced
            coefs = Deferred(*out.coefs.unbind()) if out.coefs is not None else None
            inflight.append(InFlight(step=t, scalars=Deferred(*scalars), tokens=tokens, lr=lr,
                                     wd=wd, begin=mark, end=end, moved=moved,
                                     has_g=out.projected_grad is not None, coefs=coefs,
                                     forward_passes=out.forward_passes))
            mark = end
            self.step += 1
            if (self.dist is not None and cfg.digest_check_every
                    and self.step % cfg.digest_check_every == 0):
                distributed.check_in_sync(self.dist, engine.state_flats(), self.step)
            self.guard.writes()
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                self._publish(inflight, block=True, bar=bar, drain=True)
                if self.guard.diverged_at is None:
                    self.evaluate()  # before the checkpoint: it holds the state after the eval
                mark = self._marker()  # the next step's time starts after the eval
            if (self.checkpointer is not None and cfg.checkpoint_every
                    and self.step % cfg.checkpoint_every == 0 and self.step < cfg.steps
                    and self.guard.diverged_at is None):
                self._checkpoint()
                self._write_record(every_s=1.0)
            # Bound run-ahead to two steps: the host waits here, between steps, if it must.
            self._publish(inflight, block=len(inflight) > RUN_AHEAD, bar=bar)
            self._write_record(every_s=WRITE_EVERY_S)
        self.training = False
        if self.guard.diverged_at is None:
            self._publish(inflight, block=True, bar=bar, drain=True)
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
        early = stopped and (self.stop_reason or self.guard.failure or self.dist is not None)
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
        return (self.dist.shard(batch) if self.dist is not None else batch), tokens

    def _stopping(self) -> bool:
        """A stop request ends the loop now; under torchrun it is a request only, voted on with
        each step's all-reduce, and every rank stops after the same step (``stop_at``)."""
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
        """run.json as it stands (status running), atomically; a failure is reported, not
        fatal: the last good run.json stays."""
        if self.rundir is None or not self.rundir.claimed:
            return  # refused before the claim: nothing of ours is there
        try:
            self.record_written = self.rundir.write(self.record, every_s=every_s) or \
                self.record_written
        except OSError as e:
            self.record_written = False
            warnings.warn(f"run.json not updated ({os_error(e)}); the previous one stays",
                          RunWarning)

    def _marker(self):
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # end of this step's work on the compute stream
        return event

    def _publish(self, inflight: deque, block: bool, bar, drain: bool = False) -> None:
        while inflight and (drain or block or inflight[0].scalars.ready()):
            item = inflight.popleft()
            t, begin, end = item.step, item.begin, item.end
            loss, g, loss_plus, loss_minus, *vote = item.scalars.get()
            if vote and vote[0] > 0:  # a rank asked to stop: all stop after the same step, the
                self.stop_at = min(self.stop_at, t + RUN_AHEAD + 1)  # last any may have run
            if self.guard.diverged_at is not None:
                continue  # steps after a divergence are not part of the run
            self.engine.timer.poll()  # the step's spans are complete: publish them before it
            if isinstance(end, float):
                seconds, end_t = end - begin, end - self.engine.timer.t0
            else:
                end.synchronize()  # already complete once the losses have landed; no stall
                seconds = begin.elapsed_time(end) / 1e3
                end_t = self.engine.timer.now()
            allocated, reserved, peak = _memory(self.device)
            coefs = item.coefs.get() if item.coefs is not None else None
            finite = self.guard.published(t, loss, g, item.has_g, item.lr, item.wd, coefs)
            self.bus.publish(StepEvent(
                step=t, loss=loss, projected_grad=g, seconds=seconds, tokens=item.tokens,
                loss_plus=loss_plus, loss_minus=loss_minus, lr=item.lr,
                mem_allocated=allocated, mem_reserved=reserved, mem_peak=peak,
                bytes_h2d=item.moved[0], bytes_d2h=item.moved[1], end=end_t,
                forward_passes=(float("nan") if item.forward_passes is None
                                else float(item.forward_passes))))
            if finite:
                self.guard.watch(self.record, t)  # stop_on=diverged reads the run's health
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", g=f"{g:.3g}")
            if self.guard.diverged_at is not None and self.vote is not None:
                self.stop_at = min(self.stop_at, t + RUN_AHEAD + 1)
            block = False

    def evaluate(self) -> dict[str, float]:
        """The objective's dev metrics with the current weights; publishes an EvalEvent. Under
        torchrun every rank scores its share of the dev set and the sums are all-reduced; every
        rank calls the engine's eval, so each applies the same pending update (stays identical)."""
        dev, total = self.dev_data, None
        if self.dist is not None:
            dev, total = self.dist.dev_share(dev), lambda v: self.dist.sum(v, self.device)
        metrics = self.engine.evaluate(dev, max(self.cfg.batch_size, EVAL_ROWS), total)
        self.bus.publish(EvalEvent(self.step, metrics.get("accuracy"), metrics["loss"],
                                   len(self.dev_data), metrics))
        return metrics

    # --- save -------------------------------------------------------------------------------
    def save(self, digest_params: bool = True) -> RunRecord:
        """End sampling; summary, parameter digest and the run directory (if any). Speed
        benchmarks pass ``digest_params=False``: the digest decodes and reads every weight once
        (``benchmarks/digest_speed.py`` times it)."""
        rec, cfg = self.record, self.cfg
        if self.sampler is not None:
            self.sampler.stop()  # the samples saved are all the samples there will be
        self.engine.flush()
        self.collector.flush()
        if digest_params:  # one group decoded at a time: the host never holds a 2nd model
            began = time.perf_counter()
            found = fingerprint(self.engine.state_flats())
            with rec.lock:
                rec.param_digest, rec.param_norm = found
            base = self.engine.base_flats()  # adapter runs: the frozen base, a group at a time
            if base:
                base_digest = digest(base)
                with rec.lock:
                    rec.base_digest = base_digest
            with rec.lock:  # seconds the end-of-run digests took (largest runs: minutes)
                rec.info["digest_seconds"] = time.perf_counter() - began
        with rec.lock:
            rec.info["load average at end"] = load_average()  # noise: the host, start to end
            rec.summary = _summary(rec, self.engine, self.device)
        if self.out_dir is not None and self.cfg.save_final and rec.status in ("done", "stopped"):
            write_final(self.engine, self.cfg, self.out_dir, self.step, rec)  # RUN_DIR/weights
        if self.dist is not None:  # every rank's own view, merged into rank 0's record
            mine = {"rank": self.dist.rank, "device": str(self.device),
                    "param_digest": rec.param_digest, "summary": rec.summary,
                    "step_seconds": [s["seconds"] for s in rec.steps],
                    "dev_examples": len(self.dist.dev_share(self.dev_data or [])),  # its share
                    "host": getattr(self.engine, "host_report", dict)()}
            ranks = self.dist.gather(mine)
            with rec.lock:
                rec.info["ranks"] = ranks
                rec.info["world_size"] = self.dist.world
        if self.out_dir is not None:
            from workbench.telemetry.trace import write_trace

            # run.json first, with the final status; a larger artefact that fails after it
            # is reported and costs nothing else.
            try:
                rec.save(self.out_dir, on_error=artefact_failed)
            except OSError:
                self.record_written = False
                raise
            self.record_written = True
            try:
                write_trace(rec, self.out_dir / "trace.json")
            except OSError as e:
                artefact_failed("trace.json", e)
            if self.rundir is not None:
                self.rundir.finish()
        return rec

    def _drop_trackers(self) -> None:
        """A fresh run refused before its first step: its trackers closed and what they made in
        the run directory removed (a remote MLflow server keeps its run, marked failed)."""
        if self.trackers is None:
            return
        self._unsubscribe_trackers()
        self.trackers.close("failed", {})
        self.trackers = None
        for path in self._tracker_paths:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def fail(self, error: BaseException) -> None:
        """Record how the run ended by ``error``: stopped (a signal), failed otherwise, with one
        line; run.json is rewritten when this process holds the run directory."""
        rec = self.record
        if rec.status in ("done", "stopped", "failed", "diverged") and rec.error:
            return
        if isinstance(error, KeyboardInterrupt):
            rec.status = "stopped"
            # a plain KeyboardInterrupt (Ctrl-C outside graceful_stop) names no signal
            rec.info["stopped"] = f"by {str(error) or 'SIGINT'} at step {self.step}"
        else:
            rec.status, rec.error = "failed", error_line(self.cfg, error, self.step)
            if not isinstance(error, ConfigError):
                rec.info["traceback"] = "".join(traceback.format_exception(error))
        self._write_record(every_s=0.0)

    def cleanup(self) -> None:
        """Release everything; a run left unfinished by an exception is recorded as such."""
        error = sys.exc_info()[1]
        if error is not None and self.record.status in ("new", "running"):
            self.fail(error)
        try:
            if self.trackers is not None:
                self._unsubscribe_trackers()
                self.trackers.close(self.record.status, self.record.summary)
            if self.checkpointer is not None:
                self.checkpointer.close()
            if self.sampler is not None:
                self.sampler.stop()
            if self.engine is not None:
                self.engine.close()
                if self.device.type == "cuda":  # a next run in this process starts clean
                    torch.cuda.empty_cache()
            if self.dist is not None:
                distributed.shutdown()
        finally:
            if self.rundir is not None:
                self.rundir.release()
            self._unsubscribe_rundir()
            self._unsubscribe()

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
        """Where the details of a failure are: run.json, or how to go on when it could not be
        written (a full disk: it still says ``running``)."""
        run_json = self.out_dir / "run.json" if self.out_dir else None
        if run_json is None or self.record_written:
            return f"details in {run_json}" if run_json else "not recorded (no run directory)"
        return (f"{run_json} could not be written either and still says running; free space, "
                f"then continue with: python -m workbench run --resume {self.out_dir}")

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


def _memory(device: torch.device) -> tuple[int, int, int]:
    if device.type != "cuda":
        return 0, 0, 0
    return (torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device),
            torch.cuda.max_memory_allocated(device))


def _gpu_baseline(device: torch.device) -> dict[str, float]:
    """GPU memory in use before a run builds anything (bytes): NVML's reading (this process's
    CUDA context, other processes) and torch's allocated memory (what the caller holds). The
    figures draw the run's own memory above them. An earlier run of this process is collected
    and its cached blocks returned first."""
    if device.type != "cuda":
        return {}
    gc.collect()  # an earlier run's engine, unreachable but held in a reference cycle
    torch.cuda.synchronize(device)  # setup only: the CUDA context exists before the reading
    torch.cuda.empty_cache()
    return {"gpu mem used before run (bytes)": gpu_memory_used(device.index or 0),
            "torch allocated before run (bytes)": float(torch.cuda.memory_allocated(device))}


def _summary(rec: RunRecord, engine, device: torch.device) -> dict[str, Any]:
    steps = rec.steps
    tail = steps[-max(1, len(steps) // 10):] if steps else []
    losses = [s["loss"] for s in tail if s["loss"] is not None]
    n = max(len(steps), 1)
    out: dict[str, Any] = {
        "steps": len(steps),
        **throughput(steps),  # tokens_per_s, step_seconds: steady steps (telemetry/steady.py)
        # the run's own: what the process held before it is not counted
        "peak_gpu_mem_bytes": max(_memory(device)[2] - int(
            rec.environment.get("torch allocated before run (bytes)") or 0), 0),
        "gpu_param_bytes": engine.gpu_param_bytes(),
        "final_loss": sum(losses) / len(losses) if losses else math.nan,
        "bytes_h2d": sum(s.get("bytes_h2d", 0) for s in steps) // n,
        "bytes_d2h": sum(s.get("bytes_d2h", 0) for s in steps) // n,
        "build_seconds": rec.info.get("build_seconds"),
        "warmup_seconds": rec.info.get("warmup_seconds"),
        "digest_seconds": rec.info.get("digest_seconds"),  # None: the digest was skipped
        "noise": noise(rec),  # step spread, other processes' CPU, load (telemetry/noise.py)
        "health": health(rec).to_dict(),  # learning health with its evidence
    }
    if rec.evals:
        out["eval_accuracy"] = rec.evals[-1]["accuracy"]
        out["eval_accuracy_start"] = rec.evals[0]["accuracy"]
        out["eval"] = rec.evals[-1].get("metrics", {})
        out["eval_start"] = rec.evals[0].get("metrics", {})
    return out


def _progress(total: int, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", leave=False)
