"""Background sampler of GPU (NVML) and host (psutil) metrics, delivered through a callback.

NVML is imported and initialised in ``start()``, never at import, so importing telemetry on a
machine without a GPU (or without ``pynvml``) costs nothing. Missing metrics are NaN, not
exceptions: a sampler must never take a training run down with it.
"""
from __future__ import annotations

import logging
import threading
import time
from types import ModuleType
from typing import Any, Callable

import psutil

from workbench.telemetry.values import num

log = logging.getLogger(__name__)

NAN = float("nan")

#: Per-lane, per-direction PCIe payload rate after line encoding (bytes/s), by generation.
#: Gen1/2 use 8b/10b, gen3-5 128b/130b, gen6 PAM4 with FLIT overhead.
LANE_BYTES_PER_S = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}

GPU_KEYS = ("gpu util (%)", "gpu mem used (bytes)", "pcie rx (bytes/s)", "pcie tx (bytes/s)",
            "pcie rx total (bytes)", "pcie tx total (bytes)", "power (W)", "sm clock (MHz)")
#: ``process cpu (%)`` is this process's share of the whole host (all cores = 100), so
#: ``host cpu (%)`` less it is what other processes took (``telemetry.noise``).
HOST_KEYS = ("host cpu (%)", "process cpu (%)", "host ram used (bytes)", "process rss (bytes)")

# nvmlValueType_t -> union member of c_nvmlValue_t
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_WRAP = {1: 2**32, 5: 2**32, 6: 2**16}  # counter modulus by value type; others 64-bit


def pcie_peak_bytes_per_s(gen: int | float, width: int | float) -> float:
    """Peak one-direction PCIe payload rate (bytes/s) of a ``gen`` x ``width`` link; NaN if unknown."""
    try:
        return LANE_BYTES_PER_S[int(gen)] * int(width)
    except (KeyError, TypeError, ValueError):
        return NAN


def _text(value: Any) -> str:
    # Older pynvml returns bytes for names and versions, newer returns str.
    return value.decode() if isinstance(value, bytes) else str(value)


