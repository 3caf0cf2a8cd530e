"""Trackers (``report_to``): the run's steps and evals logged to TensorBoard, W&B and MLflow.

A ``Trackers`` object subscribes to the run's event bus like the collector: from each published
``StepEvent`` it takes what the run record's step row holds (loss, lr, projected gradient, the
two perturbed losses, tokens/s, step time, GPU memory, PCIe bytes) and from each ``EvalEvent``
the dev metrics, and queues them; a thread of its own writes them to the trackers, so the
training thread never waits on a tracker's I/O and no value is read that the step did not
already publish. The run's settings are logged at the start (TensorBoard: a text table; W&B:
the run config; MLflow: params), its summary and digest at the end. TensorBoard also gets
them as hparams (its HPARAMS tab: each setting a column, beside the dev metrics); a W&B run is
grouped by ``WANDB_RUN_GROUP`` or else its model and method, and tagged with its method, model,
objective, device and rng (``wandb_labels``).

Where they write (offline by default):
    tensorboard  RUN_DIR/tensorboard (event files; ``tensorboard --logdir RUN_DIR``)
    wandb        RUN_DIR/wandb; online when ``WANDB_MODE`` says so, or when a W&B API key is
                 set (``WANDB_API_KEY`` or ``wandb login``'s netrc entry); else offline
                 (``wandb sync RUN_DIR/wandb/offline-run-*`` uploads it later)
    mlflow       ``MLFLOW_TRACKING_URI`` when set, else the folder RUN_DIR/mlruns: a file
                 store, which MLflow 3 reads only with ``MLFLOW_ALLOW_FILE_STORE=true`` in the
                 reader's environment too (docs/reference.md gives the command; ``mlflow ui``
                 is not in mlflow-skinny)
Metric names are the same everywhere: train/loss, train/lr, train/projected_grad,
train/loss_plus, train/loss_minus, train/tokens_per_s, train/step_seconds,
gpu/mem_allocated_bytes, gpu/mem_reserved_bytes, gpu/mem_peak_bytes, pcie/h2d_bytes,
pcie/d2h_bytes, eval/<metric>. Values a method does not have (NaN) are left out.
"""
from __future__ import annotations

import contextlib
import socket
import json
import math
import netrc
import os
import queue
import threading
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from workbench.config import ConfigError, RunConfig
from workbench.engine.events import EvalEvent, Event, StepEvent

STEP_KEYS = {"loss": "train/loss", "lr": "train/lr", "projected_grad": "train/projected_grad",
             "loss_plus": "train/loss_plus", "loss_minus": "train/loss_minus",
             "mem_allocated": "gpu/mem_allocated_bytes", "mem_reserved": "gpu/mem_reserved_bytes",
             "mem_peak": "gpu/mem_peak_bytes", "bytes_h2d": "pcie/h2d_bytes",
             "bytes_d2h": "pcie/d2h_bytes"}
GPU_KEYS = ("mem_allocated", "mem_reserved", "mem_peak", "bytes_h2d", "bytes_d2h")
_END = object()


def step_metrics(e: StepEvent, cuda: bool) -> dict[str, float]:
    """A published step as tracker metrics (memory and PCIe only where a GPU ran)."""
    out = {name: float(getattr(e, key)) for key, name in STEP_KEYS.items()
           if cuda or key not in GPU_KEYS}
    out["train/step_seconds"] = e.seconds
    out["train/tokens_per_s"] = e.tokens / e.seconds if e.seconds > 0 else math.nan
    return {k: v for k, v in out.items() if math.isfinite(v)}


def eval_metrics(e: EvalEvent) -> dict[str, float]:
    metrics = e.metrics or {"loss": e.loss, **({"accuracy": e.accuracy} if e.accuracy is not
                                               None else {})}
    return {f"eval/{k}": float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and math.isfinite(v)}


