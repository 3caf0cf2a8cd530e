import torch

from workbench.data.batches import LABEL_WORDS, PromptDataset, SyntheticData, label_token_ids
from workbench.data.sources import load_split
from workbench.models.tokenizer import ByteTokenizer, load_tokenizer


def test_sst2_loader_reads_shared_data(data_dir):
    train = load_split("sst2", "train", data_dir)
    dev = load_split("sst2", "dev", data_dir)
    assert len(train) == 67349 and len(dev) == 872
    assert {e.label for e in dev} == {0, 1}
    assert all(e.text for e in dev)


def test_prompt_format_with_opt_tokenizer(data_dir):
    tok = load_tokenizer("opt-125m", data_dir)
    assert tok.encode("Hello world!") == [2, 31414, 232, 328]
    prefix, ids = label_token_ids(tok)
    assert prefix == [] and ids == [tok.encode_plain(w)[0] for w in LABEL_WORDS]
    ds = PromptDataset(load_split("sst2", "dev", data_dir)[:4], tok, 64)
    text = tok.tok.decode(ds.ids[0])
    assert text.endswith(" It was") and text.startswith("</s>")
    batch = ds.collate([0, 1, 2, 3])
    last = batch.attention_mask.sum(1) - 1
    assert all(batch.input_ids[r, last[r]] == tok.encode_plain(" was")[0] for r in range(4))


def test_embedded_default_and_byte_tokenizer():
    tok = ByteTokenizer()
    prefix, ids = label_token_ids(tok)
    assert prefix == [ord(" ") + 4] and ids == [ord("t") + 4, ord("g") + 4]
    train = load_split("embedded", "train", None)
    assert len(train) >= 200 and {e.label for e in train} == {0, 1}
    ds = PromptDataset(train, tok, 32)
    assert max(len(i) for i in ds.ids) <= 32
    assert all(i[0] == tok.bos_id and i[-1] == prefix[0] for i in ds.ids)


def test_batches_are_a_function_of_seed_and_step():
    ds = PromptDataset(load_split("embedded", "train", None), ByteTokenizer(), 48)
    a, b = ds.batch_for_step(3, 8, seed=5), ds.batch_for_step(3, 8, seed=5)
    c = ds.batch_for_step(4, 8, seed=5)
    assert torch.equal(a.input_ids, b.input_ids) and not torch.equal(a.input_ids, c.input_ids)
    # one epoch visits every example once
    n = len(ds)
    seen = [tuple(ds.batch_for_step(s, 1, 5).input_ids[0].tolist()) for s in range(n)]
    assert sorted(seen) == sorted(tuple(i) for i in ds.ids)


def test_synthetic_batches():
    data = SyntheticData(vocab=1000, seq_len=32)
    b = data.batch_for_step(0, 4, 0)
    assert b.input_ids.shape == (4, 32) and b.tokens == 128
