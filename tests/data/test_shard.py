"""A rank's share of the dev set under data parallel (``data/shard.py::DevShare``): the shares
cover every example once, and each objective's metrics from the shares' sums, added up as the
eval's all-reduce adds them, are the whole set's: the token-weighted loss, exact match and F1
over all examples (not a mean of the ranks' means), also when a rank has no examples."""
import math

import pytest

from workbench.data.classify import ClassifyData
from workbench.data.fields import Example, Pair
from workbench.data.objectives import LM, Classify, Completion
from workbench.data.sequences import CompletionData, PackedText
from workbench.data.shard import DevShare
from workbench.models.adapter import BlockAdapter
from workbench.models.generate import adapter_forward
from workbench.models.tokenizer import ByteTokenizer

TEXTS = ["a calm sea", "rain all night, then sun", "the bread was too salty", "x", "ok"]
PROMPTS = ["Q: one", "Q: two two", "Q: three", "Q: four", "Q: five five five"]
WORLDS = (2, 3, 7)  # 5 examples: uneven shares; 7 ranks: two of them have none


def _ranks(objective, dev, forward, head, world: int) -> list[dict[str, float]]:
    """Every rank's metrics when ``world`` ranks share ``dev``: each rank's sums go to a
    stand-in all-reduce, which hands every rank the sums over all ranks."""
    parts: list[list[float]] = []
    for rank in range(world):
        objective.evaluate(DevShare(dev, rank, world), forward, head, "cpu", 2,
                           total=lambda v: parts.append(v) or v)
    summed = [sum(x) for x in zip(*parts)]
    return [objective.evaluate(DevShare(dev, rank, world), forward, head, "cpu", 2,
                               total=lambda v: summed) for rank in range(world)]


def _same(got: dict[str, float], want: dict[str, float]) -> None:
    assert set(got) == set(want)
    for key in want:  # other batches, other padding: the token losses differ by float noise
        assert math.isclose(got[key], want[key], rel_tol=1e-6), (key, got, want)


@pytest.fixture(scope="module")
def llama(tiny_model):
    adapter = BlockAdapter(tiny_model("tiny-llama"))
    return adapter_forward(adapter), adapter.head


def test_shares_cover_every_example_once_in_order():
    for n in (0, 1, 5, 8):
        for world in (1, 2, 3, 7):
            shares = [DevShare(range(n), rank, world) for rank in range(world)]
            assert [i for s in shares for i in range(s.lo, s.hi)] == list(range(n))
            assert max(map(len, shares)) - min(map(len, shares)) <= 1


@pytest.mark.parametrize("words", [" bad, good", " awful, so-so, lovely"])
def test_classify_from_shares_equals_the_whole_set(llama, words):
    forward, head = llama
    dev = ClassifyData([Example(t, i % 2) for i, t in enumerate(TEXTS)], ByteTokenizer(), 64,
                       "Review: {text}. Verdict:", words)
    whole = Classify().evaluate(dev, forward, head, "cpu", 2)
    for world in WORLDS:
        for got in _ranks(Classify(), dev, forward, head, world):
            _same(got, whole)


def test_lm_from_shares_is_the_token_weighted_loss(llama):
    forward, head = llama
    dev = PackedText(TEXTS * 3, ByteTokenizer(), 16)
    assert len(dev) % 2 and len({len(s) for s in dev.seqs}) > 1  # odd rows, one shorter
    whole = LM().evaluate(dev, forward, head, "cpu", 2)
    means = [LM().evaluate(DevShare(dev, rank, 2), forward, head, "cpu", 2)["loss"]
             for rank in range(2)]
    assert abs(sum(means) / 2 - whole["loss"]) > 1e-4  # a mean of the ranks' means is wrong
    for world in WORLDS:
        for got in _ranks(LM(), dev, forward, head, world):
            _same(got, whole)


def test_completion_from_shares_counts_every_answer(llama):
    forward, head = llama
    tok = ByteTokenizer()
    objective = Completion(tok, max_new_tokens=5)
    asked = CompletionData([Pair(p, "") for p in PROMPTS], tok, 32)
    answers = objective.decode(asked.prompts, forward, head, "cpu", 2)
    # The model's own answer for examples 0, 2 and 4, a wrong one for 1 and 3: with 2 ranks the
    # shares score 1/2 and 2/3, whose mean is not the 3/5 of the whole set.
    refs = [a if i % 2 == 0 else " zzz qqq" for i, a in enumerate(answers)]
    dev = CompletionData([Pair(p, r) for p, r in zip(PROMPTS, refs)], tok, 32)
    whole = objective.evaluate(dev, forward, head, "cpu", 2)
    assert whole["exact_match"] == pytest.approx(3 / 5) and whole["token_f1"] >= 3 / 5
    for world in WORLDS:
        for got in _ranks(objective, dev, forward, head, world):
            _same(got, whole)
