"""Issue #42's first measurement: session 11's gemvtz_kernel (the 12-bit stream in gemvt's TMA ring, wgmma with A
from registers; removed in session 16) against gemvt_kernel (bf16, the shipped m = 32 path) at m = 32 on pooler and
unpooler, for ncu. It loads the submission of 116d358 (the last commit that had gemvtz) as a module, adds the gemvtz
instantiations its tables did not compile, prepares each layer both ways on trained-like weights, checks each output
against the float64 reference, then runs each path --calls times (ncu profiles those launches).

    mkdir -p bench_base && git show 116d358:submission.py > bench_base/submission_116d358.py
    ncu --set full -k regex:gemvt -c 8 -o $OUT/m32 python3 experiments/m32-profile/profile_gemvtz.py
    python3 experiments/m32-profile/profile_gemvtz.py --time        # SPEC timing instead (no ncu)

What to read (FINDINGS 12.1 has the old numbers: ring alone 13.1-13.3 us, the consumers add 2-3.5 us): per kernel the
DRAM throughput, the issue slots and the warp states of the consumer warps (wgmma wait, barrier, long scoreboard on
ld.shared), shared-memory bandwidth, and the tail (how long the last CTA runs after the others)."""
import argparse
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
import judge  # noqa: E402  (the weight generators and the reference)

OLD = os.path.join(ROOT, "bench_base", "submission_116d358.py")
# the gemvtz instantiations to add (NW, UG = stages, NB, R = tiles a stage, PIPE 6), as 116d358's GEMVZ_CONFIGS spells
# them: session 11's unpooler m = 32 winner (tune-2026-12-01-s11call8-m32.log) and a one-tile-a-stage variant
ADD = ("Z3(4, 4, 4, 2, 6)", "Z3(4, 8, 4, 1, 6)")
NAMES = ("pooler", "unpooler")   # shapes from judge.LAYERS (tables/shapes.json)


def load_old():
    if not os.path.exists(OLD):
        sys.exit(f"{OLD} is missing: git show 116d358:submission.py > bench_base/submission_116d358.py")
    os.environ["MUSE_BUILD"] = "0"                       # build below, with ADD compiled in
    spec = importlib.util.spec_from_file_location("sub116d358", OLD)
    S = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(S)
    anchor = "  Z3(16, 1, 1, 2, 4)\n"
    if anchor not in S.KERNEL_SRC:
        sys.exit("116d358's GEMVZ_CONFIGS list is not where this script expects it")
    src = S.KERNEL_SRC.replace(anchor, "  Z3(16, 1, 1, 2, 4) \\\n" + " \\\n".join("  " + a for a in ADD) + "\n")
    if torch.cuda.is_available():
        S._EXT = S.build_extension(src)
    return S


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--time", action="store_true", help="time each path (graph of copies) instead of bare calls")
    a = ap.parse_args()
    S = load_old()
    if not torch.cuda.is_available():
        sys.exit("needs the H200 (the source patch and the configs were checked)")
    dev = "cuda"
    m = 32
    cfgs = {"gemvtz 4 stages x 2 tiles": S.GemvzConfig(nw=4, s=2, ug=4, r=2, pipe=6, pf=0, pdl=1, cl=2),
            "gemvtz 8 stages x 1 tile": S.GemvzConfig(nw=4, s=2, ug=8, r=1, pipe=6, pf=0, pdl=1, cl=2)}
    for name in NAMES:
        N, K = judge.LAYERS[name]["N"], judge.LAYERS[name]["K"]
        w = judge.trained_like(N, K, 7, dev)
        x = judge.fresh_x(m, K, 8, dev)
        ref = judge.reference(x, w)
        runs = [("gemvt (shipped bf16 path)", S.prepare(name, w, path="plain"))]
        for label, c in cfgs.items():
            runs.append((label, S.prepare(name, w, path="compressed", ztable={(name, m): c})))
        for label, L in runs:
            out = S.kernel_fn(x, L)
            judge.check_close(out, ref, False, f"{name} m={m} {label}")
            print(f"[m32] {name} m={m} {label}: {L.plans[m].config} exact-enough; "
                  f"{'timing' if a.time else 'profiling'} {a.calls} calls", flush=True)
            if a.time:   # SPEC: copies of the layer (>= 2 GB of weights in all), one graph over them
                P = judge.copies_for(2 * N * K)
                Ls = [L] + [S.prepare(name, w, path=L.plans[m].path, ztable={(name, m): L.plans[m].config})
                            for _ in range(P - 1)]
                us = judge.per_call_us(S.kernel_fn, Ls, x, 20)
                print(f"[m32] {name} m={m} {label}: {us:.2f} us ({P} copies)", flush=True)
                del Ls
            else:
                for _ in range(a.calls):
                    S.kernel_fn(x, L)
                torch.cuda.synchronize()


if __name__ == "__main__":
    main()
