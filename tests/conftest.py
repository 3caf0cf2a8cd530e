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


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: the 64-wide tiny models run fastest so, even on a
    busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
