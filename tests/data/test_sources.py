"""Reading sentence<TAB>label files: every malformed file is one line naming file and line."""
from __future__ import annotations

import pytest

from workbench.config import ConfigError, RunConfig
from workbench.data.sources import MAX_LINE, load_examples, read_tsv


@pytest.mark.parametrize("content, line", [
    (b"", "is empty"),
    (b"sentence\tlabel\n", "has a header but no examples"),
    (b"text\ty\nhi\t1\n", "line 1: the header must name the columns sentence and label"),
    (b"sentence\tlabel\nhi\tyes\n", "line 2: label 'yes' is not 0 or 1"),
    (b"sentence\tlabel\nhi\t-1\nho\t2\n", "line 2: label '-1' is not 0 or 1 (and 1 more"),
    (b"sentence\tlabel\nhi\t1\nalone\n", "line 3 has 1 tab-separated field(s), the header 2"),
    (b"sentence\tlabel\nhi\t1\textra\n", "line 2 has 3 tab-separated field(s)"),
    (b"sentence\tlabel\n\xff\xfe\t1\n", "is not UTF-8 text"),
    (b"sentence\tlabel\nhi\x00\t1\n", "line 2 holds NUL bytes"),
    (b"sentence\tlabel\n" + b"a" * (MAX_LINE + 1) + b"\t1\n", "line 2 is 100,003 characters"),
])
def test_malformed_files_are_one_line(tmp_path, content, line):
    (tmp_path / "train.tsv").write_bytes(content)
    with pytest.raises(ConfigError) as err:
        read_tsv(tmp_path / "train.tsv")
    assert len(err.value.problems) == 1 and line in err.value.problems[0]
    assert err.value.problems[0].startswith(f"data: {tmp_path / 'train.tsv'}")


def test_good_files_read_and_a_folder_without_dev_has_no_dev(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\nfine \"quoted\"\t1\n\nbad\t0\n")
    train, dev = load_examples(RunConfig(data=str(tmp_path), train_samples=1))
    assert [(e.sentence, e.label) for e in train] == [('fine "quoted"', 1)] and dev is None
