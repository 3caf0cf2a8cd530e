"""Every engine implements the ``Engine`` protocol: each member, with the protocol's signature,
and the contract's behaviour on a tiny model."""
import inspect

import pytest
import torch

from workbench.calibrate.fo import measure
from workbench.config import ConfigError, RunConfig
from workbench.data.batches import SyntheticData
from workbench.engine import Engine, build_engine
from workbench.engine.events import EventBus
from workbench.engine.methods.fo_offload import FOOffloadEngine
from workbench.engine.methods.fo import FOEngine
from workbench.engine.methods.forward_grad import JVPStep
from workbench.engine.methods.lora_offload import ZOAdapterStep
from workbench.engine.methods.mezo import MeZOEngine
from workbench.engine.methods.streamed import StreamedEngine
from workbench.engine.methods.zo_offload import ZOStreamStep
from workbench.engine.stream.adapters import StreamedAdapters
from workbench.engine.stream.holder import StreamedWeights
from workbench.models.build import build_skeleton

ENGINES = {"mezo": MeZOEngine, "zo-offload": StreamedEngine, "forward-grad": StreamedEngine,
           "fo": FOEngine, "fo-offload": FOOffloadEngine}
#: the streamed methods are one engine class composed of a holder and a rule
COMPOSED = {("zo-offload", "none"): (StreamedWeights, ZOStreamStep),
            ("zo-offload", "lora"): (StreamedAdapters, ZOAdapterStep),
            ("forward-grad", "none"): (StreamedWeights, JVPStep),
            ("forward-grad", "lora"): (StreamedAdapters, JVPStep)}
METHODS = [n for n, v in vars(Engine).items() if callable(v) and not n.startswith("_")]
ATTRIBUTES = list(Engine.__annotations__)


def mismatches(cls) -> list[str]:
    """Members of the protocol that ``cls`` lacks or declares with other parameters (names and
    kinds in order; extra trailing parameters must have defaults)."""
    out = []
    for name in METHODS:
        impl = getattr(cls, name, None)
        if not callable(impl):
            out.append(f"{name}: missing")
            continue
        want = list(inspect.signature(getattr(Engine, name)).parameters.values())
        have = list(inspect.signature(impl).parameters.values())
        if [(p.name, p.kind) for p in have[:len(want)]] != [(p.name, p.kind) for p in want]:
            out.append(f"{name}{inspect.signature(impl)} is not {name}"
                       f"{inspect.signature(getattr(Engine, name))}")
        elif any(p.default is inspect.Parameter.empty for p in have[len(want):]):
            out.append(f"{name}: extra parameters without defaults")
    return out


def test_the_protocol_covers_the_contract():
    assert {"step", "flush", "evaluate", "state_flats", "load_state_flats", "base_flats",
            "group_layouts",
            "snapshot", "restore", "gpu_param_bytes", "close"} == set(METHODS)
    assert {"timer", "bytes_h2d", "bytes_d2h", "reduce", "objective"} == set(ATTRIBUTES)


@pytest.mark.parametrize("cls", dict.fromkeys(ENGINES.values()), ids=lambda c: c.__name__)
def test_engine_class_has_the_protocols_methods(cls):
    assert mismatches(cls) == []


def test_signature_check_can_fail():
    class Wrong(MeZOEngine):
        def step(self, batch, lr, wd):  # no step index
            ...

        def restore(self, snap, strict):  # a parameter the recipe never passes
            ...

    assert len(mismatches(Wrong)) == 2
    assert mismatches(object) == [f"{name}: missing" for name in METHODS]


@pytest.mark.parametrize("peft", ["none", "lora"])
@pytest.mark.parametrize("method", ENGINES)
def test_built_engine_keeps_the_contract(method, peft):
    cfg = RunConfig(model="tiny-opt", method=method, peft=peft)
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus(), measure=measure)
    try:
        assert type(engine) is ENGINES[method]
        if (method, peft) in COMPOSED:  # a holder plus a rule, neither inheriting the other
            holder, rule = COMPOSED[method, peft]
            assert (type(engine.weights), type(engine.rule)) == (holder, rule)
            assert {c.__mro__[1] for c in (StreamedEngine, holder, rule)} == {object}
        assert isinstance(engine, Engine)
        assert engine.reduce is None and (engine.bytes_h2d, engine.bytes_d2h) == (0, 0)
        layouts = engine.group_layouts()
        flats = [f.detach().clone() for f in engine.state_flats()]
        assert [f.numel() for f in flats] == [lay.numel for lay in layouts]
        names = [lay.name for lay in layouts]
        if peft == "lora":  # one adapter group per block; the base is frozen apart
            assert names == [f"block.{i}.lora" for i in range(4)]
            assert len(engine.base_flats()) == 6
        else:
            assert names[::len(layouts) - 1] == ["embed", "head"] and not engine.base_flats()
        batch = SyntheticData(model.config.vocab_size, 16).batch_for_step(0, 4, 0)
        out = engine.step(batch, 0, cfg.lr, cfg.weight_decay)
        assert out.loss.dim() == 0 and torch.isfinite(out.loss)
        engine.flush()
        metrics = engine.evaluate(SyntheticData(model.config.vocab_size, 16), 4)
        assert set(metrics) == {"accuracy", "loss"} and 0 <= metrics["accuracy"] <= 1
        engine.load_state_flats(flats)  # back to the start, exactly
        assert all(torch.equal(a, b) for a, b in zip(engine.state_flats(), flats))
        if method in ("fo", "fo-offload"):
            with pytest.raises(ConfigError, match="checkpoint_every"):
                engine.snapshot(1)
        else:
            snap = engine.snapshot(1)()
            engine.restore(snap)
            assert snap.step == 1 and all(torch.equal(a, b)
                                          for a, b in zip(engine.state_flats(), flats))
    finally:
        engine.close()


@pytest.mark.parametrize("method", ["fo", "fo-offload"])
def test_first_order_refuses_checkpoints_before_any_work(method):
    # with the config, so no run directory is claimed (``tests/cli``: through the CLI) ...
    with pytest.raises(ConfigError, match="checkpoint_every: method fo.* AdamW"):
        RunConfig(model="tiny-opt", method=method, checkpoint_every=2)
    # ... and by the engine, were a snapshot asked of it all the same
    cfg = RunConfig(model="tiny-opt", method=method)
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, torch.device("cpu"), EventBus(), measure=measure)
    try:
        with pytest.raises(ConfigError, match="checkpoint_every: method fo.* AdamW"):
            engine.snapshot(1)
    finally:
        engine.close()
