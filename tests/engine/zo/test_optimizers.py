"""ZO optimizers with per-weight state (``zo_optimizer=momentum|adam``, ``zo/optim.py``): the
update against torch's own optimizers fed the ZO estimate, zo-offload bit-equal to MeZO with the
state streamed with each block, the settings checked, and the CLI as a user runs it."""
import json

import pytest
import torch

from workbench.config import ConfigError, RunConfig
from workbench.engine.groups import GroupLayout
from workbench.engine.zo.optim import new_state
from workbench.engine.zo.perturb import PendingUpdate, ZOOps, query_seeds

from zo_helpers import cli_run, train


def _reference(rule: str, x0: torch.Tensor, n_decay: int, grads: list[torch.Tensor], lr: float,
               wd: float) -> torch.Tensor:
    """torch's single-tensor SGD(momentum=0.9) / AdamW, stepping the weights on ``grads`` in
    turn, with the decayed and undecayed elements as two parameter groups (decoupled decay:
    AdamW's own; SGD's applied as AdamW applies it, before the step)."""
    decay = torch.nn.Parameter(x0[:n_decay].clone())
    rest = torch.nn.Parameter(x0[n_decay:].clone())
    if rule == "adam":
        opt = torch.optim.AdamW([{"params": [decay], "weight_decay": wd},
                                 {"params": [rest], "weight_decay": 0.0}], lr=lr,
                                betas=(0.9, 0.999), eps=1e-8, foreach=False)
    else:
        opt = torch.optim.SGD([decay, rest], lr=lr, momentum=0.9, foreach=False)
    for d in grads:
        decay.grad, rest.grad = d[:n_decay].clone(), d[n_decay:].clone()
        if rule == "momentum":
            with torch.no_grad():
                decay.mul_(1 - lr * wd)
        opt.step()
    return torch.cat([decay.detach(), rest.detach()])


@pytest.mark.parametrize("rule", ["momentum", "adam"])
@pytest.mark.parametrize("q", [1, 3])
def test_the_update_is_torch_optimizer_on_the_zo_estimate(rule, q):
    """Four updates of one group: bit for bit torch's SGD with momentum / AdamW stepping on
    d = sum_j c_j z_j, z regenerated from each step's seeds."""
    ops = ZOOps("philox", torch.device("cpu"))
    layout = GroupLayout("block.1", [], 1000, 600)
    x0 = torch.randn(1000) * 0.02
    x, state = x0.clone(), new_state(rule, 1000, torch.device("cpu"))
    hp = (0.9,) if rule == "momentum" else (0.9, 0.999, 1e-8)
    grads = []
    for t in range(4):
        seed = 17 + t
        g = torch.tensor(0.3 - 0.2 * t) if q == 1 else torch.tensor([0.5, -1.5, 2.0]) * (t + 1)
        ops.update(x, layout, PendingUpdate(seed, g, 1e-3, 0.1, rule, t + 1, hp), state)
        seeds = query_seeds(seed, q)
        grads.append(sum(ops.z(1000, s, layout.gid) * c for s, c in zip(seeds, g.reshape(-1))))
    ref = _reference(rule, x0, 600, grads, 1e-3, 0.1)
    assert torch.equal(x, ref)
    assert not torch.allclose(x, x0, atol=1e-5)
    with pytest.raises(ValueError, match="has no state"):
        ops.update(x, layout, PendingUpdate(1, torch.tensor(1.0), 1e-3, 0.0, rule, 1, hp))
    with pytest.raises(ValueError, match="mirror carries no state"):
        ops.delta(x, layout, PendingUpdate(1, torch.tensor(1.0), 1e-3, 0.0, rule, 1, hp))


@pytest.mark.parametrize("variant", [
    dict(zo_optimizer="momentum"),
    dict(zo_optimizer="momentum", resident_blocks=2, fused_update=False),
    dict(zo_optimizer="adam", lr=1e-4, queries=2, reuse_buffers=False),
    dict(zo_optimizer="adam", lr=1e-4, amp="bf16", resident_blocks=1),
    dict(zo_optimizer="adam", lr=1e-4, peft="lora")])
def test_offload_equals_mezo_with_state_streamed(variant):
    """The streamed blocks' state goes up with the block and down before it: zo-offload ends
    with MeZO's losses and weights, bit for bit, and the rule changed the trajectory."""
    offload_only = ("resident_blocks", "fused_update", "reuse_buffers")
    knobs = {"lr": 2e-3, **{k: v for k, v in variant.items() if k not in offload_only}}
    cfg = RunConfig(model="tiny-opt", method="mezo", weight_decay=0.1, **knobs)
    _, ref_digest, ref_losses = train(cfg, steps=4)
    offload = {k: v for k, v in variant.items() if k in offload_only}
    _, d, losses = train(cfg.replace(method="zo-offload", **offload), steps=4)
    assert losses == ref_losses and d == ref_digest
    _, sgd, _ = train(cfg.replace(zo_optimizer="sgd"), steps=4)
    assert sgd != ref_digest


def test_settings_are_checked_in_one_line_each():
    problems = []
    for bad in (dict(method="mezo", momentum=0.5),  # the knob of another rule
                dict(method="zo-offload", zo_optimizer="momentum", adam_beta2=0.99),
                dict(method="zo-offload", zo_optimizer="adam", codec="bf16"),  # mirror master
                dict(method="forward-grad", zo_optimizer="adam"),
                dict(method="fo", momentum=0.5)):
        with pytest.raises(ConfigError) as e:
            RunConfig(**bad)
        problems += e.value.problems
    assert any(p.startswith("momentum: applies only with zo_optimizer=momentum") for p in problems)
    assert any(p.startswith("adam_beta2: applies only with zo_optimizer=adam") for p in problems)
    assert any("the fp32 master's bf16 mirror does not carry" in p for p in problems)
    assert sum("does not apply to method" in p for p in problems) == 2
    assert all("\n" not in p for p in problems)
    RunConfig(method="zo-offload", zo_optimizer="adam", codec="bf16", master="compressed-sr",
              adam_beta1=0.8)  # state stored as bf16, with stochastic rounding


def test_the_cli_trains_adam_on_both_engines_alike(tmp_path):
    """As a user runs it: ``--set zo_optimizer=adam`` on mezo and zo-offload ends with one
    digest, the run records the rule; a mirror master is refused in one line before any work."""
    def cli(out, *sets):
        return cli_run(out, "steps=4", "zo_optimizer=adam", "lr=1e-4", *sets)

    digests = []
    for method in ("mezo", "zo-offload"):
        r = cli(tmp_path / method, f"method={method}")
        assert r.returncode == 0, r.stderr
        run = json.loads((tmp_path / method / "run.json").read_text())
        assert run["config"]["zo_optimizer"] == "adam"
        digests.append(run["param_digest"])
    assert digests[0] == digests[1]
    r = cli(tmp_path / "bad", "method=zo-offload", "codec=bf16")
    assert r.returncode == 2 and not (tmp_path / "bad" / "run.json").exists()
    assert "zo_optimizer: adam keeps per-weight state" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr
