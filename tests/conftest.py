"""Shared fixtures. GPU tests are marked ``gpu`` and skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from workbench.config import default_data_dir


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir():
    from pathlib import Path

    path = Path(default_data_dir())
    if not (path / "sst2" / "train.tsv").is_file():
        pytest.skip(f"shared data not found at {path} (set WORKBENCH_DATA_DIR)")
    return path
