"""GPU tests of PIPE 6 (gemvw_kernel: warpgroup MMA, x staged in shared memory) on every compressed layer, whether
or not the tables pick it: SPEC accuracy and exact probes (exception columns first) at m = 9..32, the cluster
and ticket split-K, the exception warp's corrections, determinism, graph replays and a chain under PDL. The
kernels come from an extension of their own (tune.py's build), swapped in for this module only."""
import pytest
import torch

import judge

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200)")

import submission as S
import tune

DEV = "cuda"
NAMES = ["qkv_gate", "o_proj", "pooler", "unpooler"]
INSTS = [("gemvz", (nw, ug, nb, 1, 6)) for nw in (4, 8) for nb in (2, 4) for ug in (1, 2)]


@pytest.fixture(scope="module")
def wgmma_ext():
    old = S._EXT
    S._EXT = tune.build_tune_ext(INSTS)
    yield S._EXT
    S._EXT = old


@pytest.fixture(scope="module")
def layers(wgmma_ext):
    out = {}
    for i, name in enumerate(NAMES):
        d = judge.LAYERS[name]
        w = judge.trained_like(d["N"], d["K"], 31 + i, DEV, torch.bfloat16)
        L = S.prepare(name, w)
        assert L.z is not None, L.describe()
        out[name] = (L, w)
    return out


@pytest.fixture(scope="module")
def suite():
    return judge.Suite(S, torch.device(DEV), log=lambda s: None)


def configs(name, m):
    """PIPE 6 configs that fit (name, m): NW 4 and 8 at the smallest S whose x slice fits, that S with the cluster
    (cl=2) and the ticket (cl=0), twice that S, and that S with two groups a trip (UG=2)."""
    d = judge.LAYERS[name]
    out = []
    for nw in (4, 8):
        s = 1
        base = S.GemvzConfig(nw=nw, s=1, ug=1, r=1, pipe=6, pf=0, pdl=1, cl=0)
        while s <= 64 and S.gemvz_fits(base._replace(s=s), d["N"], d["K"], m):
            s *= 2
        if s > 64:
            continue
        out += [base._replace(s=s, cl=2 if s > 1 else 0)]
        if s > 1:
            out += [base._replace(s=s, cl=0)]
        for c2 in (base._replace(s=2 * s, cl=2), base._replace(s=s, ug=2, cl=2 if s > 1 else 0)):
            if not S.gemvz_fits(c2, d["N"], d["K"], m):
                out.append(c2)
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("m", [9, 16, 17, 32])
def test_pipe6_is_accurate_and_probes_are_exact(layers, suite, name, m):
    L, w = layers[name]
    cfgs = configs(name, m)
    assert cfgs, f"no PIPE 6 config fits {name} m={m}"
    for c in cfgs:
        L.set_config(m, c)
        assert L.plan(m).path == "compressed" and L.plan(m).config == c
        suite.accuracy(L, w, m, 100 + m, f"{name} {c}")
        suite.probes(L, w, m, 7 * m, f"{name} {c}")


@pytest.mark.parametrize("name", NAMES)
def test_pipe6_corrections_are_needed_and_applied(layers, suite, name):
    L, w = layers[name]
    k = L.exception_columns()[0]
    m = 16
    L.set_config(m, configs(name, m)[0])
    x = torch.zeros(m, L.K, dtype=torch.bfloat16, device=DEV)
    x[:, k] = 1.0
    judge.check_probe(suite.call(x, L)[m - 1], w[:, k], False, f"{name} PIPE 6 with corrections")
    L.dbg = 1
    try:
        wrong = suite.call(x, L)[m - 1]
    finally:
        L.dbg = 0
    assert not torch.equal(wrong.view(torch.int16), w[:, k].view(torch.int16)), "skipping corrections changed nothing"


@pytest.mark.parametrize("name", NAMES)
def test_pipe6_is_deterministic_and_graph_safe(layers, suite, name):
    L, _ = layers[name]
    for m in (16, 32):
        L.set_config(m, configs(name, m)[0])
        suite.determinism(L, m, 5, name)
        suite.graph_replay(L, m, 3, name)


def test_pipe6_chain_under_pdl_matches_eager(layers, suite):
    A, B = layers["pooler"][0], layers["unpooler"][0]      # pooler N=4096 feeds unpooler K=4096
    for m in (16, 32):
        A.set_config(m, configs("pooler", m)[0])
        B.set_config(m, configs("unpooler", m)[0])
        suite.chain_graph(A, B, m, 4)
