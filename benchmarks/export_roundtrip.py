"""Export time and peak host memory, and the transformers round trip (issue 36).

    python benchmarks/export_roundtrip.py RUN_DIR --out DIR [--dtype bf16] [--device cuda]
                                          [--no-eval]

Exports RUN_DIR with ``export_run`` (timed; the process's resident memory sampled every
0.5 ms by a thread: the peak above where the export started, next to the largest parameter
group's fp32 size and the model's), then, unless ``--no-eval``, loads DIR with ``transformers``
and scores the run's dev split without any workbench code (classify on ``embedded`` or
``sst2``: prompts from the raw dev rows, tokenised by the exported tokenizer (the label words'
shared leading tokens appended), padded on the right, each label word's logit at the row's
last token), next to the run's own final eval.
The run's ``seq_len`` must hold every prompt whole (the workbench cuts long prompts from the
left; this script refuses rather than cut differently). Results: JSON via ``common.save``.
"""
from __future__ import annotations

import argparse
import csv
import math
import threading
import time
from pathlib import Path

# common first: it puts this checkout on sys.path
from common import save

import psutil  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from workbench.config import RunConfig, default_data_dir  # noqa: E402
from workbench.export.exporter import export_run  # noqa: E402
from workbench.telemetry.record import RunRecord  # noqa: E402

MiB = 2 ** 20


def timed_export(run_dir: Path, out: Path, dtype: str | None, device: str) -> dict:
    """Export with the resident memory sampled; seconds and the peak growth in bytes."""
    proc, peak, stop = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.0005)

    base = proc.memory_info().rss
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        res = export_run(run_dir, out, dtype=dtype, device=device, overwrite=True)
    finally:
        stop.set()
        thread.join()
    return {"export_seconds": res.seconds, "kind": res.kind, "step": res.step,
            "origin": res.origin, "dtype": res.dtype, "digest_matches_run": res.matches_run,
            "rss_before_bytes": base, "peak_rss_growth_bytes": max(peak[0] - base, 0),
            "largest_group_fp32_bytes": 4 * max(res.numels),
            "model_fp32_bytes": 4 * sum(res.numels),
            "folder_bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file())}


def dev_rows(cfg: RunConfig) -> list[tuple[str, int]]:
    """The run's dev examples as its task reads them (first ``eval_samples``)."""
    from workbench.data.sources import EMBEDDED

    if cfg.data == "embedded":
        path = EMBEDDED["classify"] / "dev.tsv"
    elif cfg.data == "sst2":
        path = Path(cfg.data_dir or default_data_dir()) / "sst2" / "dev.tsv"
    else:
        raise SystemExit(f"data={cfg.data}: this script reads embedded or sst2 dev rows only")
    with path.open() as f:
        rows = [(r["sentence"], int(r["label"])) for r in csv.DictReader(f, delimiter="\t")]
    return rows[:cfg.eval_samples] if cfg.eval_samples else rows


@torch.no_grad()
def transformers_eval(folder: Path, cfg: RunConfig, device: str, batch: int = 16) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    words = [tok(w, add_special_tokens=False)["input_ids"] for w in cfg.label_words.split(",")]
    shared = 0  # the words' common leading tokens (a space) belong to the prompt
    while all(len(w) > shared for w in words) and len({w[shared] for w in words}) == 1:
        shared += 1
    if any(len(w) != shared + 1 for w in words):
        raise SystemExit("label words of several tokens: not scored by this script")
    prefix, label_ids = words[0][:shared], torch.tensor([w[shared] for w in words])
    dev, correct, loss = dev_rows(cfg), 0, 0.0
    for i in range(0, len(dev), batch):
        part = dev[i:i + batch]
        ids = [tok(cfg.template.format(text=t))["input_ids"] + prefix for t, _ in part]
        width = max(map(len, ids))
        if width > cfg.seq_len:
            raise SystemExit(f"a prompt of {width} tokens exceeds seq_len={cfg.seq_len}: the "
                             "run cut it; rerun with a larger seq_len")
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        enc = {"input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in ids]),
               "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r))
                                               for r in ids])}
        enc = {k: v.to(device) for k, v in enc.items()}
        logits = model(**enc).logits
        last = enc["attention_mask"].sum(dim=1) - 1
        scores = logits[torch.arange(len(part)), last][:, label_ids].float().cpu()
        labels = torch.tensor([y for _, y in part])
        loss += float(F.cross_entropy(scores, labels, reduction="sum"))
        correct += int((scores.argmax(-1) == labels).sum())
    return {"accuracy": correct / len(dev), "loss": loss / len(dev), "examples": len(dev)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="the folder to export to (replaced)")
    ap.add_argument("--dtype", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--device", default="cpu", help="transformers' device for the eval, and "
                    "where a checkpoint's pending update is applied")
    ap.add_argument("--no-eval", action="store_true", help="export figures only")
    args = ap.parse_args()
    out = timed_export(args.run_dir, args.out, args.dtype, args.device)
    print(f"export: {out['export_seconds']:.1f} s, {out['folder_bytes'] / 1e9:.2f} GB written, "
          f"peak RSS +{out['peak_rss_growth_bytes'] / MiB:.0f} MiB (largest group "
          f"{out['largest_group_fp32_bytes'] / MiB:.0f} MiB fp32, model "
          f"{out['model_fp32_bytes'] / MiB:.0f} MiB); digest equals the run's: "
          f"{out['digest_matches_run']}")
    if not args.no_eval:
        rec = RunRecord.load(args.run_dir, telemetry=False)
        cfg = RunConfig(**{k: v for k, v in rec.config.items()
                           if k in RunConfig.__dataclass_fields__})
        run_eval = rec.evals[-1]["metrics"]
        hf = transformers_eval(args.out, cfg, args.device)
        out.update(run_eval=run_eval, transformers_eval=hf,
                   accuracy_equal=hf["accuracy"] == run_eval["accuracy"],
                   loss_rel_diff=abs(hf["loss"] - run_eval["loss"]) / max(abs(run_eval["loss"]),
                                                                          1e-12))
        print(f"dev accuracy: run {run_eval['accuracy']:.4f}, transformers {hf['accuracy']:.4f} "
              f"({hf['examples']} examples); loss {run_eval['loss']:.6f} vs {hf['loss']:.6f}")
    print(f"saved {save('export_roundtrip', out)}")
    if not args.no_eval and not math.isfinite(out["loss_rel_diff"]):
        raise SystemExit("non-finite loss")


if __name__ == "__main__":
    main()
