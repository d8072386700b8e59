"""Where compressed PIPE 6 (gemvtz_kernel) spends its time. Compile-time variants each drop one part of the
consumer loop (wrong results on purpose: their lines say UNCHECKED); the shipped kernel is checked against the
float64 reference, then timed as it is and with its exceptions skipped (dbg = 1, wrong too); gemvt_kernel (plain
PIPE 6, bf16 tiles) gives the same shape's reference. Timing as SPEC (P copies, one graph of P back-to-back
calls), every line in two interleaved rounds.

    python tools/tz_probe.py --build-only                 (fill the extension cache: tools/device.sh prebuild)
    python tools/tz_probe.py pooler:32 unpooler:32 o_proj:16 pooler:1

Variants (macros in gemvtz_kernel's consumer loop), each also timed with dbg = 1 (no patches):
    MUSE_TZ_NODEC   no decode (the raw words go to wgmma as A)
    MUSE_TZ_EMPTY   the consumers only wait for each stage and free it: the ring's own rate
(Session 10's first runs also had MUSE_TZ_NOMMA and MUSE_TZ_NOLDS, on the loop before it was software-pipelined;
session 11's MUSE_TZ_SELECT kept session 10's patch rounds for one A/B, git 5dd3481.)
Per case, the compressed and plain PIPE 6 configs are screened (3 replays) with the shipped kernel and the best of
each is timed for every variant.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("MUSE_BUILD", "0")   # the variants are built here
import torch

import ab_define
import judge
import submission as S
import tune

VARIANTS = ("", "MUSE_TZ_NODEC", "MUSE_TZ_EMPTY")
NBS = (1, 2, 4)


def variant_insts(variant):
    """The PIPE 6 instantiations: compressed, and plain too for the shipped variant."""
    return [i for i in tune.instances(NBS, [False], ("plain", "compressed") if not variant else ("compressed",))
            if i[1][-1] == 6]


def variant_source(variant):
    """ab_define's source of the variant, which must name MUSE_TZ_ macros only."""
    bad = [n for n in variant.split("+") if n and not n.startswith("MUSE_TZ_")]
    if bad:
        raise SystemExit(f"[tz] variant {variant!r}: {bad[0]!r} is not a MUSE_TZ_ macro")
    return ab_define.variant_source(variant)


def build(variant):
    """KERNEL_SRC with the variant's macros defined, as a tune-style extension of variant_insts(variant)."""
    saved = S.KERNEL_SRC
    S.KERNEL_SRC = variant_source(variant)
    try:
        return tune.build_tune_ext(variant_insts(variant), 4)
    finally:
        S.KERNEL_SRC = saved


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", default=["pooler:32", "unpooler:32", "o_proj:16", "pooler:1"])
    ap.add_argument("--variant", action="append", help="variants to time (default: all of VARIANTS)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args(argv)
    variants = args.variant or list(VARIANTS)
    if "" not in variants and not args.build_only:
        variants = [""] + variants
    t0 = time.time()
    exts = {v: build(v) for v in variants}
    print(f"[tz] {len(exts)} extensions ready in {time.time() - t0:.0f} s", flush=True)
    if args.build_only:
        return 0
    for spec in args.cases:
        name, m = spec.split(":")[0], int(spec.split(":")[1])
        d = judge.LAYERS[name]
        N, K = d["N"], d["K"]
        w = judge.trained_like(N, K, 5, "cuda")
        P = judge.copies_for(N * K * 2)
        S._EXT = exts[""]
        Ls = [S.prepare(name, w, path="compressed") for _ in range(P)]
        x = judge.fresh_x(m, K, 3 + m, "cuda")
        ref = judge.reference(x, w)
        best = {}
        for compressed in (True, False):
            cands = [c for c in tune.candidates(exts[""], N, K, m, False, compressed)[0] if c.pipe == 6]
            res = []
            for c in cands:
                try:
                    res.append((tune.time_config(Ls, m, c, x, 3), c))
                except RuntimeError as e:
                    print(f"[tz]     {c}: {e}", flush=True)
            res.sort(key=lambda r: r[0])
            best[compressed] = res[0][1]
            print(f"[tz] {spec} {'compressed' if compressed else 'plain'} PIPE 6: {len(cands)} configs screened, "
                  f"best {res[0][1]} {res[0][0]:.2f} us, next " +
                  ", ".join(f"{c.nw}/{c.u if hasattr(c, 'u') else c.ug}/{c.r}/s{c.s}: {t:.2f}" for t, c in res[1:4]),
                  flush=True)
        cz, cp = best[True], best[False]
        for L in Ls:
            L.set_config(m, cz)
        judge.check_close(S.kernel_fn(x, Ls[0]), ref, False, f"{spec} {cz}")
        rows = [("gemvt (plain PIPE 6)", "", cp, 0), ("gemvtz shipped", "", cz, 0), ("gemvtz dbg=1 (exceptions skipped)", "", cz, 1)]
        rows += [(f"gemvtz {v}" + (" dbg=1" if dbg else ""), v, cz, dbg) for v in variants if v for dbg in (0, 1)]
        res = {r[0]: [] for r in rows}
        for _ in range(2):
            for label, v, c, dbg in rows:
                S._EXT = exts[v]
                for L in Ls:
                    L.dbg = dbg
                res[label].append(tune.time_config(Ls, m, c, x, args.replays))
        for L in Ls:
            L.dbg = 0
        mb = N * K * 1.5 / 1e6
        for label, v, c, dbg in rows:
            t = res[label]
            note = "" if (not v and not dbg) else "  UNCHECKED"
            rate = (N * K * 2 / 1e6 if c is cp else mb) / min(t)
            print(f"[tz] {spec:<12} {label:<40} {t[0]:7.2f} / {t[1]:7.2f} us  ({rate:.2f} TB/s of weights){note}",
                  flush=True)
        del Ls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
