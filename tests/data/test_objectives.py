"""Each objective's loss equals an independent computation from the full Hugging Face forward."""
import math

import pytest
import torch
import torch.nn.functional as F

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.data.classify import ChoiceBatch, ClassifyData
from workbench.data.fields import Example, Pair
from workbench.data.objectives import LM, Classify, Completion
from workbench.data.sequences import CompletionData, PackedText, TokenBatch
from workbench.data.task import build_task
from workbench.models.adapter import BlockAdapter
from workbench.models.generate import adapter_forward
from workbench.models.tokenizer import ByteTokenizer

TEXTS = ["a calm sea", "rain all night, then sun", "the bread was too salty", "x", "ok"]


@pytest.fixture(params=["tiny-opt", "tiny-llama"])
def model(request, tiny_model):
    return tiny_model(request.param)


def _hidden(model, batch):
    return adapter_forward(BlockAdapter(model))(batch.input_ids, batch.attention_mask)


def _head(model):
    return BlockAdapter(model).head


@torch.no_grad()
def test_classify_one_token_words_is_last_position_cross_entropy(model):
    data = ClassifyData([Example(t, i % 3) for i, t in enumerate(TEXTS)], ByteTokenizer(), 64,
                        "Review: {text}. Verdict:", " a, b, c")
    batch = data.collate(list(range(5)))
    assert isinstance(batch, Batch) and batch.label_ids.tolist() == [ord(c) + 4 for c in "abc"]
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    last = batch.attention_mask.sum(1) - 1
    logp = logits[torch.arange(5), last].log_softmax(-1)[:, batch.label_ids]  # prefix " " in prompt
    assert batch.input_ids[0, last[0]] == ord(" ") + 4
    ref = F.cross_entropy(logp, batch.labels)
    loss = Classify().loss(_hidden(model, batch), batch, _head(model))
    assert torch.allclose(loss, ref, atol=1e-6, rtol=0) and loss.dtype == torch.float32


@torch.no_grad()
def test_classify_multi_token_words_sum_their_log_probabilities(model):
    tok = ByteTokenizer()
    data = ClassifyData([Example(t, i % 2) for i, t in enumerate(TEXTS)], tok, 64)
    batch = data.collate([0, 1, 2, 3, 4])
    assert isinstance(batch, ChoiceBatch) and batch.input_ids.shape[0] == 10
    scores = torch.zeros(5, 2)
    for b, text in enumerate(TEXTS):  # one plain forward per (example, word)
        prompt = tok.encode(f"{text} It was") + tok.encode_plain(" ")
        for c, word in enumerate(("terrible", "great")):
            ids = torch.tensor([prompt + tok.encode_plain(word)])
            logp = model(input_ids=ids).logits[0].log_softmax(-1)
            scores[b, c] = sum(logp[len(prompt) - 1 + j, t] for j, t in
                               enumerate(tok.encode_plain(word)))
    ref = F.cross_entropy(scores, batch.labels)
    objective = Classify(chunk=7)
    got = objective.scores(_hidden(model, batch), batch, _head(model))
    assert torch.allclose(got, scores, atol=1e-4, rtol=0)
    assert torch.allclose(objective.loss(_hidden(model, batch), batch, _head(model)), ref, atol=1e-5)


@torch.no_grad()
def test_completion_loss_is_hf_loss_on_completion_tokens_only(model):
    tok = ByteTokenizer()
    pairs = [Pair("Q: 2+2?", " 4"), Pair("The opposite of hot is", " cold"), Pair("hi", " there!")]
    batch = CompletionData(pairs, tok, 64).collate([0, 1, 2])
    labels = torch.full_like(batch.input_ids, -100)
    for r, p in enumerate(pairs):
        start = len(tok.encode(p.prompt))
        n = len(tok.encode_plain(p.completion)) + 1  # and the EOS
        labels[r, start:start + n] = batch.input_ids[r, start:start + n]
    assert (labels[:, :][labels != -100] == batch.target_ids).all()
    ref = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
    loss = Completion(tok, 4, chunk=5).loss(_hidden(model, batch), batch, _head(model))
    assert torch.allclose(loss, ref, atol=1e-6, rtol=0)


@torch.no_grad()
def test_lm_loss_is_hf_loss_on_every_token_of_packed_rows(model):
    tok = ByteTokenizer()
    data = PackedText(TEXTS, tok, 16)
    stream = sum((tok.encode_plain(t) + [tok.eos_id] for t in TEXTS), [])
    packed = [t for s in data.seqs for t in s]
    assert packed == stream[:len(packed)] and {len(s) for s in data.seqs[:-1]} == {16}
    assert len(stream) - len(packed) in (0, 1)  # a last row of one token predicts nothing
    batch = data.collate(list(range(len(data))))
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    ref = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
    loss = LM(chunk=9).loss(_hidden(model, batch), batch, _head(model))
    assert torch.allclose(loss, ref, atol=1e-6, rtol=0)


