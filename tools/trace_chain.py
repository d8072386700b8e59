"""Where the time of back-to-back calls goes: each CTA's thread 0 timestamps its start, the release of
griddepcontrol.wait, its first weights and then its first x in registers, partials in shared memory, the CTA
barrier, the split-K combine and its end, in a build of the kernels with MUSE_TRACE defined (the shipped build
compiles the hooks to nothing: same PTX) that holds the cases' instantiations only. Each CTA stores its slot
(SLOT_U64 = 14 u64) into its own layer copy's workspace, which this tool grows for that. One replay of a graph of P
back-to-back calls (P copies, as SPEC times them) is traced after three warm-up replays.

    python tools/trace_chain.py router:1 pooler:1 router:1:nw=8:u=4
    python tools/trace_chain.py --define MUSE_SKIP_CORRECTIONS o_proj:16   (a variant, as tools/ab.py times them)
    python tools/trace_chain.py --build-only [--define NAME] router:1      (fill the extension cache)
    (cases: 'layer:m[:plain|compressed][:field=value...]', tools/cases.py; gemv_kernel and gemvz_kernel only:
    gemvt_kernel has no trace hooks)

Per case: the graph's time per call; then medians over the launches of: end of launch i-1 (its last CTA's last
timestamp) to the first CTA of launch i passing the wait; from there to launch i's last CTA end; how long
launch i's CTAs were resident before that release; and, per CTA after its release (clock64, converted with the
CTAs' own globaltimer / clock64 ratio): until the first weights are in registers (loaded before the wait; 0 when
they were there already), then the first x (an L2 read after the wait), the rest of the main loop, CTA barrier, split-K combine (CTAs that store / that do not),
store. Timestamps are thread 0's: the kernel's completion (every thread, memory flush) comes a little later.
"""
import os
import statistics
import sys

os.environ.setdefault("MUSE_BUILD", "0")   # this tool builds its own (traced) extension
import torch

import cases
import judge
import submission as S


