"""The one-pass CPU AdamW for bf16 compute weights (``adamw16.c``): built once per machine with
the C compiler, loaded with ctypes, and called on a subgroup's runs.

Why. A CPU-updated parameter costs host memory traffic, and that is what bounds fo-offload's
step once most of the model is updated on the CPU. torch's fused AdamW reads fp32 gradients
(so the gradient crosses the link and lands in host memory as 4 bytes) and leaves the 16-bit
copy for the upload to a second pass over the fp32 masters. This kernel reads the bf16
gradient as backward wrote it (2 bytes down the link, exactly widened), updates fp32 (p, m, v)
and writes the bf16 weights for the upload in the same pass: 28 bytes of the CPU's host memory
traffic per parameter against 34 (32 against 40 with the DMA's:
``plan/fo.py::host_traffic_per_param``), and half the gradient's PCIe bytes.

Exactness. The kernel makes torch's vector-path operations in torch's order (``adamw16.c``);
the last ``numel % 16`` elements of each run, which torch takes on its scalar path, are given
to torch itself, so every element is bit for bit what ``adamw.adamw`` computes.

Building. ``$CC`` (default ``cc``) with ``-O3 -march=native``, into the user's cache folder
(``$XDG_CACHE_HOME`` or ``~/.cache``, ``zo-workbench/``), named by a hash of the source, the
flags, the compiler's version and the CPU's model and flags; a failed build is an error that
names the compiler's output.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from workbench.config import ConfigError
from workbench.engine.fo.adamw import AdamW, OptState, Segment
from workbench.plan.fo import c_compiler, one_pass_applies

SOURCE = Path(__file__).with_name("adamw16.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared",
         "-pthread")
VECTOR = 16  # elements per AVX-512 vector of fp32: torch's scalar tail is numel % 16 at most


class BuildError(RuntimeError):
    """The kernel could not be built or loaded (the message says why)."""


def _cpu() -> str:
    """What -march=native builds for: the machine, and on Linux the CPU's model and feature
    flags (a cache shared between hosts must not hand one CPU's build to another)."""
    seen = [os.uname().machine]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features")) and line not in seen:
                    seen.append(line)
                if len(seen) >= 3:
                    break
    except OSError:
        pass
    return "".join(seen)


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "zo-workbench"


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The built kernel (built on first use, then loaded from the cache). Raises BuildError."""
    cc = c_compiler()
    if cc is None:
        raise BuildError(f"no C compiler: {os.environ.get('CC', 'cc')!r} is not on PATH")
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"C compiler {cc!r} did not run: {e}") from e
    key = hashlib.sha256(source + " ".join(FLAGS).encode() + version.encode()
                         + _cpu().encode()).hexdigest()[:16]
    target = _cache_dir() / f"adamw16-{key}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        except OSError as e:
            raise BuildError(f"cannot write the kernel's cache folder {target.parent}: {e} "
                             f"(set XDG_CACHE_HOME to a writable folder)") from e
        os.close(fd)
        try:
            done = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp, "-lm"],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise BuildError(f"building {SOURCE.name} with {cc} failed: "
                                 f"{done.stderr.strip()[-400:]}")
            os.replace(tmp, target)  # atomic: a concurrent build writes the same bytes
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        raise BuildError(f"loading {target} failed: {e}") from e
    fn = lib.wb_adamw16
    fn.restype = ctypes.c_int
    fn.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int64] + [ctypes.c_double] * 6
                   + [ctypes.c_int] * 2)
    return lib


@lru_cache(maxsize=1)
def v_fma() -> int:
    """Whether this torch build fuses the multiply-add of v's update (1) or not (0), found by
    running torch's fused AdamW and the kernel both ways on the same random state. Raises
    BuildError if neither way gives torch's bits."""
    fn = library().wb_adamw16
    gen = torch.Generator().manual_seed(0)
    n = 64 * VECTOR
    p = torch.randn(n, generator=gen)
    m = torch.randn(n, generator=gen) * 1e-3
    v = torch.rand(n, generator=gen) * 1e-5
    g = (torch.randn(n, generator=gen) * 10 ** torch.randint(-6, 2, (n,), generator=gen)).bfloat16()
    want = [t.clone() for t in (p, m, v)]
    torch._fused_adamw_(*[[t] for t in want[:1]], [g.float()], [want[1]], [want[2]], [],
                        [torch.tensor(3.0)], lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                        weight_decay=0.1, amsgrad=False, maximize=False)
    for flag in (1, 0):
        got = [t.clone() for t in (p, m, v)]
        fn(*(t.data_ptr() for t in got), g.data_ptr(), None, n, 1e-3, 0.9, 0.999, 1e-8, 0.1,
           3.0, 1, flag)
        if all(torch.equal(a, b) for a, b in zip(got, want)):
            return flag
    raise BuildError("torch's fused CPU AdamW in this build rounds differently from both "
                     "arithmetic orders adamw16.c knows")


def problem() -> str | None:
    """Why the kernel cannot be used on this machine, or None (it builds and loads)."""
    try:
        v_fma()
    except BuildError as e:
        return str(e)
    return None


def adamw16(state: OptState, g: torch.Tensor, w: torch.Tensor | None, segments: list[Segment],
            opt: AdamW, step: float, threads: int) -> None:
    """AdamW on one subgroup's host state in place, from its bf16 gradients ``g`` (n,);
    ``w`` (n,) bf16, if given, receives the new weights rounded to bf16. ``step``: the Adam
    step count (as torch reads ``state_step``); ``threads``: the kernel's threads. Bit for bit
    ``adamw.adamw`` on ``g`` widened to fp32, followed by ``w.copy_(p)``."""
    fn, fused = library().wb_adamw16, v_fma()
    p, m, v = state
    for lo, hi, decayed in segments:
        wd = opt.weight_decay if decayed else 0.0
        body = lo + (hi - lo) // VECTOR * VECTOR
        if body > lo:
            out = w[lo:].data_ptr() if w is not None else None
            if fn(p[lo:].data_ptr(), m[lo:].data_ptr(), v[lo:].data_ptr(), g[lo:].data_ptr(),
                  out, body - lo, opt.lr, opt.beta1, opt.beta2, opt.eps, wd, float(step),
                  threads, fused) != 0:
                raise BuildError("adamw16: its thread pool could not be started")
        if hi > body:  # torch's scalar tail: torch computes it, so the bits are torch's
            torch._fused_adamw_([p[body:hi]], [g[body:hi].float()], [m[body:hi]], [v[body:hi]],
                                [], [torch.tensor(float(step))], lr=opt.lr, beta1=opt.beta1,
                                beta2=opt.beta2, eps=opt.eps, weight_decay=wd, amsgrad=False,
                                maximize=False)
            if w is not None:
                w[body:hi].copy_(p[body:hi])


def choose(setting: str, amp: str, adam_state_dtype: str) -> tuple[bool, str]:
    """``cpu_adamw``'s kernel for a run: (one-pass or not, what the run record says). auto
    takes one-pass where it applies (bf16 compute weights, fp32 moments) and builds here, and
    otherwise says why it did not; one-pass that cannot build is refused (ConfigError)."""
    if setting == "torch":
        return False, "torch"
    why = (problem() if one_pass_applies(amp, adam_state_dtype)
           else "it needs amp=bf16 with fp32 moments")
    if setting == "one-pass" and why is not None:
        raise ConfigError([f"cpu_adamw: one-pass cannot run here ({why}); use cpu_adamw=torch"])
    return (True, "one-pass") if why is None else (False, f"torch (not one-pass: {why})")
