"""A/B timing: cases under several choices, each timed as SPEC times (P copies >= 2 GB, one graph of P back-to-back
calls, median of the replays) in interleaved rounds, each checked against the float64 reference before it is timed.

    python tools/ab.py --variant '' --variant MUSE_SKIP_CORRECTIONS o_proj:1 pooler:8:compressed   # exception cost
    python tools/ab.py --field pf=0,1 router:1 qkv_gate:16:plain                # one config field's values
    python tools/ab.py --preps 3 --xallocs 3 o_proj:16 o_proj:16:plain          # the spread over memory placements
    python tools/ab.py --build-only --variant '' --variant MUSE_TRACE pooler:1  # fill the extension cache

A choice is one of each of:
  --variant V      a compile-time variant: '' (the shipped source) or NAME[+NAME...], macros defined before the
                   kernel source (repeat for more; default ''). Each variant is built with only the instantiations
                   its cases plan (seconds). A variant that defines an UNCHECKED macro (MUSE_SKIP_CORRECTIONS, or one
                   named by --unchecked) is wrong on purpose: it is timed without the output check and its column
                   says UNCHECKED. The exception warp's cost is --variant '' --variant MUSE_SKIP_CORRECTIONS.
  --field F=V,...  one config field's values, set on the case's plan (values that do not fit a case's shape are
                   skipped, with the reason).
  placement        --preps N preparations of the same case (same weights and x), all held at once so that each has
                   memory of its own, and preparation 0's copies with x copied into --xallocs fresh allocations at
                   other offsets: how far the time moves with memory placement alone. A placement that repeats its
                   time between rounds is placement; one that drifts with the others is time (clocks, temperature).
Cases: 'layer:m[:plain|compressed][:field=value...]' (tools/cases.py). Per case: one line per time taken, then the
summary: every choice's time in each round, the fastest, the largest change of one choice between rounds and, with
several placements, their median and range per variant and value.

Why one tool: the A/B of compile-time variants, the field sweep, the spread of preparations and the exception cost
were four scripts with four copies of the same rounds (issue #25). Why placements (session 15): o_proj m=16's
compressed time read 7.55-7.88 us over four preparations of the same data on one machine, plain 8.69-8.86, so one
compressed-against-plain ratio could read anywhere from about 9% to 15%.
"""
import argparse
import collections
import itertools
import os
import statistics
import sys

os.environ.setdefault("MUSE_BUILD", "0")   # the variants are built here, with the instantiations the cases need
import torch

import cases
import judge
import submission as S

# macros whose builds return wrong results on purpose (timing only): the exception warp's corrections skipped; and the
# router ablations of session 22 (FINDINGS 7.2): x fragments constants instead of loads, no split-K combine (CTA 0 of a
# row group stores its own partials), no griddepcontrol.wait (no dependency on the previous launch)
UNCHECKED = ("MUSE_SKIP_CORRECTIONS", "MUSE_ABL_NOX", "MUSE_ABL_NOCOMB", "MUSE_ABL_NOWAIT", "MUSE_TZ_EMPTY")
# one choice: variant (tuple of macro names), value of the swept field (None: no --field), preparation, x allocation
# (None: the preparation's own x)
Choice = collections.namedtuple("Choice", "variant value prep xalloc")


