"""A small back-to-back graph for compute-sanitizer (racecheck / synccheck): split-K plain (router-style
DUAL) through a non-portable cluster of 16 CTAs (cl=2, the mbarrier variant) and through the global ticket (cl=0),
compressed with exceptions through a cluster of 4 (cl=2), a chain where one layer reads the other's output, all
under PDL. SANITIZE_CL=0 puts the cl=2 layers on the ticket instead: compute-sanitizer's racecheck never finished a
cl=2 launch (FINDINGS, "sanitizers"; synccheck passes it), so device.sh runs racecheck on cl=0.
SANITIZE_MIN=1: only the smallest cl=2 case (device.sh stage racemin); SANITIZE_MIN=2: one cluster of two CTAs
(SANITIZE_PDL=0: without PDL). SANITIZE_TMA=1: gemvt_kernel (GemvtConfig: the TMA ring's full / empty mbarriers)
at m=32, uneven split-K through the ticket (S=3) feeding a layer split through a cluster (S=2, cl=2; the ticket with
SANITIZE_CL=0), the first layer twice in a row, all under PDL."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root: `python3 tools/x.py`
import judge  # noqa: E402
import submission as S  # noqa: E402

dev = "cuda"


def minimal_case():
    """The smallest cl=2 case: one compressed layer, S=2 (a cluster of 2, the mbarrier and st.async), two launches
    back to back under PDL. Returns (layers at their m, the graph's calls, their eager outputs)."""
    A = S.prepare("small_a", judge.trained_like(512, 1024, 2, dev), path="compressed")
    A.set_config(8, S.GemvzConfig(nw=4, s=2, ug=1, r=1, loop=1, mb=2, walk=0, pf=0, cl=2))
    xa = judge.fresh_x(8, 1024, 5, dev)
    y = S.kernel_fn(xa, A).clone()
    return [(8, A)], lambda: (S.kernel_fn(xa, A), S.kernel_fn(xa, A)), (y, y)


def tiny_case():
    """SANITIZE_MIN=2: one cluster (2 CTAs, cl=2) of a plain 16 x 1024 layer, two launches back to back under PDL:
    does racecheck finish the st.async + mbarrier protocol at all, at the smallest size it has?"""
    A = S.prepare("tiny", judge.trained_like(16, 1024, 3, dev), path="plain")
    A.set_config(8, S.GemvConfig(nw=4, s=2, u=1, r=1, loop=1, mb=2, pf=0, cl=2))
    A.pdl = os.environ.get("SANITIZE_PDL", "1") == "1"     # SANITIZE_PDL=0: the same launches without PDL
    xa = judge.fresh_x(8, 1024, 6, dev)
    y = S.kernel_fn(xa, A).clone()
    torch.cuda.synchronize()
    print("tiny case: the eager call's kernel has ended", flush=True)
    return [(8, A)], lambda: (S.kernel_fn(xa, A), S.kernel_fn(xa, A)), (y, y)


def full_case():
    R = S.prepare("router", judge.trained_like(256, 2048, 1, dev, torch.float32))            # split-K DUAL
    A = S.prepare("small_a", judge.trained_like(512, 1024, 2, dev), path="compressed")
    B = S.prepare("small_b", judge.trained_like(256, 512, 3, dev), path="plain")
    Rb = S.prepare("router_b", judge.trained_like(256, 2048, 6, dev, torch.float32))
    CL = int(os.environ.get("SANITIZE_CL", "2"))
    R.set_config(4, S.GemvConfig(nw=4, s=16, u=1, r=1, loop=1, mb=2, pf=0, cl=CL))
    Rb.set_config(4, S.GemvConfig(nw=4, s=16, u=1, r=1, loop=1, mb=2, pf=0, cl=0))
    A.set_config(8, S.GemvzConfig(nw=4, s=4, ug=1, r=1, loop=1, mb=2, walk=0, pf=0, cl=CL))
    x = judge.fresh_x(4, 2048, 4, dev)
    xa = judge.fresh_x(8, 1024, 5, dev)
    eager = (S.kernel_fn(x, R).clone(), S.kernel_fn(S.kernel_fn(xa, A), B).clone(), S.kernel_fn(x, Rb).clone())
    calls = lambda: (S.kernel_fn(x, R), S.kernel_fn(x, R), S.kernel_fn(S.kernel_fn(xa, A), B), S.kernel_fn(x, Rb))
    return [(4, R), (4, Rb), (8, A), (8, B)], calls, (eager[0], eager[0], eager[1], eager[2])


def tma_case():
    T1 = S.prepare("tma_a", judge.trained_like(512, 1024, 7, dev), path="plain")
    T2 = S.prepare("tma_b", judge.trained_like(256, 512, 8, dev), path="plain")
    T1.set_config(32, S.GemvtConfig(nw=4, s=3, st=4, ka=2, cl=0))      # 8 steps over 3 CTAs: 2, 3, 3
    T2.set_config(32, S.GemvtConfig(nw=4, s=2, st=4, ka=2, cl=int(os.environ.get("SANITIZE_CL", "2"))))
    x = judge.fresh_x(32, 1024, 9, dev)
    y1 = S.kernel_fn(x, T1).clone()
    y2 = S.kernel_fn(y1, T2).clone()
    calls = lambda: (S.kernel_fn(x, T1), S.kernel_fn(S.kernel_fn(x, T1), T2))
    return [(32, T1), (32, T2)], calls, (y1, y2)


if os.environ.get("SANITIZE_TMA"):
    layers, calls, eager = tma_case()
elif os.environ.get("SANITIZE_MIN") == "2":
    layers, calls, eager = tiny_case()
elif os.environ.get("SANITIZE_MIN"):
    layers, calls, eager = minimal_case()
else:
    layers, calls, eager = full_case()
for m, L in layers:
    print(L.describe().splitlines()[0], "|", L.plan(m))
print("capturing the graph", flush=True)
g, ys = judge.capture(calls)
print("captured", flush=True)
for i in range(3):
    g.replay()
    torch.cuda.synchronize()
    print(f"replay {i} done", flush=True)
assert all(torch.equal(y, e) for y, e in zip(ys, eager)), "graph != eager"
print("sanitize case: graph == eager")
