"""The one-pass CPU AdamW (``engine/fo/adamw16.py``): bit for bit torch's fused AdamW on the
widened gradients, alone and inside fo-offload, and refused or passed over, saying why, where
it cannot run."""
from __future__ import annotations

import pytest
import torch

from workbench.config import ConfigError, RunConfig
from workbench.engine.fo import adamw16 as a16
from workbench.engine.fo.adamw import AdamW, OptState, Segment, adamw

from tests.engine.fo.test_fo import LR, WD, _engine


def _state(n: int, gen: torch.Generator) -> OptState:
    return OptState(torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 1e-3,
                    torch.rand(n, generator=gen) * 1e-6)


def _grads(n: int, gen: torch.Generator) -> torch.Tensor:
    """bf16 gradients over 8 decades, some exactly zero."""
    g = torch.randn(n, generator=gen) * 10.0 ** torch.randint(-7, 2, (n,), generator=gen)
    g[::97] = 0.0
    return g.bfloat16()


@pytest.mark.parametrize("threads", [1, 3, 7])
@pytest.mark.parametrize("beta1", [0.9, 0.3])  # 1 - beta1 below 0.5, and not: both lerp forms
def test_equals_torch_fused_adamw_bit_for_bit(threads, beta1):
    """Runs of lengths that leave torch a scalar tail (and one shorter than a vector), decayed
    and not, over five steps: p, m, v and the bf16 weights all equal."""
    gen = torch.Generator().manual_seed(threads)
    n = 100_003
    segs = [Segment(0, 7, False), Segment(7, 77_777, True), Segment(77_777, n, False)]
    ref = _state(n, gen)
    got = OptState(*(t.clone() for t in ref))
    w = torch.empty(n, dtype=torch.bfloat16)
    for step in range(1, 6):
        g = _grads(n, gen)
        opt = AdamW(1e-3 * step, 0.1, beta1, 0.999, 1e-8)
        adamw(ref, g.float(), segs, opt, torch.tensor(float(step)))
        a16.adamw16(got, g, w, segs, opt, step, threads)
        for name, x, y in zip("pmv", ref, got):
            assert torch.equal(x, y), f"{name} differs at step {step}"
        assert torch.equal(w, ref.p.bfloat16())


def test_without_out_leaves_no_weights_and_the_same_state():
    gen = torch.Generator().manual_seed(1)
    n = 4096
    ref, segs, opt = _state(n, gen), [Segment(0, n, True)], AdamW(1e-3, 0.01, 0.9, 0.999, 1e-8)
    got = OptState(*(t.clone() for t in ref))
    g = _grads(n, gen)
    adamw(ref, g.float(), segs, opt, torch.tensor(1.0))
    a16.adamw16(got, g, None, segs, opt, 1, 2)
    assert all(torch.equal(x, y) for x, y in zip(ref, got))


def test_the_probe_finds_which_rounding_this_torch_makes():
    assert a16.v_fma() in (0, 1)
    assert a16.problem() is None


def _no_compiler(monkeypatch, cc: str):
    monkeypatch.setenv("CC", cc)
    a16.library.cache_clear()
    a16.v_fma.cache_clear()


@pytest.fixture
def rebuilt():
    """The kernel's caches cleared after a test that broke the compiler on purpose."""
    yield
    a16.library.cache_clear()
    a16.v_fma.cache_clear()


def test_without_a_compiler_auto_says_why_and_one_pass_is_refused(monkeypatch, rebuilt):
    _no_compiler(monkeypatch, "no-such-cc-here")
    one_pass, why = a16.choose("auto", "bf16", "fp32")
    assert not one_pass and why.startswith("torch (not one-pass: no C compiler")
    with pytest.raises(ConfigError, match="cpu_adamw: one-pass cannot run here .*no C compiler"):
        a16.choose("one-pass", "bf16", "fp32")
    with pytest.raises(ConfigError, match="cpu_adamw"):  # before any work: at the engine build
        _engine(RunConfig(model="tiny-opt", method="fo-offload", amp="bf16",
                          cpu_adamw="one-pass"))


