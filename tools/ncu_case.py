"""One kernel_fn launch per case, for Nsight Compute (tools/device.sh stage `ncu`): the layer's tuned plan, or
the plan with fields replaced, on trained-looking weights. Prints the cases in launch order (ncu numbers the
profiled gemv launches in that order).

    ncu -k regex:gemv python3 tools/ncu_case.py pooler:1 pooler:1:pf=1 router:1 pooler:1:plain
    ncu -k regex:gemv python3 tools/ncu_case.py --define MUSE_SKIP_CORRECTIONS pooler:1

--define NAME[+NAME...]: run the cases on that compile-time variant, built with the cases' instantiations only
(tools/cases.py; tools/ab.py times such variants).
"""
import os
import sys

if sys.argv[1:2] == ["--define"]:
    os.environ.setdefault("MUSE_BUILD", "0")  # the variant is built instead of the shipped extension
import torch

import cases
import submission as S


def main(specs):
    ext = None                                  # the shipped build
    if specs[:1] == ["--define"]:
        defines, specs = cases.variant_defines(specs[1]), specs[2:]
        ext = cases.build(defines, [cases.planned(s) for s in specs])
    todo = []
    for spec in specs:
        Ls, m, x = cases.prepare(spec, copies=1, ext=ext)
        todo.append((spec, Ls[0], m, x))
    torch.cuda.synchronize()
    for i, (spec, L, m, x) in enumerate(todo):
        p = L.plan(m)
        print(f"[ncu case {i}] {spec}: {p.path} {p.config}", flush=True)
        S.kernel_fn(x, L)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
