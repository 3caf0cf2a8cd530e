"""First-order engines: fo-offload equals torch's AdamW on the same gradients for every schedule,
fo and fo-offload train alike, and the stride model is Equation 1 of Deep Optimizer States.

Tolerance (weights after 5 steps): atol 1e-6 + rtol 1e-5. fo-offload runs torch's fused AdamW
kernel, the reference the single-tensor one (foreach=False); per element they differ only in
rounding (operation order, FMA), a few ulps of p, m, v per step: for |p| <= ~1 a few 1e-7, and a
relative ~1e-6 of the lr-sized (1e-2) Adam step, ~1e-8. Five steps stay well inside the bound,
while the bugs it guards against are orders of magnitude larger: decay applied to a norm weight
(1.0) moves it by lr * wd = 1e-3 per step; a stale or skipped subgroup, a wrong bias correction
or a lost m / v move weights by about lr = 1e-2.
"""
from __future__ import annotations

import math

import pytest
import torch

from workbench.calibrate.fo import measure
from workbench.config import RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine import build_engine
from workbench.engine.events import EventBus, InfoEvent, OpEvent
from workbench.engine.fo.host import threads_text
from workbench.models.build import build_skeleton
from workbench.plan import placement

ATOL, RTOL, STEPS, LR, WD = 1e-6, 1e-5, 5, 1e-2, 0.1
THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: an OpenMP fork / join costs more than the work, and on a loaded CI machine
    each parallel region can stall for milliseconds. Results do not depend on the thread count
    (elementwise kernels); ``test_multithreaded_cpu_side_equals_adamw`` runs with all threads."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(THREADS)


@pytest.fixture
def all_threads(one_thread):
    torch.set_num_threads(THREADS)
    yield


def _engine(cfg: RunConfig, bus: EventBus | None = None):
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device(cfg.device), bus or EventBus(),
                          measure=measure)
    return engine, SyntheticData(model.config.vocab_size, 16)


def _reference(engine, flats0: list[torch.Tensor]):
    """torch.optim.AdamW (foreach=False) over copies of the initial weights, decaying only the
    first n_decay elements of each group, as the engines do."""
    decay, rest, slots = [], [], []
    for lay, flat in zip(engine.flat.layouts, flats0):
        n, k = lay.numel, lay.n_decay
        pair = []
        for lo, hi, bucket in ((0, k, decay), (k, n, rest)):
            t = torch.nn.Parameter(flat[lo:hi].clone()) if hi > lo else None
            if t is not None:
                bucket.append(t)
            pair.append((lo, hi, t))
        slots.append(pair)
    cfg = engine.cfg
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=LR, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                            foreach=False)
    return opt, slots


SCHEDULES = [  # (model, update_stride, gpu_resident_ratio, subgroup_size)
    ("tiny-opt", "1", 0.0, 20000),  # every subgroup prefetched and updated on the "GPU" side
    ("tiny-opt", "2", 0.0, 8192),
    ("tiny-opt", "3", 0.2, 5000),
    ("tiny-opt", "-2", 0.0, 3000),  # more GPU than CPU subgroups
    ("tiny-opt", "auto", 0.5, 7777),
    ("tiny-opt", "2", 1.0, 5000),  # everything resident
    ("tiny-opt", "1000000", 0.0, 40000),  # everything on the CPU (ZeRO-Offload)
    ("tiny-llama", "-3", 0.2, 20000),
    ("tiny-llama", "auto", 0.0, 9000),
]


