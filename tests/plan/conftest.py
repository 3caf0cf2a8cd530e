"""Shared by the planner's tests."""
from __future__ import annotations

import pytest

from workbench.config import RunConfig
from workbench.plan.planner import plan


def _assert_planned(actual: dict[str, int], cfg: RunConfig) -> None:
    """An engine's device buffers by item (``buffer_bytes``, the non-zero ones) are the plan's
    parts byte for byte, and the plan has no other but the activations and cuBLAS workspace."""
    planned = plan(cfg, gpu="h200").gpu_breakdown
    assert actual == {k: planned[k] for k in actual}
    assert not {k for k, v in planned.items() if v} - set(actual) - {"activations",
                                                                    "cuBLAS workspace"}


@pytest.fixture
def assert_planned():
    return _assert_planned
