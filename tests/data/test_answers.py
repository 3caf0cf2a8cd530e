"""Exact match / token F1, and completion eval scores the model's own greedy answers as perfect."""
import math

import pytest

from workbench.data.answers import exact_match, normalize, token_f1
from workbench.data.fields import Pair
from workbench.data.objectives import Completion
from workbench.data.sequences import CompletionData
from workbench.models.adapter import BlockAdapter
from workbench.models.generate import adapter_forward
from workbench.models.tokenizer import ByteTokenizer


def test_squad_style_normalisation():
    assert normalize("  The Cat, sat!  ") == "cat sat"
    assert exact_match(" Paris.", "paris") == 1.0 and exact_match("Paris", "Rome") == 0.0
    assert token_f1("the red big house", "a big red barn") == pytest.approx(2 * (2 / 3) * (2 / 3) / (4 / 3))
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0 and token_f1("a b", "c") == 0.0


def test_completion_eval_of_answers_the_model_itself_gives(tiny_model):
    model = tiny_model("tiny-llama")
    adapter, tok = BlockAdapter(model), ByteTokenizer()
    forward = adapter_forward(adapter)
    prompts = ["Q: one", "Q: two two", "Q: three"]
    objective = Completion(tok, max_new_tokens=5)
    data = CompletionData([Pair(p, "") for p in prompts], tok, 32)
    answers = objective.decode(data.prompts, forward, adapter.head, "cpu", 2)
    assert any(normalize(a) for a in answers)  # real words to match, not only punctuation
    right = CompletionData([Pair(p, a) for p, a in zip(prompts, answers)], tok, 32)
    got = objective.evaluate(right, forward, adapter.head, "cpu", 2)
    assert got["exact_match"] == 1.0 and got["token_f1"] == 1.0
    assert math.isclose(got["perplexity"], math.exp(got["loss"]))
    wrong = CompletionData([Pair(p, " zzz qqq") for p in prompts], tok, 32)
    assert objective.evaluate(wrong, forward, adapter.head, "cpu", 2)["exact_match"] == 0.0