def _check_against_adamw(cfg: RunConfig, steps: int = STEPS,
                         cpu_downcast: bool | None = None) -> None:
    """``steps`` steps of ``cfg``; torch's AdamW fed the engine's own gradients must end with the
    same weights, and the compute weights must be the (downcast) masters."""
    engine, data = _engine(cfg)
    if cpu_downcast is not None:
        engine.reschedule(cfg.update_stride, cfg.gpu_resident_ratio, cpu_downcast)
    flats0 = [f.clone() for f in engine.state_flats()]
    base0 = [f.clone() for f in engine.base_flats()]  # peft=lora: the frozen base
    opt, slots = _reference(engine, flats0)
    for t in range(steps):
        engine.step(data.batch_for_step(t, 4, cfg.seed).to(cfg.device), t, LR, WD)
        grads = engine.grad_flats()
        assert sum(float(g.norm()) for g in grads) > 0
        for pair, g in zip(slots, grads):
            for lo, hi, p in pair:
                if p is not None:
                    p.grad = g[lo:hi].clone()
        opt.step()
    got = engine.state_flats()
    for pair, flat in zip(slots, got):
        for lo, hi, p in pair:
            if p is not None:
                torch.testing.assert_close(flat[lo:hi], p.detach(), atol=ATOL, rtol=RTOL)
    moved = max(float((f - w0).abs().max()) for f, w0 in zip(got, flats0))
    assert moved > 100 * ATOL  # the weights really trained
    # The weights the next forward reads are the masters: no stale or lost subgroup.
    assert torch.equal(engine.flat.w.cpu(), torch.cat(got).to(engine.flat.wdtype))
    assert len(base0) == (6 if cfg.peft == "lora" else 0)
    assert all(torch.equal(a, b) for a, b in zip(base0, engine.base_flats()))  # never updated
    engine.close()


@pytest.mark.parametrize("model, stride, ratio, size", [
    ("tiny-opt", "2", 0.0, 2000), ("tiny-llama", "-2", 0.25, 3000),
    ("tiny-opt", "1000000", 0.0, 40000)])
def test_lora_offload_equals_adamw_on_the_adapters(model, stride, ratio, size):
    """peft=lora: the subgroups cut the adapters only (their p, m, v on the host), the base
    stays as loaded."""
    _check_against_adamw(RunConfig(model=model, method="fo-offload", peft="lora", lr=LR,
                                   weight_decay=WD, update_stride=stride,
                                   gpu_resident_ratio=ratio, subgroup_size=size))


@pytest.mark.parametrize("model, stride, ratio, size", SCHEDULES)
def test_offload_equals_adamw_on_the_same_gradients(model, stride, ratio, size):
    _check_against_adamw(RunConfig(model=model, method="fo-offload", lr=LR, weight_decay=WD,
                                   update_stride=stride, gpu_resident_ratio=ratio,
                                   subgroup_size=size))


@pytest.mark.parametrize("kernel", ["torch", "one-pass"])
@pytest.mark.parametrize("cpu_downcast", [True, False])
@pytest.mark.parametrize("stride, ratio", [("1000000", 0.0), ("-2", 0.2)])
def test_bf16_offload_equals_adamw_for_both_downcast_sites(stride, ratio, cpu_downcast, kernel):
    # bf16 compute weights, downcast on the CPU before the upload or on the "GPU" after it,
    # with either CPU AdamW kernel.
    _check_against_adamw(RunConfig(model="tiny-opt", method="fo-offload", lr=LR, weight_decay=WD,
                                   amp="bf16", update_stride=stride, gpu_resident_ratio=ratio,
                                   subgroup_size=6000, cpu_adamw=kernel), steps=3,
                         cpu_downcast=cpu_downcast)


@pytest.mark.parametrize("amp, stride, ratio, size", [
    ("off", "1", 0.0, 20000), ("off", "-2", 0.2, 7777), ("bf16", "2", 0.0, 8192)])
def test_subgroups_through_slots_in_pieces_equal_adamw(monkeypatch, amp, stride, ratio, size):
    """GPU-updated subgroups larger than a slot go through the slots in pieces (a ragged last
    piece, decay runs cut at piece edges): the same weights as AdamW, and slots of the piece
    size, not the subgroup's."""
    monkeypatch.setattr(placement, "SLOT_PIECE", 3000)
    cfg = RunConfig(model="tiny-opt", method="fo-offload", lr=LR, weight_decay=WD, amp=amp,
                    update_stride=stride, gpu_resident_ratio=ratio, subgroup_size=size)
    engine, _ = _engine(cfg)
    assert len(engine.gpu.pieces) > 2 * len(engine.placement.schedule.gpu)  # pieces per subgroup
    assert {t.numel() for slot in engine.gpu.slots for t in slot} == {3000}
    engine.close()
    _check_against_adamw(cfg, steps=3)


