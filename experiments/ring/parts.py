"""Issue #48 (session 28): gemvtz's time taken apart at pooler m = 32 on one card: the shipped kernel, the ring alone
(MUSE_TZ_EMPTY: consumers only wait and free), the corrections left out (MUSE_SKIP_CORRECTIONS), against gemvz's tuned
row, SPEC timing (copies >= 2 GB, one graph). Prints one line per variant."""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tools")]
import judge  # noqa: E402
import submission as S  # noqa: E402
import cases  # noqa: E402

M = 32
RING = S.GemvtzConfig(4, 2, 6, 2, 1, 2)
Z = S.GemvzConfig(nw=4, s=2, ug=1, r=1, loop=1, mb=2, walk=0, pf=0, pdl=1, cl=2)


def others():
    """The ring without its corrections against each other bf16 layer's tuned gemvz row (H100 rows, m = 32)."""
    rows = {"o_proj": (S.GemvzConfig(4, 1, 1, 1, 1, 2, 0, 0, 1, 0), S.GemvtzConfig(4, 1, 6, 2, 1, 0)),
            "unpooler": (S.GemvzConfig(4, 1, 1, 1, 1, 2, 0, 0, 1, 0), S.GemvtzConfig(4, 1, 6, 2, 1, 0)),
            "qkv_gate": (S.GemvzConfig(4, 3, 1, 2, 1, 0, 0, 0, 1, 2), S.GemvtzConfig(4, 3, 6, 2, 1, 2))}
    for name, (z, ring) in rows.items():
        d = judge.LAYERS[name]
        w = judge.trained_like(d["N"], d["K"], 99, "cuda", torch.bfloat16)
        x = judge.fresh_x(M, d["K"], 131, "cuda")
        P = judge.copies_for(3 * d["N"] * d["K"] // 2)
        for label, defines, cfg in (("gemvz row", (), z), ("gemvtz", (), ring),
                                    ("gemvtz no corrections", ("MUSE_SKIP_CORRECTIONS",), ring)):
            ext = cases.variant_extension(defines, [S.instance_of(cfg, M)])
            Ls = [S.prepare(name, w, path="compressed", ext=ext) for _ in range(P)]
            for L in Ls:
                L.set_config(M, cfg)
            print(f"[parts] {name} m={M} {label:<22} {cfg}: {judge.per_call_us(S.kernel_fn, Ls, x, 20):.2f} us", flush=True)
            del Ls
            torch.cuda.empty_cache()


def main():
    d = judge.LAYERS["pooler"]
    w = judge.trained_like(d["N"], d["K"], 99, "cuda", torch.bfloat16)
    x = judge.fresh_x(M, d["K"], 131, "cuda")
    P = judge.copies_for(3 * d["N"] * d["K"] // 2)
    for label, defines, cfg in (("gemvz row", (), Z), ("gemvtz", (), RING), ("gemvtz ring alone", ("MUSE_TZ_EMPTY",), RING),
                                ("gemvtz no corrections", ("MUSE_SKIP_CORRECTIONS",), RING),
                                ("gemvtz st=4 ka=1", (), RING._replace(st=4, ka=1)),
                                ("gemvtz st=4 ka=1 ring alone", ("MUSE_TZ_EMPTY",), RING._replace(st=4, ka=1))):
        ext = cases.variant_extension(defines, [S.instance_of(cfg, M)])
        Ls = [S.prepare("pooler", w, path="compressed", ext=ext) for _ in range(P)]
        for L in Ls:
            L.set_config(M, cfg)
        us = judge.per_call_us(S.kernel_fn, Ls, x, 20)
        print(f"[parts] pooler m={M} {label:<28} {cfg}: {us:.2f} us ({P} copies)", flush=True)
        del Ls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    others() if sys.argv[1:] == ["--others"] else main()
