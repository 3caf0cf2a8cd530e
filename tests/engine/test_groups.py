"""The run's fingerprint (``param_digest``, ``param_norm``) against a reference written here:
hashlib over each group's fp32 bytes cut into pieces, and a torch fp64 norm of everything."""
import hashlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from workbench.engine import groups


def tree_digest(flats: list[torch.Tensor], piece: int) -> str:
    """SHA-256 over the SHA-256 digests of ``piece``-element slices of each group's fp32
    bytes (bytes copied and sliced here: the eager way the engine must agree with)."""
    leaves = []
    for flat in flats:
        data = flat.detach().float().contiguous().numpy().tobytes()
        leaves += [hashlib.sha256(data[i:i + 4 * piece]).digest()
                   for i in range(0, len(data), 4 * piece)]
    return hashlib.sha256(b"".join(leaves)).hexdigest()


def fp64_norm(flats: list[torch.Tensor]) -> float:
    return float(torch.cat([f.detach().float().reshape(-1) for f in flats]).double().square().sum()) ** 0.5


def some_groups(seed: int = 0) -> list[torch.Tensor]:
    """Groups of 0, 1, 3 pieces and a bit (PIECE patched to 1000), one bf16 (decoded to fp32)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3500, generator=g), torch.randn(0), torch.randn(1000, generator=g),
            torch.randn(777, generator=g).bfloat16(), torch.randn(2, 50, generator=g)]


def test_digest_is_defined_over_64_mib_pieces():
    """At the real piece size (a group one piece and a bit long, and a short one): the digest
    is the tree of piece hashes, not the hash of the concatenated bytes."""
    assert groups.PIECE == 1 << 24  # changing it changes every recorded digest
    flats = [torch.randn(groups.PIECE + 3), torch.randn(5)]
    found, norm = groups.fingerprint(flats, threads=2)
    assert found == tree_digest(flats, 1 << 24)
    assert found != hashlib.sha256(b"".join(f.numpy().tobytes() for f in flats)).hexdigest()
    assert norm == pytest.approx(fp64_norm(flats), rel=1e-13)


def test_digest_and_norm_do_not_depend_on_the_thread_count(monkeypatch):
    monkeypatch.setattr(groups, "PIECE", 1000)
    flats = some_groups()
    want = tree_digest(flats, 1000)
    found = {groups.fingerprint(flats, threads=t) for t in (1, 2, 3, 8)}
    assert len(found) == 1  # digest and norm, bit for bit: partial sums added in piece order
    (digest, norm), = found
    assert digest == want == groups.digest(flats, threads=5)
    assert norm == pytest.approx(fp64_norm(flats), rel=1e-13) and norm == groups.norm(flats)


def test_equal_weights_equal_digest_one_changed_element_changes_it(monkeypatch):
    monkeypatch.setattr(groups, "PIECE", 1000)
    a, b = some_groups(seed=7), some_groups(seed=7)
    assert groups.digest(a, threads=3) == groups.digest(b, threads=2)
    b[0][2500] = torch.nextafter(b[0][2500], torch.tensor(float("inf")))  # one ulp, 3rd piece
    assert groups.digest(a, threads=3) != groups.digest(b, threads=3) == tree_digest(b, 1000)
    # the same bytes cut into other groups are other parameters: the digest says so
    merged = [torch.cat([a[0], a[2]])] + a[3:]
    assert groups.digest(merged) != groups.digest(a[:1] + a[2:])



class SliceReader:
    """A ``PieceReader`` over a tensor (reads counted), standing in for a frozen block."""

    def __init__(self, flat: torch.Tensor):
        self.flat, self.numel, self.reads = flat.float(), flat.numel(), []

    def read(self, lo: int, hi: int, out: torch.Tensor) -> None:
        self.reads.append((lo, hi))
        out.copy_(self.flat.reshape(-1)[lo:hi])


@pytest.mark.parametrize("threads", [1, 2, 8])
def test_groups_read_piece_by_piece_give_the_same_digest_and_norm(monkeypatch, threads):
    """A LazyFlats whose groups 0 and 2 have readers: those groups are read a piece at a
    time (their tensors never made; buffers reused from group to group) and the fingerprint
    equals the one of the plain tensors, for any thread count."""
    monkeypatch.setattr(groups, "PIECE", 1000)
    flats = some_groups(seed=3)
    readers = {0: SliceReader(flats[0]), 2: SliceReader(flats[2])}
    made = []

    def get(i):
        made.append(i)
        return flats[i]

    lazy = groups.LazyFlats(len(flats), get, readers.get)
    assert groups.fingerprint(lazy, threads=threads) == groups.fingerprint(flats, threads=threads)
    assert made == [1, 3, 4]  # the groups with readers were never decoded whole
    assert groups.digest(lazy) == tree_digest(flats, 1000)
    # each piece read once, by whichever thread took it
    assert sorted(readers[0].reads[:4]) == [(0, 1000), (1000, 2000), (2000, 3000), (3000, 3500)]
    assert all(torch.equal(a, b) for a, b in zip(lazy, flats))  # iterating gives tensors
    assert groups.digest(lazy[2:]) == groups.digest(flats[2:])  # a slice keeps its readers


def test_reading_threads_leave_torch_thread_count_as_it_was(monkeypatch):
    """The reading threads run torch with one thread each (no OpenMP team per thread); after
    the fingerprint this thread and threads started later have the caller's count again."""
    monkeypatch.setattr(groups, "PIECE", 1000)
    flats = some_groups(seed=4)
    seen: list[int] = []

    class CountingReader(SliceReader):
        def read(self, lo, hi, out):
            seen.append(torch.get_num_threads())
            super().read(lo, hi, out)

    before = torch.get_num_threads()
    lazy = groups.LazyFlats(len(flats), flats.__getitem__, lambda i: CountingReader(flats[i]))
    assert groups.fingerprint(lazy, threads=2) == groups.fingerprint(flats, threads=2)
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before
    with ThreadPoolExecutor(1) as pool:  # a new thread starts with the process's count
        assert pool.submit(torch.get_num_threads).result() == before
