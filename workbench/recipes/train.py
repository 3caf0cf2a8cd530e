"""The training recipe: setup -> train -> save -> cleanup, shared by the CLI and the notebooks.

It composes the pieces (data, model skeleton, engine, telemetry) and owns the loop. The loop
never waits for the GPU: each step's losses travel to the host through ``Deferred`` copies and
are published once they have landed.
"""
from __future__ import annotations

import json
import math
import sys
import threading
import time
import traceback
import warnings
from collections import deque
from pathlib import Path
from typing import Any

import torch

from workbench import distributed
from workbench.config import ZO_METHODS, ConfigError, RunConfig, check_environment, check_resume
from workbench.data.batches import PromptDataset, SyntheticData
from workbench.data.sources import has_split, load_split
from workbench.engine import build_engine
from workbench.engine.checkpoint import (AsyncCheckpointer, CheckpointError, StepLog,
                                         checkpoint_step, complete_checkpoints, read_checkpoint)
from workbench.engine.events import EvalEvent, EventBus, InfoEvent, StepEvent
from workbench.engine.groups import digest, norm
from workbench.engine.timing import Deferred
from workbench.engine.zo_common import step_seed
from workbench.models.build import build_skeleton, check_model_folder
from workbench.models.tokenizer import load_tokenizer
from workbench.planner import check_fits
from workbench.recipes.limits import cap_gpu_memory, out_of_memory_line
from workbench.recipes.rundir import WRITE_EVERY_S, RunDir, RunWarning, newest_covered
from workbench.telemetry.collector import Collector
from workbench.telemetry.environment import environment
from workbench.telemetry.record import RunRecord
from workbench.telemetry.sampler import Sampler


