"""Several perturbations per step (``queries``), the one-sided estimator (``estimator``) and
the sign rule (``zo_optimizer``): the estimates against an independent computation, the
updates' arithmetic, zo-offload bit-equal to MeZO, and a resumed run's step log."""
import json

import pytest
import torch

from workbench.config import ConfigError, RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine.events import EventBus
from workbench.engine.groups import GroupLayout
from workbench.engine.methods.mezo import MeZOEngine
from workbench.engine.zo.perturb import PendingUpdate, ZOOps, pending_dict, pending_from_dict, \
    query_seeds
from workbench.engine.zo.step import step_seed
from workbench.models.build import build_skeleton

from zo_helpers import BASE, cli_run, losses_of_copies, train


@pytest.mark.parametrize("estimator", ["central", "one-sided"])
def test_estimates_equal_an_independent_computation(estimator):
    """q = 3: every direction's difference quotient, from losses of deep copies perturbed with
    the engine's z of ``query_seeds``; the one-sided coefficients divided by q and the spread
    of the perturbed losses (FZOO)."""
    eps, q = 1e-2, 3
    cfg = RunConfig(model="tiny-llama", eps=eps, lr=0.0, queries=q, estimator=estimator)
    model, source = build_skeleton(cfg.model)
    engine = MeZOEngine(model, source, cfg, torch.device("cpu"), EventBus())
    batch = SyntheticData(260, 16).batch_for_step(0, 4, 0)
    seeds = query_seeds(step_seed(cfg.seed, 0), q)
    assert seeds[0] == step_seed(cfg.seed, 0) and len(set(seeds)) == q
    theta = [g.flat.clone() for g in engine.groups]
    out = engine.step(batch, 0, 0.0, 0.0)
    if estimator == "central":
        plus = losses_of_copies(engine, model, batch, theta, [(s, +eps) for s in seeds])
        minus = losses_of_copies(engine, model, batch, theta, [(s, -eps) for s in seeds])
        g = (plus - minus) / (2 * eps)
        expected = g / q
        assert abs(float(out.loss_plus) - float(plus.mean())) < 1e-4
    else:
        clean = losses_of_copies(engine, model, batch, theta, [(seeds[0], 0.0)])
        perturbed = losses_of_copies(engine, model, batch, theta, [(s, +eps) for s in seeds])
        g = (perturbed - clean) / eps
        expected = g / (q * perturbed.std())
        assert out.loss_minus is None and abs(float(out.loss) - float(clean)) < 1e-5
    assert (g.abs() > 1e-3).all()  # a real signal in every direction, not 0 == 0
    assert not torch.allclose(g, g[0].expand(q), rtol=1e-2)  # the directions differ
    assert torch.allclose(out.coefs.double(), expected, rtol=2e-3, atol=1e-5)
    assert abs(float(out.projected_grad) - float(g.mean())) <= 2e-3 * max(1.0, float(g.abs().max()))


def test_an_update_of_several_directions_is_their_sequence_and_its_delta_their_sum():
    ops = ZOOps("philox", torch.device("cpu"))
    layout = GroupLayout("block.3", [], 1000, 600)
    gid = layout.gid
    x0 = torch.randn(1000)
    upd = PendingUpdate(91, torch.tensor([0.5, -1.5, 2.0]), 1e-2, 0.1)
    x = x0.clone()
    ops.update(x, layout, upd)
    ref = x0.clone()
    for j, s in enumerate(query_seeds(91, 3)):  # weight decay once, with the first direction
        u = ops.z(1000, s, gid) * float(upd.g[j])
        if j == 0:
            u[:600] += 0.1 * ref[:600]
        ref -= 1e-2 * u
    assert torch.allclose(x, ref, atol=1e-6) and not torch.allclose(x, x0, atol=1e-3)
    d = ops.delta(x0, layout, upd)
    assert torch.allclose(x0 + d, ref, atol=1e-6)
    one = PendingUpdate(91, torch.tensor(0.5), 1e-2, 0.1)  # one direction: unchanged
    assert [(s, float(g), wd) for s, g, wd in one.parts()] == [(91, 0.5, 0.1)]
    for u in (upd, one):  # a checkpoint's and the step log's form, both ways
        back = pending_from_dict(json.loads(json.dumps(pending_dict(u, u.g))), torch.device("cpu"))
        assert back.seed == u.seed and torch.equal(back.g, u.g)