@pytest.mark.parametrize("amp,kernel", [("off", "auto"), ("bf16", "torch"),
                                         ("bf16", "one-pass")])
def test_gradients_go_down_in_chunks_through_two_staging_buffers(monkeypatch, amp, kernel):
    """Host pieces of a group longer than a chunk: 16-bit ones for torch's CPU AdamW are upcast
    through the two fp32 staging buffers in turn (of at most CHUNK elements); fp32 ones, and
    16-bit ones for the one-pass kernel (into a bf16 host buffer), go down as they are; the
    host gets every gradient exactly (the AdamW equality)."""
    monkeypatch.setattr(placement, "CHUNK", 777)
    cfg = RunConfig(model="tiny-opt", method="fo-offload", lr=LR, weight_decay=WD, amp=amp,
                    update_stride=str(placement.NO_GPU), subgroup_size=20000, cpu_adamw=kernel)
    engine, _ = _engine(cfg)
    assert engine.flat.g.dtype == (torch.bfloat16 if kernel == "one-pass" else torch.float32)
    if kernel == "torch":
        assert [t.numel() for t in engine.grads.upcast] == [777, 777]
    else:
        assert engine.grads.upcast is None
    engine.close()
    _check_against_adamw(cfg, steps=3)


def test_multithreaded_cpu_side_equals_adamw(all_threads):
    _check_against_adamw(RunConfig(model="tiny-opt", method="fo-offload", lr=LR, weight_decay=WD,
                                   update_stride="-2", gpu_resident_ratio=0.2,
                                   subgroup_size=16384, update_threads=THREADS), steps=3)


def _losses(cfg: RunConfig, steps: int = STEPS) -> list[float]:
    """Losses of ``steps`` steps on one repeated batch (so they must fall)."""
    engine, data = _engine(cfg)
    batch = data.batch_for_step(0, 4, cfg.seed)
    out = [float(engine.step(batch, t, cfg.lr, cfg.weight_decay).loss) for t in range(steps)]
    engine.close()
    return out


@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama"])
def test_fo_and_fo_offload_train_alike(model):
    base = RunConfig(model=model, lr=1e-3, weight_decay=WD)
    fo = _losses(base.replace(method="fo"))
    off = _losses(base.replace(method="fo-offload", update_stride="-2", gpu_resident_ratio=0.2,
                               subgroup_size=4096))
    assert off == pytest.approx(fo, rel=RTOL, abs=ATOL)
    assert all(b < a for a, b in zip(fo, fo[1:]))  # it learns


def test_bf16_offload_tracks_fp32():
    # bf16 compute weights round every weight to 8 bits of mantissa: losses agree to ~1%.
    base = RunConfig(model="tiny-opt", method="fo-offload", lr=1e-3, weight_decay=WD,
                     update_stride="2", subgroup_size=4096)
    ref = _losses(base)
    bf16 = _losses(base.replace(amp="bf16"))
    assert bf16 == pytest.approx(ref, rel=2e-2)


def _recorded(cfg: RunConfig, steps: int, cpu_downcast: bool | None = None):
    """``steps`` steps of ``cfg``: (engine, op events, info) as the bus carried them."""
    events, infos = [], {}
    bus = EventBus()
    bus.subscribe(lambda e: events.append(e) if isinstance(e, OpEvent) else
                  infos.__setitem__(e.key, e.value) if isinstance(e, InfoEvent) else None)
    engine, data = _engine(cfg, bus)
    if cpu_downcast is not None:
        engine.reschedule(cfg.update_stride, cfg.gpu_resident_ratio, cpu_downcast)
    for t in range(steps):
        engine.step(data.batch_for_step(t, 4, 0), t, LR, 0.0)
    engine.close()
    return engine, events, infos