def parse_args(argv=None):
    """The command line, with variant = tuples of macro names, field = (name, [values]) or None; SystemExit naming
    what cannot be read."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", help="'' (shipped) or NAME[+NAME...]; repeat for more")
    ap.add_argument("--field", help="NAME=V1,V2,...: integer values of one config field")
    ap.add_argument("--preps", type=int, default=1, help="preparations of each case, all held at once")
    ap.add_argument("--xallocs", type=int, default=0, help="fresh x allocations timed on preparation 0")
    ap.add_argument("--unchecked", action="append", default=[], metavar="NAME",
                    help=f"a macro whose builds are wrong on purpose (timed unchecked), besides {', '.join(UNCHECKED)}")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every choice")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--build-only", action="store_true", help="build the variants' extensions, time nothing")
    ap.add_argument("cases", nargs="+")
    args = ap.parse_args(argv)
    args.variant = [cases.variant_defines(v) for v in dict.fromkeys(args.variant or [""])]
    if args.field is not None:
        name, _, vals = args.field.partition("=")
        try:
            values = list(dict.fromkeys(int(v) for v in vals.split(",")))
        except ValueError:
            values = []
        if not name or not values:
            raise SystemExit(f"[ab] --field {args.field!r}: expected NAME=V1,V2,... with integer values")
        args.field = name, values
    if args.preps < 1 or args.xallocs < 0 or args.rounds < 1:
        raise SystemExit(f"[ab] expected --preps >= 1, --xallocs >= 0, --rounds >= 1; got {args.preps}, "
                         f"{args.xallocs}, {args.rounds}")
    args.unchecked = set(UNCHECKED) | set(args.unchecked)
    for spec in args.cases:
        cases.parse(spec)
    return args


def choices(args):
    """Every choice: variants x field values x placements (the preparations, then preparation 0's x allocations)."""
    values = args.field[1] if args.field else [None]
    places = [(i, None) for i in range(args.preps)] + [(0, j) for j in range(args.xallocs)]
    return [Choice(v, val, p, xa) for v, val, (p, xa) in itertools.product(args.variant, values, places)]


def checker(args):
    """is_checked(choice): whether its output is checked; not when its variant defines a macro wrong on purpose."""
    return lambda c: not set(c.variant) & args.unchecked


def labeler(args):
    """label(choice, place=True): the parts that vary between the choices ('shipped' when none does); place=False
    leaves out the placement."""
    variants = len(args.variant) > 1 or args.variant != [()]
    places = args.preps > 1 or args.xallocs > 0

    def label(c, place=True):
        parts = ["+".join(c.variant) or "shipped"] if variants else []
        if args.field:
            parts.append(f"{args.field[0]}={c.value}")
        if places and place:
            parts.append(f"prep {c.prep}" + (f" x {c.xalloc}" if c.xalloc is not None else ""))
        return " ".join(parts) or "shipped"
    return label


def swept(p, field):
    """({value: config} of the field's values that fit the case, {value: why} of those that do not) for Planned p;
    without a field, {None: p.config}."""
    if field is None:
        return {None: p.config}, {}
    name, values = field
    if p.config is None or name not in p.config._fields:
        return {}, {v: f"the plan's config {p.config} has no field {name!r}" for v in values}
    cfgs = {v: p.config._replace(**{name: v}) for v in values}
    why = {v: S.config_misfit(c, p.N, p.K, p.m, p.dual) for v, c in cfgs.items()}
    return {v: c for v, c in cfgs.items() if why[v] is None}, {v: w for v, w in why.items() if w}


def build_all(args):
    """{variant: extension}, every variant with the same instantiations: those of each case's fitting configs."""
    plans = [cases.planned(s) for s in args.cases]
    plans = [p._replace(config=c) for p in plans for c in swept(p, args.field)[0].values()]
    return {v: cases.build(v, plans) for v in args.variant}


def check_output(Ls, x, ref, what):
    """The first copy's output against the float64 reference ref with SPEC's tolerance; SystemExit naming `what` on a
    wrong result."""
    try:
        judge.check_close(S.kernel_fn(x, Ls[0]), ref, Ls[0].dual, what)
    except judge.CheckFailed as e:
        raise SystemExit(f"[ab] wrong result: {e}") from None


def time_interleaved(spec, chosen, setup, label, replays, is_checked, rounds=2):
    """Each choice in `rounds` interleaved rounds: setup(choice) sets it up and returns the (copies, x) to time; the
    first copy's output is checked against the float64 reference with SPEC's tolerance (any choice may change the
    summation order) unless is_checked(choice) is False, then the copies are timed as SPEC times them, and the time
    is printed. Every choice computes the same product (same weights, same x), so one reference serves them all.
    Returns {choice: [us per round]}; SystemExit on a wrong result, naming the case and the choice."""
    ref, res = None, {c: [] for c in chosen}
    for r in range(rounds):
        for c in chosen:
            Ls, x = setup(c)
            if is_checked(c):
                ref = judge.reference(x, Ls[0].weight) if ref is None else ref
                check_output(Ls, x, ref, f"{spec} {label(c)}")
            res[c].append(judge.per_call_us(S.kernel_fn, Ls, x, replays))
            print(f"[ab] {spec} round {r + 1} {label(c)}: {res[c][-1]:.2f} us", flush=True)
    return res


def summary(res, label, is_checked=lambda c: True):
    """('label: round1/round2 ...' for every choice, UNCHECKED after those not checked; the fastest choice in any
    round; the largest change of one choice between rounds, us)."""
    cols = "  ".join(f"{label(c)}: {'/'.join(f'{t:.2f}' for t in ts)}{'' if is_checked(c) else ' UNCHECKED'}"
                     for c, ts in res.items())
    return cols, min(res, key=lambda c: min(res[c])), max(max(ts) - min(ts) for ts in res.values())


def placement_spread(res, label):
    """Per variant and field value with several placements: 'label: preparations median M us, range R; x allocations
    range Q' (a placement's time: its fastest round)."""
    groups = collections.defaultdict(dict)
    for c, ts in res.items():
        groups[label(c, place=False)][c.prep, c.xalloc] = min(ts)
    out = []
    for name, ts in groups.items():
        if len(ts) < 2:
            continue
        preps = [t for (_, xa), t in ts.items() if xa is None]
        xs = [t for (_, xa), t in ts.items() if xa is not None]
        line = (f"{name}: preparations median {statistics.median(preps):.2f} us, range "
                f"{max(preps) - min(preps):.2f}")
        out.append(line + (f"; x allocations range {max(xs) - min(xs):.2f}" if xs else ""))
    return out


def x_allocation(x, j):
    """A copy of x in a fresh allocation, offset by 128 B * (j + 1) + 16 B * j (16-B aligned, as kernel_fn needs)."""
    off = 64 * (j + 1) + 8 * j                      # bf16 elements
    buf = torch.empty(x.numel() + off, dtype=x.dtype, device=x.device)
    xj = buf[off:off + x.numel()].view_as(x)
    xj.copy_(x)
    return xj


def run_case(args, spec, exts, label):
    """Prepare the case's placements, time every choice that fits, print the summary."""
    want = cases.planned(spec)
    fit, skipped = swept(want, args.field)
    for v, why in skipped.items():
        print(f"[ab] {spec}: {args.field[0]}={v} skipped: {why}", flush=True)
    chosen = [c for c in choices(args) if c.value in fit]
    if not chosen:
        return
    first = exts[args.variant[0]]
    preps = [cases.prepare(spec, ext=first) for _ in range(args.preps)]   # all held: memory of its own each
    Ls, m, x = preps[0]
    if Ls[0].plan(m).config not in (want.config, S.coop_twin(want.config)):
        raise SystemExit(f"[ab] {spec}: prepare planned {Ls[0].plan(m)}, the build was made for {want.config} "
                         f"(the CPU's plan)")
    if Ls[0].plan(m).config != want.config and (not args.field or args.field[0] not in ("loop", "mb")):
        fit = {v: S.coop_twin(c) for v, c in fit.items()}   # the case's weights have a long row: every choice
        print(f"[ab] {spec}: its weights take the cooperative walk (PIPE + 8): {Ls[0].plan(m).why}", flush=True)
    xs = [x_allocation(x, j) for j in range(args.xallocs)]

    def setup(c):
        Ls, _, x = preps[c.prep]
        for L in Ls:
            L.ext = exts[c.variant]
            if args.field:
                L.set_config(m, fit[c.value])
        return Ls, x if c.xalloc is None else xs[c.xalloc]

    is_checked = checker(args)
    res = time_interleaved(spec, chosen, setup, label, args.replays, is_checked, args.rounds)
    cols, best, drift = summary(res, label, is_checked)
    moved = f"; largest change of one choice between rounds {drift:.2f} us" if args.rounds > 1 else ""
    print(f"[ab] {spec} {Ls[0].plan(m).path} {want.config}: {cols}  best {label(best)}{moved}", flush=True)
    for line in placement_spread(res, label):
        print(f"[ab] {spec} {line}", flush=True)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("[ab] needs a CUDA device")
        return 1
    exts = build_all(args)
    if args.build_only:
        return 0
    label = labeler(args)
    for spec in args.cases:
        run_case(args, spec, exts, label)
        torch.cuda.empty_cache()                    # the case's copies went with run_case's frame
    return 0


if __name__ == "__main__":
    sys.exit(main())
