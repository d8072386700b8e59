"""The exception warp's cost: each compressed scored shape timed as SPEC says (P copies, one graph of P
back-to-back calls) with the corrections applied (dbg=0) and skipped (dbg=1, wrong results).

    python tools/exception_cost.py                          # every compressed row at m = 1, 8, 32
    python tools/exception_cost.py --m 8 16 --layers o_proj qkv_gate
"""
import argparse

import torch

import judge
import submission as S

BF16_LAYERS = [n for n, d in judge.LAYERS.items() if d["dtype"] == "bf16"]   # the ones prepare may compress

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--m", type=int, nargs="+", default=[1, 8, 32])
ap.add_argument("--layers", nargs="+", default=BF16_LAYERS, choices=BF16_LAYERS)
ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds of (with, skipped)")
args = ap.parse_args()

print(f"{'layer':<9} {'m':>2} {'capr':>4} {'with':>7} {'skipped':>8} {'cost':>6}  (capr: most exceptions in one row)")
for name in args.layers:
    d = judge.LAYERS[name]
    w = judge.trained_like(d["N"], d["K"], 99, "cuda")
    P = judge.copies_for(d["N"] * d["K"] * 2)
    Ls = [S.prepare(name, w) for _ in range(P)]
    for m in args.m:
        if Ls[0].plan(m).path != "compressed":
            print(f"{name:<9} {m:>2}  (the tables send this shape to the {Ls[0].plan(m).path} path)", flush=True)
            continue
        x = judge.fresh_x(m, d["K"], m, "cuda")
        for _ in range(args.rounds):
            t = []
            for dbg in (0, 1):
                for L in Ls:
                    L.dbg = dbg
                t.append(judge.per_call_us(S.kernel_fn, Ls, x, 30))
            print(f"{name:<9} {m:>2} {Ls[0].z.capr:>4} {t[0]:7.2f} {t[1]:8.2f} {t[0] - t[1]:+6.2f}", flush=True)
    del Ls
    torch.cuda.empty_cache()
