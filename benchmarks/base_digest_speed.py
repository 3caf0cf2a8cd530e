"""The end-of-run ``base_digest`` of a frozen, compressed base (issue 21, part 2): the old host
decode against the new one, per block.

opt-175b's ZO-LoRA run over an fp8 base (H200, 2026-11-23) trained its steps at 3.21 s and was
then still in its end-of-run save after 415 s: ``base_digest`` decodes each of 96 blocks (1.8 B
elements) to fp32 on the host and hashes it. The old decode went through the block's device form
(a bf16 buffer, an fp32 block for the fp8 decode, the bf16 matrices widened again, and a
concatenation: four fresh block-sized allocations); ``to_fp32`` now decodes into one fp32 block and
rounds the matrices in place; the run's digest now reads each block a piece (16 Mi elements) at a time
into buffers reused from block to block while threads hash the pieces before it
(``FrozenTransfer.reader``). All must give the same digest (the run stops with an error if not).

Rows: ``old`` / ``whole block`` decode followed by ``groups.fingerprint`` (the digest the recipe
took), ``whole block, decode only``, and ``pieces`` (what the recipe takes now). Synthetic blocks
with opt-175b's block shapes by default.

    python benchmarks/base_digest_speed.py --blocks 4                 # opt-175b blocks (GPU)
    python benchmarks/base_digest_speed.py --blocks 3 --hidden 4096   # 2-core CPU: ~30 s
"""
from __future__ import annotations

import argparse
import time

# common first: it puts this checkout on sys.path
from common import save, table

import torch  # noqa: E402

from workbench.engine import groups  # noqa: E402
from workbench.engine.codecs.frozen_form import FrozenForm  # noqa: E402
from workbench.engine.groups import Entry, GroupLayout  # noqa: E402
from workbench.engine.stream.frozen_transfer import FrozenTransfer  # noqa: E402


def block_layout(hidden: int) -> GroupLayout:
    """An OPT block: q, k, v, out (h x h), fc1 (4h x h), fc2 (h x 4h), then biases and norms."""
    shapes = [(hidden, hidden)] * 4 + [(4 * hidden, hidden), (hidden, 4 * hidden)]
    shapes += [(hidden,)] * 5 + [(4 * hidden,)] + [(hidden,)] * 4
    entries, off = [], 0
    for k, shape in enumerate(shapes):
        n = int(torch.tensor(shape).prod())
        entries.append(Entry(f"p{k}", (), shape, off, n))
        off += n
    return GroupLayout("block", entries, off, sum(e.numel for e in entries if len(e.shape) == 2))


def old_to_fp32(host) -> torch.Tensor:
    """The decode this replaced: into the device form on the host, then widened and joined."""
    buf = host.form.empty("cpu")
    host.codec.decode_form(host.buf, *host.form.parts(buf))
    return host.form.to_fp32(buf)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--hidden", type=int, default=12288, help="opt-175b: 12288 (1.81 B / block)")
    p.add_argument("--codec", default="fp8-e4m3", choices=("fp8-e4m3", "int8", "bf16"))
    p.add_argument("--name", default="base_digest_speed")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    lay = block_layout(args.hidden)
    tr = FrozenTransfer(args.codec, [lay], torch.device("cuda" if cuda else "cpu"), None,
                        torch.bfloat16)
    hosts = []
    for i in range(args.blocks):  # random blocks, encoded where the run encodes them
        x = torch.randn(lay.numel, device=tr.device, generator=torch.Generator(tr.device)
                        .manual_seed(i)) * 0.02
        host = tr.host_storage(lay)
        tr.store_fp32(host, x)
        hosts.append(host)
        del x
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    assert FrozenForm(lay, torch.bfloat16).n_mat == lay.n_decay
    gb = args.blocks * lay.numel * 4 / 1e9
    rows, digests = [], {}
    for name, decode, hash_it in (("old", old_to_fp32, True), ("whole block", tr.to_fp32, True),
                                  ("whole block, decode only", tr.to_fp32, False),
                                  ("pieces", None, True)):
        if decode is None:  # what the run does: each block read a piece at a time
            flats = groups.LazyFlats(len(hosts), tr.to_fp32, lambda k: tr.reader(hosts[k]))
        else:
            flats = groups.LazyFlats(len(hosts), lambda k, d=decode: d(hosts[k]))
        t = time.perf_counter()
        if hash_it:
            digests[name] = groups.digest(flats)
        else:
            for flat in flats:
                del flat
        s = time.perf_counter() - t
        rows.append({"row": name, "seconds": s, "per_block_s": s / args.blocks,
                     "gb_per_s": gb / s, "digest": digests.get(name, "")[:16]})
        print(table(rows[-1:], COLS), flush=True)
    if len(set(digests.values())) != 1:
        raise SystemExit(f"digests differ: {digests}")
    print("\n" + table(rows, COLS))
    print(f"{args.blocks} blocks of {lay.numel / 1e9:.2f} B elements ({args.codec}); GB/s = fp32 "
          f"GB (1e9 B) decoded per second; threads {torch.get_num_threads()} (torch), "
          f"{groups.default_threads()} (hash); same digest both ways")
    print(f"saved {save(args.name, {'rows': rows, 'args': vars(args)})}")


COLS = [("row", "row", ""), ("s", "seconds", "{:.2f}"), ("s / block", "per_block_s", "{:.3f}"),
        ("GB/s", "gb_per_s", "{:.2f}"), ("digest", "digest", "")]

if __name__ == "__main__":
    main()
