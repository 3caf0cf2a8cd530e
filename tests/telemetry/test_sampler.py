"""Sampler and environment tests against fake NVML modules; no GPU needed, a few seconds total."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import warnings
from types import SimpleNamespace

import pytest

from workbench.telemetry.environment import environment
from workbench.telemetry.sampler import GPU_KEYS, HOST_KEYS, Sampler

GiB = 1024**3


class FakeNVML:
    """Minimal pynvml stand-in with known, distinct values; ``fail`` names calls that raise."""

    NVML_PCIE_UTIL_TX_BYTES = 0  # same numbering as pynvml, so a swapped constant is caught
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_CLOCK_SM = 1
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198

    def __init__(self, fail: tuple[str, ...] = (), count: int = 1):
        self.fail, self.count = set(fail), count
        self.inits = self.shutdowns = 0
        self.calls: dict[str, int] = {}

    def _call(self, name: str, value):
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.fail:
            raise RuntimeError(f"fake NVML: {name} not supported")
        return value

    def nvmlInit(self):
        self._call("nvmlInit", None)
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._call("util", SimpleNamespace(gpu=37, memory=12))

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._call("mem", SimpleNamespace(used=5 * GiB, total=80 * GiB, free=75 * GiB))

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        kb_s = {self.NVML_PCIE_UTIL_RX_BYTES: 1000, self.NVML_PCIE_UTIL_TX_BYTES: 250}[counter]
        return self._call("pcie", kb_s)

    def nvmlDeviceGetFieldValues(self, h, ids):
        # Like the real driver: 32-bit counters (valueType 1 = unsigned int) that wrap at 4 GiB.
        # Each read advances RX by 3e9 bytes (wraps most reads) and TX by 1e6.
        n = self._call("fields", self.calls.get("fields", 0))
        raw = {self.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: 4_000_000_000 + n * 3_000_000_000,
               self.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: 123 + n * 1_000_000}
        return [SimpleNamespace(fieldId=i, nvmlReturn=0, valueType=1,
                                value=SimpleNamespace(uiVal=raw[i] % 2**32)) for i in ids]

    def nvmlDeviceGetPowerUsage(self, h):
        return self._call("power", 123456)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self._call("clock", {self.NVML_CLOCK_SM: 1755}[kind])

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlSystemGetDriverVersion(self):
        return "570.86.15"

    # Idle link downshifted to gen 1; the max is what a transfer gets.
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 1

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16


def _run(sampler: Sampler, n: int, timeout: float = 3.0) -> list[dict[str, float]]:
    """Start, wait for ``n`` samples, stop; returns the samples."""
    sampler.start()
    end = time.perf_counter() + timeout
    while len(sampler.samples) < n and time.perf_counter() < end:
        time.sleep(0.01)
    sampler.stop()
    assert len(sampler.samples) >= n, f"only {len(sampler.samples)} samples in {timeout} s"
    return sampler.samples


def _check_host_only(sampler: Sampler) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sampler.start()
        time.sleep(0.3)
        sampler.stop()
        sampler.stop()  # idempotent
    # a CPU machine is not a problem: no warning per run; nvml_status (and the run's status
    # line) say why GPU metrics are off
    assert not caught, [str(w.message) for w in caught]
    assert sampler.nvml_status != "ok"
    assert len(sampler.samples) >= 5  # 50 Hz for 0.3 s is ~15; leave room for a loaded CI box
    for s in sampler.samples:
        assert set(s) == {"t (s)", *GPU_KEYS, *HOST_KEYS}
        assert all(math.isnan(s[k]) for k in GPU_KEYS)
        assert math.isfinite(s["host cpu (%)"]) and 0 <= s["host cpu (%)"] <= 100
        assert s["host ram used (bytes)"] > 0
        assert 0 < s["process rss (bytes)"] < s["host ram used (bytes)"] + 2**30
    ts = [s["t (s)"] for s in sampler.samples]
    assert ts == sorted(ts) and 0 <= ts[0] < 0.2
    assert sampler._thread is None


def test_nvml_init_fails_runs_host_only():
    nv = FakeNVML(fail=("nvmlInit",))
    sampler = Sampler(hz=50, nvml_module=nv)
    _check_host_only(sampler)
    assert "fake NVML" in sampler.nvml_status
    assert nv.shutdowns == 0  # never inited, so never shut down
    assert sampler.static_info()["nvml"].startswith("NVML unavailable")


def test_pynvml_missing_runs_host_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    sampler = Sampler(hz=50)
    _check_host_only(sampler)
    assert "pynvml" in sampler.nvml_status  # ModuleNotFoundError names the module
    assert sampler.static_info() == {"nvml": sampler.nvml_status}


def test_no_device_runs_host_only():
    nv = FakeNVML(count=0)
    sampler = Sampler(hz=50, nvml_module=nv)
    _check_host_only(sampler)
    assert sampler.nvml_status.startswith("no GPU")
    assert nv.inits == nv.shutdowns == 1


def test_fake_nvml_values_units_and_directions():
    nv = FakeNVML()
    got: list[dict[str, float]] = []
    t0 = time.perf_counter()
    sampler = Sampler(hz=100, t0=t0, on_sample=got.append, nvml_module=nv)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NVML works, so no warning may be raised
        samples = _run(sampler, 3)
    assert got == samples
    s = samples[-1]
    assert s["gpu util (%)"] == 37
    assert s["gpu mem used (bytes)"] == 5 * GiB
    assert s["pcie rx (bytes/s)"] == 1000 * 1024  # host -> GPU
    assert s["pcie tx (bytes/s)"] == 250 * 1024  # GPU -> host
    # Totals count from start(), one counter read per sample, unwrapped across 2**32.
    for i, si in enumerate(samples):
        assert si["pcie rx total (bytes)"] == i * 3_000_000_000
        assert si["pcie tx total (bytes)"] == i * 1_000_000
    assert s["power (W)"] == pytest.approx(123.456)
    assert s["sm clock (MHz)"] == 1755
    assert 0 < s["t (s)"] < time.perf_counter() - t0
    assert nv.inits == nv.shutdowns == 1
    sampler.stop()
    assert nv.shutdowns == 1  # second stop() does not shut NVML down twice


def test_static_info_pcie_peak_uses_max_link():
    nv = FakeNVML()
    info = Sampler(nvml_module=nv).static_info()
    assert info["nvml"] == "ok"
    assert info["gpu name"] == "NVIDIA H100 80GB HBM3" and info["driver"] == "570.86.15"
    assert (info["pcie gen"], info["pcie width"]) == (1, 16)
    assert (info["pcie max gen"], info["pcie max width"]) == (5, 16)
    assert info["pcie peak (bytes/s)"] == pytest.approx(16 * 3.938e9)
    assert info["gpu mem total (bytes)"] == 80 * GiB
    assert nv.inits == nv.shutdowns == 1  # opened and closed for the query alone


def test_one_failing_metric_is_nan_and_thread_survives():
    nv = FakeNVML(fail=("power",))
    sampler = Sampler(hz=100, nvml_module=nv)
    sampler.start()
    end = time.perf_counter() + 3.0
    while len(sampler.samples) < 5 and time.perf_counter() < end:
        time.sleep(0.01)
    assert sampler._thread is not None and sampler._thread.is_alive()
    sampler.stop()
    assert len(sampler.samples) >= 5 and nv.calls["power"] >= 5
    for s in sampler.samples:
        assert math.isnan(s["power (W)"])
        assert s["gpu util (%)"] == 37 and s["sm clock (MHz)"] == 1755


def test_missing_counters_and_bad_callback():
    nv = FakeNVML(fail=("fields",))

    def bad_callback(sample):
        raise ValueError("sink broke")

    samples = _run(Sampler(hz=100, on_sample=bad_callback, nvml_module=nv), 3)
    s = samples[-1]
    assert math.isnan(s["pcie rx total (bytes)"]) and math.isnan(s["pcie tx total (bytes)"])
    assert s["pcie rx (bytes/s)"] == 1000 * 1024


def test_zero_hz_does_nothing():
    nv = FakeNVML()
    sampler = Sampler(hz=0, nvml_module=nv)
    sampler.start()
    sampler.stop()
    assert sampler.samples == [] and nv.inits == 0


def test_imports_are_light():
    """Import does not touch NVML; environment("cpu") pulls in neither plotly nor ipywidgets.

    (torch itself imports pynvml, so only the sampler import is checked for it.)
    """
    code = (
        "import json, sys\n"
        "import workbench.telemetry.sampler\n"
        "assert 'pynvml' not in sys.modules, 'pynvml imported at import time'\n"
        "from workbench.telemetry.environment import environment\n"
        "env = environment('cpu')\n"
        "print(json.dumps({'env': env, 'mods': sorted(m for m in sys.modules"
        " if m.split('.')[0] in ('plotly', 'ipywidgets'))}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["mods"] == []
    env = data["env"]
    for key in ("python", "platform", "torch", "transformers", "triton", "cuda", "device",
                "cpu count", "host ram (bytes)", "date"):
        assert key in env
    assert env["device"] == "cpu" and env["host ram (bytes)"] > 0 and env["cpu count"] >= 1
    assert env["date"].endswith("+00:00")
    assert "nvml" not in env  # cpu runs do not probe the GPU


def test_environment_merges_sampler_info():
    info = Sampler(nvml_module=FakeNVML()).static_info()
    env = environment("cpu", info)
    assert env["gpu name"] == "NVIDIA H100 80GB HBM3"
    assert env["pcie peak (bytes/s)"] == pytest.approx(16 * 3.938e9)