def test_a_compiler_that_fails_is_named_with_its_output(monkeypatch, rebuilt, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _no_compiler(monkeypatch, "false")  # runs, prints nothing, exits 1
    with pytest.raises(a16.BuildError, match="building adamw16.c with .*false failed"):
        a16.library()
    assert not list(tmp_path.rglob("*.so"))  # no half-built library is left to load later


def test_choose_takes_one_pass_only_where_it_applies():
    assert a16.choose("torch", "bf16", "fp32") == (False, "torch")
    assert a16.choose("auto", "bf16", "fp32") == (True, "one-pass")
    for amp, moments in (("off", "fp32"), ("fp16", "fp32"), ("bf16", "bf16")):
        one_pass, why = a16.choose("auto", amp, moments)
        assert not one_pass and "needs amp=bf16 with fp32 moments" in why


def test_the_config_refuses_one_pass_where_it_cannot_apply():
    with pytest.raises(ConfigError, match="cpu_adamw: one-pass needs amp=bf16 and "
                                          "adam_state_dtype=fp32 .*amp=off"):
        RunConfig(method="fo-offload", cpu_adamw="one-pass")
    with pytest.raises(ConfigError, match="cpu_adamw: 'one-pass' does not apply to method=fo"):
        RunConfig(method="fo", amp="bf16", cpu_adamw="one-pass")


@pytest.mark.parametrize("stride, ratio, cpu_downcast", [("1000000", 0.0, True),
                                                         ("-2", 0.2, False), ("3", 0.0, True)])
def test_fo_offload_with_either_kernel_ends_in_the_same_bits(stride, ratio, cpu_downcast):
    """Three steps with each kernel from the same start: masters, moments and compute weights
    equal bit for bit, and only the one-pass run keeps bf16 gradients on the host."""
    states = []
    for kernel in ("torch", "one-pass"):
        cfg = RunConfig(model="tiny-opt", method="fo-offload", lr=LR, weight_decay=WD,
                        amp="bf16", update_stride=stride, gpu_resident_ratio=ratio,
                        subgroup_size=6000, cpu_adamw=kernel)
        engine, data = _engine(cfg)
        engine.reschedule(int(stride), ratio, cpu_downcast)
        assert engine.cpu_adamw == kernel
        assert engine.flat.g.dtype == (torch.bfloat16 if kernel == "one-pass" else torch.float32)
        for t in range(3):
            engine.step(data.batch_for_step(t, 4, cfg.seed), t, LR, WD)
        engine.sync()
        f = engine.flat
        states.append([t.clone() for t in (f.p32, f.m, f.v, f.w)])
        engine.close()
    for name, a, b in zip(("p", "m", "v", "w"), *states):
        assert torch.equal(a, b), name


def test_an_unwritable_cache_folder_is_named(monkeypatch, rebuilt, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    a16.library.cache_clear()
    with pytest.raises(a16.BuildError, match="cannot write the kernel's cache folder"):
        a16.library()


def test_a_forked_child_starts_its_own_threads():
    """The pool's threads do not survive a fork: a child that updates starts its own (a child
    that waited for its parent's would hang). The child makes no torch op (torch's own OpenMP
    pool is not fork-safe): it updates shared memory, which the parent checks."""
    import os
    import signal

    gen = torch.Generator().manual_seed(5)
    n, segs, opt = 64 * 4096, [Segment(0, 64 * 4096, True)], AdamW(1e-3, 0.0, 0.9, 0.999, 1e-8)
    state, g = _state(n, gen), _grads(n, gen)
    a16.adamw16(state, g, None, segs, opt, 1, 4)  # the parent's pool is up
    ref = OptState(*(t.clone() for t in state))
    adamw(ref, g.float(), segs, opt, torch.tensor(2.0))
    shared = OptState(*(t.clone().share_memory_() for t in state))
    pid = os.fork()
    if pid == 0:  # the child: done within 20 s, or killed
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(20)
        a16.adamw16(shared, g, None, segs, opt, 2, 4)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert all(torch.equal(x, y) for x, y in zip(ref, shared))
