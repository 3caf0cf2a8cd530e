"""The training recipe: setup -> train -> save -> cleanup, shared by the CLI and the notebooks.

It composes the pieces (data, model skeleton, engine, telemetry) and owns the loop. The loop
never waits for the GPU: each step's losses travel to the host through ``Deferred`` copies and
are published once they have landed.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from workbench import distributed
from workbench.config import ZO_METHODS, ConfigError, RunConfig, check_environment
from workbench.data.batches import PromptDataset, SyntheticData
from workbench.data.sources import load_split
from workbench.engine import build_engine
from workbench.engine.checkpoint import (AsyncCheckpointer, CheckpointError, StepLog,
                                         latest_checkpoint, read_checkpoint)
from workbench.engine.events import EvalEvent, EventBus, InfoEvent, StepEvent
from workbench.engine.groups import digest, norm
from workbench.engine.timing import Deferred
from workbench.engine.warmup import warm_kernels
from workbench.engine.zo_common import step_seed
from workbench.models.build import build_skeleton
from workbench.models.tokenizer import load_tokenizer
from workbench.telemetry.collector import Collector
from workbench.telemetry.environment import environment
from workbench.telemetry.record import RunRecord
from workbench.telemetry.sampler import Sampler
from workbench.telemetry.steady import throughput


class TrainRecipe:
    """Args:
        cfg: the run.
        out_dir: run directory to write (None: keep the record in memory only).
        bus: event bus to publish on (a fresh one by default); the UI subscribes to it.
        progress: show a tqdm progress bar.
    """

    def __init__(self, cfg: RunConfig, out_dir: str | Path | None = None,
                 bus: EventBus | None = None, progress: bool = True):
        self.cfg, self.progress = cfg, progress
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.bus = bus or EventBus()
        self.record = RunRecord(config=cfg.to_dict(), status="new")
        self.collector = Collector(self.record, cfg.keep_steps)
        self._unsubscribe = self.bus.subscribe(self.collector)
        self.stop_event = threading.Event()
        self.live: dict[str, float] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
        self.engine: Any = None
        self.sampler: Sampler | None = None
        self.checkpointer: AsyncCheckpointer | None = None
        self.steplog: StepLog | None = None
        self.step = 0
        self.dist = None  # set under torchrun (data parallel)

    # --- setup ------------------------------------------------------------------------------
    def setup(self, resume: bool = False) -> "TrainRecipe":
        """Check the machine, load data, build the model and engine, start sampling; with
        ``resume``, continue from the newest complete checkpoint."""
        cfg = self.cfg
        check_environment(cfg)
        self.dist = distributed.from_env(cfg)
        if self.dist is not None and not self.dist.main:
            self.out_dir = None  # rank 0 writes the run directory and the checkpoints
        root = self._checkpoint_root() if self.dist is None or self.dist.main else None
        torch.manual_seed(cfg.seed)
        self.device = self.dist.device(cfg) if self.dist else torch.device(cfg.device)
        model, source = build_skeleton(cfg.model)
        self.train_data, self.dev_data = self._data(model.config.vocab_size)
        if self.dist is not None and not self.dist.main:
            self.dev_data = None  # rank 0 evaluates
        t = time.perf_counter()
        self.engine = build_engine(model, source, cfg, self.device, self.bus)
        if self.dist is not None:
            self.engine.reduce = self.dist.mean
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # setup only: build time includes the GPU's work
        self.bus.publish(InfoEvent("build_seconds", time.perf_counter() - t))
        t = time.perf_counter()
        warm_kernels(self.engine)  # compile time is paid here, not in the first steps
        self.bus.publish(InfoEvent("warmup_seconds", time.perf_counter() - t))
        if root is not None:
            self.checkpointer = AsyncCheckpointer(root, cfg.keep_last, self.bus, self.engine.timer)
            if cfg.method in ZO_METHODS:
                self.steplog = StepLog(root)
        if resume:
            self._resume(root)
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

    def _resume(self, root: Path | None) -> None:
        """Load the newest complete checkpoint and continue from its step."""
        path = latest_checkpoint(root) if root is not None else None
        if path is None:
            raise CheckpointError(f"resume: no complete checkpoint under {root}")
        layouts = self.engine.group_layouts()
        snap = read_checkpoint(path, [l.name for l in layouts], [l.numel for l in layouts])
        for key in ("model", "method"):
            if snap.config.get(key) != getattr(self.cfg, key):
                raise CheckpointError(f"resume: checkpoint {path.name} is for {key}="
                                      f"{snap.config.get(key)!r}, this run has "
                                      f"{getattr(self.cfg, key)!r}")
        self.engine.restore(snap)
        self.step = snap.step
        if self.out_dir is not None and (self.out_dir / "run.json").is_file():
            previous = RunRecord.load(self.out_dir)
            with self.record.lock:
                self.record.steps = [r for r in previous.steps if r["step"] < snap.step]
                self.record.evals = [e for e in previous.evals if e["step"] <= snap.step]
                self.record.step_ops = [r for r in previous.step_ops if r["step"] < snap.step]
        self.bus.publish(InfoEvent("resumed_from", path.name))

    def _data(self, vocab: int):
        """(train, dev) data; ``vocab`` sizes synthetic token ids."""
        cfg = self.cfg
        pending = [k for k in ("objective", "template", "label_words")
                   if getattr(cfg, k) != RunConfig.__dataclass_fields__[k].default]
        if pending:  # the engines train today's two-word loss until issue 18 phase B wires these
            raise ConfigError([f"{k}: not trained yet (the engines use objective=classify with the "
                               "default template and label_words)" for k in pending])
        if cfg.data == "synthetic":
            return SyntheticData(vocab, cfg.seq_len), None
        tok = load_tokenizer(cfg.model, cfg.resolved_data_dir)
        fields = {"text_field": cfg.text_field, "label_field": cfg.label_field}
        train = load_split(cfg.data, "train", cfg.resolved_data_dir, **fields)
        dev = load_split(cfg.data, "dev", cfg.resolved_data_dir, **fields)
        if cfg.train_samples:
            train = train[:cfg.train_samples]
        if cfg.eval_samples:
            dev = dev[:cfg.eval_samples]
        return PromptDataset(train, tok, cfg.seq_len), PromptDataset(dev, tok, cfg.seq_len)

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
        """Run steps until ``cfg.steps`` or ``stop_event``; evaluates at start and end."""
        cfg, engine, rec = self.cfg, self.engine, self.record
        rec.status = "running"
        if self.dev_data is not None and self.step == 0:
            self.evaluate()
        inflight: deque = deque()
        nan = torch.full((), float("nan"), device=self.device)  # stands in for absent scalars
        mark = self._marker()
        bar = _progress(cfg.steps, self.step) if self.progress else None
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
            inflight.append((t, Deferred(*scalars), tokens, lr, wd, mark, end, moved))
            mark = end
            self.step += 1
            if (self.dist is not None and cfg.digest_check_every
                    and self.step % cfg.digest_check_every == 0):
                distributed.check_in_sync(self.dist, engine.state_flats(), self.step)
            if (self.checkpointer is not None and cfg.checkpoint_every
                    and self.step % cfg.checkpoint_every == 0 and self.step < cfg.steps):
                self._checkpoint()
            # Bound run-ahead to two steps: the host waits here, between steps, if it must.
            self._publish(inflight, block=len(inflight) > 2, bar=bar)
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                self._publish(inflight, block=True, bar=bar)
                self.evaluate()
                mark = self._marker()  # the next step's time starts after the eval
        self._publish(inflight, block=True, bar=bar, drain=True)
        if self.checkpointer is not None and cfg.checkpoint_every:
            self.checkpointer.wait()
            # The final state, its update still pending, so a longer run continues exactly as a
            # straight one (applying it now would add a rounding under master=compressed-sr).
            self._checkpoint()
            self.checkpointer.wait()
        engine.flush()
        if bar is not None:
            bar.close()
        if self.dev_data is not None:
            self.evaluate()
        rec.status = "stopped" if self.stop_event.is_set() else "done"
        return rec

    def _checkpoint(self) -> None:
        """Hand a snapshot to the background writer; skip it if the last is still writing."""
        if self.checkpointer.busy:
            self.checkpointer.skipped += 1
            self.bus.publish(InfoEvent("checkpoints_skipped", self.checkpointer.skipped))
            return
        self.checkpointer.submit(self.engine.snapshot(self.step))

    def _marker(self):
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # end of this step's work on the compute stream
        return event

    def _publish(self, inflight: deque, block: bool, bar, drain: bool = False) -> None:
        while inflight and (drain or block or inflight[0][1].ready()):
            t, deferred, tokens, lr, wd, begin, end, moved = inflight.popleft()
            loss, g, loss_plus, loss_minus = deferred.get()
            self.engine.timer.poll()  # the step's spans are complete: publish them before it
            if isinstance(end, float):
                seconds, end_t = end - begin, end - self.engine.timer.t0
            else:
                end.synchronize()  # already complete once the losses have landed; no stall
                seconds = begin.elapsed_time(end) / 1e3
                end_t = self.engine.timer.now()
            mem = _memory(self.device)
            if self.steplog is not None:
                self.steplog.append(t, step_seed(self.cfg.seed, t), g, lr, wd)
            self.bus.publish(StepEvent(t, loss, g, seconds, tokens,
                                       loss_plus, loss_minus, lr, *mem, *moved, end=end_t))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", g=f"{g:.3g}")
            block = False

    @torch.no_grad()
    def evaluate(self) -> float:
        """Dev accuracy (fraction) and loss with the current weights; publishes an EvalEvent."""
        correct = total = 0
        loss_sum = 0.0
        for batch in self.dev_data.eval_batches(max(self.cfg.batch_size, 16)):
            batch = batch.to(self.device)
            logits = self.engine.predict(batch)
            correct += int((logits.argmax(-1) == batch.labels).sum())
            loss_sum += float(torch.nn.functional.cross_entropy(logits, batch.labels,
                                                                reduction="sum"))
            total += len(batch.labels)
        acc = correct / max(total, 1)
        self.bus.publish(EvalEvent(self.step, acc, loss_sum / max(total, 1), total))
        return acc

    # --- save -------------------------------------------------------------------------------
    def save(self, digest_params: bool = True) -> RunRecord:
        """End sampling; summary, parameter digest and the run directory (if any). Speed
        benchmarks pass ``digest_params=False``: hashing a 13B model's weights takes half a
        minute."""
        rec, cfg = self.record, self.cfg
        if self.sampler is not None:
            self.sampler.stop()  # the samples saved are all the samples there will be
        self.engine.flush()
        self.collector.flush()
        if digest_params:
            flats = [f.detach().cpu() for f in self.engine.state_flats()]
            with rec.lock:
                rec.param_digest, rec.param_norm = digest(flats), norm(flats)
            base = self.engine.base_flats()  # adapter runs: the frozen base
            if base:
                with rec.lock:
                    rec.base_digest = digest([f.detach().cpu() for f in base])
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
            rec.save(self.out_dir)
            from workbench.telemetry.trace import write_trace

            write_trace(rec, self.out_dir / "trace.json")
        return rec

    def cleanup(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
        if self.sampler is not None:
            self.sampler.stop()
        if self.engine is not None:
            self.engine.close()
        if self.dist is not None:
            distributed.shutdown()
        self._unsubscribe()


def run(cfg: RunConfig, out_dir: str | Path | None = None, bus: EventBus | None = None,
        progress: bool = True, resume: bool = False) -> RunRecord:
    """Set up, train, save and clean up one run; returns its record. With ``resume``, continue
    ``out_dir``'s run from its newest complete checkpoint."""
    recipe = TrainRecipe(cfg, out_dir, bus, progress)
    try:
        recipe.setup(resume=resume)
        recipe.train()
        return recipe.save()
    except BaseException:
        recipe.record.status = "failed"
        raise
    finally:
        recipe.cleanup()


def _memory(device: torch.device) -> tuple[int, int, int]:
    if device.type != "cuda":
        return 0, 0, 0
    return (torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device),
            torch.cuda.max_memory_allocated(device))


def _summary(rec: RunRecord, engine, device: torch.device) -> dict[str, Any]:
    steps = rec.steps
    tail = steps[-max(1, len(steps) // 10):] if steps else []
    losses = [s["loss"] for s in tail if s["loss"] is not None]
    n = max(len(steps), 1)
    out: dict[str, Any] = {
        "steps": len(steps),
        **throughput(steps),  # tokens_per_s, step_seconds: steady steps (telemetry/steady.py)
        "peak_gpu_mem_bytes": _memory(device)[2],
        "gpu_param_bytes": engine.gpu_param_bytes(),
        "final_loss": sum(losses) / len(losses) if losses else math.nan,
        "bytes_h2d": sum(s.get("bytes_h2d", 0) for s in steps) // n,
        "bytes_d2h": sum(s.get("bytes_d2h", 0) for s in steps) // n,
        "build_seconds": rec.info.get("build_seconds"),
        "warmup_seconds": rec.info.get("warmup_seconds"),
    }
    if rec.evals:
        out["eval_accuracy"] = rec.evals[-1]["accuracy"]
        out["eval_accuracy_start"] = rec.evals[0]["accuracy"]
    return out


def _progress(total: int, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", leave=False)
