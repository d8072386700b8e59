"""A/B of compile-time variants of the kernel source: each variant is KERNEL_SRC with `#define NAME` lines
prepended (an empty variant is the shipped source), built as its own extension; every case is timed as SPEC
times it (P copies >= 2 GB, one graph of P back-to-back calls, median of the replays) with each variant in two
interleaved rounds, after a check of its output against the float64 reference.

    python tools/ab_define.py --variant '' --variant MUSE_NO_LAND_Z router:1 pooler:1 qkv_gate:1
    python tools/ab_define.py --build-only --variant MUSE_NO_LAND_Z      (fill the extension cache)

A variant may hold several names separated by '+'. Cases: 'layer:m[:plain|compressed][:field=value...]'
(tools/cases.py).
"""
import argparse
import os
import sys

os.environ.setdefault("MUSE_BUILD", "0")   # each variant is built here
import torch

import cases
import submission as S


def variant_source(variant):
    names = [n for n in variant.split("+") if n]
    for n in names:
        if not n.replace("_", "").isalnum():
            raise SystemExit(f"[ab] variant {variant!r}: {n!r} is not a macro name")
    return "".join(f"#define {n}\n" for n in names) + S.KERNEL_SRC


def build(variant):
    return S.build_extension(variant_source(variant))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="'' or NAME[+NAME...]")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--no-check", action="store_true",
                    help="time without checking the output (for variants that are wrong on purpose: a memory "
                         "pattern timed alone); every line then says UNCHECKED")
    ap.add_argument("cases", nargs="*")
    args = ap.parse_args(argv)
    for v in args.variant:
        variant_source(v)
    if not torch.cuda.is_available():
        print("[ab] needs a CUDA device")
        return 1
    ext = {v: build(v) for v in args.variant}
    if args.build_only:
        return 0
    label = lambda v: v or "shipped"
    for spec in args.cases:
        S._EXT = ext[args.variant[0]]
        Ls, m, x = cases.prepare(spec)
        res = cases.time_interleaved(Ls, x, spec, args.variant, lambda v: setattr(S, "_EXT", ext[v]), label,
                                     args.replays, "ab", check=not args.no_check)
        cols, best = cases.summary(res, label)
        print(f"[ab] {spec} {Ls[0].plan(m).path} {Ls[0].plan(m).config}: {cols}  best {label(best)}"
              f"{'  UNCHECKED' if args.no_check else ''}", flush=True)
        Ls = None                                   # the case's copies go before the next case's
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
