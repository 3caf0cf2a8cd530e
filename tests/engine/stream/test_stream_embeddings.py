"""stream_embeddings: the embedding and the head stream through the block slots (CPU here; the
same on CUDA with three streams in test_stream_embeddings_gpu.py). References: MeZO (every
group resident) for the fp32 transfer, the fp32-slot run for compute-dtype slots; block_slots
against the default slot count."""
from __future__ import annotations

import pytest
import torch

from workbench.config import ConfigError, RunConfig
from workbench.engine import build_engine
from workbench.engine.events import EventBus
from workbench.models.build import build_skeleton
from zo_helpers import BASE, assert_replay_exact, train

#: tiny-llama: an untied head (tiny-opt ties it: refused)
PLAIN = dict(model="tiny-llama", lr=5e-3, weight_decay=0.1)
#: compute-dtype slots whose embedding form holds rows (max(2, 16) x (8 + 1) = 144 < 260)
ROWS = dict(PLAIN, method="zo-offload", codec="bf16", master="compressed-sr", amp="bf16",
            stream_embeddings=True, batch_size=2, seq_len=8, max_new_tokens=1)
#: scheduler knobs against MeZO: (overlap, reuse_buffers, fused_update, resident_blocks,
#: prefetch_depth, block_slots)
KNOBS = {"default": (True, True, True, 0, 1, "auto"), "two-slots": (True, True, True, 0, 1, 2),
         "unfused": (True, True, False, 0, 1, "auto"), "fresh": (True, False, True, 0, 1, "auto"),
         "resident-2": (True, True, True, 2, 1, 2), "depth-2": (False, True, False, 0, 2, 3)}
SLOW_KNOBS = {"all-resident": (True, True, True, 4, 1, "auto"),
              "fresh-unfused": (True, False, False, 2, 2, "auto"),
              "depth-3": (True, True, True, 1, 3, 4)}


@pytest.fixture(scope="module")
def mezo():
    _, digest, losses = train(RunConfig(method="mezo", **PLAIN), steps=6)
    return digest, losses


@pytest.mark.parametrize("knobs", [pytest.param(v, id=k) for k, v in KNOBS.items()] + [
    pytest.param(v, id=k, marks=pytest.mark.slow) for k, v in SLOW_KNOBS.items()])
def test_streamed_embeddings_equal_mezo(mezo, knobs):
    """master=fp32, codec=fp32: losses, g and the final digest equal MeZO's bit for bit, and
    neither the embedding nor the head is on the device outside its visit."""
    overlap, reuse, fused, resident, depth, slots = knobs
    cfg = RunConfig(method="zo-offload", stream_embeddings=True, overlap=overlap,
                    reuse_buffers=reuse, fused_update=fused, resident_blocks=resident,
                    prefetch_depth=depth, block_slots=slots, **PLAIN)
    engine, digest, losses = train(cfg, steps=6)
    assert (digest, losses) == mezo
    s = engine.streamer
    assert s.streamed[0] == 0 and s.streamed[-1] == s.n_blocks + 1
    assert s.n_slots == (depth + 2 if slots == "auto" else slots)


@pytest.mark.parametrize("variant", [
    pytest.param(dict(), id="rows"), pytest.param(dict(seq_len=64), id="whole-table"),
    pytest.param(dict(block_slots=2), id="two-slots"),
    pytest.param(dict(fused_update=False, resident_blocks=1), id="unfused-resident"),
    pytest.param(dict(prefetch_depth=2, reuse_buffers=False), id="depth-2-fresh"),
    pytest.param(dict(master="compressed"), id="nearest"),
    pytest.param(dict(queries=2), id="queries-2", marks=pytest.mark.slow),
    pytest.param(dict(codec="fp16", amp="fp16"), id="fp16", marks=pytest.mark.slow)])
