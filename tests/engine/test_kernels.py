"""Loading the optional Triton kernels."""
import importlib.util

import pytest

from workbench.engine import kernels


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_loads_both_kernel_modules():
    assert hasattr(kernels.load("zo.kernels", "rng=philox"), "launch")
    assert hasattr(kernels.load("codecs.sr_kernel", "master=compressed-sr"), "stochastic_round_into")


def test_a_missing_kernel_module_is_said_once_and_gives_none():
    with pytest.warns(UserWarning, match="some_knob: the fused Triton kernel is unavailable"):
        assert kernels.load("no_such_kernels", "some_knob") is None
    assert kernels.load("no_such_kernels", "some_knob") is None  # cached: no second warning
