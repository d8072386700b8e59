"""One kernel_fn launch per case, for Nsight Compute (tools/device.sh stage `ncu`): the layer's tuned plan, or
the plan with fields replaced, on trained-looking weights. Prints the cases in launch order (ncu numbers the
profiled gemv launches in that order).

    ncu -k regex:gemv python3 tools/ncu_case.py pooler:1 pooler:1:pf=1 router:1 pooler:1:plain
    ncu -k regex:gemv python3 tools/ncu_case.py --define MUSE_NO_LAND_Z pooler:1

--define NAME[+NAME...]: run the cases on that compile-time variant (tools/ab_define.py builds it).
"""
import os
import sys

if sys.argv[1:2] == ["--define"]:
    os.environ.setdefault("MUSE_BUILD", "0")  # the variant is built instead of the shipped extension
import torch

import cases
import submission as S


def main(specs):
    if specs[:1] == ["--define"]:
        import ab_define
        S._EXT = ab_define.build(specs[1])
        specs = specs[2:]
    todo = []
    for spec in specs:
        Ls, m, x = cases.prepare(spec, copies=1)
        todo.append((spec, Ls[0], m, x))
    torch.cuda.synchronize()
    for i, (spec, L, m, x) in enumerate(todo):
        p = L.plan(m)
        print(f"[ncu case {i}] {spec}: {p.path} {p.config}", flush=True)
        S.kernel_fn(x, L)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
