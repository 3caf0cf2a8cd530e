"""fo-offload's downcast sites, placement by placement: the same engine stepped under fixed
placements (interleaved stride 3 and all on the CPU, no residents), 16-bit weights downcast on
the CPU and on the GPU, with one CPU AdamW kernel (``--cpu-adamw``), in this process.

For each placement: 4 steps (the first a warm-up), the median step, the model's predicted and
the measured update phase (after backward), and the phases of the last two steps as
``fo_offload.py`` reports them, with the CPU worker's waits for a free staging buffer apart
(``stage_wait_s``). The timeline keeps one span per subgroup here whatever their count
(``--merged-spans``: as a run does, one per phase above 64 subgroups, so that busy times span
the whole phase; the results in ``benchmarks/results/sites/`` were taken so, without the
staging waits).

    python benchmarks/fo_sites.py --cpu-adamw one-pass            # opt-6.7b, 50 M subgroups
    python benchmarks/fo_sites.py --device cpu --model tiny-opt --subgroup 20000  # plumbing

Saves benchmarks/results/<--name>-<gpu>-<date>.json (and a copy to $OUT) on a GPU.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchmarks.fo_offload as fb  # noqa: E402
from benchmarks.common import save, table  # noqa: E402
from workbench.calibrate.fo import measure  # noqa: E402
from workbench.config import RunConfig  # noqa: E402
from workbench.data.batches import SyntheticData  # noqa: E402
from workbench.engine import build_engine  # noqa: E402
from workbench.engine.fo import spans  # noqa: E402
from workbench.models.build import build_skeleton  # noqa: E402
from workbench.plan import placement  # noqa: E402

PLACEMENTS = [(3, True), (3, False), (placement.NO_GPU, True), (placement.NO_GPU, False)]
PHASES = ("backward_s", "grad_d2h_s", "cpu_update_s", "upload_s", "prefetch_s", "flush_out_s",
          "gpu_update_s", "cpu_update_params_per_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--model", default="opt-6.7b")
    ap.add_argument("--subgroup", type=int, default=50_000_000)
    ap.add_argument("--cpu-adamw", default="one-pass", choices=("torch", "one-pass"))
    ap.add_argument("--name", default="fo_sites")
    ap.add_argument("--merged-spans", action="store_true",
                    help="merge the timeline's spans per phase above 64 subgroups, as runs do")
    args = ap.parse_args()
    if not args.merged_spans:  # one span per subgroup: the waits and updates apart
        spans.SPAN_LIMIT = 1 << 30
    dev = torch.device(args.device)
    cfg = RunConfig(model=args.model, method="fo-offload", device=dev.type, amp="bf16", lr=1e-5,
                    data="synthetic", batch_size=8, seq_len=128, cpu_adamw=args.cpu_adamw,
                    subgroup_size=args.subgroup, update_stride="3", weight_decay=0.0)
    bus, events, _ = fb._collect()
    model, source = build_skeleton(cfg.model)
    engine = build_engine(model, source, cfg, dev, bus, measure=measure)
    data = SyntheticData(model.config.vocab_size, cfg.seq_len)
    rows, t = [], 0
    for stride, cpu_downcast in PLACEMENTS:
        engine.reschedule(stride, 0.0, cpu_downcast)
        seconds = []
        for _ in range(4):
            batch = data.batch_for_step(t, 8, 0).to(dev)
            fb._sync(dev)  # whole steps on the host clock
            t0 = time.perf_counter()
            engine.step(batch, t, cfg.lr, 0.0)
            fb._sync(dev)
            seconds.append(time.perf_counter() - t0)
            t += 1
        engine.sync()
        ph = fb.phases(events, [t - 2, t - 1], engine)
        waits = [e for e in events if e.step in (t - 2, t - 1) and e.op == "cpu-wait"
                 and e.detail == "staging buffer"]
        rows.append({"kernel": engine.cpu_adamw, "stride": stride if stride != placement.NO_GPU
                     else "all-cpu", "cpu_downcast": cpu_downcast,
                     "step_s": statistics.median(seconds[1:]),
                     "update_s_predicted": engine.placement.predicted_s,
                     "update_s_measured": statistics.median(engine.clock.seconds[-2:]),
                     "stage_wait_s": sum(e.end - e.start for e in waits) / 2,
                     **{k: ph[k] for k in PHASES}})
    engine.close()
    cols = [("kernel", "kernel", ""), ("stride", "stride", ""),
            ("CPU downcast", "cpu_downcast", ""),
            ("step s", "step_s", "{:.3f}"), ("upd pred s", "update_s_predicted", "{:.3f}"),
            ("upd meas s", "update_s_measured", "{:.3f}"),
            ("stage wait s", "stage_wait_s", "{:.3f}"),
            ("cpu upd G/s", "cpu_update_params_per_s", "{:.3g}")]
    print(table(rows, cols))
    if dev.type == "cuda":
        print(f"saved {save(args.name, {'rows': rows, 'model': args.model})}")


if __name__ == "__main__":
    main()
