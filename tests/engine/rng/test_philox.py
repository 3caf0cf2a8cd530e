import math

import pytest
import torch

from workbench.engine.rng import philox
from workbench.engine.zo.perturb import ZOOps


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


@pytest.mark.parametrize("n", [1, 7, 4000, 4003])
def test_element_is_box_muller_of_its_counters_words(n):
    """What z depends on: element e of a group of n elements is lane e // Q of counter e % Q,
    Q = ceil(n / 4), under the key (seed, group id); lanes 0 and 1 are Box-Muller's cos and
    sin of the counter's words 0 and 1, lanes 2 and 3 of words 2 and 3. Checked in float64 on
    the raw Philox words (themselves checked against Random123 above)."""
    seed, gid = 3, 5
    z = philox.normals(n, seed, gid)
    q = (n + 3) // 4
    for e in sorted({0, q - 1, q % n, (q + 1) % n, 2 * q % n, 3 * q % n, n // 2, n - 1}):
        counter, lane = e % q, e // q
        words = [int(w) for w in philox.philox4x32(torch.tensor([counter]), seed, gid)]
        u1, u2 = (((words[2 * (lane // 2) + i] >> 9) * 2 + 1) * 2.0 ** -24 for i in (0, 1))
        r, theta = math.sqrt(-2 * math.log(u1)), 2 * math.pi * u2
        expected = r * (math.cos(theta) if lane % 2 == 0 else math.sin(theta))
        assert abs(float(z[e]) - expected) <= 2e-6 * max(1.0, abs(expected)), (e, lane)


def test_group_length_enters_only_through_q():
    q1000 = philox.normals(4000, 3, 5)
    assert torch.equal(q1000[:3997], philox.normals(3997, 3, 5))  # also Q = 1000: same z
    q1001 = philox.normals(4004, 3, 5)
    assert torch.equal(q1000[:1000], q1001[:1000])  # lane 0: counter e under either Q
    assert (q1000[1000:] != q1001[1000:4000]).float().mean() > 0.99  # other lanes: moved


def test_box_muller_tail_is_bounded():
    z = philox.normals(1 << 20, 1, 1)
    # u >= 2^-24 bounds |z| by sqrt(2 ln 2^24) ~ 5.77
    assert float(z.abs().max()) <= math.sqrt(2 * 24 * math.log(2)) + 1e-4


def test_torch_rng_choice_is_deterministic():
    ops = ZOOps("torch", torch.device("cpu"))
    assert torch.equal(ops.z(100, 1, 2), ops.z(100, 1, 2))
    assert not torch.equal(ops.z(100, 1, 2), ops.z(100, 2, 2))
