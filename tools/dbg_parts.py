"""Where a compressed config's time goes: each case timed as SPEC times it (P copies >= 2 GB, one graph of P
back-to-back calls, two interleaved rounds) with the layer's debug bits set: 0 = the real kernel, 1 = the
exception warp's corrections skipped, 2 = (PIPE 6) the x staging skipped, 3 = both. Every value but 0 gives
wrong results on purpose (UNCHECKED). PIPE 6 configs run from an extension of all PIPE 6 instantiations
(tune.py's build), so they need no table row.

    python tools/dbg_parts.py --dbg 0,1,2,3 unpooler:32:compressed:pipe=6:nw=8:ug=2:s=4:cl=2:r=1
"""
import argparse
import os

os.environ.setdefault("MUSE_BUILD", "0")   # the extension is built below
import torch

import cases
import submission as S
import tune


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dbg", default="0,1,2,3", help="comma-separated debug values")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("cases", nargs="+")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("[dbg] needs a CUDA device")
        return 1
    vals = [int(v) for v in args.dbg.split(",")]
    S._EXT = tune.build_tune_ext([("gemvz", (nw, ug, nb, 1, 6)) for nw in (4, 8) for ug in tune.UGS for nb in (2, 4)])
    for spec in args.cases:
        Ls, m, x = cases.prepare(spec)

        def apply(v):
            for L in Ls:
                L.dbg = v
        res = cases.time_interleaved(Ls, x, spec, vals, apply, lambda v: f"dbg={v}", args.replays, "dbg", check=False)
        apply(0)
        cols, best = cases.summary(res, lambda v: f"dbg={v}")
        print(f"[dbg] {spec} {Ls[0].plan(m).config}: {cols}  UNCHECKED for dbg > 0", flush=True)
        Ls = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