def test_sst2_defaults_are_todays_batches_and_loss_bit_for_bit(data_dir, tiny_model):
    from workbench.data.batches import PromptDataset
    from workbench.data.sources import load_split
    from workbench.engine.objective import label_loss
    from workbench.models.tokenizer import load_tokenizer

    tok = load_tokenizer("opt-125m", data_dir)
    dev = load_split("sst2", "dev", data_dir)[:40]
    old, new = PromptDataset(dev, tok, 64), ClassifyData(dev, tok, 64)
    batches = [(old.batch_for_step(s, 8, 3), new.batch_for_step(s, 8, 3)) for s in range(6)]
    batches += list(zip(old.eval_batches(16), new.eval_batches(16)))
    for a, b in batches:
        assert isinstance(b, Batch)
        assert all(torch.equal(x, y) for x, y in zip(
            (a.input_ids, a.attention_mask, a.labels, a.label_ids),
            (b.input_ids, b.attention_mask, b.labels, b.label_ids)))
    model = tiny_model("tiny-opt", vocab=50272)  # OPT's vocabulary, tiny blocks
    adapter = BlockAdapter(model)
    with torch.no_grad():
        for a, _ in batches[:3]:
            hidden, ctx = adapter.embed(a)
            for block in adapter.blocks:
                hidden = adapter.run_block(block, hidden, ctx)
            today = label_loss(adapter.head(hidden, ctx), a)
            assert torch.equal(Classify().loss(hidden, a, adapter.head), today)


def test_build_task_for_each_objective_on_embedded_data():
    tok = ByteTokenizer()
    for objective, kind in (("classify", ChoiceBatch), ("completion", TokenBatch),
                            ("lm", TokenBatch)):
        task = build_task(RunConfig(objective=objective, train_samples=50, eval_samples=12), tok, 260)
        batch = task.train.batch_for_step(2, 4, 0)
        assert type(batch) is kind and batch.tokens == int(batch.attention_mask.sum())
        again = task.train.batch_for_step(2, 4, 0)
        assert torch.equal(batch.input_ids, again.input_ids)
        assert len(task.train) <= 50 or objective == "lm"
        if objective != "lm":
            assert len(task.dev) == 12
    task = build_task(RunConfig(objective="lm", data="synthetic", seq_len=32), None, 1000)
    b = task.train.batch_for_step(0, 3, 0)
    assert task.dev is None and b.input_ids.shape == (3, 32) and b.scored == 3 * 31


def test_eval_metrics_of_each_objective(model):
    tok, device = ByteTokenizer(), "cpu"
    forward, head = adapter_forward(BlockAdapter(model)), _head(model)
    cls = ClassifyData([Example(t, i % 2) for i, t in enumerate(TEXTS)], tok, 64)
    got = Classify().evaluate(cls, forward, head, device, 2)
    with torch.no_grad():
        batch = cls.collate(list(range(5)))
        scores = Classify().scores(forward(batch.input_ids, batch.attention_mask), batch, head)
    assert got["accuracy"] == int((scores.argmax(-1) == batch.labels).sum()) / 5
    assert math.isclose(got["loss"], float(F.cross_entropy(scores, batch.labels)), rel_tol=1e-5)
    lm = PackedText(TEXTS, tok, 16)
    got = LM().evaluate(lm, forward, head, device, 3)
    with torch.no_grad():
        batch = lm.collate(list(range(len(lm))))
        full = LM().loss(forward(batch.input_ids, batch.attention_mask), batch, head)
    assert math.isclose(got["loss"], float(full), rel_tol=1e-5)  # token-weighted over batches
    assert math.isclose(got["perplexity"], math.exp(got["loss"]), rel_tol=1e-9)


def test_row_sums_equal_a_per_row_sum_and_never_accumulate_into_one_cell():
    """Each row's values summed (the reference: a Python loop per row); the cells written are
    distinct, so nothing depends on the order CUDA threads arrive in (index_add's atomics did:
    MeZO's digests on an H100 changed from run to run)."""
    from workbench.data.objectives import cell_sums, row_sums

    g = torch.Generator().manual_seed(0)
    rows = torch.tensor([0, 0, 0, 1, 3, 3, 2, 2, 2, 2])  # row 4 has no values: sum 0
    values = torch.randn(len(rows), generator=g, dtype=torch.float64)
    got = row_sums(values, rows, 5)
    # the GPU's path (a cell per value), called directly: it sums the same rows
    assert torch.allclose(cell_sums(values, rows, 5), got, rtol=0, atol=1e-12)
    ref = torch.stack([values[rows == r].sum() for r in range(5)])
    assert torch.allclose(got, ref, rtol=0, atol=1e-12) and got[4] == 0
    assert got.dtype == values.dtype and got.shape == (5,)
    # a row of one value is that value, bit for bit
    assert got[1] == values[3]
    # forward-mode AD (forward-grad's dual tensors) and backward (fo) both pass through
    import torch.autograd.forward_ad as fwAD
    for sums in (row_sums, cell_sums):
        with fwAD.dual_level():
            dual = fwAD.make_dual(values, torch.ones_like(values))
            tangent = fwAD.unpack_dual(sums(dual, rows, 5)).tangent
        assert torch.equal(tangent, torch.tensor([3.0, 1.0, 4.0, 2.0, 0.0], dtype=torch.float64))
        leaf = values.clone().requires_grad_()
        sums(leaf, rows, 5).sum().backward()
        assert torch.equal(leaf.grad, torch.ones_like(values))
