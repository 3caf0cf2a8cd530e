"""Every streamed host format implements the transfer contract (``stream/transfer.py``): each
member, with the protocol's parameter names and kinds, every parameter annotated; the check is
shown to fail; and the transfers a run builds are instances of it."""
from __future__ import annotations

import inspect
import typing

import pytest
import torch

from workbench.engine.events import EventBus
from workbench.engine.stream.compute_slots import ComputeSlotTransfer
from workbench.engine.stream.frozen_transfer import FrozenTransfer
from workbench.engine.stream.transfer import TrainedTransfer, Transfer
from workbench.engine.stream.transfers import (MirrorTransfer, PlainTransfer, SRTransfer,
                                               make_transfer)
from workbench.engine.timing import OpTimer
from workbench.engine.zo.perturb import ZOOps

TRAINED = [PlainTransfer, SRTransfer, MirrorTransfer, ComputeSlotTransfer]


def members(proto: type) -> list[str]:
    """The protocol's methods and attributes (its own and its bases')."""
    names = {n for c in proto.__mro__ if c not in (object, typing.Protocol, typing.Generic)
             for n, v in vars(c).items() if callable(v) and not n.startswith("_")}
    return sorted(names | {n for c in proto.__mro__ for n in getattr(c, "__annotations__", {})})


def mismatches(cls: type, proto: type) -> list[str]:
    """Members of ``proto`` that ``cls`` lacks, declares with other parameters (names and kinds
    in order; extra trailing ones need defaults), or leaves unannotated."""
    out = []
    for name in members(proto):
        impl = getattr(cls, name, None)
        if impl is None:
            out.append(f"{name}: missing")
            continue
        want_fn = getattr(proto, name, None)
        if not callable(want_fn) or isinstance(impl, (int, bool, torch.dtype)):
            continue  # an attribute: present is all the protocol asks
        want = list(inspect.signature(want_fn).parameters.values())
        have = list(inspect.signature(impl).parameters.values())
        if [(p.name, p.kind) for p in have[:len(want)]] != [(p.name, p.kind) for p in want]:
            out.append(f"{name}{inspect.signature(impl)} is not {name}"
                       f"{inspect.signature(want_fn)}")
        elif any(p.default is inspect.Parameter.empty for p in have[len(want):]):
            out.append(f"{name}: extra parameters without defaults")
        untyped = [p.name for p in have[1:] if p.annotation is inspect.Parameter.empty]
        if untyped:
            out.append(f"{name}: parameters without a type: {untyped}")
    return out


@pytest.mark.parametrize("cls", TRAINED, ids=lambda c: c.__name__)
def test_each_trained_transfer_keeps_the_contract(cls):
    assert mismatches(cls, TrainedTransfer) == []


def test_the_frozen_transfer_keeps_the_scheduler_contract():
    assert mismatches(FrozenTransfer, Transfer) == []


def test_the_protocol_covers_what_the_scheduler_and_replay_call():
    assert {"upload", "offload", "before_compute", "slot_buffers", "host_storage", "wait_host",
            "spare_slots", "lazy", "close"} <= set(members(Transfer))
    assert {"store_fp32", "to_fp32", "read_master", "settle", "master_dtype"} \
        <= set(members(TrainedTransfer)) - set(members(Transfer))


def test_the_check_can_fail():
    class Wrong(PlainTransfer):
        def upload(self, host, slot, step, block, stream) -> int:  # no extra; untyped
            return 0

    class Missing:
        spare_slots, lazy = 1, False

    found = mismatches(Wrong, TrainedTransfer)
    assert len(found) == 2 and found[0].startswith("upload(") and "without a type" in found[1]
    assert "host_storage: missing" in mismatches(Missing, Transfer)

    class Untyped(PlainTransfer):
        def wait_host(self, block) -> None:
            pass

    assert mismatches(Untyped, TrainedTransfer) == ["wait_host: parameters without a type: "
                                                    "['block']"]


@pytest.mark.parametrize("master,codec", [("fp32", "fp32"), ("compressed-sr", "bf16"),
                                          ("fp32", "bf16")])
def test_built_transfers_are_instances(master, codec):
    device = torch.device("cpu")
    t = make_transfer(master, codec, device, OpTimer(device, EventBus(), enabled=False),
                      ZOOps("torch", device))
    try:
        assert isinstance(t, TrainedTransfer) and isinstance(t, Transfer)
    finally:
        t.close()
