"""Time one config field's values on tabled plans, as SPEC times (P copies >= 2 GB, one graph of P back-to-back
calls, median of the replays), each value measured in two interleaved rounds so the spread shows.

    python tools/sweep_field.py --field co --values -1,0,50,100 router:1 pooler:1 qkv_gate:32:plain
    python tools/sweep_field.py --field pdl --values 1,0 o_proj:1:s=2

A case is 'layer:m[:plain|compressed][:field=value...]' (tools/cases.py): the layer's plan for m, with the
fields replaced. Prints one line per case: the time of each value in both rounds, and the best value.
"""
import argparse
import sys

import torch

import cases
import judge
import submission as S


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--field", required=True)
    ap.add_argument("--values", required=True, help="comma-separated integers")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("cases", nargs="+")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("[sweep] needs a CUDA device")
        return 1
    values = [int(v) for v in args.values.split(",")]
    for spec in args.cases:
        Ls, m, x = cases.prepare(spec)
        P = len(Ls)
        base = Ls[0].plan(m).config
        if base is None or not hasattr(base, args.field):
            print(f"[sweep] {spec}: plan {Ls[0].plan(m)} has no field {args.field!r}; skipped", flush=True)
            continue
        ref = judge.reference(x, Ls[0].weight)
        res = {v: [] for v in values}
        for _ in range(2):
            for v in values:
                cfg = base._replace(**{args.field: v})
                for L in Ls:
                    L.set_config(m, cfg)
                try:                                # SPEC's tolerance: any field may change the summation order
                    judge.check_close(S.kernel_fn(x, Ls[0]), ref, Ls[0].dual, f"{spec} {args.field}={v}")
                except judge.CheckFailed as e:
                    raise SystemExit(f"[sweep] wrong result: {e}") from None
                ms, _ = judge.time_graph([lambda L=L: S.kernel_fn(x, L) for L in Ls], args.replays)
                res[v].append(ms * 1e3 / P)
        best = min(values, key=lambda v: min(res[v]))
        cols = "  ".join(f"{args.field}={v}: {res[v][0]:.2f}/{res[v][1]:.2f}" for v in values)
        print(f"[sweep] {spec} {Ls[0].plan(m).path} {base}: {cols}  best {args.field}={best}", flush=True)
        del Ls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
