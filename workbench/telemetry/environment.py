"""What a run ran on: software versions, host, GPU and PCIe link, for the run record."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from importlib import metadata

import psutil


def _version(dist: str) -> str | None:
    # Package metadata, not an import: importing transformers/triton costs seconds and side effects.
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def load_average() -> float | None:
    """The host's 1-minute load average (processes running or waiting for a core); None where
    the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def environment(device: str = "cpu", sampler_info: dict | None = None) -> dict[str, object]:
    """Describe the software and hardware of this run.

    Args:
        device: torch device string of the run (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        sampler_info: ``Sampler.static_info()`` output; when None and ``device`` is CUDA, a
            fresh ``Sampler().static_info()`` is taken (NVML index 0, which matches CUDA
            index 0 only under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or a single visible GPU).

    Returns:
        Flat dict: ``python``, ``platform``, ``torch``, ``transformers``, ``triton`` (versions or
        None), ``cuda`` (torch's CUDA version or None), ``device``, ``cpu count``,
        ``host ram (bytes)``, ``torch threads`` (intra-op threads of this process),
        ``load average at start`` (runnable processes, 1 minute; ``telemetry.noise`` reads
        it), ``date`` (ISO 8601, UTC), then the ``sampler_info`` entries (``gpu name``,
        ``driver``, ``pcie ...``, ``nvml``).
    """
    try:
        import torch
        torch_version, cuda = torch.__version__, torch.version.cuda
    except ImportError:
        torch = None
        torch_version = cuda = None
    dev_name = device
    if device.startswith("cuda") and torch is not None:
        try:
            dev_name = torch.cuda.get_device_name(torch.device(device))
        except Exception as e:  # no CUDA build / no GPU: record why instead of failing
            dev_name = f"{device} (unavailable: {type(e).__name__})"
    env: dict[str, object] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch_version,
        "transformers": _version("transformers"),
        "triton": _version("triton"),
        "cuda": cuda,
        "device": dev_name,
        "cpu count": os.cpu_count(),
        "host ram (bytes)": psutil.virtual_memory().total,
        "torch threads": torch.get_num_threads() if torch is not None else None,
        "load average at start": load_average(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if sampler_info is None and device.startswith("cuda"):
        from workbench.telemetry.sampler import Sampler
        sampler_info = Sampler().static_info()
    env.update(sampler_info or {})
    return env