def ctas_by_registers(regs, threads):
    """Resident CTAs per SM that the register file allows (65536 registers; a warp's registers are allocated in
    units of 256, i.e. per thread rounded up to a multiple of 8)."""
    per_warp = -(-regs * 32 // 256) * 256
    return 65536 // (per_warp * -(-threads // 32))


def occupancy_note(untraced, traced, plan, m, dual):
    """'' when the traced build holds as many CTAs per SM (by registers) as the untraced one, else a warning line:
    MUSE_TRACE adds registers, and where that changes the occupancy the trace describes a different kernel
    (2026-12-01: unpooler's Z3(8,1,1,2,4) 92 -> 114 registers, 2 -> 1 CTAs per SM)."""
    kind, args = cases.inst_of(plan.config, m, dual)
    threads = (plan.config.nw + (kind == "gemvz")) * 32           # gemvz: one more warp, the exception warp
    t = [int(v) for v in args]                                     # DUAL as 0 / 1
    fam = [f.name for f in S.FAMILIES].index(kind)
    a, b = untraced.attrs(fam, t), traced.attrs(fam, t)
    na, nb = ctas_by_registers(a[0], threads), ctas_by_registers(b[0], threads)
    if na == nb:
        return ""
    return (f"  WARNING: registers untraced {a[0]} / traced {b[0]}: {na} / {nb} CTAs per SM by registers; this trace "
            f"runs at a different occupancy than the untraced kernel")


SLOT_U64 = 14   # one CTA's slot: MUSE_TRACE's muse_trace_flush writes 14 u64 (7 float4 of the workspace)


def trace_region(L, m):
    """(first float4 of the CTA slots in L.ws, CTAs of one launch) for L's plan at m (see MUSE_TRACE in
    submission.KERNEL_SRC: the slots follow the split-K area, N/16 x S x 128 float4; SLOT_U64 a CTA)."""
    c = L.plan(m).config
    return L.N // 16 * c.s * 128, L.N // (16 * c.r) * c.s


def med(v):
    return statistics.median(v) if v else float("nan")


def p90(v):
    return sorted(v)[int(0.9 * (len(v) - 1))] if v else float("nan")


def analyse(launches):
    """launches: one [CTAs, SLOT_U64] int64 tensor of slots per launch, in launch (graph) order."""
    by = {i: t.tolist() for i, t in enumerate(launches)}
    if len(by) < 2:
        raise SystemExit(f"[trace] only {len(by)} launches recorded: nothing to compare")
    L = sorted(by)
    first_rel = {i: min(r[1] for r in by[i]) for i in L}
    start = {i: min(r[0] for r in by[i]) for i in L}
    end = {i: max(r[2] for r in by[i]) for i in L}
    gaps, crit, early, period = [], [], [], []
    for a, b in zip(L, L[1:]):
        gaps.append(first_rel[b] - end[a])
        crit.append(end[b] - first_rel[b])
        early.append(first_rel[b] - start[b])
        period.append(end[b] - end[a])
    ratio = med([(r[2] - r[0]) / (r[8] - r[3]) for i in L for r in by[i] if r[8] > r[3]])   # ns per cycle
    # clock64 columns: 3 start, 4 released, 5 partials, 6 barrier, 7 combined, 8 end, 9 weights in, 10 x in,
    # 12 gemvz's exception warp at the barrier (0: none)
    cta = [r for i in L for r in by[i]]
    ph = lambda j, k, sel=None, f=med: f([(r[3 + k] - r[3 + j]) * ratio for r in cta if sel is None or sel(r)])
    stored = lambda r: (r[11] >> 48) & 1
    # per SM (word 11 bits 32..47): when its last CTA of the launch ended, after the launch's first release, by
    # the number of the launch's CTAs it ran; and how long the last SM outlasts the median SM
    sm_end, tails = {}, []
    for i in L:
        ends = {}
        for r in by[i]:
            sm = (r[11] >> 32) & 0xFFFF
            n, e = ends.get(sm, (0, 0))
            ends[sm] = (n + 1, max(e, r[2]))
        for n, e in ends.values():
            sm_end.setdefault(n, []).append(e - first_rel[i])
        tails.append(end[i] - med([e for _, e in ends.values()]))
    gts = sorted({r[c] for r in cta for c in (0, 1, 2)})
    res = min((b - a for a, b in zip(gts, gts[1:]) if b > a), default=0)
    return {
        "launches": len(L), "ctas": len(cta) / len(L),
        "period": med(period), "gap": med(gaps), "crit": med(crit), "early": med(early),
        "wait": ph(0, 1), "loop": ph(1, 2), "barrier": ph(2, 3),
        "weights_in": ph(1, 6), "weights_in_p90": ph(1, 6, f=p90), "x_in": ph(6, 7), "loop_rest": ph(7, 2),
        "combine_store": ph(3, 4, lambda r: stored(r)), "combine_other": ph(3, 4, lambda r: not stored(r)),
        "store": ph(4, 5, lambda r: stored(r)), "ns_per_cycle": ratio, "gt_res": res,
        "sm_end": {n: (med(v), len(v) / len(L)) for n, v in sorted(sm_end.items())}, "sm_tail": med(tails),
        # the exception warp against streaming warp 0 (thread 0's partials) and the barrier's release
        "exc": [(r[12] - r[5]) * ratio for r in cta if r[12]], "exc_to_bar": [(r[6] - r[12]) * ratio for r in cta if r[12]],
        "w0_to_bar": [(r[6] - r[5]) * ratio for r in cta if r[12]],
    }


def run_case(spec, traced, untraced):
    """Trace one case with the traced build; untraced (the same build without MUSE_TRACE) gives occupancy_note its
    registers."""
    Ls, m, x = cases.prepare(spec, ext=traced)
    p = Ls[0].plan(m)
    inst = cases.inst_of(p.config, m, Ls[0].dual)
    if inst is None or inst[0] not in ("gemv", "gemvz"):
        print(f"[trace] {spec}: {p.path} {p.config} has no trace hooks; skipped", flush=True)
        return
    base, ctas = trace_region(Ls[0], m)
    for Lc in Ls:                                   # the traced build writes every CTA's slot after the split-K area
        Lc.ws = torch.zeros((base + SLOT_U64 // 2 * ctas, 4), dtype=torch.float32, device=Lc.device)
    us = judge.per_call_us(S.kernel_fn, Ls, x, 10)
    g, _ = judge.capture(lambda: [S.kernel_fn(x, Lc) for Lc in Ls])
    for _ in range(3):
        g.replay()
    for Lc in Ls:
        Lc.ws[base:].zero_()                        # a slot the traced replay did not write stays zero
    g.replay()
    torch.cuda.synchronize()
    launches = [Lc.ws[base:].contiguous().view(torch.int64).view(ctas, SLOT_U64).cpu() for Lc in Ls]
    missing = sum(int((t[:, 2] == 0).sum()) for t in launches)
    if missing:
        raise SystemExit(f"[trace] {spec}: {missing} CTA slots were not written")
    a = analyse(launches)
    note = occupancy_note(untraced, traced, p, m, Ls[0].dual)
    print(f"[trace] {spec}: {p.path} {p.config}; {a['launches']} launches x {a['ctas']:.0f} CTAs; "
          f"graph {us:.2f} us per call (traced build)", flush=True)
    print(f"  per launch (globaltimer, medians): end to end {a['period'] / 1e3:.2f} us = previous launch's last "
          f"CTA end -> first release {a['gap'] / 1e3:.2f} us + release -> last CTA end {a['crit'] / 1e3:.2f} us; "
          f"CTAs resident {a['early'] / 1e3:.2f} us before the release", flush=True)
    print(f"  per CTA (clock64 at {1 / a['ns_per_cycle']:.2f} GHz, medians): start -> wait released "
          f"{a['wait'] / 1e3:.2f} us; main loop {a['loop'] / 1e3:.2f} us (first weights in "
          f"{a['weights_in'] / 1e3:.2f} (p90 {a['weights_in_p90'] / 1e3:.2f}), then first x {a['x_in'] / 1e3:.2f}, rest {a['loop_rest'] / 1e3:.2f}); CTA barrier {a['barrier'] / 1e3:.2f} us; "
          f"combine {a['combine_store'] / 1e3:.2f} us (storing CTAs) / {a['combine_other'] / 1e3:.2f} us (others); "
          f"store {a['store'] / 1e3:.2f} us; globaltimer step {a['gt_res']} ns", flush=True)
    per_n = "; ".join(f"{n} CTA{'s' if n > 1 else ''}: {e / 1e3:.2f} us ({k:.0f} SMs)" for n, (e, k) in a["sm_end"].items())
    print(f"  per SM (globaltimer, medians): last CTA end after the release, by the launch's CTAs on the SM: {per_n}; "
          f"last SM end - median SM end {a['sm_tail'] / 1e3:.2f} us", flush=True)
    if a["exc"]:
        late = sum(v > 0 for v in a["exc"]) / len(a["exc"])
        last = sum(v < 100 for v in a["exc_to_bar"]) / len(a["exc_to_bar"])
        print(f"  exception warp (gemvz, per CTA, medians): at the barrier {med(a['exc']) / 1e3:+.2f} us after streaming "
              f"warp 0 (p90 {p90(a['exc']) / 1e3:+.2f}; later than warp 0 in {late:.0%} of CTAs); barrier released "
              f"{med(a['exc_to_bar']) / 1e3:.2f} us after it (within 0.1 us in {last:.0%} of CTAs); warp 0 waited "
              f"{med(a['w0_to_bar']) / 1e3:.2f} us", flush=True)
    if note:
        print(note, flush=True)


def main(argv):
    defines, build_only = [], False
    while argv and argv[0].startswith("--"):
        if argv[0] == "--define" and len(argv) > 1:
            defines += cases.variant_defines(argv[1])
            argv = argv[2:]
        elif argv[0] == "--build-only":
            build_only, argv = True, argv[1:]
        else:
            raise SystemExit(f"[trace] cannot read {argv[0]!r}: expected --define NAME or --build-only, then cases")
    if not argv:
        raise SystemExit("[trace] expected cases after the options")
    if not torch.cuda.is_available():
        print("[trace] needs a CUDA device")
        return 1
    plans = [cases.planned(s) for s in argv]
    traced = cases.build(("MUSE_TRACE", *defines), plans)
    untraced = cases.build(defines, plans)          # the same kernels' registers without the hooks (occupancy_note)
    if build_only:
        return 0
    if defines:
        print(f"[trace] variant: {' '.join(defines)}", flush=True)
    for spec in argv:
        run_case(spec, traced, untraced)
        torch.cuda.empty_cache()                    # the case's copies are gone with run_case's frame
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
