"""One kernel_fn launch per case, for Nsight Compute (tools/device.sh stage `ncu`): the layer's tuned plan, or
the plan with fields replaced, on trained-looking weights. Prints the cases in launch order (ncu numbers the
profiled gemv launches in that order).

    ncu -k regex:gemv python3 tools/ncu_case.py pooler:1 pooler:1:pf=1 router:1 pooler:1:plain
"""
import sys

import torch

import judge
import submission as S


def case(spec):
    """'layer:m[:plain|compressed][:field=value...]' -> (prepared layer, m, x)."""
    name, m, *rest = spec.split(":")
    m = int(m)
    d = judge.LAYERS[name]
    path = next((r for r in rest if r in ("plain", "compressed")), None)
    w = judge.trained_like(d["N"], d["K"], 7, "cuda", torch.float32 if d["dtype"] == "fp32" else torch.bfloat16)
    L = S.prepare(name, w, path=path)
    fields = {k: int(v) for k, v in (r.split("=") for r in rest if "=" in r)}
    if fields:
        L.set_config(m, L.plan(m).config._replace(**fields))
    return L, m, judge.fresh_x(m, d["K"], 11, "cuda")


def main(specs):
    cases = [(s, *case(s)) for s in specs]
    torch.cuda.synchronize()
    for i, (spec, L, m, x) in enumerate(cases):
        p = L.plan(m)
        print(f"[ncu case {i}] {spec}: {p.path} {p.config}", flush=True)
        S.kernel_fn(x, L)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
