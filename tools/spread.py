"""How much one case's SPEC time moves when nothing but memory placement changes (a CUDA device, shipped build).

    python tools/spread.py o_proj:16 o_proj:16:plain --preps 3 --xallocs 4

For each case: --preps preparations, all held at once (so each has memory of its own; same weights and x), timed in
order; then the first one's copies with x copied into --xallocs fresh allocations at other offsets; then every
preparation a second time (a preparation that repeats its number is placement; one that drifts with the others is
time: clocks, temperature). Every timing is the median of --replays replays of one graph of the P back-to-back
calls (judge.time_graph), twice in a row. Each preparation's output is checked against the float64 reference first
(dbg rows excepted: they are wrong on purpose).

Why (NOTES.md, session 15): o_proj m=16's compressed time read 7.55-7.88 us over four preparations of the same data
on one machine, plain 8.69-8.86, so a single compressed-against-plain ratio (issue #4's 12%) can read anywhere from
about 9% to 15%.
"""
import argparse
import statistics
import sys

import torch

import cases
import judge
import submission as S


def timed(Ls, x, replays):
    return [judge.per_call_us(S.kernel_fn, Ls, x, replays) for _ in range(2)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--preps", type=int, default=3)
    ap.add_argument("--xallocs", type=int, default=3)
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("[spread] needs a CUDA device")
        return 1
    for spec in args.cases:
        check = "dbg=" not in spec
        preps, per_x = [], []
        for i in range(args.preps):                 # all kept: each preparation gets memory of its own
            Ls, m, x = cases.prepare(spec)
            if check:
                cases.check_output(Ls, x, None, spec, "spread")
            preps.append((Ls, x))
        first = []
        for i, (Ls, x) in enumerate(preps):
            t = timed(Ls, x, args.replays)
            first.append(t)
            print(f"[spread] {spec} preparation {i}: {t[0]:.2f}/{t[1]:.2f} us", flush=True)
        Ls, x = preps[0]
        keep = []                                   # held, so every x below gets an allocation of its own
        for j in range(args.xallocs):
            off = 64 * (j + 1) + 8 * j              # bf16 elements: 128 B steps plus 16 B * j (stays 16-B aligned)
            buf = torch.empty(x.numel() + off, dtype=x.dtype, device=x.device)
            xj = buf[off:off + x.numel()].view_as(x)
            xj.copy_(x)
            keep.append(buf)
            t = timed(Ls, xj, args.replays)
            per_x.append(t)
            print(f"[spread] {spec} preparation 0, x allocation {j} (+{2 * off} B): {t[0]:.2f}/{t[1]:.2f} us", flush=True)
        again = []
        for i, (Ls, x) in enumerate(preps):         # the second pass: placement repeats, drift over time does not
            t = timed(Ls, x, args.replays)
            again.append(t)
            print(f"[spread] {spec} preparation {i} again: {t[0]:.2f}/{t[1]:.2f} us", flush=True)
        med = lambda ts: statistics.median(min(t) for t in ts)
        rng = lambda ts: max(min(t) for t in ts) - min(min(t) for t in ts)
        delta = max(abs(min(a) - min(b)) for a, b in zip(first, again))
        print(f"[spread] {spec}: preparations median {med(first):.2f} us, range {rng(first):.2f}, largest change of one "
              f"preparation between passes {delta:.2f}; x allocations range {rng(per_x) if per_x else 0:.2f}", flush=True)
        del preps, keep, Ls, x
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