MAX_WRITE_FAILURES = 3  # checkpoint writes failing in a row before the run stops as failed


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
        self.record = RunRecord(config=cfg.to_dict(), status="new")
        self.collector = Collector(self.record, cfg.keep_steps)
        self._unsubscribe = self.bus.subscribe(self.collector)
        self.stop_event = threading.Event()
        self.stop_reason = ""  # what set stop_event, for the record ("SIGINT", ...)
        self.training = False  # inside the step loop (a stop request ends it cleanly)
        self.live: dict[str, float] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
        self.engine: Any = None
        self.sampler: Sampler | None = None
        self.checkpointer: AsyncCheckpointer | None = None
        self.steplog: StepLog | None = None
        self.rundir: RunDir | None = None
        self.step = 0
        self.dist = None  # set under torchrun (data parallel)
        self.diverged_at: int | None = None
        self.failure = ""  # set when the run must end as failed (checkpoint writes)
        self._prepared = False
        self._resume_from: list[str] = []  # checkpoint names to try, newest first

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
        if resume:
            self._plan_resume(previous)
        check_model_folder(cfg.model)
        self.examples = self._examples()
        if not self.force:
            check_fits(cfg)
        if self.rundir is not None:
            self.rundir.claim(overwrite=self.overwrite and not resume)
            self.bus.subscribe(self.rundir)
            if previous is not None:  # kept whole until a checkpoint is loaded
                with self.record.lock:
                    self.record.steps, self.record.evals = previous.steps, previous.evals
                    self.record.step_ops = previous.step_ops
            else:
                self.rundir.start_history([], [])
            self.record.status = "running"
            self.rundir.write(self.record)
        self._prepared = True
        return self

    def setup(self, resume: bool = False) -> "TrainRecipe":
        """``prepare``, then load data, build the model and engine, start sampling; with
        ``resume``, continue from the newest usable checkpoint."""
        self.prepare(resume)
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self.device = self.dist.device(cfg) if self.dist else torch.device(cfg.device)
        cap_gpu_memory(cfg, self.device)
        model, source = build_skeleton(cfg.model)
        self.train_data, self.dev_data = self._data(model.config.vocab_size)
        t = time.perf_counter()
        self.engine = build_engine(model, source, cfg, self.device, self.bus)
        if self.dist is not None:
            self.engine.reduce = self.dist.mean
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # setup only: build time includes the GPU's work
        self.bus.publish(InfoEvent("build_seconds", time.perf_counter() - t))
        root = self.checkpoint_root if self.dist is None or self.dist.main else None
        if root is not None:
            self.checkpointer = AsyncCheckpointer(root, cfg.keep_last, self.bus, self.engine.timer)
            if cfg.method in ZO_METHODS:
                self.steplog = StepLog(root)
        if resume:
            self._resume()
        self.sampler = Sampler(hz=cfg.sample_hz, t0=self.engine.timer.t0,
                               device_index=self.device.index or 0, on_sample=self._on_sample)
        self.record.environment = environment(cfg.device, self.sampler.static_info())
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

    def _plan_resume(self, previous: RunRecord | None) -> None:
        """Resume rules, checked before anything is built: fixed knobs unchanged, ``steps`` not
        below the newest checkpoint; the checkpoints to try, newest first, whose earlier steps
        are all in the history (so the resumed history has no gap)."""
        root = self.checkpoint_root
        found, covered = newest_covered(root, previous.steps) if previous else (
            complete_checkpoints(root) if root is not None else [], None)
        if previous is None:
            covered = found[-1] if found else None
            if covered is None:
                raise CheckpointError(f"resume: no complete checkpoint under {root}")
            reference = json.loads((covered / "manifest.json").read_text()).get("config", {})
        else:
            reference = previous.config
        problems = check_resume(reference, self.cfg)
        newest = max((checkpoint_step(p) for p in found), default=0)
        if self.cfg.steps < newest:
            problems.append(f"steps: {self.cfg.steps} is below the newest checkpoint of this run "
                            f"(step {newest}); give steps={newest} or more")
        if problems:
            raise ConfigError(problems)
        if covered is not None and covered != found[-1]:
            warnings.warn(f"resume: {found[-1].name} is newer than the recorded history (a kill "
                          f"while its steps were in flight); resuming from {covered.name}",
                          RunWarning)
        names = [p.name for p in found if covered is not None
                 and checkpoint_step(p) <= checkpoint_step(covered)][::-1]
        if self.dist is not None:  # every rank resumes from the checkpoint rank 0 chose
            names = self.dist.gather(names)[0]
        self._resume_from = names

    def _resume(self) -> None:
        """Load the newest usable checkpoint (a corrupted one is reported and an older one
        tried) and continue from its step; with none yet, start again from step 0."""
        layouts = self.engine.group_layouts()
        snap, errors = None, []
        for name in self._resume_from:
            try:
                snap = read_checkpoint(self.checkpoint_root / name, [l.name for l in layouts],
                                       [l.numel for l in layouts])
                break
            except CheckpointError as e:
                errors.append(str(e))
                warnings.warn(f"{e}; trying an older checkpoint", RunWarning)
        if snap is None and errors:
            raise CheckpointError(f"resume: no usable checkpoint in {self.checkpoint_root} "
                                  f"({errors[-1]}); start over with --overwrite")
        if snap is None:
            warnings.warn(f"resume: no complete checkpoint yet in {self.checkpoint_root}; "
                          "starting again from step 0", RunWarning)
            start, name = 0, None
        else:
            start, name = snap.step, f"step-{snap.step:08d}"
            for key in ("model", "method"):
                if snap.config.get(key) != getattr(self.cfg, key):
                    raise CheckpointError(f"resume: checkpoint {name} is for {key}="
                                          f"{snap.config.get(key)!r}, this run has "
                                          f"{getattr(self.cfg, key)!r}")
            self.engine.load_state_flats(snap.flats)
            self.engine.set_pending(snap.pending)
        self.step = start
        with self.record.lock:  # the history before the checkpoint, no step twice
            self.record.steps = [r for r in self.record.steps if r["step"] < start]
            self.record.evals = [e for e in self.record.evals if e["step"] <= start]
            self.record.step_ops = [r for r in self.record.step_ops if r["step"] < start]
        if self.rundir is not None:
            self.rundir.start_history(self.record.steps, self.record.evals)
            self.rundir.write(self.record)
        self.bus.publish(InfoEvent("resumed_from", name))

    def _examples(self):
        """(train, dev) examples, read and checked before the model is built (None: none)."""
        cfg = self.cfg
        if cfg.data == "synthetic":
            return None, None
        try:
            self.tokenizer = load_tokenizer(cfg.model, cfg.resolved_data_dir)
        except (OSError, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise ConfigError([f"model: no usable tokenizer for {cfg.model} ({first})"]) from None
        train = load_split(cfg.data, "train", cfg.resolved_data_dir)
        dev = (load_split(cfg.data, "dev", cfg.resolved_data_dir)
               if has_split(cfg.data, "dev", cfg.resolved_data_dir) else None)
        if cfg.train_samples:
            train = train[:cfg.train_samples]
        if cfg.eval_samples and dev is not None:
            dev = dev[:cfg.eval_samples]
        return train, dev

    def _data(self, vocab: int):
        """(train, dev) data; ``vocab`` sizes synthetic token ids."""
        cfg = self.cfg
        if cfg.data == "synthetic":
            return SyntheticData(vocab, cfg.seq_len), None
        train, dev = self.examples
        return (PromptDataset(train, self.tokenizer, cfg.seq_len),
                PromptDataset(dev, self.tokenizer, cfg.seq_len) if dev else None)

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
        while self.step < cfg.steps and not self.stop_event.is_set():
            t = self.step
            batch = self.train_data.batch_for_step(t, cfg.batch_size, cfg.seed)
            tokens = batch.tokens  # the global batch's, on every rank
            if self.dist is not None:
                batch = self.dist.shard(batch, cfg.batch_size)
            batch = batch.to(self.device)
            lr, wd = self.live["lr"], self.live["weight_decay"]
            moved = engine.bytes_h2d, engine.bytes_d2h
            out = engine.step(batch, t, lr, wd)
            end = self._marker()
            moved = (engine.bytes_h2d - moved[0], engine.bytes_d2h - moved[1])
            scalars = [out.loss, *(x if x is not None else nan for x in
                                   (out.projected_grad, out.loss_plus, out.loss_minus))]
            inflight.append((t, Deferred(*scalars), tokens, lr, wd, mark, end, moved,
                             out.projected_grad is not None))
            mark = end
            self.step += 1
            if (self.dist is not None and cfg.digest_check_every
                    and self.step % cfg.digest_check_every == 0):
                distributed.check_in_sync(self.dist, engine.state_flats(), self.step)
            self._check_writes()
            if (self.checkpointer is not None and cfg.checkpoint_every
                    and self.step % cfg.checkpoint_every == 0 and self.step < cfg.steps):
                self._checkpoint()
                self._write_record(every_s=1.0)
            # Bound run-ahead to two steps: the host waits here, between steps, if it must.
            self._publish(inflight, block=len(inflight) > 2, bar=bar)
            if (cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps
                    and self.diverged_at is None):
                self._publish(inflight, block=True, bar=bar)
                self.evaluate()
            self._write_record(every_s=WRITE_EVERY_S)
        self.training = False
        if self.diverged_at is None:
            self._publish(inflight, block=True, bar=bar, drain=True)
        if (self.checkpointer is not None and cfg.checkpoint_every and self.diverged_at is None
                and not self.failure):
            self.checkpointer.wait()
            self.checkpointer.verified = self.step  # every step so far was published finite
            # The final state, its update still pending, so a longer run continues exactly as a
            # straight one (applying it now would add a rounding under master=compressed-sr).
            self._checkpoint()
            self.checkpointer.wait()
            self._check_writes()
        engine.flush()
        if bar is not None:
            bar.close()
        stopped = self.step < cfg.steps
        if (self.dev_data is not None and self.diverged_at is None and not self.failure
                and not (stopped and self.stop_reason) and not self._evaluated()):
            self.evaluate()
        if self.failure:
            rec.status, rec.error = "failed", self.failure
        elif self.diverged_at is not None:
            rec.status = "diverged"
        elif stopped:
            rec.status = "stopped"
            rec.info["stopped"] = f"by {self.stop_reason or 'request'} after step {self.step}"
        else:
            rec.status = "done"
        return rec

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

    def _check_writes(self) -> None:
        """Report failed checkpoint writes as they happen; after MAX_WRITE_FAILURES in a row
        the run stops as failed."""
        ck = self.checkpointer
        while ck is not None and (error := ck.failure()) is not None:
            line = _os_error(error)
            warnings.warn(f"checkpoint_dir: a checkpoint write failed ({line}); training goes on",
                          RunWarning)
            self.bus.publish(InfoEvent("checkpoint_error", line))
            if ck.failures >= MAX_WRITE_FAILURES and not self.failure:
                self.failure = (f"checkpoint_dir: {ck.failures} checkpoint writes failed in a "
                                f"row (last: {line}); free space in {ck.root} or point "
                                "checkpoint_dir elsewhere, then --resume")
                self.stop_event.set()

    def _write_record(self, every_s: float) -> None:
        """run.json as it stands (status running), atomically; a failure is reported, not
        fatal: the last good run.json stays."""
        if self.rundir is None or not self.rundir.claimed:
            return  # refused before the claim: nothing of ours is there
        try:
            self.rundir.write(self.record, every_s=every_s)
        except OSError as e:
            warnings.warn(f"run.json not updated ({_os_error(e)}); the previous one stays",
                          RunWarning)

    def _diverge(self, t: int, loss: float, g: float | None) -> None:
        """Stop at step ``t``: drop checkpoints taken after it (they hold its result)."""
        self.diverged_at = t
        self.stop_event.set()
        kept = []
        if self.checkpointer is not None:
            self.checkpointer.discard_after(t)
            kept = complete_checkpoints(self.checkpointer.root)
        what = ", ".join(f"{k} = {v}" for k, v in (("loss", loss), ("projected_grad", g))
                         if v is not None and not math.isfinite(v))
        where = (f"the last good checkpoint is {kept[-1].name}" if kept else
                 "no checkpoint was taken before it")
        self.record.error = (f"diverged at step {t} ({what}); {where}; try a lower lr (a resume "
                             "may change it)")

    def _marker(self):
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # end of this step's work on the compute stream
        return event

    def _publish(self, inflight: deque, block: bool, bar, drain: bool = False) -> None:
        while inflight and (drain or block or inflight[0][1].ready()):
            t, deferred, tokens, lr, wd, begin, end, moved, has_g = inflight.popleft()
            loss, g, loss_plus, loss_minus = deferred.get()
            self.engine.timer.poll()  # the step's spans are complete: publish them before it
            if isinstance(end, float):
                seconds, end_t = end - begin, end - self.engine.timer.t0
            else:
                end.synchronize()  # already complete once the losses have landed; no stall
                seconds = begin.elapsed_time(end) / 1e3
                end_t = self.engine.timer.now()
            mem = _memory(self.device)
            finite = math.isfinite(loss) and (not has_g or math.isfinite(g))
            if self.steplog is not None and finite:
                self._log_step(t, g, lr, wd)
            self.bus.publish(StepEvent(t, loss, g, seconds, tokens,
                                       loss_plus, loss_minus, lr, *mem, *moved, end=end_t))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", g=f"{g:.3g}")
            if not finite:
                self._diverge(t, loss, g if has_g else None)
                inflight.clear()  # steps after the divergence are not part of the run
                return
            if self.checkpointer is not None:
                self.checkpointer.verified = t + 1  # checkpoints up to here hold good states
            block = False

    def _log_step(self, t: int, g: float, lr: float, wd: float) -> None:
        """One line of the step log; a failed write turns the log off with a warning (steps
        after it cannot be replayed between snapshots, the snapshots themselves still can)."""
        try:
            self.steplog.append(t, step_seed(self.cfg.seed, t), g, lr, wd)
        except OSError as e:
            warnings.warn(f"{self.steplog.path} not written ({_os_error(e)}); the step log is "
                          "off for the rest of this run", RunWarning)
            self.steplog = None

    @torch.no_grad()
    def evaluate(self) -> float:
        """Dev accuracy (fraction) and loss with the current weights; publishes an EvalEvent.
        Under torchrun every rank takes part: each scores its share of the dev batches and the
        sums are all-reduced, so the ranks' engines do the same work and stay identical."""
        dist = self.dist
        if dist is not None:
            # predict() applies a pending update first; under master=compressed-sr that is a
            # rounding pass, which must happen on every rank, including one with no batches.
            self.engine.flush()
        correct = total = 0
        loss_sum = 0.0
        for i, batch in enumerate(self.dev_data.eval_batches(max(self.cfg.batch_size, 16))):
            if dist is not None and i % dist.world != dist.rank:
                continue  # another rank's share
            batch = batch.to(self.device)
            logits = self.engine.predict(batch)
            correct += int((logits.argmax(-1) == batch.labels).sum())
            loss_sum += float(torch.nn.functional.cross_entropy(logits, batch.labels,
                                                                reduction="sum"))
            total += len(batch.labels)
        if dist is not None:
            correct, loss_sum, total = dist.sum([correct, loss_sum, total], self.device)
        acc = correct / max(total, 1)
        self.bus.publish(EvalEvent(self.step, acc, loss_sum / max(total, 1), int(total)))
        return acc

    # --- save -------------------------------------------------------------------------------
    def save(self, digest_params: bool = True) -> RunRecord:
        """Summary, parameter digest and the run directory (if any). Speed benchmarks pass
        ``digest_params=False``: hashing a 13B model's weights takes half a minute."""
        rec, cfg = self.record, self.cfg
        if self.sampler is not None:
            self.sampler.stop()  # the saved record is the returned one: no sample after it
        self.engine.flush()
        self.collector.flush()
        if digest_params:
            flats = [f.detach().cpu() for f in self.engine.state_flats()]
            with rec.lock:
                rec.param_digest, rec.param_norm = digest(flats), norm(flats)
        with rec.lock:
            rec.summary = _summary(rec, self.engine, self.device)
        if self.dist is not None:  # every rank's own view, merged into rank 0's record
            mine = {"rank": self.dist.rank, "device": str(self.device),
                    "param_digest": rec.param_digest, "summary": rec.summary,
                    "step_seconds": [s["seconds"] for s in rec.steps]}
            ranks = self.dist.gather(mine)
            with rec.lock:
                rec.info["ranks"] = ranks
                rec.info["world_size"] = self.dist.world
        if self.out_dir is not None:
            from workbench.telemetry.trace import write_trace

            # run.json first, with the final status; a larger artefact that fails after it
            # is reported and costs nothing else.
            rec.save(self.out_dir, on_error=_artefact_failed)
            try:
                write_trace(rec, self.out_dir / "trace.json")
            except OSError as e:
                _artefact_failed("trace.json", e)
            if self.rundir is not None:
                self.rundir.finish()
        return rec

    def fail(self, error: BaseException) -> None:
        """Record how the run ended by ``error``: stopped (a signal), failed otherwise, with one
        line; run.json is rewritten when this process holds the run directory."""
        rec = self.record
        if rec.status in ("done", "stopped", "failed", "diverged") and rec.error:
            return
        if isinstance(error, KeyboardInterrupt):
            rec.status = "stopped"
            rec.info["stopped"] = f"by {error} at step {self.step}"
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
            if self.checkpointer is not None:
                self.checkpointer.close()
            if self.sampler is not None:
                self.sampler.stop()
            if self.engine is not None:
                self.engine.close()
            if self.dist is not None:
                distributed.shutdown()
        finally:
            if self.rundir is not None:
                self.rundir.release()
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

    def outcome(self) -> str:
        """One line saying how the run ended (the CLI prints it, the panel shows it)."""
        rec, where = self.record, f"run directory {self.out_dir}" if self.out_dir else ""
        if rec.status in ("failed", "diverged"):  # a diverged run's error says so itself
            return (f"{'failed: ' if rec.status == 'failed' else ''}{rec.error}"
                    + (f"; {where}" if where else ""))
        if rec.status == "stopped":
            ck = self.checkpointer
            kept = complete_checkpoints(ck.root) if ck is not None else []
            resume = (f"checkpoint {kept[-1].name} kept; continue with: python -m workbench run "
                      f"--resume {self.out_dir}" if kept and self.out_dir else
                      "no checkpoint (checkpoint_every=0): a resume starts from step 0")
            return f"stopped {rec.info.get('stopped', '')}; {resume}"
        return f"{rec.status}: {len(rec.steps)} steps" + (f", {where}" if where else "")


def run(cfg: RunConfig, out_dir: str | Path | None = None, bus: EventBus | None = None,
        progress: bool = True, resume: bool = False, *, overwrite: bool = False,
        force: bool = False) -> RunRecord:
    """Set up, train, save and clean up one run; returns its record.

    Args:
        resume: continue ``out_dir``'s run from its newest usable checkpoint.
        overwrite: replace the run ``out_dir`` holds (else a directory holding one is refused).
        force: run even when the planner says it cannot fit.
    Raises:
        ConfigError: bad settings, data, model folder, directory or fit; nothing was written.
    """
    return TrainRecipe(cfg, out_dir, bus, progress, overwrite=overwrite, force=force).run(resume)


def error_line(cfg: RunConfig, error: BaseException, step: int) -> str:
    """One line for the record and the terminal."""
    if isinstance(error, torch.OutOfMemoryError):
        return out_of_memory_line(cfg, error)
    if isinstance(error, ConfigError):
        return "; ".join(error.problems)
    first = (str(error).strip().splitlines() or [""])[0][:300]
    return f"{type(error).__name__} at step {step}: {first}"


def _os_error(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
    return f"{type(e).__name__}: {e}"


def _artefact_failed(name: str, error: OSError) -> None:
    warnings.warn(f"{name} not written ({_os_error(error)}); run.json is complete", RunWarning)


def _memory(device: torch.device) -> tuple[int, int, int]:
    if device.type != "cuda":
        return 0, 0, 0
    return (torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device),
            torch.cuda.max_memory_allocated(device))


def _summary(rec: RunRecord, engine, device: torch.device) -> dict[str, Any]:
    steps = rec.steps
    timed = steps[1:] if len(steps) >= 3 else steps  # the first step carries compile / warm-up
    seconds = sum(s["seconds"] for s in timed)
    tokens = sum(s["tokens"] for s in timed)
    tail = steps[-max(1, len(steps) // 10):] if steps else []
    losses = [s["loss"] for s in tail if s["loss"] is not None]
    n = max(len(steps), 1)
    out: dict[str, Any] = {
        "steps": len(steps),
        "tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
        "step_seconds": seconds / max(len(timed), 1),
        "peak_gpu_mem_bytes": _memory(device)[2],
        "gpu_param_bytes": engine.gpu_param_bytes(),
        "final_loss": sum(losses) / len(losses) if losses else math.nan,
        "bytes_h2d": sum(s.get("bytes_h2d", 0) for s in steps) // n,
        "bytes_d2h": sum(s.get("bytes_d2h", 0) for s in steps) // n,
        "build_seconds": rec.info.get("build_seconds"),
    }
    if rec.evals:
        out["eval_accuracy"] = rec.evals[-1]["accuracy"]
        out["eval_accuracy_start"] = rec.evals[0]["accuracy"]
    return out


def _progress(total: int, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", leave=False)
