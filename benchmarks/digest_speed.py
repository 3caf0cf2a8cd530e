"""The end-of-run fingerprint (``param_digest`` + ``param_norm``), old way against new (issue 21).

Synthetic groups stand in for a streamed model: bf16 host groups, each decoded to fp32 when it is
reached (the bf16 codec's decode is this copy), as ``state_flats`` does for a bf16 SR master;
``--source fp32`` hands fp32 groups over as they are. Rows:

* ``decode only``: walking the groups without hashing (the floor both ways share);
* ``old``: a copy of the single-threaded fingerprint it replaced: one SHA-256 over all the bytes,
  then fp64 squares of 4 Mi elements at a time (opt-66b's save took ~290 s this way);
* ``new, N threads``: ``workbench.engine.groups.fingerprint``: pieces of 16 Mi elements hashed
  and squared by N threads, one group decoded at a time.

GB/s = fp32 bytes fingerprinted (GB = 1e9) per second. The new digest must be the same for every
thread count and the norms must agree; the run stops with an error if not. No GPU is needed.

    python benchmarks/digest_speed.py --groups 8 --group-gb 2          # 16 GB of fp32, ~1 min
    python benchmarks/digest_speed.py --groups 2 --group-gb 0.2 --threads 2   # plumbing
"""
from __future__ import annotations

import argparse
import hashlib
import math
import time

# common first: it puts this checkout on sys.path
from common import save, table

import torch  # noqa: E402

from workbench.engine import groups  # noqa: E402

OLD_NORM_CHUNK = 1 << 22  # the old fingerprint's fp64 chunk (elements)


def old_fingerprint(flats) -> tuple[str, float]:
    """The fingerprint before issue 21's follow-up, verbatim in effect: one SHA-256 over every
    group's fp32 bytes, one thread, and fp64 squares ``OLD_NORM_CHUNK`` elements at a time."""
    h, total = hashlib.sha256(), 0.0
    for flat in flats:
        host = flat.detach().to("cpu", torch.float32).contiguous().reshape(-1)
        h.update(host.numpy())
        total += sum(float(c.double().square_().sum()) for c in host.split(OLD_NORM_CHUNK))
        del flat, host
    return h.hexdigest(), total ** 0.5


def decode_only(flats) -> tuple[str, float]:
    for flat in flats:
        del flat
    return "", math.nan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-gb", type=float, default=2.0, help="fp32 GB (1e9 bytes) per group")
    p.add_argument("--source", choices=("bf16", "fp32"), default="bf16",
                   help="bf16: host groups decoded to fp32 when reached; fp32: handed as they are")
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help=f"thread counts of the new way (default: 1 and {groups.default_threads()})")
    p.add_argument("--name", default="digest_speed")
    args = p.parse_args()
    if args.groups < 1 or args.group_gb <= 0:
        p.error("--groups must be >= 1 and --group-gb > 0")
    threads = args.threads or sorted({1, groups.default_threads()})
    if min(threads) < 1:
        p.error("--threads: each count must be >= 1")
    n = int(args.group_gb * 1e9 / 4)
    dtype = torch.bfloat16 if args.source == "bf16" else torch.float32
    t = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    host = [torch.empty(n, dtype=dtype).normal_(generator=gen) for _ in range(args.groups)]
    print(f"{args.groups} groups x {n / 2 ** 20:.0f} Mi elements ({args.source} on the host), "
          f"made in {time.perf_counter() - t:.1f} s; torch threads {torch.get_num_threads()}")
    flats = groups.LazyFlats(len(host), lambda i: host[i].to(torch.float32))
    fp32_bytes = 4 * n * args.groups

    ways = [("decode only", decode_only), ("old (1 thread)", old_fingerprint)]
    ways += [(f"new, {k} thread{'s' * (k > 1)}", lambda f, k=k: groups.fingerprint(f, threads=k))
             for k in threads]
    rows = []
    for name, fn in ways:
        t = time.perf_counter()
        found, norm = fn(flats)
        secs = time.perf_counter() - t
        rows.append({"way": name, "seconds": secs, "gb_per_s": fp32_bytes / secs / 1e9,
                     "digest": found[:16], "norm": norm})
        print(f"  {name}: {secs:.2f} s", flush=True)
    old, new = rows[1], rows[2:]
    if len({r["digest"] for r in new}) != 1:
        raise SystemExit(f"the new digest depends on the thread count: {new}")
    if any(abs(r["norm"] - old["norm"]) > 1e-12 * old["norm"] for r in new):
        raise SystemExit(f"the norms disagree: old {old['norm']!r}, new {[r['norm'] for r in new]}")
    for r in rows[1:]:
        r["speedup"] = old["seconds"] / r["seconds"]
    print("\n" + table(rows, [("way", "way", ""), ("s", "seconds", "{:.2f}"),
                              ("GB/s", "gb_per_s", "{:.2f}"), ("vs old", "speedup", "{:.1f}x"),
                              ("digest", "digest", ""), ("norm", "norm", "{:.6f}")]))
    best = max(new, key=lambda r: r["speedup"])
    print(f"\nnew digest identical for threads {threads}; norms agree to 1e-12. Best: {best['way']}, "
          f"{best['speedup']:.1f}x the old way ({fp32_bytes / 1e9:.1f} GB of fp32).")
    out = {"groups": args.groups, "group_elements": n, "source": args.source,
           "fp32_bytes": fp32_bytes, "piece_elements": groups.PIECE,
           "torch_threads": torch.get_num_threads(), "rows": rows}
    print(f"saved {save(args.name, out)}")


if __name__ == "__main__":
    main()
