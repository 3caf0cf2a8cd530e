"""The task an export records (``workbench_export.json``'s ``task``): the run settings that make
its data and how it is read and scored, so ``evaluate FOLDER`` scores the export on what the run
learned, wherever the folder is."""
from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from workbench.config import RunConfig

#: The run settings that make its task (``run_task``).
TASK_KEYS = ("data", "data_dir", "train_samples", "eval_samples", "seq_len", "seed",
             *(f.name for f in fields(RunConfig) if f.metadata.get("group") == "task"))


def run_task(config: dict[str, Any], relative_to: Path | None = None) -> dict[str, Any]:
    """The settings that make a run's task (its data and how it is read and scored), for
    ``evaluate FOLDER`` to score the export on the task it learned. A local data file or folder
    is named relative to ``relative_to`` (the export folder: no local path in what is shared,
    and ``evaluate`` finds it from the folder), else absolute."""
    task = {k: config[k] for k in TASK_KEYS if k in config}

    def local(value: str) -> str:
        path = Path(value).expanduser().resolve()
        if relative_to is None:
            return str(path)
        return os.path.relpath(path, Path(relative_to).expanduser().resolve())

    data = str(task.get("data", ""))
    if data and data not in ("embedded", "sst2", "synthetic") and not data.startswith("hf:") \
            and Path(data).expanduser().exists():
        task["data"] = local(data)
    if task.get("data_dir"):
        task["data_dir"] = local(str(task["data_dir"]))
    return task
