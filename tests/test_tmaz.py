"""GPU tests of gemvtz_kernel (GemvtzConfig: the 12-bit stream, pack_z's, in a TMA ring, decoded into registers,
warpgroup MMA on a permuted copy of x, the exception warp's corrections) on every bf16 layer, whether or not the tables
pick it: SPEC accuracy and exact one-hot probes (the exception columns among them) at m = 1..32, the cluster and
ticket split-K, uneven slices, one and two groups a stage, determinism, graph replays, a chain under PDL, and the
same bytes as gemvz (one copy serves both). Heavy-tailed and pruned weights too (more exceptions). The kernels come
from an extension of their own (tune.py's parallel build of these instantiations), which the layers launch with."""
import pytest
import torch

import judge

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (an H100 or H200)")

import submission as S
import tune
from tests.ring_layers import NAMES, prepared_layers

DEV = "cuda"
INSTS = ([("gemvtz", (nw, st, nb, ka)) for nw in (4, 8) for nb in (1, 2, 4) for st, ka in ((4, 1), (6, 2))] +
         [("gemvz", S.template_args(S.DEFAULT_GEMVZ[0], m)) for m in (1, 9, 17)])


@pytest.fixture(scope="module")
def tz_ext():
    return tune.build_tune_ext(INSTS)


@pytest.fixture(scope="module")
def layers(tz_ext):
    return prepared_layers(tz_ext, "compressed", 51)


@pytest.fixture(scope="module")
def suite():
    return judge.Suite(S, torch.device(DEV), log=lambda s: None)


def configs(name, m):
    """gemvtz configs that fit (name, m): NW 4 and 8, two (stages, groups a stage) pairs, at the S whose grid comes
    closest below one CTA an SM with the cluster (cl = 2) and the ticket (cl = 0), S = 1, and an uneven S."""
    d = judge.LAYERS[name]
    out = []
    for nw in (4, 8):
        for st, ka in ((4, 1), (6, 2)):
            base = S.GemvtzConfig(nw, 1, st, ka, 1, 0)
            tiles = d["N"] // (16 * nw)
            s = max(1, min(8, 132 // tiles))
            for c in (base._replace(s=s, cl=2 if s > 1 else 0), base._replace(s=s, cl=0), base,
                      base._replace(s=s + 1, cl=0), base._replace(s=3, cl=2)):
                if not S.config_misfit(c, d["N"], d["K"], m) and c not in out:
                    out.append(c)
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("m", [1, 5, 9, 16, 17, 31, 32])
def test_gemvtz_is_accurate_and_probes_are_exact(layers, suite, name, m):
    L, w = layers[name]
    cfgs = configs(name, m)
    assert len(cfgs) >= 4, f"too few gemvtz configs fit {name} m={m}: {cfgs}"
    assert L.exception_columns(), f"{name}: no out-of-window weight, the corrections go untested"
    for i, c in enumerate(cfgs):
        L.set_config(m, c)
        assert L.plan(m).path == "compressed" and L.plan(m).config == c
        suite.accuracy(L, w, m, 200 + m, f"{name} {c}")
        if i < 2 or c.s > 2:          # the probes (up to 256 exception columns) on a few configs: the split ones among them
            suite.probes(L, w, m, 11 * m, f"{name} {c}")


@pytest.mark.parametrize("name", NAMES)
def test_gemvtz_is_deterministic_and_graph_safe(layers, suite, name):
    L, _ = layers[name]
    for m in (16, 32):
        for c in configs(name, m)[:2]:
            L.set_config(m, c)
            suite.determinism(L, m, 5, f"{name} {c}")
            suite.graph_replay(L, m, 3, f"{name} {c}")


def test_gemvtz_chain_under_pdl_matches_eager(layers, suite):
    A, B = layers["pooler"][0], layers["unpooler"][0]      # pooler N=4096 feeds unpooler K=4096
    for m in (16, 32):
        for i in range(2):
            A.set_config(m, configs("pooler", m)[i])
            B.set_config(m, configs("unpooler", m)[i])
            suite.chain_graph(A, B, m, 4)


def test_gemvtz_reads_the_same_stream_as_gemvz(tz_ext):
    """One copy: a layer whose m <= 16 run gemvz and m = 17..32 run gemvtz holds pack_z's stream once, no bf16 copy of
    any kind, and both read it (their results agree within the SPEC tolerance of the reference)."""
    d = judge.LAYERS["unpooler"]
    w = judge.trained_like(d["N"], d["K"], 78, DEV, torch.bfloat16)
    zt = {("unpooler", m): S.DEFAULT_GEMVZ[0] for m in (1, 2, 4, 8, 16)}
    zt[("unpooler", 32)] = S.GemvtzConfig(4, 1, 6, 2, 1, 0)
    L = S.prepare("unpooler", w, ext=tz_ext, ctable={}, ztable=zt)
    assert all(L.plan(m).path == "compressed" for m in range(1, 33)), L.describe()
    assert L.w is None and L.wt is None, "a layer that runs compressed at every m packed a bf16 copy"
    for m in (16, 32):
        x = judge.fresh_x(m, d["K"], 5 + m, DEV)
        judge.check_close(S.kernel_fn(x, L).float(), judge.reference(x, w), False, f"unpooler m={m} one copy")


@pytest.mark.parametrize("gen", ["heavy_tailed", "pruned"])
def test_gemvtz_on_weights_with_more_exceptions(tz_ext, suite, gen):
    """Heavy-tailed weights (more out-of-window weights) and 2:4-like pruned ones (every zero an exception: the
    cooperative walk's longest chains) stay accurate and their probes exact."""
    d = judge.LAYERS["o_proj"]
    if gen == "pruned":
        w = judge.trained_like(d["N"], d["K"], 91, DEV, torch.bfloat16)
        w[:, 1::4] = 0
        w[:, 2::4] = 0
    else:
        w = judge.heavy_tailed(d["N"], d["K"], 92, DEV, torch.bfloat16)
    L = S.prepare("o_proj", w, path="compressed", ext=tz_ext)
    for m in (9, 32):
        for c in configs("o_proj", m)[:3]:
            L.set_config(m, c)
            suite.accuracy(L, w, m, 300 + m, f"o_proj {gen} {c}")
            suite.probes(L, w, m, 13 * m, f"o_proj {gen} {c}")
