"""Bits a weight of session 25's quad-slot format if the escape entries sat at an address computable without a load
(FINDINGS 8.8, issue #41's reopening item 2), on the CPU: (a) as built (an anchor every 32 groups + a count a block),
(b) a fixed capacity a row block = the largest row block's entries, (c) a capacity at the 90th / 99th percentile of
the row blocks with the rest in an overflow list (an int32 start a row block). Run it on branch issue41-s25 (its
pack_z and judge's pruned weights):

    MUSE_BUILD=0 python3 experiments/escapes-s25/capstudy.py      # about a minute; prints a markdown table
"""
import math
import os
import sys

os.environ.setdefault("MUSE_BUILD", "0")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

import judge  # noqa: E402
import submission as S  # noqa: E402

NAMES = ("o_proj", "qkv_gate", "pooler", "unpooler")   # shapes from judge.LAYERS (tables/shapes.json)
KINDS = {"trained": judge.trained_like, "gaussian": judge.gaussian, "heavy": judge.heavy_tailed,
         "exc1": judge.outliers(0.01), "pruned30": judge.WEIGHTS["pruned30"]}


def main():
    print("| layer | weights | escapes | entries a row block: mean, p90, p99, max | as built | fixed = max "
          "| p90 + overflow | p99 + overflow |")
    print("|---|---|---|---|---|---|---|---|")
    for layer in NAMES:
        N, K = judge.LAYERS[layer]["N"], judge.LAYERS[layer]["K"]
        for kind, gen in KINDS.items():
            if layer in ("qkv_gate", "unpooler") and kind != "trained":
                continue
            z = S.pack_z(gen(N, K, 11))
            RB, KG, nw = N // 16, K // 64, N * K
            per = (z.eoff[:, KG] - z.eoff[:, 0]).double()
            base = z.stream.numel() + z.tab.numel()
            mx = per.max().item()
            fixed = 8 * (base + 2 * mx * RB + RB * KG) / nw

            def overflow(q):
                c = math.ceil(torch.quantile(per, q).item())
                over = (per - c).clamp(min=0).sum().item()
                return 8 * (base + 2 * c * RB + 2 * over + 4 * (RB + 1) + RB * KG) / nw, (per > c).float().mean().item()

            (b90, f90), (b99, f99) = overflow(0.9), overflow(0.99)
            print(f"| {layer} | {kind} | {100 * z.n_esc / nw:.4f}% | {per.mean():.1f}, {torch.quantile(per, .9):.0f}, "
                  f"{torch.quantile(per, .99):.0f}, {mx:.0f} | {S.bits_per_weight(z, N, K):.4f} | {fixed:.4f} | "
                  f"{b90:.4f} ({100 * f90:.0f}% of row blocks overflow) | {b99:.4f} ({100 * f99:.0f}%) |", flush=True)


if __name__ == "__main__":
    main()