@pytest.mark.parametrize("amp, cpu_downcast, piece, kernel", [
    ("off", None, None, "auto"), ("bf16", True, None, "one-pass"), ("bf16", True, None, "torch"),
    ("bf16", False, None, "one-pass"), ("off", None, 6000, "auto")])
def test_timeline_has_every_subgroups_update_once_per_step(monkeypatch, amp, cpu_downcast,
                                                           piece, kernel):
    """Also when a subgroup goes through the slots in pieces: one span per subgroup each. A
    CPU downcast is a span of its own with torch's kernel; the one-pass kernel makes it in its
    update (whose span says so)."""
    if piece:
        monkeypatch.setattr(placement, "SLOT_PIECE", piece)
    cfg = RunConfig(model="tiny-opt", method="fo-offload", update_stride="3", amp=amp,
                    gpu_resident_ratio=0.25, subgroup_size=20000, lr=LR, cpu_adamw=kernel)
    engine, events, infos = _recorded(cfg, 3, cpu_downcast)
    n_sub = engine.flat.groups.count
    r = int(0.25 * n_sub)
    gpu = {i for i in range(n_sub - r) if (i + 1) % 3 == 0}
    resident = set(range(n_sub - r, n_sub))
    cpu = set(range(n_sub)) - gpu - resident
    assert gpu and cpu and resident
    for t in range(3):
        of = lambda op: sorted(e.block for e in events if e.op == op and e.step == t)  # noqa: E731
        # Every subgroup's update exactly once per step, on the side the schedule put it.
        assert sorted(of("cpu-update") + of("gpu-update")) == list(range(n_sub))
        assert of("gpu-update") == sorted(gpu | resident)
        assert of("prefetch") == of("flush-out") == sorted(gpu)
        for op in ("prefetch", "flush-out"):  # a subgroup's span carries all its pieces' bytes
            assert {e.block: e.nbytes for e in events if e.op == op and e.step == t} == {
                j: 12 * engine.flat.groups.numel_of(j) for j in gpu}
        assert of("upload-weights") == sorted(cpu)
        assert of("downcast") == (sorted(cpu) if cpu_downcast and kernel == "torch" else [])
        assert set(of("grad-d2h")) == cpu  # one piece per (group, subgroup) overlap
        assert len(of("gpu-wait")) == 1
        details = {e.detail for e in events if e.op == "cpu-update" and e.step == t}
        one_pass = "one-pass, " if kernel == "one-pass" else ""
        assert details == {one_pass + threads_text(engine.host.threads)}
    assert {e.stream for e in events if e.op == "cpu-update"} == {"cpu"}
    assert infos["fo_stride"] == 3
    assert infos["fo_perf_inputs"]["subgroups"] == n_sub
    assert infos["fo_perf_inputs"]["downcast"] == {None: "none", True: "cpu", False: "gpu"}[
        cpu_downcast]
    assert infos["fo_update_predicted_s"] > 0 and infos["fo_update_measured_s"] > 0


def test_recipe_runs_fo_offload_and_records_the_model():
    from workbench.recipes.train import run

    cfg = RunConfig(model="tiny-opt", method="fo-offload", steps=3, batch_size=4, seq_len=32,
                    eval_samples=16, lr=1e-3, subgroup_size=8192)
    rec = run(cfg, progress=False)
    assert len(rec.steps) == 3 and all(math.isfinite(s["loss"]) for s in rec.steps)
    assert {"fo_stride", "fo_perf_inputs", "fo_update_predicted_s",
            "fo_update_measured_s"} <= set(rec.info)
    assert rec.param_digest


def test_fp16_needs_a_gpu():
    for method in ("fo", "fo-offload"):
        with pytest.raises(ValueError, match="fp16"):
            _engine(RunConfig(model="tiny-opt", method=method, amp="fp16"))


# --- CUDA ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("amp, stride, ratio, cpu_downcast", [
    ("off", "-2", 0.2, None), ("bf16", "2", 0.0, True), ("bf16", "2", 0.0, False),
    ("bf16", "auto", 0.3, None), ("bf16", str(placement.NO_GPU), 0.0, False)])
