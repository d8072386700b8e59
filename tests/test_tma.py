"""GPU tests of PIPE 6 of the plain path (gemvt_kernel: a TMA ring of the natural weight and x, warpgroup MMA from
shared memory) on every bf16 layer, whether or not the tables pick it: SPEC accuracy and exact one-hot probes at
m = 1..32 (odd m too: x's rows past m come from the copy's zero fill), the cluster and ticket split-K, one and two
atoms a stage, determinism, graph replays and a chain under PDL. The kernels come from an extension of their own
(tune.py's build, the PIPE 6 instantiations only), swapped in for this module."""
import pytest
import torch

import judge

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200)")

import submission as S
import tune

DEV = "cuda"
NAMES = ["qkv_gate", "o_proj", "pooler", "unpooler"]
INSTS = [("gemv", (nw, st, nb, ka, False, 6)) for nw in (4, 8) for nb in (1, 2, 4) for st, ka in ((4, 1), (8, 2))]


@pytest.fixture(scope="module")
def tma_ext():
    old = S._EXT
    S._EXT = tune.build_tune_ext(INSTS)
    yield S._EXT
    S._EXT = old


@pytest.fixture(scope="module")
def layers(tma_ext):
    out = {}
    for i, name in enumerate(NAMES):
        d = judge.LAYERS[name]
        w = judge.trained_like(d["N"], d["K"], 41 + i, DEV, torch.bfloat16)
        out[name] = (S.prepare(name, w, path="plain"), w)
    return out


@pytest.fixture(scope="module")
def suite():
    return judge.Suite(S, torch.device(DEV), log=lambda s: None)


def configs(name, m):
    """PIPE 6 configs that fit (name, m): NW 4 and 8, (4 stages, 1 atom) and (8 stages, 2 atoms), at the S that
    gives about two CTAs per SM with the cluster (cl=2) and with the ticket (cl=0), and S = 1."""
    d = judge.LAYERS[name]
    out = []
    for nw in (4, 8):
        for st, ka in ((4, 1), (8, 2)):
            base = S.GemvConfig(nw=nw, s=1, u=st, r=ka, pipe=6, pf=0, pdl=1, cl=0)
            s = 1
            while d["N"] // (16 * nw) * s < 264 and not S.gemv_fits(base._replace(s=2 * s), d["N"], d["K"], m):
                s *= 2
            s3 = 3 * s // 2 if s > 1 else 3                                  # uneven: S does not divide K / 64
            for c in (base._replace(s=s, cl=2 if s > 1 else 0), base._replace(s=s, cl=0), base, base._replace(s=s3, cl=0),
                      base._replace(s=s3, cl=2)):
                if not S.gemv_fits(c, d["N"], d["K"], m) and c not in out:
                    out.append(c)
    return out


def test_pipe6_fits_rules():
    c = S.GemvConfig(nw=4, s=2, u=4, r=1, pipe=6, pf=0, pdl=1, cl=2)
    assert S.gemv_fits(c, 4096, 8192, 32) is None
    assert "DUAL" in S.gemv_fits(c, 256, 8192, 32, dual=True)
    assert "16*NW=64" in S.gemv_fits(c, 4080, 8192, 32)
    assert S.gemv_fits(c._replace(s=3), 4096, 8192, 32) is None          # uneven split-K: slices differ by a step
    assert "S=129" in S.gemv_fits(c._replace(s=129, cl=0), 4096, 8192, 32)
    assert "shared memory" in S.gemv_fits(c._replace(nw=8, u=12, r=2), 4096, 8192, 32)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("m", [1, 5, 9, 16, 17, 31, 32])
def test_pipe6_is_accurate_and_probes_are_exact(layers, suite, name, m):
    L, w = layers[name]
    cfgs = configs(name, m)
    assert len(cfgs) >= 6, f"too few PIPE 6 configs fit {name} m={m}: {cfgs}"
    for c in cfgs:
        L.set_config(m, c)
        assert L.plan(m).path == "plain" and L.plan(m).config == c
        suite.accuracy(L, w, m, 100 + m, f"{name} {c}")
        suite.probes(L, w, m, 7 * m, f"{name} {c}")


@pytest.mark.parametrize("name", NAMES)
def test_pipe6_is_deterministic_and_graph_safe(layers, suite, name):
    L, _ = layers[name]
    for m in (16, 32):
        for c in configs(name, m)[:2]:
            L.set_config(m, c)
            suite.determinism(L, m, 5, f"{name} {c}")
            suite.graph_replay(L, m, 3, f"{name} {c}")


def test_pipe6_chain_under_pdl_matches_eager(layers, suite):
    A, B = layers["pooler"][0], layers["unpooler"][0]      # pooler N=4096 feeds unpooler K=4096
    for m in (16, 32):
        for i in range(2):
            A.set_config(m, configs("pooler", m)[i])
            B.set_config(m, configs("unpooler", m)[i])
            suite.chain_graph(A, B, m, 4)


def test_pipe6_plans_pack_tiles_only(tma_ext):
    d = judge.LAYERS["o_proj"]
    w = judge.trained_like(d["N"], d["K"], 77, DEV, torch.bfloat16)
    L = S.prepare("o_proj", w, path="plain",
                  ctable={("o_proj", m): S.GemvConfig(8, 2, 4, 1, 6, 0, 1, 2) for m in (1, 2, 4, 8, 16, 32)})
    assert all(L.plan(m).config.pipe == 6 for m in range(1, 33)), L.describe()
    assert L.w is None, "PIPE 6 plans packed the weight for nothing"
    assert L.wt is not None and L.wn is None, "PIPE 6 reads pack_tma's tiles (and no natural copy is kept for it)"
    x = judge.fresh_x(32, d["K"], 5, DEV)
    judge.check_close(S.kernel_fn(x, L).float(), judge.reference(x, w), False, "o_proj PIPE 6 from prepare's tables")
