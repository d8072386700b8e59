"""The planner's data: every candidate kernel family x split-K S on a set of shapes, each checked and timed as SPEC
times (P copies >= 2 GB, one graph of back-to-back calls, median replay), with the grid's CTA count and the CTAs one
SM holds (from the compiled kernel's registers and shared memory). The rows fit the planner's cost model
(FINDINGS 13.3) and test it on shapes it was not fitted on.

    python3 tools/plan_grid.py --shapes public --m 1,16,32 --json $OUT/grid.json
    python3 tools/plan_grid.py --layers qkv_gate,o_proj --m 1 --families z8

Families (--families, comma list): the cost model's classes (submission.PLAN_MODELS; z8: compressed m <= 8, z16:
compressed 9..16, t32: gemvt at 17..32), each with all its families, at every S the planner prices
(submission.plan_candidates: the fit's domain). Weights: judge.py's trained-looking ones (--weights for others).
Writes one JSON row per timing as it goes (a run cut short by --budget-s keeps what it timed).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root
os.environ.setdefault("MUSE_BUILD", "0")   # built below with the candidates' instantiations only
import torch

import judge
import submission as S

SMS = S.hardware().sms
Z, T = S.GemvzConfig, S.GemvtConfig
# the candidates per class: the planner's cost-model families (submission.PLAN_MODELS), by class name
CLASS_NAMES = {("compressed", 1): "z8", ("compressed", 2): "z16", ("plain", 4): "t32"}
FAMILIES = {CLASS_NAMES[md.path, md.nb]: (md.nb, [f.config for f in md.families]) for md in S.PLAN_MODELS}


def threads_of(cfg):
    """Threads of one CTA: NW warps + the exception warp (gemvz) or the producer warp (gemvt)."""
    return 32 * (cfg.nw + (0 if isinstance(cfg, S.GemvConfig) else 1))


def dyn_smem(cfg, m):
    """Dynamic shared memory of one CTA: gemvt's ring (+ cbuf), or the register kernels' cluster cbuf."""
    nb = S.nb_of(m)
    if isinstance(cfg, T):
        return S.gemvt_smem(cfg.nw, cfg.st, nb, cfg.ka, cfg.s, cfg.cl)
    return (cfg.s - 1) * cfg.r * nb * 32 * 16 if cfg.cl else 0


def occupancy(ext, cfg, m, dual):
    """CTAs of this config one SM holds at once: registers (per warp, in units of 256), threads (2048), shared
    memory (228 KB per SM, 1 KB reserved per CTA), from the compiled kernel's attributes; None if not compiled."""
    kind, t = S.instance_of(cfg, m, dual)
    a = ext.attrs([f.name for f in S.FAMILIES].index(kind), list(t))
    if not a:
        return None
    regs, _, smem_static, _ = a
    threads = threads_of(cfg)
    warps = (threads + 31) // 32
    per_warp = ((regs * 32 + 255) // 256) * 256
    by_regs = 65536 // (per_warp * warps)
    dyn = dyn_smem(cfg, m)
    by_smem = S.hardware().smem_sm // (smem_static + dyn + 1024)
    return max(0, min(by_regs, 2048 // threads, by_smem, 32))


def candidates(N, K, m, families, plain=False, max_s=S.PLAN_MAX_S, max_ctas=S.PLAN_SPLIT_WAVES * SMS, ticket=False,
               uneven=None, plain_gemvt=0):
    """[(class name, config)] of every candidate the planner prices (submission.plan_candidates) in the classes named;
    with plain, at m <= 16 also the plain PLANNER rule's gemv config (planner_rule(..., 'plain'), class 'plain'; none
    where only the default rule fits), what the layer ran when the 12-bit path was refused before plain_gemvt; with
    plain_gemvt = n, at m <= 16 also the n gemvt candidates the m = 17..32 model prices cheapest (class 't16',
    submission.plan_priced's order, as plain_gemvt takes them): the plain path's other family."""
    path = "plain" if S.nb_of(m) == 4 else "compressed"
    out = [(CLASS_NAMES[md.path, md.nb], c) for md, _, c in S.plan_candidates(N, K, m, path, max_s, max_ctas, uneven)
           if CLASS_NAMES[md.path, md.nb] in families]
    if ticket:   # the split-K ticket beside each cluster candidate (the planner prices the cluster where it fits)
        out += [(f, c._replace(cl=0)) for f, c in list(out) if c.cl and not S.config_misfit(c._replace(cl=0), N, K, m)]
    if plain and path == "compressed":
        c = S.planner_rule(N, K, m, "plain")[0]   # the PLANNER rule's gemv (plain_gemvt may take gemvt instead)
        if c is not None:
            out.append(("plain", c))
    if plain_gemvt and path == "compressed":   # gemvt at m <= 16: the m = 17..32 class's candidates, cheapest first
        fit = [c for _, c, _ in S.plan_priced(N, K, 32, "plain") if not S.config_misfit(c, N, K, m)]
        out += [("t16", c) for c in fit[:plain_gemvt]]   # the first is plain_gemvt's pick
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="public", help="comma list of judge.SHAPE_SETS (scored, public)")
    ap.add_argument("--layers", default=None, help="comma list of layers of those sets (default: every bf16 one)")
    ap.add_argument("--m", default="1,16,32")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--weights", choices=tuple(judge.WEIGHTS), default="trained")
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds over a case's candidates; the fastest "
                    "kept (session 19: a first timing after a large preparation read 11-40%% slow)")
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--plain", action="store_true", help="at m <= 16 also time the plain path's plan")
    ap.add_argument("--plain-gemvt", type=int, default=0, metavar="N",
                    help="at m <= 16 also time the N gemvt configs the m = 17..32 model prices cheapest")
    ap.add_argument("--max-s", type=int, default=S.PLAN_MAX_S, help="widen the priced splits (data beyond the fit)")
    ap.add_argument("--max-ctas", type=int, default=S.PLAN_SPLIT_CTAS, help="widen the split grids' CTA cap")
    ap.add_argument("--uneven", action="store_true", help="price every uneven split of gemvz (data beyond the rule)")
    ap.add_argument("--ticket", action="store_true", help="also time the ticket (cl = 0) of every cluster candidate")
    ap.add_argument("--json", default=None)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    ms = [int(v) for v in args.m.split(",")]
    fams = args.families.split(",")
    bad = [f for f in fams if f not in FAMILIES]
    if bad:
        raise SystemExit(f"[grid] unknown families {bad}; expected {', '.join(FAMILIES)}")
    shapes = {}
    for sset in args.shapes.split(","):
        shapes.update({n: d for n, d in judge.SHAPE_SETS[sset].items() if d["dtype"] == "bf16"})
    if args.layers:
        want = args.layers.split(",")
        missing = [n for n in want if n not in shapes]
        if missing:
            raise SystemExit(f"[grid] unknown layers {missing}")
        shapes = {n: shapes[n] for n in want}
    work = {n: {m: candidates(d["N"], d["K"], m, fams, args.plain, args.max_s, args.max_ctas, args.ticket,
                              True if args.uneven else None, args.plain_gemvt) for m in ms}
            for n, d in shapes.items()}
    insts = sorted({S.instance_of(c, m, False) for n in work for m in work[n] for _, c in work[n][m]})
    print(f"[grid] {sum(len(v) for w in work.values() for v in w.values())} timings on {len(shapes)} shapes x m "
          f"{ms}; {len(insts)} instantiations", flush=True)
    ext = S.build_extension(insts=insts)
    if args.build_only or not torch.cuda.is_available():
        return 0
    rows = []

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                           "weights": args.weights, "rows": rows}, f, indent=1)

    for n, d in shapes.items():
        if time.time() - t0 > args.budget_s:
            print(f"[grid] budget spent: {n} and later shapes not timed", flush=True)
            break
        N, K = d["N"], d["K"]
        w = judge.WEIGHTS[args.weights](N, K, 7, "cuda", torch.bfloat16)
        Ls = [S.prepare(n, w, ext=ext) for _ in range(judge.copies_for(N * K * 2))]
        if Ls[0].z is None:
            print(f"[grid] {n}: not compressible ({Ls[0].z_note}); compressed candidates skipped", flush=True)
        for m in ms:
            x = judge.fresh_x(m, K, 11 + m, "cuda")
            ref = judge.reference(x, w)
            timed = {}
            for rnd in range(args.rounds):
                for fam, c in work[n][m]:
                    if isinstance(c, S.GemvzConfig) and Ls[0].z is None:
                        continue
                    if time.time() - t0 > args.budget_s:
                        break
                    for L in Ls:
                        L.set_config(m, c)
                    if rnd == 0:
                        judge.check_close(S.kernel_fn(x, Ls[0]), ref, False, f"{n} m={m} {c}")
                    us = judge.per_call_us(S.kernel_fn, Ls, x, args.replays)
                    timed.setdefault((fam, c), []).append(us)
            for (fam, c), uss in timed.items():
                occ, ctas = occupancy(ext, c, m, False), S.plan_grid_ctas(c, N)
                nbytes, us = Ls[0].bytes_read(m), min(uss)
                rows.append({"layer": n, "N": N, "K": K, "m": m, "family": fam, "kind": type(c).__name__,
                             "config": c._asdict(), "ctas": ctas, "occ": occ, "bytes": nbytes, "us": us, "rounds": uss})
                print(f"[grid] {n:18s} {N:6d} {K:6d} m={m:2d} {fam:4s} {S.config_short(c):36s} CTAs {ctas:5d} occ {occ} "
                      f"{us:8.2f} us {nbytes / us / 1e6:5.2f} TB/s  ({' '.join(f'{u:.2f}' for u in uss)})", flush=True)
            save()
        del Ls
        torch.cuda.empty_cache()
    save()
    print(f"[grid] {len(rows)} timings in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
