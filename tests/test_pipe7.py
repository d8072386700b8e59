"""GPU tests of PIPE 7 of the plain path (gemv_kernel with the CTA's whole weight slice bulk-copied into shared
memory before griddepcontrol.wait) on the router (DUAL: hi and lo, fp32 out) and on o_proj (bf16), whether or not
the tables pick it: SPEC accuracy and exact one-hot probes at m = 1..32 (odd m too), the same bits as PIPE 0 with
the same NW / U / R / S / cl (the same mma order per accumulator), the cluster and ticket split-K, determinism,
graph replays and a chain under PDL. The kernels come from an extension of their own (tune.py's build), swapped in
for this module."""
import pytest
import torch

import judge

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200)")

import submission as S
import tune

DEV = "cuda"
# (nw, u, r, s, cl): 128 CTAs of 64 KB (cl=2), 256 of 32 KB (ticket; cl=2 at S=16 is non-portable), 64 of 128 KB
CASES = [(8, 1, 1, 8, 2), (8, 1, 1, 16, 0), (8, 1, 1, 16, 2), (16, 2, 2, 8, 2), (4, 2, 1, 4, 0)]
OPROJ = [(8, 1, 1, 8, 2), (4, 2, 1, 4, 0)]     # the CASES o_proj's K / 32 = 64 blocks divide
INSTS = sorted({("gemv", (nw, u, nb, r, dual, p)) for dual, cases in ((True, CASES), (False, OPROJ))
                for nw, u, r, _, _ in cases for nb in (1, 2, 4) for p in (0, 7)})


@pytest.fixture(scope="module")
def p7_ext():
    old = S._EXT
    S._EXT = tune.build_tune_ext(INSTS)
    yield S._EXT
    S._EXT = old


@pytest.fixture(scope="module")
def layers(p7_ext):
    out = {}
    for i, name in enumerate(("router", "o_proj")):
        d = judge.LAYERS[name]
        dt = torch.float32 if d["dtype"] == "fp32" else torch.bfloat16
        w = judge.trained_like(d["N"], d["K"], 61 + i, DEV, dt)
        out[name] = (S.prepare(name, w, path="plain"), w)
    return out


@pytest.fixture(scope="module")
def suite():
    return judge.Suite(S, torch.device(DEV), log=lambda s: None)


def configs(name, m):
    d = judge.LAYERS[name]
    out = []
    for nw, u, r, s, cl in CASES:
        c = S.GemvConfig(nw=nw, s=s, u=u, r=r, pipe=7, pf=0, pdl=1, cl=cl)
        if S.config_fits(c, d["N"], d["K"], m, d["dtype"] == "fp32") is None:
            out.append(c)
    return out


def test_pipe7_fits_refuses_what_it_cannot_run():
    d = judge.LAYERS["router"]
    c = S.GemvConfig(nw=8, s=2, u=1, r=1, pipe=7, pf=0, pdl=1, cl=2)   # 2 x 16 x 4096 x 2 B x 2 = 512 KB a CTA
    assert "do not fit" in S.config_fits(c, d["N"], d["K"], 1, True)
    assert "pf must be 0" in S.config_fits(c._replace(s=8, pf=1), d["N"], d["K"], 1, True)


@pytest.mark.parametrize("name", ["router", "o_proj"])
@pytest.mark.parametrize("m", [1, 5, 8, 16, 17, 31, 32])
def test_pipe7_is_accurate_exact_and_gives_pipe0_bits(layers, suite, name, m):
    L, w = layers[name]
    cfgs = configs(name, m)
    assert len(cfgs) >= (4 if name == "router" else 2), f"too few PIPE 7 configs fit {name} m={m}: {cfgs}"
    x = judge.fresh_x(m, L.K, 300 + m, DEV)
    for c in cfgs:
        L.set_config(m, c)
        assert L.plan(m).config == c
        suite.accuracy(L, w, m, 500 + m, f"{name} {c}")
        suite.probes(L, w, m, 11 * m, f"{name} {c}")
        y7 = suite.call(x, L).clone()
        twin = c._replace(pipe=0)       # PIPE 0's cluster buffer must fit 48 KB; the ticket gives the same bits
        L.set_config(m, twin if S.config_fits(twin, L.N, L.K, m, L.dual) is None else twin._replace(cl=0))
        y0 = suite.call(x, L)
        assert torch.equal(y7.view(torch.int32 if y7.dtype == torch.float32 else torch.int16),
                           y0.view(torch.int32 if y0.dtype == torch.float32 else torch.int16)), \
            f"{name} m={m} {c}: PIPE 7 and PIPE 0 differ in {(y7 != y0).sum().item()} outputs"


@pytest.mark.parametrize("name", ["router", "o_proj"])
def test_pipe7_is_deterministic_and_graph_safe(layers, suite, name):
    L, _ = layers[name]
    for m in (1, 32):
        for c in configs(name, m)[:3]:
            L.set_config(m, c)
            suite.determinism(L, m, 5, f"{name} {c}")
            suite.graph_replay(L, m, 3, f"{name} {c}")


def test_pipe7_chain_under_pdl_matches_eager(layers, suite):
    """o_proj (N = 8192) feeds the router (K = 8192), both PIPE 7, back to back in one graph under PDL: the
    router's bulk copies (issued before its wait) overlap o_proj's run, and only weights are read before the wait,
    so y = router(o_proj(x)) replays as eager."""
    A, B = layers["o_proj"][0], layers["router"][0]
    for m in (1, 16, 32):
        for i in range(2):
            A.set_config(m, configs("o_proj", m)[i])
            B.set_config(m, configs("router", m)[i])
            suite.chain_graph(A, B, m, 4)