def test_the_sign_rule_steps_by_the_sign_of_the_whole_estimate():
    ops = ZOOps("philox", torch.device("cpu"))
    layout = GroupLayout("block.2", [], 1000, 600)
    x0 = torch.randn(1000) * 0.02
    for g in (torch.tensor(-0.7), torch.tensor([0.5, -1.5, 2.0])):
        upd = PendingUpdate(91, g, 1e-3, 0.1, "sign")
        seeds = query_seeds(91, g.numel())
        est = sum(ops.z(1000, s, layout.gid) * float(c) for s, c in zip(seeds, g.reshape(-1)))
        step = torch.sign(est)
        step[:600] += 0.1 * x0[:600]
        x = x0.clone()
        ops.update(x, layout, upd)
        assert torch.allclose(x, x0 - 1e-3 * step, atol=1e-7)
        moved = (x - x0).abs()[600:]  # undecayed elements move by lr exactly, either way
        assert torch.allclose(moved, torch.full_like(moved, 1e-3), atol=1e-7)
        assert torch.allclose(x0 + ops.delta(x0, layout, upd), x, atol=1e-7)
        back = pending_from_dict(json.loads(json.dumps(pending_dict(upd, g))), torch.device("cpu"))
        assert back.rule == "sign"
    assert pending_from_dict({"seed": 1, "g": 0.5, "lr": 1, "wd": 0}, torch.device("cpu"),
                             "sign").rule == "sign"  # a step-log row takes the run's rule


#: zo-offload's own knobs, which MeZO does not take
OFFLOAD_ONLY = ("resident_blocks", "fused_update")


@pytest.mark.parametrize("variant", [
    dict(queries=2), dict(queries=2, amp="bf16"), dict(queries=3, estimator="one-sided", lr=1e-6),
    dict(queries=3, resident_blocks=2, fused_update=False), dict(queries=2, peft="lora"),
    dict(queries=2, zo_optimizer="sign", lr=1e-4)])
def test_offload_equals_mezo_with_several_queries(variant):
    """Every pass of a block during its one visit (2q hidden states travelling together, the
    tied head's 2q - 1 copies): the same losses and weights as MeZO, bit for bit."""
    knobs = {"lr": 5e-3, **{k: v for k, v in variant.items() if k not in OFFLOAD_ONLY}}
    cfg = RunConfig(model="tiny-opt", method="mezo", weight_decay=0.1, **knobs)
    _, ref_digest, ref_losses = train(cfg, steps=3)
    offload = {k: v for k, v in variant.items() if k in OFFLOAD_ONLY}
    _, d, losses = train(cfg.replace(method="zo-offload", **offload), steps=3)
    assert losses == ref_losses and d == ref_digest
    if variant == dict(queries=2):
        _, one, _ = train(cfg.replace(queries=1), steps=3)
        assert one != ref_digest  # the queries changed the trajectory


def test_tied_head_keeps_a_copy_per_pass_but_the_last():
    from workbench.engine import build_engine

    for q, estimator, copies in ((1, "central", 1), (3, "central", 5), (4, "one-sided", 4)):
        cfg = RunConfig(model="tiny-opt", method="zo-offload", queries=q, estimator=estimator,
                        amp="bf16")
        model, source = build_skeleton(cfg.model)
        engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus())
        try:
            assert len(engine.tied.bufs) == copies
            assert all(b.dtype == torch.bfloat16 for b in engine.tied.bufs)
        finally:
            engine.close()


def test_step_log_keeps_the_coefficients_and_settings_are_checked(tmp_path):
    from workbench.recipes.train import run

    cfg = RunConfig(**BASE, method="zo-offload", queries=3, steps=3, checkpoint_every=2)
    rec = run(cfg, tmp_path / "r", progress=False)
    rows = [json.loads(l) for l in (tmp_path / "r" / "checkpoints" / "steps.jsonl").read_text()
            .splitlines()]
    assert [len(r["g"]) for r in rows] == [3, 3, 3]
    assert [r["g"] for r in rows] != [[r["g"][0]] * 3 for r in rows]
    assert rec.steps[0]["projected_grad"] == pytest.approx(sum(rows[0]["g"]), rel=1e-5)
    problems = []
    for bad in (dict(estimator="one-sided"), dict(method="fo", queries=2),
                dict(method="forward-grad", zo_optimizer="sign"),
                dict(method="forward-grad", estimator="one-sided", queries=2), dict(queries=0)):
        with pytest.raises(ConfigError) as e:
            RunConfig(**bad)
        problems += e.value.problems
    assert any("queries >= 2" in p for p in problems)
    assert sum("does not apply to method" in p for p in problems) >= 3
    assert any("queries: 0 is outside [1, 64]" in p for p in problems)


def test_the_cli_trains_queries_on_both_engines_alike_and_refuses_a_bad_estimator(tmp_path):
    """As a user runs it: ``--set queries=3`` on mezo and zo-offload ends with one digest, the
    run records the knobs, and a one-sided estimator of one query is refused in one line before
    any work."""
    def cli(out, *sets):
        return cli_run(out, "steps=4", "queries=3", "lr=1e-3", *sets)

    digests = []
    for method in ("mezo", "zo-offload"):
        r = cli(tmp_path / method, f"method={method}")
        assert r.returncode == 0, r.stderr
        run = json.loads((tmp_path / method / "run.json").read_text())
        assert run["config"]["queries"] == 3 and run["config"]["estimator"] == "central"
        digests.append(run["param_digest"])
    assert digests[0] == digests[1]
    r = cli(tmp_path / "bad", "method=zo-offload", "estimator=one-sided", "queries=1")
    assert r.returncode == 2 and not (tmp_path / "bad" / "run.json").exists()
    assert "estimator: one-sided divides the step by the spread" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr
