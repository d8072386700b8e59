"""GPU tests of PIPE 6 of the plain path (gemvt_kernel: a TMA ring of the natural weight and x, warpgroup MMA from
shared memory) on every bf16 layer, whether or not the tables pick it: SPEC accuracy and exact one-hot probes at
m = 1..32 (odd m too: x's rows past m come from the copy's zero fill), the cluster and ticket split-K, one and two
atoms a stage, determinism, graph replays and a chain under PDL. The kernels come from an extension of their own
(tune.py's build, the PIPE 6 instantiations only), swapped in for this module. The compressed PIPE 6
(gemvtz_kernel: the 12-bit stream in the same ring, decoded into wgmma's A registers, its exceptions patched into
them) gets the same checks, probes on exception columns first, a check that its patches are needed and applied, and
a check that it returns the plain PIPE 6's bits (the tensor cores see the same operands in the same order)."""
import pytest
import torch

import judge

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200)")

import submission as S
import tune

DEV = "cuda"
NAMES = ["qkv_gate", "o_proj", "pooler", "unpooler"]
INSTS = [("gemv", (nw, st, nb, ka, False, 6)) for nw in (4, 8) for nb in (1, 2, 4) for st, ka in ((4, 1), (8, 2))]
INSTS += [("gemvz", (nw, st, nb, ka, 6)) for nw in (4, 8) for nb in (1, 2, 4) for st, ka in ((4, 1), (6, 2))]


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
        L = S.prepare(name, w)
        assert L.z is not None, L.describe()
        out[name] = (L, w)
    return out


@pytest.fixture(scope="module")
def suite():
    return judge.Suite(S, torch.device(DEV), log=lambda s: None)


def configs(name, m, compressed=False):
    """PIPE 6 configs that fit (name, m): NW 4 and 8, two (stages, 64-k groups a stage) pairs, at the power-of-two
    S that comes closest below a target CTA count (plain: two CTAs per SM; compressed: one) with the cluster (cl=2)
    and with the ticket (cl=0), S = 1, and an uneven S (3/2 of that one: it does not divide K / 64)."""
    d = judge.LAYERS[name]
    cls, fits = (S.GemvzConfig, S.gemvz_fits) if compressed else (S.GemvConfig, S.gemv_fits)
    sts, target = (((4, 1), (6, 2)), 132) if compressed else (((4, 1), (8, 2)), 264)
    out = []
    for nw in (4, 8):
        for st, ka in sts:
            base = cls(nw, 1, st, ka, 6, 0, 1, 0)
            s = 1
            while d["N"] // (16 * nw) * s < target and not fits(base._replace(s=2 * s), d["N"], d["K"], m):
                s *= 2
            s3 = 3 * s // 2 if s > 1 else 3
            uneven = (base._replace(s=s3, cl=2),) if compressed else (base._replace(s=s3, cl=0), base._replace(s=s3, cl=2))
            for c in (base._replace(s=s, cl=2 if s > 1 else 0), base._replace(s=s, cl=0), base) + uneven:
                if not fits(c, d["N"], d["K"], m) and c not in out:
                    out.append(c)
    return out


def check_accurate_and_exact(layers, suite, name, m, compressed, seed, probe_seed):
    """SPEC accuracy and exact one-hot probes (exception columns first) for every PIPE 6 config of the path."""
    L, w = layers[name]
    cfgs = configs(name, m, compressed)
    assert len(cfgs) >= 6, f"too few {'compressed ' if compressed else ''}PIPE 6 configs fit {name} m={m}: {cfgs}"
    for c in cfgs:
        L.set_config(m, c)
        assert L.plan(m).path == ("compressed" if compressed else "plain") and L.plan(m).config == c
        suite.accuracy(L, w, m, seed + m, f"{name} {c}")
        suite.probes(L, w, m, probe_seed * m, f"{name} {c}")


def check_deterministic_and_graph_safe(layers, suite, name, compressed):
    L, _ = layers[name]
    for m in (16, 32):
        for c in configs(name, m, compressed)[:2]:
            L.set_config(m, c)
            suite.determinism(L, m, 5, f"{name} {c}")
            suite.graph_replay(L, m, 3, f"{name} {c}")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("m", [1, 5, 9, 16, 17, 31, 32])
def test_pipe6_is_accurate_and_probes_are_exact(layers, suite, name, m):
    check_accurate_and_exact(layers, suite, name, m, False, 100, 7)


@pytest.mark.parametrize("name", NAMES)
def test_pipe6_is_deterministic_and_graph_safe(layers, suite, name):
    check_deterministic_and_graph_safe(layers, suite, name, False)


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


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("m", [1, 9, 16, 17, 32])
def test_compressed_pipe6_is_accurate_and_probes_are_exact(layers, suite, name, m):
    check_accurate_and_exact(layers, suite, name, m, True, 200, 9)


@pytest.mark.parametrize("name", NAMES)
def test_compressed_pipe6_patches_are_needed_and_applied(layers, suite, name):
    L, w = layers[name]
    k = L.exception_columns()[0]
    for m in (16, 32):
        L.set_config(m, configs(name, m, True)[0])
        x = torch.zeros(m, L.K, dtype=torch.bfloat16, device=DEV)
        x[:, k] = 1.0
        judge.check_probe(suite.call(x, L)[m - 1], w[:, k], False, f"{name} compressed PIPE 6 with its patches")
        L.dbg = 1
        try:
            wrong = suite.call(x, L)[m - 1]
        finally:
            L.dbg = 0
        assert not torch.equal(wrong.view(torch.int16), w[:, k].view(torch.int16)), "skipping the patches changed nothing"


@pytest.mark.parametrize("name", NAMES)
def test_compressed_pipe6_returns_the_plain_pipe6_bits(layers, suite, name):
    L, w = layers[name]
    for m in (1, 16, 32):
        x = judge.fresh_x(m, L.K, 60 + m, DEV)
        n = 0
        for nw in (4, 8):
            for stz, stp, ka in ((4, 4, 1), (6, 8, 2)):
                for s in (1, 3):
                    cz = S.GemvzConfig(nw, s, stz, ka, 6, 0, 1, 0)
                    cp = S.GemvConfig(nw, s, stp, ka, 6, 0, 1, 0)
                    if S.gemvz_fits(cz, L.N, L.K, m) or S.gemv_fits(cp, L.N, L.K, m):
                        continue
                    L.set_config(m, cz)
                    yz = S.kernel_fn(x, L).clone()
                    L.set_config(m, cp)
                    yp = S.kernel_fn(x, L)
                    assert torch.equal(yz.view(torch.int16), yp.view(torch.int16)), f"{name} m={m} {cz} vs {cp}"
                    n += 1
        assert n >= 4, (name, m)
    judge.check_close(yz.float(), judge.reference(x, w), False, f"{name} compressed PIPE 6")


@pytest.mark.parametrize("name", NAMES)
def test_compressed_pipe6_is_deterministic_and_graph_safe(layers, suite, name):
    check_deterministic_and_graph_safe(layers, suite, name, True)


def test_compressed_pipe6_chain_under_pdl_matches_eager(layers, suite):
    A, B = layers["pooler"][0], layers["unpooler"][0]
    for m in (16, 32):
        A.set_config(m, configs("pooler", m, True)[0])
        B.set_config(m, configs("unpooler", m, True)[1])
        suite.chain_graph(A, B, m, 4)