class Trackers:
    """Args:
        names: the trackers (``cfg.trackers``), each installed (``check_environment``).
        config: the run's settings (logged once).
        run_dir: the run directory (local files of the trackers go inside it).
        name: the run's display name.
    Raises:
        RuntimeError: a tracker would not start (its own message, one line).
    """

    def __init__(self, names: tuple[str, ...] | list[str], config: dict[str, Any], run_dir: Path, name: str):
        self.cuda = config.get("device") == "cuda"
        self.sinks = []
        try:
            for tracker in names:
                self.sinks.append(SINKS[tracker](config, Path(run_dir), name))
        except Exception as e:
            for sink in self.sinks:
                sink.close("failed", {})
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise RuntimeError(f"report_to: {tracker} did not start ({first})") from None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._drain, name="trackers", daemon=True)
        self._thread.start()

    def __call__(self, event: Event) -> None:
        """Bus subscriber: queue a step's or an eval's metrics (never blocks)."""
        if isinstance(event, StepEvent):
            self._queue.put((event.step, step_metrics(event, self.cuda)))
        elif isinstance(event, EvalEvent):
            self._queue.put((event.step, eval_metrics(event)))

    def _drain(self) -> None:
        while (item := self._queue.get()) is not _END:
            step, metrics = item
            for sink in list(self.sinks):
                try:
                    sink.log(step, metrics)
                except Exception as e:  # a tracker that fails is dropped; the run goes on
                    self.sinks.remove(sink)
                    with contextlib.suppress(Exception):
                        sink.close("failed", {})
                    warnings.warn(f"report_to: {sink.name} stopped logging at step {step} "
                                  f"({type(e).__name__}: {str(e).splitlines()[0][:200]})",
                                  stacklevel=1)

    def close(self, status: str, summary: dict[str, Any]) -> None:
        """Write what is queued, then the run's end (status, summary) and close each tracker."""
        self._queue.put(_END)
        self._thread.join()
        for sink in self.sinks:
            sink.close(status, summary)


def _scalars(summary: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, config: dict[str, Any], run_dir: Path, name: str):
        from torch.utils.tensorboard import SummaryWriter

        from torch.utils.tensorboard.summary import hparams

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        rows = "\n".join(f"| {k} | `{v}` |" for k, v in sorted(config.items()))
        self.writer.add_text("settings", f"| setting | value |\n|---|---|\n{rows}", 0)
        # the HPARAMS tab: the settings (numbers, flags and text as they are, anything else as
        # its text) and, as its metric columns, the series this run logs under those tags
        values = {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str)
                  for k, v in sorted(config.items())}
        experiment, start, self._end = hparams(values, {k: 0.0 for k in hparam_metrics(config)})
        for summary in (experiment, start):
            self.writer.file_writer.add_summary(summary)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self, status: str, summary: dict[str, Any]) -> None:
        self.writer.add_text("end", f"status: {status}\n\n```\n{json.dumps(summary, indent=1)}"
                             "\n```", 0)
        if status in ("done", "stopped"):  # torch's session end says success
            self.writer.file_writer.add_summary(self._end)
        self.writer.close()


#: the dev metrics an objective's evals log (``telemetry/evals.py``), as eval/<metric> tags
EVAL_TAGS = {"classify": ("accuracy", "loss"), "lm": ("loss", "perplexity"),
             "completion": ("loss", "perplexity", "exact_match", "token_f1")}


def hparam_metrics(config: dict[str, Any]) -> list[str]:
    """The tags TensorBoard's HPARAMS tab shows as metric columns for a run of ``config``."""
    evals = EVAL_TAGS.get(str(config.get("objective", "classify")), ("loss",))
    return ["train/loss", *(f"eval/{m}" for m in evals)]


def wandb_labels(config: dict[str, Any]) -> tuple[str, list[str]]:
    """(group, tags) of a W&B run: ``WANDB_RUN_GROUP`` or "model/method" (runs of one model and
    method side by side), and the settings one filters runs by, as "key=value" (W&B allows 64
    characters a tag)."""
    group = os.environ.get("WANDB_RUN_GROUP") or f"{config.get('model')}/{config.get('method')}"
    keys = ("method", "model", "objective", "device", "rng", "peft")
    tags = [f"{k}={config[k]}"[:64] for k in keys if config.get(k) not in (None, "", "none")]
    return group[:128], tags


