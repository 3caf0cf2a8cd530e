"""The plan of the ZO methods: mezo (every group resident), zo-offload and forward-grad (blocks
streamed host <-> GPU through ``prefetch_depth`` + ``SPARE_SLOTS`` slots).

Memory (n = elements of one block, B rows, T = seq_len, D hidden).
  Parameters as the engines hold them (their ``gpu_param_bytes``). mezo: every group in fp32,
    or 2 B/param with half weights (master=compressed|compressed-sr, codec=bf16|fp16); their
    passes materialise an fp32 z (the update: z g + w) of one group at a time even with the
    fused kernel, and compressed-sr's torch rounding path about 23 B per element beside it.
    zo-offload: embedding + head + resident blocks; prefetch_depth + 2 fp32 slots of a block
    (+ 1 under master=compressed-sr: a slot is free once encoded); a copy of a tied LM-head
    weight in the head's compute dtype (``engine/zo/tied.py``: bf16 / fp16 under amp, else fp32),
    one per forward pass of a step but the last.
    A compressed codec adds two wire buffers (one per direction, shared by the slots) and,
    with master=fp32 (the mirror transfer of ``engine/stream/transfers.py``), a bf16 delta per
    slot. reuse_buffers=false: fresh buffers, freed across streams only once their events
    complete, while the host enqueues a whole step: up to every streamed block at once (the
    allocator syncs rather than failing, so the fit check counts only the slots' number of them).
    stream_embeddings (zo-offload): no resident embedding + head; they stream as units of the
    same pass, so each slot holds the largest of a block, the embedding and the head in the
    transfer's bytes (``block_slots`` slots: prefetch_depth + the spare ones by default); under
    compute-dtype slots the work buffer holds the largest form: a block's, the head's (a block's
    form: its matrix in the compute dtype) or the embedding's looked-up rows in fp32
    (``memory.embed_rows`` rows at most), and the head reads its matrix with no autocast copy.
    forward-grad: zo-offload + an fp32 tangent for every group (``ForwardGradEngine`` leaves
    each group's weights bound as duals until the step's dual level ends, so the tangents of all
    blocks accumulate within a step; measured on CPU).
  Activations (``memory.py``). Live across blocks: mezo 1, zo-offload 2 (+ and - travel
    together; 2q with ``queries``, q + 1 one-sided), forward-grad 2 (primal, tangent).
    ``BlockAdapter.embed`` keeps its ``_Captured`` exception, whose traceback cycle holds the
    embedding frame until the GC runs: 3 hidden states per embedding call for OPT (token +
    position embeddings + sum), 1 for Llama (measured on CPU). forward-grad uses the math
    attention backend (scores + probabilities, dual). Prompt batches are planned at T = seq_len
    (an upper bound). Evaluation (max(B, 16) rows, one pass) counts towards the peak as it does
    in a run. Without the fused kernel z is materialised (4 B per element of a group + philox
    temporaries; directions=rademacher always); so is it for the sign rule's update, with the
    estimate beside it (8 B per element of the largest group). codec with master=compressed-sr:
    the stochastic rounding is one fused kernel with nothing extra (its torch path, without
    Triton: about 23 B per block element beside compute); the mirror transfer, a 4 B delta per
    element. ZO activation memory was checked against the engines on the CPU (profiler, 1%).
Time. A step is max(device time, host launch time, the mirror codec's host pass). Per streamed
  block: max(both passes + its perturbation, upload, offload) with overlap (both directions
  share the link at the measured both-at-once rate), their sum without; resident blocks,
  embedding and head add compute. Perturbation: 4 regenerations per element per step and
  query (one-sided 3; forward-grad 2), 2 forward passes per query (one-sided: 1, and 1 clean).
  fused_update=false: a second round trip and an update pass. reuse_buffers=false: transfers
  x ``reuse_off_factor``. Pipeline fill is hidden by the loop running ahead. Streamed embedding
  and head: their bytes cross PCIe each pass as a block's do, overlapped with their own compute.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from workbench.config import ZO_STATE_SLOTS, RunConfig, compute_slots, zo_passes
from workbench.plan.lora import block_matrices
from workbench.plan.memory import (EVAL_ROWS, SPARE_SLOTS, block_slot_count, ends_work_bytes,
                                   form_bytes, moments, pinned_bytes)
from workbench.plan.rates import host_key
from workbench.plan.wire import codec_bytes, wire_kind, zo_regens
from workbench.presets import Preset

OP_LAUNCH_S = 5e-5  # host time of one perturbation kernel or one transfer launch


def weight_bytes(cfg: RunConfig) -> int:
    """Bytes per parameter of mezo's weights on the device: 2 for its half weights
    (``engine/zo/half.py``), else 4 (the streamed methods' resident groups too)."""
    half = cfg.method == "mezo" and cfg.master != "fp32" and cfg.codec in ("bf16", "fp16")
    return 2 if half else 4


def transfer_kind(cfg: RunConfig, p: Preset) -> str:
    """How trained blocks of a model of shape ``p`` travel: the wire's kind (``wire.wire_kind``:
    plain, sr, mirror), or compute (the compressed master kept as it is in its slot:
    ``slot_dtype``; under ``auto`` only where every block matrix is a weight autocast casts, as
    the engine decides: ``Preset.uncast``, ``models/castable.py``)."""
    if compute_slots(cfg) and (cfg.slot_dtype == "compute" or not p.uncast):
        return "compute"
    return wire_kind(cfg.codec, cfg.master)


def work_bytes(p: Preset, item: int = 2) -> int:
    """Bytes of compute-dtype slots' work buffer (``FrozenForm.nbytes`` of a block): the
    matrices in the compute dtype (``item`` B), padded to 16 B, then the 1-D tail in fp32. A
    preset counted on its model (``counts``) plans every element as a matrix (its tail, the
    norms and biases, is a fraction of a percent)."""
    nb = p.block_params()
    n_mat = nb if p.counts is not None else sum(o * i for o, i in block_matrices(p).values())
    return form_bytes(nb, n_mat, item)


def chain_regens(cfg: RunConfig, pending: bool = True) -> int:
    """z regenerations per element of a streamed block per step with compute-dtype slots
    (``zo/chain.py``): each forward pass's fill and the final write start again from the master
    and regenerate one z per distinct seed so far (the pending update's q, then the queries')."""
    q, p = cfg.queries, cfg.queries if pending else 0
    if cfg.estimator == "central":  # passes 2j, 2j + 1 see p + j + 1 seeds; the write p + q
        return sum(2 * (p + j + 1) for j in range(q)) + p + q
    return p + sum(p + j + 1 for j in range(q)) + p + q  # a clean pass first


@dataclass(frozen=True)
class Stream:
    """What a ZO plan's parts share: the shapes (N blocks of nb elements, embedding ne, head
    nh), r resident and s streamed blocks through ``slots`` slots, the transfer ``kind`` with
    its bytes per block ``up`` and ``down``, the perturbation rate ``pr`` (elements/s) and
    ``z(k)``: the bytes a materialised z of k elements takes (0 with the fused kernel).
    ``ends``: the embedding and head stream too (``stream_embeddings``), ``unit`` the largest
    streamed unit's elements (a slot's), ``eup`` / ``edown`` their bytes each way per pass.
    ``sizes``: each streamed block's elements (a counted preset's blocks differ: a hybrid's
    state-space, attention and MLP blocks), ``resident``: the resident blocks' elements; slots
    are sized for the largest block, and what scales with the blocks (host memory, PCIe, time)
    counts each block at its own size: ``se``, ``re`` and ``Ne`` are the streamed, resident and
    all blocks in largest-block equivalents."""

    cuda: bool
    streaming: bool
    N: int
    nb: int
    ne: int
    nh: int
    r: int
    s: int
    slots: int
    kind: str
    up: int
    down: int
    pr: float
    z: Callable[[int], int]
    sizes: tuple[int, ...] = ()
    resident: int = 0
    ends: bool = False
    unit: int = 0
    eup: int = 0
    edown: int = 0

    @property
    def ends_e(self) -> float:
        """The streamed embedding and head in largest-block equivalents (0: resident)."""
        return (self.ne + self.nh) / self.nb if self.ends and self.nb else 0.0

    @property
    def se(self) -> float:
        return sum(self.sizes) / self.nb if self.nb else 0.0

    @property
    def re(self) -> float:
        return self.resident / self.nb if self.nb else 0.0

    @property
    def Ne(self) -> float:
        return self.se + self.re

    def per_block(self, f: Callable[[int], int]) -> int:
        """f summed over the streamed blocks (f of one block's elements)."""
        return sum(f(n) for n in self.sizes)


def _stream(cfg: RunConfig, p: Preset, prof: dict) -> Stream:
    cuda, streaming = cfg.device == "cuda", cfg.method != "mezo"
    N, nb = p.num_layers, p.block_params()
    fused = cfg.rng == "philox" and cuda and bool(prof.get("fused_kernel"))
    pr = prof["perturb_fused_per_s" if fused else
              "perturb_torch_per_s" if cfg.rng == "torch" else "perturb_philox_torch_per_s"]
    signs = cfg.directions == "rademacher"  # torch ops on the kernel's normals, signed (half
    if fused and (weight_bytes(cfg) == 2 or signs):  # weights: ``engine/zo/half.py``'s too),
        pr = prof["perturb_torch_per_s"]  # planned at torch's rate
    z = (lambda k: 0) if fused and not signs else (  # z materialised, + philox's int64 chunk
        lambda k: 4 * k + (0 if cfg.rng == "torch" or fused else 80 * min((k + 3) // 4, 1 << 22)))
    r = min(cfg.resident_blocks, N) if streaming else N
    kind = transfer_kind(cfg, p) if streaming else "plain"  # mezo: nothing travels
    ends = cfg.method == "zo-offload" and cfg.stream_embeddings
    slots = block_slot_count(cfg, kind) if streaming and (r < N or ends) else 0
    up_of = lambda n: codec_bytes(cfg.codec, n)  # noqa: E731
    down_of = lambda n: {"plain": 4 * n, "sr": up_of(n), "mirror": 2 * n,  # noqa: E731
                         "compute": up_of(n)}[kind]
    blocks = p.counts[1] if p.counts is not None else (nb,) * N
    ne, nh = p.embed_params(), p.head_params()
    return Stream(cuda, streaming, N, nb, ne, nh, r, N - r, slots, kind, up_of(nb),
                  down_of(nb), pr, z, tuple(blocks[r:]), sum(blocks[:r]), ends,
                  max((*blocks[r:], ne, nh)) if ends else nb,
                  (up_of(ne) + up_of(nh)) * ends, (down_of(ne) + down_of(nh)) * ends)


def plan_zo(cfg: RunConfig, p: Preset, prof: dict, e: dict, notes: list[str]) -> None:
    """ZO methods: fill e (memory parts, PCIe bytes, times)."""
    st = _stream(cfg, p, prof)
    tied_copy = _parameters(cfg, p, st, e, notes)
    _activations(cfg, p, prof, st, e, notes, tied_copy)
    _time(cfg, prof, st, e, notes)


def _parameters(cfg: RunConfig, p: Preset, st: Stream, e: dict, notes: list[str]) -> int:
    """Device and host bytes of the weights, slots and wires; returns the tied head copy's."""
    cuda, dev, nb, s, slots, kind, up = st.cuda, e["dev"], st.nb, st.s, st.slots, st.kind, st.up
    wb = weight_bytes(cfg)
    ends = 0 if st.ends else st.ne + st.nh  # elements of the embedding and head on the device
    dev["embedding + head"] = wb * ends
    dev["resident blocks" if st.streaming else "blocks"] = wb * st.resident
    tied_copy = 0
    if cfg.method == "zo-offload" and p.hf.get("tie_word_embeddings", True):  # the head's copies
        tied_copy = (2 if e["amp"] else 4) * p.vocab * p.hf.get("word_embed_proj_dim", p.hidden) \
            * (zo_passes(cfg.queries, cfg.estimator, cfg.zo_optimizer) - 1)
        dev["tied head weight copy"] = tied_copy
    unit_up = codec_bytes(cfg.codec, st.unit)  # the largest streamed unit on the wire
    slot_b = unit_up if kind == "compute" else 4 * st.unit  # in its slot
    if slots:
        ahead = s if cuda and cfg.overlap and not cfg.reuse_buffers else slots
        dev["block slots" if cfg.reuse_buffers else "blocks in flight"] = slot_b * ahead
        e["elastic"] = slot_b * (ahead - slots)
        if kind == "compute":  # the forward's form of one unit, shared by every slot
            dev["work buffer"] = max([work_bytes(p, 2), *(ends_work_bytes(cfg, p) if st.ends
                                                          else ())])
        elif kind != "plain":  # shared wires (one per direction) with reuse, else per block
            wires = {"sr": 2 * unit_up, "mirror": unit_up} if cfg.reuse_buffers else {
                "sr": slots * unit_up, "mirror": slots * unit_up}
            dev["codec wire buffers"] = wires[kind]
            if kind == "mirror":
                dev["mirror deltas"] = slots * 2 * st.unit
        pin = lambda nbytes: pinned_bytes(nbytes, cuda)  # noqa: E731
        held = lambda n: {  # noqa: E731
            "plain": pin(4 * n), "sr": pin(codec_bytes(cfg.codec, n)),
            "compute": pin(codec_bytes(cfg.codec, n)),
            "mirror": pin(codec_bytes(cfg.codec, n)) + pin(2 * n)}[kind]
        e["pinned"] = st.per_block(held) + (held(st.ne) + held(st.nh)) * st.ends
        if kind == "mirror":  # a pageable fp32 master, a pinned mirror and delta
            e["host"]["block masters (fp32)"] = 4 * (sum(st.sizes) + (st.ne + st.nh) * st.ends)
            e["host"][f"{cfg.codec} mirrors + bf16 deltas"] = e["pinned"]
        else:
            e["host"][f"block masters ({cfg.codec})"] = e["pinned"]
        if cuda and e["pinned"] > 1.1 * st.se * (4 * nb if kind == "plain" else up + 2 * nb):
            notes.append("blocks under 64 MiB are pinned by torch's allocator, which rounds each "
                         "up to a power of two: pinned host memory is counted as rounded")
    extras = (dev.get("codec wire buffers", 0) + dev.get("mirror deltas", 0)
              if cfg.reuse_buffers else 0) + dev.get("work buffer", 0)
    e["gpu_param_bytes"] = cuda * (wb * (ends + st.resident) + tied_copy
                                   + slot_b * slots * cfg.reuse_buffers + extras)
    k = ZO_STATE_SLOTS[cfg.zo_optimizer]
    if k:  # momentum / adam (``engine/stream/opt_state.py``): fp32 beside the device groups,
        # fp32 state slots beside the block slots (+ their wires), the master's form on the host
        sb = _state_wire(cfg, st, k)
        state = 4 * k * (ends + st.resident) + (4 * k * slots * st.unit + (
            2 * sb if kind == "sr" else 0)) * cfg.reuse_buffers
        dev["optimizer state"] = state
        e["gpu_param_bytes"] += cuda * state
        if s:
            kept = lambda n: pinned_bytes(k * (  # noqa: E731
                4 * n if kind == "plain" else codec_bytes(cfg.codec, n)), cuda)
            held = st.per_block(kept) + (kept(st.ne) + kept(st.nh)) * st.ends
            e["pinned"] += held
            e["host"][f"optimizer state ({'fp32' if kind == 'plain' else cfg.codec})"] = held
    return tied_copy


def _state_wire(cfg: RunConfig, st: Stream, k: int) -> int:
    """Bytes of one streamed block's optimizer state on the host and on the wire each way:
    k x the block's weights in the master's format (fp32, or the codec's 2 B)."""
    return k * (4 * st.nb if st.kind == "plain" else codec_bytes(cfg.codec, st.nb))


def _activations(cfg: RunConfig, p: Preset, prof: dict, st: Stream, e: dict, notes: list[str],
                 tied_copy: int) -> None:
    """The activation peak of a step (and of an evaluation pass), into ``e["dev"]``."""
    rows, t, masked, hb, m, dev = cfg.batch_size, cfg.seq_len, e["masked"], e["hb"], e["m"], e["dev"]
    nb, ne, nh, z = st.nb, st.ne, st.nh, st.z
    live = {"mezo": 1, "forward-grad": 2}.get(cfg.method) or zo_passes(cfg.queries, cfg.estimator,
                                                                       cfg.zo_optimizer)
    held = (3 if p.family == "opt" else 1) * hb * live  # embedding frames kept by the adapter
    # SR encode beside compute: the fused kernel holds nothing extra; the torch path about 23 B
    # per element (int64 noise words, int32 noise, mask, rounded, selected, cast)
    fused = st.cuda and prof.get("fused_kernel")
    blockm = m["block"] + (0 if fused else 23 * nb) * (st.kind == "sr")
    if st.kind == "compute":  # the matrices are read in the compute dtype: no cast copy; the
        # torch path replays the chain on an fp32 copy (+ z), then the SR encode's 23 B
        u = st.unit  # the torch path replays the largest streamed unit
        blockm = moments(p, rows, t, e["amp"], masked, cast=False)["block"] + (0 if fused else (
            4 * u + z(u) + 23 * u * (cfg.master == "compressed-sr")))
    if cfg.method == "forward-grad":  # dual tensors, math-backend attention (scores + probs)
        blockm = 2 * m["block"] + 4 * rows * p.heads * t * t * (2 if e["amp"] else 4)
        # embedding and head tangents live all step; a block's only while it computes
        dev["tangents (embedding, head, one block)"] = 4 * (ne + nh + nb)
        # forward-AD transients per block parameter (dual casts under autocast, the next
        # block's tangent): an empirical 16 B, fitted to the H200 peaks of opt-1.3b / 6.7b bf16
        # (benchmarks/results/methods-fgfix-*.json; the plan was 27-31% under without it)
        dev["forward-AD transients"] = 16 * nb
        notes.append("forward-grad: the embedding's and head's tangents live all step, a block's "
                     "only while it computes (4 B/param); jvp taken as 3x forward FLOPs")
    # the head reads the tied copy in its compute dtype: no autocast cast of that weight
    # and so does a streamed head from its form in the work buffer (compute-dtype slots)
    formed = st.ends and st.kind == "compute"
    head_cast = 2 * p.vocab * p.hf.get("word_embed_proj_dim", p.hidden) if e["amp"] else 0
    head_m = m["head"] - (head_cast if tied_copy or formed else 0)
    peaks = [m["embed"] + (live - 1) * (hb + held // live), live * hb + held + blockm,
             live * hb + held + head_m]
    peaks += [held + _resident_z(cfg, prof, st, max(ne, nb, nh))] if not st.streaming else [
        live * hb + held + max(z(st.unit) + 4 * st.unit * (st.kind == "mirror"), z(ne))]
    if cfg.zo_optimizer != "sgd":  # sign, momentum, adam: the update materialises z and the
        peaks[-1] += 8 * max(ne, nb, nh)  # estimate (4 B each; adam's denominator reuses it)
    act = max(peaks) + rows * t * t * masked  # + the padding mask, alive all step
    if masked:  # evaluation: one pass over max(B, 16) rows
        er = max(rows, EVAL_ROWS)
        ehb = 4 * er * t * p.hidden
        # compute-dtype slots: blocks (and a streamed head) read their form, never cast
        em = moments(p, er, t, e["amp"], True, e["cast"] and st.kind != "compute")
        em = max(em["embed"], em["block"], em["head"] - (head_cast if formed else 0))
        act = max(act, ehb + held // live * er // rows + em + er * t * t)
    dev["activations"] = act


def _resident_z(cfg: RunConfig, prof: dict, st: Stream, k: int) -> int:
    """Bytes a perturbation or update of a resident group of k elements materialises (mezo):
    ``st.z``, or with half weights an fp32 z always (+ philox's temporaries without the fused
    kernel) and compressed-sr's torch rounding path (about 23 B per element) without it."""
    if weight_bytes(cfg) == 4:
        return st.z(k)
    fused = st.cuda and bool(prof.get("fused_kernel"))
    sr = 23 * k * (cfg.master == "compressed-sr" and not fused)
    return max(st.z(k), 4 * k) + sr


def _time(cfg: RunConfig, prof: dict, st: Stream, e: dict, notes: list[str]) -> None:
    """Compute, transfer and host seconds of a step, and its PCIe bytes, into ``e``."""
    cuda, N, nb, ne, nh, r, s, kind, pr = (st.cuda, st.N, st.nb, st.ne, st.nh, st.r, st.s,
                                           st.kind, st.pr)
    passes, regens = (3, 2) if cfg.method == "forward-grad" else (
        zo_passes(cfg.queries, cfg.estimator, cfg.zo_optimizer),
        zo_regens(cfg.queries, cfg.estimator))  # hizoo: 1 update + 3 perturbations, as central
    eh_t = passes * e["eh"] + regens * (ne + nh) / pr
    if kind == "compute":  # bf16 weights read, not cast; each pass's fill from the master
        bw = prof["gpu_mem_bps"]
        # one regeneration of z over the block without the fp32 pass's 8 B of memory traffic
        # (the chain kernel reads 2 B and writes 2 B once per launch, however many it regenerates)
        regen = max(nb / pr - 8 * nb / bw, 0.25 * nb / pr)
        c_blk = passes * (max(e["blk_flops"], 2 * nb / bw) + 4 * nb / bw) + (
            chain_regens(cfg) * regen)  # every fill, and the last write (``settle``)
    else:
        c_blk = passes * e["blk"] + regens * nb / pr
    e["compute"] = eh_t + st.Ne * c_blk
    # this machine's host seconds per step and per block (a GPU's; on a CPU host time is compute)
    measured = prof.get("host_costs_s", {}).get(host_key(cfg.method, bool(e["amp"]))) \
        if cuda else None
    if measured is not None:
        e["host_t"] = measured[0] + N * measured[1]
    else:
        e["host_t"] = prof["step_overhead_s"] + (N + 2) * (passes * prof["launch_s"]
                                                           + 3 * OP_LAUNCH_S)
    e["step"] = e["compute"]
    if not st.slots:
        return
    overlap, bw = cfg.overlap and cuda, prof["gpu_mem_bps"]
    if not cuda:  # the CPU engine copies master <-> slot in host memory
        bu = bd = prof["host_memcpy_bps"] / 2
    else:  # with overlap both directions run at once and share the link
        bu, bd = ((prof["duplex_bps"] / 2,) * 2 if overlap else (prof["h2d_bps"], prof["d2h_bps"]))
    # fewer slots than the transfer keeps by default (block_slots): a unit's upload waits for
    # the offload of its slot's last unit, so each slot in turn computes, goes down and comes
    # up again (each copy alone on its direction): a unit every (c + up + down) / slots at best
    turns = cuda and overlap and st.slots < cfg.prefetch_depth + SPARE_SLOTS[kind]
    alone = (st.up / prof["h2d_bps"] + st.down / prof["d2h_bps"]) if turns else 0.0
    factor = 1.0 if cfg.reuse_buffers or not cuda else prof["reuse_off_factor"]
    decoded = kind not in ("plain", "compute")  # a decode on the GPU after the copy
    x_up = factor * st.up / bu + (st.up + 4 * nb) / bw * decoded
    x_dn = factor * st.down / bd + {"plain": 0, "sr": 30 * nb, "mirror": 14 * nb,
                                    "compute": 0}[kind] / bw
    k = ZO_STATE_SLOTS[cfg.zo_optimizer]
    sb = _state_wire(cfg, st, k) if k else 0  # momentum / adam: the state travels with the
    s_up = factor * sb / bu + (sb + 4 * k * nb) / bw * (kind != "plain")  # block in the pass
    s_dn = factor * sb / bd + 30 * k * nb / bw * (kind == "sr")  # that updates it
    rounds = [(c_blk, x_up + s_up, x_dn + s_dn)]
    if not cfg.fused_update:  # flush(): a second round trip with an update pass (hizoo: H
        hz = cfg.zo_optimizer == "hizoo"  # scales the perturbation, so it travels in both)
        rounds = [(c_blk, x_up + hz * s_up, (0.0 if kind == "mirror" else x_dn) + hz * s_dn),
                  (nb / pr, x_up + s_up, x_dn + s_dn)]
        e["compute"] += (ne + nh + N * nb) / pr
        eh_t += (ne + nh + st.resident) / pr
    per = sum(max(c, u, w, (c + alone) / st.slots) if overlap else c + u + w
              for c, u, w in rounds)
    se, ee = st.se, st.ends_e  # each streamed unit at its own size (the largest's bytes, scaled)
    ups, downs = sum(u for _, u, _ in rounds), sum(w for _, _, w in rounds)
    # a streamed embedding and head: their transfers beside their own compute
    ends_t = (max(eh_t, ee * ups, ee * downs, (eh_t + ee * alone) / max(st.slots, 1))
              if overlap else eh_t + ee * (ups + downs))
    e["step"] = ends_t + st.re * c_blk + se * per
    down_rounds = 1 if kind == "mirror" else len(rounds)
    sb *= 1 + (cfg.zo_optimizer == "hizoo" and len(rounds) > 1)  # H in both rounds (above)
    e["h2d"] = round(se * (st.up * len(rounds) + sb) + st.eup * len(rounds) + ee * sb)
    e["d2h"] = round(se * (st.down * down_rounds + sb) + st.edown * down_rounds + ee * sb)
    e["transfer"] = (se + ee) * max(ups, downs, alone / max(st.slots, 1))
    if measured is None:  # the measured per-block cost holds the transfers'
        e["host_t"] += (s + 2 * st.ends) * len(rounds) * 3 * OP_LAUNCH_S
    elif len(rounds) > 1:  # fused_update off: a second streamed pass
        e["host_t"] += s * 3 * OP_LAUNCH_S
    if kind == "mirror":  # one host thread: master += delta, re-encode the mirror
        e["host_t"] = max(e["host_t"], (sum(st.sizes) + (st.ne + st.nh) * st.ends)
                          / prof["host_update_per_s"])
    if not cfg.reuse_buffers and cuda:
        notes.append(f"reuse_buffers=false: transfers {factor:.2f}x slower (the paper's 0.37x "
                     f"ablation; our caching allocator may do better); fits with {st.slots} in "
                     "flight")