class Sampler:
    """Samples GPU and host metrics at ``hz`` on a daemon thread.

    Each sample is a ``dict[str, float]`` with unit-bearing keys (``"t (s)"``, ``GPU_KEYS``,
    ``HOST_KEYS``); it is appended to ``samples`` and passed to ``on_sample``. GPU keys are NaN
    when NVML is off or a single query fails. PCIe ``rx`` is host->GPU, ``tx`` GPU->host;
    ``total`` keys count bytes since ``start()``. NVML's PCIe throughput query blocks ~20 ms per
    direction, so with NVML the thread tops out near 25 Hz (it skips ticks, never bursts).
    ``samples`` grows ~1 KB per sample; for hour-long runs prefer ``on_sample``.

    Args:
        hz: samples per second; <= 0 makes ``start()`` a no-op.
        device_index: NVML device index (NVML order, which can differ from CUDA's).
        t0: ``time.perf_counter()`` origin for ``"t (s)"``; defaults to the moment of ``start()``.
        on_sample: called on the sampler thread with each sample; exceptions are logged once.
        nvml_module: a ``pynvml``-like module (tests inject fakes); default imports ``pynvml``.
    """

    def __init__(self, hz: float = 20.0, device_index: int = 0, t0: float | None = None,
                 on_sample: Callable[[dict[str, float]], None] | None = None,
                 nvml_module: ModuleType | Any | None = None):
        self.hz, self.device_index, self.t0, self.on_sample = hz, device_index, t0, on_sample
        self.samples: list[dict[str, float]] = []
        self.nvml_status = "not started"
        self._nvml, self._handle, self._inited = nvml_module, None, False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._callback_failed = False
        self._pcie_last: list[int | None] = [None, None]  # raw RX/TX counters at the last read
        self._pcie_total = [0, 0]  # unwrapped RX/TX bytes since start()
        self._process = psutil.Process()  # this run's process: its resident memory

    def _open_nvml(self) -> str:
        """Import and init NVML and get the device handle; returns "ok" or why it is off."""
        try:
            if self._nvml is None:
                import pynvml  # lazy: importing telemetry must not need a GPU or the library
                self._nvml = pynvml
            nv = self._nvml
            nv.nvmlInit()
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, driver errors, ...
            return f"NVML unavailable: {type(e).__name__}: {e}"
        self._inited = True
        try:
            count = nv.nvmlDeviceGetCount()
            if self.device_index >= count:
                raise LookupError(f"NVML sees {count} GPU(s), no index {self.device_index}")
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as e:
            self._close_nvml()
            return f"no GPU: {type(e).__name__}: {e}"
        return "ok"

    def _close_nvml(self) -> None:
        if self._inited:
            self._inited, self._handle = False, None
            try:
                self._nvml.nvmlShutdown()
            except Exception as e:
                log.debug("nvmlShutdown failed: %s", e)

    def start(self) -> Sampler:
        """Start the sampling thread (no-op if ``hz <= 0`` or already running). Never raises.

        Without NVML it samples host metrics only; ``nvml_status`` says why (no warning: a CPU
        run is not a problem, and the dashboard's status line says it once).
        """
        if self.hz <= 0 or (self._thread is not None and self._thread.is_alive()):
            return self
        try:
            self.nvml_status = self._open_nvml()
            if self.nvml_status != "ok":  # said once, in the run's environment and status line
                log.info("GPU metrics are off (%s); sampling host only", self.nvml_status)
            if self.t0 is None:
                self.t0 = time.perf_counter()
            psutil.cpu_percent(interval=None)  # primes the counter: the first call returns 0.0
            _try(lambda: self._process.cpu_percent(interval=None))  # and this process's
            self._pcie_last, self._pcie_total = [None, None], [0, 0]
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="telemetry-sampler", daemon=True)
            self._thread.start()
        except Exception as e:  # a sampler that cannot start must not stop the run
            log.warning("telemetry sampler did not start: %s", e)
            self._close_nvml()
        return self

    def stop(self) -> None:
        """Stop and join the thread and shut NVML down. Safe to call more than once."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            # A wedged driver can hang an NVML call; bound the wait rather than hang the run.
            thread.join(timeout=max(2.0, 5.0 / self.hz))
            if thread.is_alive():
                log.warning("telemetry sampler thread did not stop; leaving NVML initialised")
                return
        self._close_nvml()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sample(self) -> dict[str, float]:
        """Take one sample now (on the caller's thread). Failed metrics are NaN.

        Returns:
            ``{"t (s)": ..., **GPU_KEYS, **HOST_KEYS}``, all floats in the units of the key.
        """
        t0 = self.t0 if self.t0 is not None else time.perf_counter()
        s: dict[str, float] = {"t (s)": time.perf_counter() - t0}
        s.update(self._gpu() if self._handle is not None else dict.fromkeys(GPU_KEYS, NAN))
        s["host cpu (%)"] = _reading(lambda: psutil.cpu_percent(interval=None))
        # psutil counts a process's cores (2 busy cores = 200%); shared over the host's
        s["process cpu (%)"] = _reading(lambda: self._process.cpu_percent(interval=None)
                                    / (psutil.cpu_count() or 1))
        s["host ram used (bytes)"] = _reading(lambda: psutil.virtual_memory().used)
        s["process rss (bytes)"] = _reading(lambda: self._process.memory_info().rss)
        return s

    def static_info(self) -> dict[str, object]:
        """GPU name, driver, PCIe link and memory size; ``"nvml"`` is "ok" or why it is off.

        ``"pcie peak (bytes/s)"`` (per direction) uses the *max* link gen/width, which NVML caps
        at what both GPU and slot support: the *current* link downshifts when the GPU is idle,
        so it would understate the peak whenever this is called before work starts.
        """
        opened_here = self._handle is None
        if opened_here:
            status = self._open_nvml()
            if status != "ok":
                return {"nvml": status}
        nv, h = self._nvml, self._handle
        try:
            info: dict[str, object] = {
                "gpu name": _try(lambda: _text(nv.nvmlDeviceGetName(h))),
                "driver": _try(lambda: _text(nv.nvmlSystemGetDriverVersion())),
                "pcie gen": _try(lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
                "pcie width": _try(lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
                "pcie max gen": _try(lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                "pcie max width": _try(lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h)),
                "gpu mem total (bytes)": _reading(lambda: nv.nvmlDeviceGetMemoryInfo(h).total),
            }
            info["pcie peak (bytes/s)"] = pcie_peak_bytes_per_s(info["pcie max gen"],
                                                                info["pcie max width"])
            info["nvml"] = "ok"
            return info
        finally:
            if opened_here:
                self._close_nvml()

    def _gpu(self) -> dict[str, float]:
        nv, h = self._nvml, self._handle
        rx_total, tx_total = self._pcie_counters()
        return {
            "gpu util (%)": _reading(lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu),
            "gpu mem used (bytes)": _reading(lambda: nv.nvmlDeviceGetMemoryInfo(h).used),
            # RX = received by the GPU, i.e. host->GPU. NVML reports KB/s averaged over a 20 ms
            # window, and each call blocks for that window, so these two cost ~40 ms per sample.
            "pcie rx (bytes/s)": _reading(lambda: nv.nvmlDeviceGetPcieThroughput(
                h, nv.NVML_PCIE_UTIL_RX_BYTES) * 1024),
            "pcie tx (bytes/s)": _reading(lambda: nv.nvmlDeviceGetPcieThroughput(
                h, nv.NVML_PCIE_UTIL_TX_BYTES) * 1024),
            "pcie rx total (bytes)": rx_total,
            "pcie tx total (bytes)": tx_total,
            "power (W)": _reading(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),  # NVML gives mW
            "sm clock (MHz)": _reading(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        }

    def _pcie_counters(self) -> tuple[float, float]:
        """PCIe RX/TX bytes since ``start()`` from NVML's cumulative counters; NaN if absent.

        The driver reports these counters as 32-bit (measured on an H200, driver 580), so they
        wrap every 4 GiB: ~68 ms at gen5 x16 line rate. Each read adds the delta modulo the
        counter width, which is exact while under 4 GiB crosses between reads; below ~15 Hz a
        saturated link can wrap unseen and the total undercounts by multiples of 4 GiB.
        """
        nv = self._nvml
        ids = [getattr(nv, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", None),
               getattr(nv, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", None)]
        if None in ids:  # older pynvml: the field ids do not exist
            return NAN, NAN
        try:
            values = nv.nvmlDeviceGetFieldValues(self._handle, ids)
        except Exception:
            return NAN, NAN
        out = []
        for i, v in enumerate(values[:2]):
            # nvmlReturn is the per-field status (0 is NVML_SUCCESS); the value type picks the union
            raw = _try(lambda: int(getattr(v.value, _VALUE_FIELDS[v.valueType]))
                       if v.nvmlReturn == 0 else None)
            if raw is None:
                out.append(NAN)
                continue
            wrap = _WRAP.get(v.valueType, 2**64)
            if self._pcie_last[i] is not None:
                self._pcie_total[i] += (raw - self._pcie_last[i]) % wrap
            self._pcie_last[i] = raw
            out.append(float(self._pcie_total[i]))
        return out[0], out[1]

    def _run(self) -> None:
        period = 1.0 / self.hz
        deadline = time.perf_counter()
        while not self._stop.is_set():
            try:
                s = self.sample()
            except Exception as e:  # sample() guards each metric; this is a last resort
                log.debug("sample failed: %s", e)
            else:
                self.samples.append(s)  # list.append is atomic under the GIL; readers copy
                if self.on_sample is not None:
                    try:
                        self.on_sample(s)
                    except Exception:
                        if not self._callback_failed:
                            self._callback_failed = True
                            log.exception("telemetry on_sample callback failed (logged once)")
            deadline += period
            delay = deadline - time.perf_counter()
            if delay < 0:  # fell behind (slow NVML): skip missed ticks rather than burst
                deadline, delay = time.perf_counter(), 0.0
            self._stop.wait(delay)


def gpu_memory_used(device_index: int = 0, nvml_module: Any = None) -> float:
    """NVML's used memory of one GPU now (bytes: every process's, CUDA contexts included);
    NaN without NVML. A run reads it before it builds anything, so its figures can draw the
    run's own memory above what was there."""
    s = Sampler(hz=0, device_index=device_index, nvml_module=nvml_module)
    if s._open_nvml() != "ok":
        return NAN
    try:
        return _reading(lambda: s._nvml.nvmlDeviceGetMemoryInfo(s._handle).used)
    finally:
        s._close_nvml()


def _try(fn: Callable[[], Any], default: Any = None) -> Any:
    """``fn()``, or ``default`` if it raises: one broken metric must not lose the sample."""
    try:
        return fn()
    except Exception:
        return default


def _reading(fn: Callable[[], Any]) -> float:
    """``fn()`` as a number (``values.num``), NaN if the call fails."""
    return num(_try(fn, None))