class WandbSink:
    name = "wandb"

    def __init__(self, config: dict[str, Any], run_dir: Path, name: str):
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_key() else "offline")
        group, tags = wandb_labels(config)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "zo-workbench"),
                              name=name, config=config, dir=str(run_dir), mode=mode,
                              group=group, tags=tags,
                              reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self, status: str, summary: dict[str, Any]) -> None:
        self.run.summary.update({**_scalars(summary), "status": status})
        self.run.finish(exit_code=0 if status in ("done", "stopped") else 1)


def _wandb_key() -> bool:
    """A W&B API key is configured (no network): the environment or netrc's entry."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class MlflowSink:
    name = "mlflow"
    STATUS = {"done": "FINISHED", "stopped": "KILLED"}  # anything else: FAILED

    def __init__(self, config: dict[str, Any], run_dir: Path, name: str):
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # a folder in the run directory; MLflow 3 asks to opt in to file stores
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (run_dir / "mlruns").resolve().as_uri()
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "zo-workbench")
        found = self.client.get_experiment_by_name(experiment)
        eid = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(eid, run_name=name).info.run_id
        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:6000])
                                                   for k, v in sorted(config.items())])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step)
                                                    for k, v in metrics.items()])

    def close(self, status: str, summary: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        final = [Metric(f"summary/{k}", v, now, 0) for k, v in _scalars(summary).items()]
        if final:
            self.client.log_batch(self.run_id, metrics=final)
        self.client.set_terminated(self.run_id, self.STATUS.get(status, "FAILED"))


SINKS = {"tensorboard": TensorBoardSink, "wandb": WandbSink, "mlflow": MlflowSink}


def start_trackers(cfg: RunConfig, run_dir: Path, name: str) -> Trackers:
    """``cfg.report_to``'s trackers for a run in ``run_dir``.

    Raises:
        ConfigError: a tracker that would not start, in one line.
    """
    try:
        return Trackers(cfg.trackers, cfg.to_dict(), run_dir, name)
    except RuntimeError as e:
        raise ConfigError([str(e)]) from None


REACH_S = 3.0  # how long a tracking server may take to accept a connection before it is refused


def preflight(names: tuple[str, ...], run_dir: Path, timeout_s: float = REACH_S) -> list[str]:
    """Why each of ``names`` would not start in ``run_dir``, found without writing anything and
    within ``timeout_s`` seconds: a folder it writes that cannot be made or written, W&B asked
    to log online with no API key, an MLflow tracking server where nothing listens (MLflow's own
    client retries for minutes). Run before the run directory is touched."""
    problems = []
    for name in names:
        if name in ("tensorboard", "wandb"):
            problems += _writable(run_dir / name, name)
        if name == "wandb" and os.environ.get("WANDB_MODE") == "online" and not _wandb_key():
            problems.append("report_to: wandb: WANDB_MODE=online but no W&B API key is set "
                            "(WANDB_API_KEY or wandb login); log in, or unset WANDB_MODE to log "
                            "offline into RUN_DIR/wandb")
        if name == "mlflow":
            uri = os.environ.get("MLFLOW_TRACKING_URI")
            problems += (_writable(run_dir / "mlruns", name) if not uri else
                         _reachable(uri, timeout_s))
    return problems


def _writable(path: Path, name: str) -> list[str]:
    """``path`` is a folder this process can write, or one it can make."""
    if path.exists() and not path.is_dir():
        return [f"report_to: {name} writes into {path}, which is a file; move it away"]
    at = path
    while not at.exists() and at != at.parent:
        at = at.parent
    if not at.is_dir() or not os.access(at, os.W_OK | os.X_OK):
        what = "cannot be written" if at == path else f"cannot be made ({at} is not writable)"
        return [f"report_to: {name}'s folder {path} {what}; make it writable, or leave "
                f"{name} out of report_to"]
    return []


def _reachable(uri: str, timeout_s: float) -> list[str]:
    """An http(s) tracking server accepts a connection within ``timeout_s`` (other stores: a
    file: URI is a folder to write; the rest are left to MLflow)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return _writable(Path(parsed.path), "mlflow")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return []
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        return [f"report_to: mlflow: nothing answers at {uri} (MLFLOW_TRACKING_URI: {why} within "
                f"{timeout_s:g} s); start the tracking server, or unset MLFLOW_TRACKING_URI to log "
                "into RUN_DIR/mlruns"]
    return []
