"""The 12-bit format on weights of several distributions: exception rate, bits per weight, whether prepare
compresses, and the time of both paths (issue #29; GPU, SPEC timing).

    python3 tools/format_bench.py                                  # o_proj and pooler, every distribution, m = 1, 16
    python3 tools/format_bench.py --layers pooler --weights gaussian,rowscaled --m 1

For each (layer, weights): the layer prepared as the submission prepares it (which path each m takes, and why), then
P copies (SPEC: >= 2 GB of weights) forced onto the compressed path and P forced onto the plain path, each timed as
SPEC times it at every m, after a check of its output against the float64 reference. The compressed copies are forced
(prepare lifts the exception limits MAX_EXC_RATE, MAX_CAPR then), so a rate prepare refuses is timed too. Weights:
judge.py's (trained, gaussian, heavy, rowscaled) and Gaussian with a share p of weights planted far above every
window (judge.outliers: p out of window, plus Gaussian's own): exc0.01, exc0.1, exc0.2, exc0.3, exc1 (p = 0.01% ..
1%). Writes results/format-<date>-<sha>.json: rows {weights, layer, N, K, bits_per_weight, exception_rate,
windows_moved, compressed (what prepare chose at m = 1), why, m, us_compressed, us_plain, us_chosen, faster}.
"""
import argparse
import datetime
import json
import os
import sys

os.environ.setdefault("MUSE_BUILD", "1")
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import judge  # noqa: E402
import submission as S  # noqa: E402


WEIGHTS = dict(judge.WEIGHTS, **{f"exc{q:g}": judge.outliers(q / 100) for q in (0.01, 0.1, 0.2, 0.3, 1)})


def forced(name, w, path, n):
    """n copies of the layer forced onto path (prepare's path='compressed' lifts the exception limits)."""
    return [S.prepare(name, w, path=path) for _ in range(n)]


def bench(name, kind, ms, replays, log):
    d = judge.LAYERS[name]
    N, K = d["N"], d["K"]
    w = WEIGHTS[kind](N, K, 31, "cuda")
    L = S.prepare(name, w)                                  # what the submission does with these weights
    P = judge.copies_for(N * K * 2)
    Lz = forced(name, w, "compressed", P)
    Lp = forced(name, w, "plain", P)
    z = Lz[0].z
    rate, bits = z.n_exc / (N * K), 12 + S.side_table_bits(z, N, K)     # stream + row windows + side table
    log(f"[format] {name} {kind}: {100 * rate:.4f}% out of window (row windows start at class "
        f"{int(z.zbase.min())}..{int(z.zbase.max())}, {z.moved} moved for exactness), {bits:.4f} bit/weight; "
        f"prepare: {L.z_note}")
    rows = []
    for m in ms:
        x = judge.fresh_x(m, K, 77 + m, "cuda")
        ref = judge.reference(x, w)
        us = {}
        for path, Ls in (("compressed", Lz), ("plain", Lp)):
            judge.check_close(S.kernel_fn(x, Ls[0]), ref, False, f"{name} {kind} m={m} {path}")
            us[path] = judge.per_call_us(S.kernel_fn, Ls, x, replays)
        chosen = L.plan(m).path
        row = {"weights": kind, "layer": name, "N": N, "K": K, "bits_per_weight": round(bits, 4),
               "exception_rate": round(rate, 6), "windows_moved": z.moved, "max_exc_row": z.capr,
               "compressed": chosen == "compressed", "why": L.plan(m).why if chosen != "compressed" else L.z_note,
               "m": m, "us_compressed": round(us["compressed"], 3), "us_plain": round(us["plain"], 3),
               "us_chosen": round(us.get(chosen, float("nan")), 3),
               "faster": min(us, key=us.get)}
        rows.append(row)
        log(f"[format]   m={m:<2} compressed {us['compressed']:6.2f} us  plain {us['plain']:6.2f} us  prepare chose "
            f"{chosen}{'' if chosen == row['faster'] else '  (NOT the faster path)'}")
    del Lz, Lp, L
    torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="o_proj,pooler")
    ap.add_argument("--weights", default=",".join(WEIGHTS))
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("[format] needs a CUDA device (an H100 or H200)")
        return 1
    layers, kinds = args.layers.split(","), args.weights.split(",")
    for k in kinds:
        if k not in WEIGHTS:
            ap.error(f"--weights {k!r}: expected some of {', '.join(WEIGHTS)}")
    rows = []
    for name in layers:
        for kind in kinds:
            rows += bench(name, kind, [int(v) for v in args.m.split(",")], args.replays, lambda s: print(s, flush=True))
    date = datetime.date.today().isoformat()
    path = args.json or os.path.join(judge.ROOT, "results", f"format-{date}-{judge.git_sha()}.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "date": date, "submission_sha1": judge.submission_sha(),
                   "rows": rows}, f, indent=1)
    print(f"[format] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