def test_cuda_offload_equals_adamw(amp, stride, ratio, cpu_downcast):
    _check_against_adamw(RunConfig(model="tiny-llama", method="fo-offload", device="cuda",
                                   amp=amp, lr=LR, weight_decay=WD, update_stride=stride,
                                   gpu_resident_ratio=ratio, subgroup_size=4096),
                         cpu_downcast=cpu_downcast)


@pytest.mark.gpu
@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_cuda_gradients_in_chunks_through_the_staging_buffers_equal_adamw(monkeypatch, amp):
    # Many chunks per group: each upcast into a staging buffer must wait for its last D2H.
    monkeypatch.setattr(placement, "CHUNK", 1000)
    _check_against_adamw(RunConfig(model="tiny-llama", method="fo-offload", device="cuda",
                                   amp=amp, lr=LR, weight_decay=WD, update_stride="3",
                                   subgroup_size=4096))


@pytest.mark.gpu
@pytest.mark.parametrize("amp, codec", [("off", "fp32"), ("bf16", "bf16")])
def test_cuda_lora_offload_equals_adamw(amp, codec):
    _check_against_adamw(RunConfig(model="tiny-llama", method="fo-offload", device="cuda",
                                   peft="lora", base_codec=codec, amp=amp, lr=LR,
                                   weight_decay=WD, update_stride="-2", gpu_resident_ratio=0.25,
                                   subgroup_size=1024))


@pytest.mark.gpu
def test_cuda_fo_matches_fo_offload():
    base = RunConfig(model="tiny-opt", device="cuda", lr=1e-3, weight_decay=WD)
    fo = _losses_cuda(base.replace(method="fo"))
    off = _losses_cuda(base.replace(method="fo-offload", update_stride="-2", subgroup_size=4096))
    assert off == pytest.approx(fo, rel=1e-4, abs=1e-5)  # TF32 / kernel choice may differ


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fo", "fo-offload"])
def test_cuda_fp16_loss_scaling_trains(method):
    offload = {"update_stride": "-2", "subgroup_size": 4096} if method == "fo-offload" else {}
    base = RunConfig(model="tiny-opt", method=method, device="cuda", lr=1e-3, weight_decay=WD,
                     **offload)
    ref = _losses_cuda(base)
    fp16 = _losses_cuda(base.replace(amp="fp16"))
    assert all(math.isfinite(x) for x in fp16)
    assert fp16 == pytest.approx(ref, rel=2e-2)  # fp16 activations: ~1e-3 relative per op


def _losses_cuda(cfg: RunConfig) -> list[float]:
    engine, data = _engine(cfg)
    batch = data.batch_for_step(0, 4, cfg.seed).to("cuda")
    out = [engine.step(batch, t, cfg.lr, cfg.weight_decay).loss for t in range(STEPS)]
    engine.close()
    return [float(x) for x in out]


@pytest.mark.gpu
@pytest.mark.parametrize("stride, limit", [(str(placement.NO_GPU), 4.0), ("auto", 8.0)])
def test_cuda_adam_state_stays_on_the_host(stride, limit):
    # opt-125m: 125M parameters; resident Adam (fp32 p, g, m, v) would be 16 bytes each, 2 GB.
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    cfg = RunConfig(model="opt-125m", method="fo-offload", device="cuda", amp="bf16", lr=1e-5,
                    update_stride=stride, subgroup_size=2_000_000)
    engine, data = _engine(cfg)
    for t in range(2):
        engine.step(data.batch_for_step(t, 2, 0).to("cuda"), t, 1e-5, 0.0)
    torch.cuda.synchronize()
    per_param = (torch.cuda.memory_allocated() - base) / engine.flat.numel
    assert per_param < limit, f"{per_param:.2f} bytes / parameter on the GPU"
    assert engine.gpu_param_bytes() < limit * engine.flat.numel
    engine.close()
