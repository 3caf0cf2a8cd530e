import math

import torch

from workbench.engine import philox
from workbench.engine.perturb import ZOOps


def test_philox_known_answer():
    # Random123's Philox4x32-10 test vector: counter 0, key 0.
    words = philox.philox4x32(torch.tensor([0]), 0, 0)
    assert [int(w) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def test_mulhilo_exact():
    a = torch.randint(0, 2**32, (5000,), dtype=torch.int64, generator=torch.Generator().manual_seed(0))
    for m in (philox.PHILOX_M0, philox.PHILOX_M1):
        hi, lo = philox._mulhilo(a, m)
        assert [(h << 32) | l for h, l in zip(hi.tolist(), lo.tolist())] == [x * m for x in a.tolist()]


def test_normals_are_standard_and_keyed():
    z = philox.normals(400_001, seed=7, gid=11)
    assert z.shape == (400_001,) and torch.isfinite(z).all()
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    assert not torch.equal(z[:1000], philox.normals(1000, seed=8, gid=11))
    assert not torch.equal(z[:1000], philox.normals(1000, seed=7, gid=12))


def test_element_value_independent_of_group_length():
    # Element e depends on (seed, gid, e) and the group length only through Q = ceil(n/4).
    z = philox.normals(4000, 3, 5)
    q = 1000
    assert torch.equal(z[:q], philox.normals(4000, 3, 5)[:q])
    assert torch.allclose(z[1:2], torch.tensor([philox.normals(4000, 3, 5)[1].item()]))


def test_box_muller_tail_is_bounded():
    z = philox.normals(1 << 20, 1, 1)
    # u >= 2^-24 bounds |z| by sqrt(2 ln 2^24) ~ 5.77
    assert float(z.abs().max()) <= math.sqrt(2 * 24 * math.log(2)) + 1e-4


def test_torch_rng_choice_is_deterministic():
    ops = ZOOps("torch", torch.device("cpu"))
    assert torch.equal(ops.z(100, 1, 2), ops.z(100, 1, 2))
    assert not torch.equal(ops.z(100, 1, 2), ops.z(100, 2, 2))
