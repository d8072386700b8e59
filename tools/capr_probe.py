"""What one row's exceptions cost the compressed path: trained-looking weights with c out-of-window weights planted in
one row (capr, the most exceptions of any row, then >= c), the planner's compressed plan and the plain path's plan
timed as SPEC times (P copies >= 2 GB), checked first.

    python3 tools/capr_probe.py --layers gemma-2b.down,o_proj --m 1,16 --c 0,16,32,64,128,256 --json $OUT/capr.json
    python3 tools/capr_probe.py --coop --layers gemma-2b.down,qwen2-7b.down --m 1,16 --c 0,64,176   # the coop walk too

Why (session 19): heavy-tailed weights (Student-t, 3 dof) at about 0.04% out of window ran gemma-2b.down m = 1 at 12.8 us
with one draw (capr 18) and 26.8 us with another (capr 126; plain 17.7): the rate is the same, the worst row is not.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root
import torch  # noqa: E402

import judge  # noqa: E402
import submission as S  # noqa: E402


def planted(N, K, c, seed=7):
    """Trained-looking [N, K] weights with c weights of row N // 2 set to 4.0 (about 2^8 above the row's bulk, outside
    any window that holds the bulk) at c columns spread over K."""
    w = judge.trained_like(N, K, seed, "cuda")
    if c:
        cols = torch.linspace(0, K - 1, c).round().long().to(w.device)
        w[N // 2, cols] = 4.0
    return w


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="gemma-2b.down")
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--c", default="0,16,32,64,128,256")
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--json", default=None)
    ap.add_argument("--coop", action="store_true",
                    help="also time the compressed plan with the cooperative walk (its PIPE + 8: coop_walk)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("[capr] needs a CUDA device")
        return 1
    ms = [int(v) for v in args.m.split(",")]
    rows = []
    shapes = {n: d for s in judge.SHAPE_SETS.values() for n, d in s.items()}
    for name in args.layers.split(","):
        d = shapes[name]
        N, K = d["N"], d["K"]
        for c in (int(v) for v in args.c.split(",")):
            w = planted(N, K, c)
            P = judge.copies_for(N * K * 2)
            Lz = [S.prepare(name, w, path="compressed") for _ in range(P)]
            Lp = [S.prepare(name, w, path="plain") for _ in range(P)]
            Lc = []
            if args.coop:     # the same plans with the cooperative walk (the shipped build has every twin)
                coop = {m: S.coop_twin(Lz[0].plan(m).config) for m in ms}
                Lc = [S.prepare(name, w, path="compressed") for _ in range(P)]
            for m in ms:
                x = judge.fresh_x(m, K, 11 + m, "cuda")
                ref = judge.reference(x, w)
                res = {}
                for L in Lc:
                    L.set_config(m, coop[m])
                for path, Ls in (("compressed", Lz), ("plain", Lp), ("coop", Lc)):
                    if not Ls:
                        continue
                    judge.check_close(S.kernel_fn(x, Ls[0]), ref, False, f"{name} c={c} m={m} {path}")
                    res[path] = min(judge.per_call_us(S.kernel_fn, Ls, x, args.replays) for _ in range(2))
                cfg = Lz[0].plan(m).config
                rows.append({"layer": name, "N": N, "K": K, "m": m, "c": c, "capr": Lz[0].z.capr,
                             "rate": Lz[0].z.n_exc / (N * K), "config": S.config_short(cfg), **res})
                coop_us = f"  coop walk {res['coop']:7.2f} us" if "coop" in res else ""
                print(f"[capr] {name:16s} m={m:2d} c={c:4d} capr {Lz[0].z.capr:4d} rate {100 * rows[-1]['rate']:.4f}% "
                      f"compressed {res['compressed']:7.2f} us ({S.config_short(cfg)})  plain {res['plain']:7.2f} us"
                      f"{coop_us}", flush=True)
            del Lz, Lp, Lc
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
