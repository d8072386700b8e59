"""One kernel_fn launch per case, for Nsight Compute (tools/device.sh stage `ncu`): the layer's tuned plan, or
the plan with fields replaced, on trained-looking weights. Prints the cases in launch order (ncu numbers the
profiled gemv launches in that order).

    ncu -k regex:gemv python3 tools/ncu_case.py pooler:1 pooler:1:pf=1 router:1 pooler:1:plain
"""
import sys

import torch

import cases
import submission as S


def main(specs):
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