def test_compute_slots_with_streamed_embeddings_equal_fp32_slots(variant):
    """The head in a block's form, the embedding as the fp32 rows the batch looks up (or the
    whole table where it has no more rows than a forward's tokens): bit-equal to fp32 slots."""
    cfg = RunConfig(**{**ROWS, **variant})
    _, d32, out32 = train(cfg.replace(slot_dtype="fp32"), steps=3)
    engine, d16, out16 = train(cfg.replace(slot_dtype="compute"), steps=3)
    assert (d16, out16) == (d32, out32)
    rows = engine.streamer.transfer.rows
    assert rows.whole == (cfg.seq_len == 64)
    assert rows.capacity == (260 if rows.whole else 144)


def _logits_after_steps(cfg: RunConfig, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    from workbench.data.batches import SyntheticData

    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus())
    data = SyntheticData(model.config.vocab_size, 16)
    for t in range(2):
        engine.step(data.batch_for_step(t, 4, cfg.seed), t, cfg.lr, cfg.weight_decay)
    engine.flush()
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=cfg.amp != "off"):
        if cfg.method == "mezo":
            out = engine.adapter.forward(ids, mask)
        else:
            out = engine.streamed_head(engine.streamed_forward(ids, mask))
    engine.close()
    return out


def test_read_only_passes_stream_the_embedding_and_head():
    """Evaluation and generation (``streamed_forward``, then ``streamed_head``) see MeZO's
    weights (fp32), and the fp32-slot run's under compute-dtype slots."""
    ids = torch.randint(0, 260, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    ref = _logits_after_steps(RunConfig(method="mezo", **PLAIN), ids, mask)
    got = _logits_after_steps(RunConfig(method="zo-offload", stream_embeddings=True, **PLAIN),
                              ids, mask)
    assert torch.equal(got, ref)
    cfg = RunConfig(**ROWS)
    assert torch.equal(_logits_after_steps(cfg.replace(slot_dtype="compute"), ids, mask),
                       _logits_after_steps(cfg.replace(slot_dtype="fp32"), ids, mask))


def test_a_run_evaluates_as_mezo_does(tmp_path):
    """Through the recipe (embedded data, classify): the dev metrics and digest of a
    streamed-embeddings run are MeZO's."""
    from workbench.recipes.train import run

    common = dict(PLAIN, steps=3, batch_size=4, seq_len=32, eval_samples=16, sample_hz=0.0)
    ref = run(RunConfig(method="mezo", **common), tmp_path / "mezo", progress=False)
    got = run(RunConfig(method="zo-offload", stream_embeddings=True, **common),
              tmp_path / "streamed", progress=False)
    metrics = lambda rec: [{k: v for k, v in e.items() if not k.endswith("_s")}  # noqa: E731
                           for e in rec.evals]
    assert metrics(got) == metrics(ref) and len(ref.evals) == 2  # at the start and the end
    assert got.param_digest == ref.param_digest


@pytest.mark.parametrize("variant", [
    pytest.param(dict(), id="fp32"),
    pytest.param(dict(codec="bf16", master="compressed-sr", amp="bf16", slot_dtype="compute"),
                 id="compute"),
    pytest.param(dict(codec="bf16", resident_blocks=1, block_slots=2), id="mirror"),
    pytest.param(dict(zo_optimizer="momentum"), id="momentum")])
def test_replay_and_resume_are_exact(variant, tmp_path):
    """The checkpoint replay streams the embedding and head through the run's transfer, and a
    resumed run ends with the straight run's digest."""
    from workbench.recipes.train import run

    cfg = RunConfig(**{**BASE, "model": "tiny-llama", "method": "zo-offload",
                       "stream_embeddings": True, **variant})
    assert_replay_exact(cfg, tmp_path / "replay")
    straight = run(cfg.replace(steps=8), tmp_path / "straight", progress=False)
    run(cfg.replace(steps=4, checkpoint_every=2), tmp_path / "resumed", progress=False)
    resumed = run(cfg.replace(steps=8, checkpoint_every=2), tmp_path / "resumed",
                  progress=False, resume=True)
    assert resumed.param_digest == straight.param_digest


@pytest.mark.parametrize("transfer, default", [
    pytest.param(dict(), 3, id="plain"), pytest.param(dict(codec="bf16"), 3, id="mirror"),
    pytest.param(dict(codec="bf16", master="compressed-sr"), 2, id="sr"),
    pytest.param(dict(codec="bf16", master="compressed-sr", amp="bf16", slot_dtype="compute"),
                 3, id="compute"),
    pytest.param(dict(method="forward-grad", codec="bf16", master="compressed-sr"), 2,
                 id="forward-grad-sr"),
    pytest.param(dict(peft="lora", base_codec="int8"), 2, id="frozen-base")])
def test_two_block_slots_train_as_the_default_count(transfer, default):
    """block_slots=2 (an upload waits for its slot's last offload) ends as the default number
    of slots does, for each transfer."""
    cfg = RunConfig(**{**PLAIN, "method": "zo-offload", **transfer})
    ref_engine, d, out = train(cfg, steps=4)
    engine, d2, out2 = train(cfg.replace(block_slots=2), steps=4)
    assert (d2, out2) == (d, out)
    assert (ref_engine.streamer.n_slots, engine.streamer.n_slots) == (default, 2)


def test_refusals_name_the_setting_in_one_line():
    with pytest.raises(ConfigError) as err:
        RunConfig(method="zo-offload", model="tiny-opt", stream_embeddings=True)
    assert err.value.problems == ["stream_embeddings: tiny-opt ties its LM head to the "
                                  "embedding (one weight in two groups); use "
                                  "stream_embeddings=false"]
    with pytest.raises(ConfigError, match=r"^stream_embeddings: True does not apply to "
                                          r"method=mezo \(only to zo-offload\)"):
        RunConfig(method="mezo", stream_embeddings=True)
    with pytest.raises(ConfigError) as err:
        RunConfig(method="zo-offload", model="tiny-llama", stream_embeddings=True, peft="lora")
    assert [p.split(":")[0] for p in err.value.problems] == ["stream_embeddings"]
    with pytest.raises(ConfigError) as err:
        RunConfig(method="zo-offload", prefetch_depth=2, block_slots=2)
    assert err.value.problems == ["block_slots: 2 is below the 3 a correct schedule needs "
                                  "(prefetch_depth=2 blocks ahead + the one computing); use "
                                  "auto or more"]
    cfg = RunConfig(method="zo-offload", model="tiny:opt", stream_embeddings=True)
    model, source = build_skeleton(cfg.model)  # not a preset: the engine finds the tie
    with pytest.raises(ValueError, match="^stream_embeddings: this model ties its LM head"):
        build_engine(model, source, cfg, torch.device("cpu"), EventBus())


def test_generation_streams_the_head_for_every_token(tmp_path):
    """A completion eval (greedy generation: a streamed forward, then the streamed head, per
    token): MeZO's metrics with codec=fp32, the fp32-slot run's under compute-dtype slots."""
    import json

    from workbench.recipes.train import run

    data = tmp_path / "qa.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"Count {i} and", "completion": f" {i + 1}"})
                              for i in range(40)))
    common = dict(PLAIN, objective="completion", data=str(data), steps=1, batch_size=2,
                  seq_len=8, max_new_tokens=2, eval_samples=4, sample_hz=0.0, save_final=False)
    metrics = lambda rec: [{k: v for k, v in e.items() if not k.endswith("_s")}  # noqa: E731
                           for e in rec.evals]
    runs = {name: run(RunConfig(**{**common, **knobs}), tmp_path / name, progress=False)
            for name, knobs in {
                "mezo": dict(method="mezo"),
                "streamed": dict(method="zo-offload", stream_embeddings=True),
                "fp32-slots": dict(ROWS, slot_dtype="fp32", max_new_tokens=2),
                "compute-slots": dict(ROWS, slot_dtype="compute", max_new_tokens=2)}.items()}
    assert metrics(runs["streamed"]) == metrics(runs["mezo"])
    assert metrics(runs["compute-slots"]) == metrics(runs["fp32-slots"])
    assert "exact_match" in runs["mezo"].evals[-1]["metrics"]
    assert runs["compute-slots"].config["max_new_tokens"] == 2  # 16 x 10 rows < 260: row form
