"""Time one config field's values on tabled plans, as SPEC times (P copies >= 2 GB, one graph of P back-to-back
calls, median of the replays), each value measured in two interleaved rounds so the spread shows.

    python tools/sweep_field.py --field co --values -1,0,50,100 router:1 pooler:1 qkv_gate:32:plain
    python tools/sweep_field.py --field pdl --values 1,0 o_proj:1:s=2

Values that do not fit a case's shape are skipped, with the reason. A case is 'layer:m[:plain|compressed][:field=value...]' (tools/cases.py): the layer's plan for m, with the
fields replaced. Prints one line per case: the time of each value in both rounds, and the best value.
"""
import argparse
import sys

import torch

import cases
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
        base = Ls[0].plan(m).config
        if base is None or not hasattr(base, args.field):
            print(f"[sweep] {spec}: plan {Ls[0].plan(m)} has no field {args.field!r}; skipped", flush=True)
            continue
        def apply(v, Ls=Ls, m=m, base=base):
            for L in Ls:
                L.set_config(m, base._replace(**{args.field: v}))

        why = {v: S.config_fits(base._replace(**{args.field: v}), Ls[0].N, Ls[0].K, m, Ls[0].dual) for v in values}
        ok = [v for v in values if why[v] is None]
        for v in values:
            if why[v]:
                print(f"[sweep] {spec}: {args.field}={v} skipped: {why[v]}", flush=True)
        if not ok:
            continue
        res = cases.time_interleaved(Ls, x, spec, ok, apply, lambda v: f"{args.field}={v}", args.replays, "sweep")
        cols, best = cases.summary(res, lambda v: f"{args.field}={v}")
        print(f"[sweep] {spec} {Ls[0].plan(m).path} {base}: {cols}  best {args.field}={best}", flush=True)
        Ls = None                                   # the case's copies go before the next case's
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
