"""The local judge: checks submission.py the way the competition judge does (stricter), then times it.

    python judge.py                      # all 30 scored shapes: correctness, then timing, score, JSON + PNG
    python judge.py --quick              # fewer replays
    python judge.py --layers pooler,router --m 1,8 --no-timing
    python judge.py --compare results/judge-2026-11-30-abc1234.json
    python judge.py --shapes public      # layer shapes of public models, in no table: the planner's score
    python judge.py --shapes holdout     # more such shapes, never used to fit the planner's cost model
    python judge.py --no-tables          # the 30 shapes with the tables ignored (planner only): ...-notables.json
    python judge.py --weights rowscaled  # another weight distribution (gaussian, heavy, rowscaled, colscaled; default trained)

Correctness (docs/SPEC.md): float64 reference on the device; bf16 outputs within
2**-7 |ref| + 2**-10 max|ref_row|, fp32 (router) rows within 1e-5 normwise; one-hot probe rows return
W[:, k] exactly (bf16; 2**-16 relative for fp32), on random columns AND on every column that holds an
out-of-window weight of the 12-bit format; determinism; a CUDA graph replayed 50 times; fresh x copied into
the captured input with the output poisoned; several layers in one graph; special-value weights; odd m;
shapes in no table. Outputs are poisoned (NaN) before every run, so an unwritten element fails.

Timing: per shape, P prepared copies (P x weight bytes >= 2 GB, so weights come from HBM, not the 60 MB L2),
one CUDA graph of P back-to-back kernel_fn calls, >= 15 replays after warm-up, time = median / P; cuBLAS
(torch.nn.functional.linear, fp32 for the router) timed the same way in the same run. Also reported: the
same with PDL off, and an isolated time (one call per replay after an L2 flush), so overlap between
back-to-back calls is not mistaken for a faster kernel. Every row on the compressed path is also timed on the
plain path (forced, same weights and x) and the gain is listed: issue #4 asks for >= 12% (not with --quick).

Without CUDA it runs what works on a CPU (the checkers' self-test, the 12-bit format statistics of every
layer, the dispatch plan) and exits 0.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.abspath(__file__))
FLOOR_BPS = 4.8e12
TARGET_BYTES = 2e9
SHAPES = json.load(open(os.path.join(ROOT, "tables", "shapes.json")))
LAYERS = {d["layer"]: d for d in SHAPES["layers"]}
SCORED_M = SHAPES["m"]
ODD_M = SHAPES["odd_m"]
# Layer shapes from public model configs (hidden, intermediate, head sizes; bf16, [N, K] = [out, in]), none of them in
# the tables: what the default rule (the planner, issue #30) must handle. N and K from 2048 to 32768, one N that is not
# a multiple of 128 (Phi-3's vocabulary) and one lm_head-sized N. `judge.py --shapes public` times them.
PUBLIC_SHAPES = [  # (name, N, K, where the numbers come from)
    ("llama3-8b.qkv", 6144, 4096, "Llama-3-8B: hidden 4096, 32 query + 2 x 8 key/value heads of 128"),
    ("llama3-8b.o", 4096, 4096, "Llama-3-8B: attention output"),
    ("llama3-8b.gate_up", 28672, 4096, "Llama-3-8B: intermediate 14336, gate and up fused"),
    ("llama3-8b.down", 4096, 14336, "Llama-3-8B: down projection"),
    ("qwen2-7b.qkv", 4608, 3584, "Qwen2-7B: hidden 3584, 28 query + 2 x 4 key/value heads of 128"),
    ("qwen2-7b.down", 3584, 18944, "Qwen2-7B: intermediate 18944"),
    ("phi3-mini.qkv", 9216, 3072, "Phi-3-mini: hidden 3072, 32 heads of 96, q, k, v fused"),
    ("phi3-mini.down", 3072, 8192, "Phi-3-mini: intermediate 8192"),
    ("phi3-mini.lm_head", 32064, 3072, "Phi-3-mini: vocabulary 32064 (not a multiple of 128)"),
    ("gemma-2b.gate_up", 32768, 2048, "Gemma-2B: hidden 2048, intermediate 16384, gate and up fused"),
    ("gemma-2b.down", 2048, 16384, "Gemma-2B: down projection"),
    ("llama3.2-1b.qkv", 3072, 2048, "Llama-3.2-1B: hidden 2048, 32 query + 2 x 8 key/value heads of 64"),
    ("llama3.2-1b.down", 2048, 8192, "Llama-3.2-1B: intermediate 8192"),
]
# Shapes the planner's cost model was never fit on (tools/plan_fit.py fits on the scored and public sets): how it does
# on a model it has not seen. From public configs too; no (N, K) here is one of the fit set's.
HOLDOUT_SHAPES = [  # (name, N, K, where the numbers come from)
    ("qwen2.5-14b.qkv", 7168, 5120, "Qwen2.5-14B: hidden 5120, 40 query + 2 x 8 key/value heads of 128"),
    ("qwen2.5-14b.gate_up", 27648, 5120, "Qwen2.5-14B: intermediate 13824, gate and up fused"),
    ("qwen2.5-14b.down", 5120, 13824, "Qwen2.5-14B: down projection"),
    ("gemma-7b.qkv", 12288, 3072, "Gemma-7B: hidden 3072, 16 heads of 256 for q, k and v"),
    ("gemma-7b.down", 3072, 24576, "Gemma-7B: intermediate 24576"),
    ("phi-2.fc1", 10240, 2560, "Phi-2: hidden 2560, intermediate 10240"),
    ("phi-2.fc2", 2560, 10240, "Phi-2: down projection"),
    ("qwen2-1.5b.qkv", 2048, 1536, "Qwen2-1.5B: hidden 1536, 12 query + 2 x 2 key/value heads of 128"),
    ("qwen2-1.5b.down", 1536, 8960, "Qwen2-1.5B: intermediate 8960"),
    ("mistral-nemo.o", 5120, 4096, "Mistral-NeMo-12B: 32 heads of 128 -> hidden 5120"),
    ("llama2-13b.o", 5120, 5120, "Llama-2-13B: hidden 5120"),
]
def _bf16_layers(rows):
    """(name, N, K, source) rows as LAYERS-style entries of bf16 layers."""
    return {n: {"layer": n, "N": N, "K": K, "dtype": "bf16", "source": src} for n, N, K, src in rows}


SHAPE_SETS = {"scored": LAYERS, "public": _bf16_layers(PUBLIC_SHAPES), "holdout": _bf16_layers(HOLDOUT_SHAPES)}
PUBLIC_M = [1, 8, 16, 32]


# ===================================================================================================
# Weights and inputs
# ===================================================================================================
def trained_like(N, K, seed, device="cpu", dtype=torch.bfloat16):
    """Trained-looking weights: per-row scale 0.02 * exp(N(0, 0.1)), Student-t (6 dof, unit variance) for a
    heavy tail, about 1e-4 exact zeros. Seeded; the same on every device for a given seed (drawn on the CPU)."""
    g = torch.Generator().manual_seed(seed)
    scale = 0.02 * torch.exp(0.1 * torch.randn(N, 1, generator=g))
    z = torch.randn(N, K, generator=g)
    chi2 = torch.zeros(N, K)
    for _ in range(6):
        chi2 += torch.randn(N, K, generator=g) ** 2
    t = z / torch.sqrt(chi2 / 6) / math.sqrt(6 / 4)
    w = t * scale
    w[torch.rand(N, K, generator=g) < 1e-4] = 0.0
    return w.to(dtype).to(device)


def gaussian(N, K, seed, device="cpu", dtype=torch.bfloat16):
    """randn * 0.02: the plainest weight; its 12-bit exception rate is the lowest (about 0.008%)."""
    g = torch.Generator().manual_seed(seed)
    return (0.02 * torch.randn(N, K, generator=g)).to(dtype).to(device)


def heavy_tailed(N, K, seed, device="cpu", dtype=torch.bfloat16):
    """Student-t with 3 degrees of freedom, scaled 0.02: much heavier tails than trained_like's 6 dof."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(N, K, generator=g)
    chi2 = sum(torch.randn(N, K, generator=g) ** 2 for _ in range(3))
    return (0.02 * z / torch.sqrt(chi2 / 3)).to(dtype).to(device)


def row_scaled(N, K, seed, device="cpu", dtype=torch.bfloat16):
    """randn * 0.02 * 2**u, u uniform in [-4, 4] per row: rows of different scale, as when norms or per-channel scales
    are folded into a weight (issue #29: one window per layer left 0.34-0.82% of these out of window, a window per row
    leaves about 0.01%)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(N, 1, generator=g) * 8 - 4
    return (0.02 * torch.randn(N, K, generator=g) * 2.0 ** u).to(dtype).to(device)


def col_scaled(N, K, seed, device="cpu", dtype=torch.bfloat16):
    """randn * 0.02 * 2**u, u uniform in [-4, 4] per column: columns of different scale, as when an input-side scale is
    folded into a weight. A row then spans the columns' scales, so no window of one row holds them: about 0.35% out of
    window, over every exception limit, and prepare refuses compression (the plain path's own distribution)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(1, K, generator=g) * 8 - 4
    return (0.02 * torch.randn(N, K, generator=g) * 2.0 ** u).to(dtype).to(device)


def outliers(p):
    """A generator like the ones above: Gaussian weights (0.02) with a share p of them replaced by outliers
    +-(1 + u) * 2**e, e uniform in 5..10: 11 to 19 binades above the Gaussian's largest, so no row's window takes them
    in (it would lose the row's bulk) and each is an exact exception of the 12-bit format (within 16 binades of its
    row's window): p of the weights out of window, plus Gaussian's own (about 0.008%); seeded. tools/format_bench.py
    and the GPU tests set an exception rate with it (FINDINGS.md section 8.4)."""
    def make(N, K, seed, device="cpu", dtype=torch.bfloat16):
        g = torch.Generator().manual_seed(seed)
        w = 0.02 * torch.randn(N, K, generator=g)
        hit = torch.rand(N, K, generator=g) < p
        big = (1 + torch.rand(N, K, generator=g)) * 2.0 ** torch.randint(5, 11, (N, K), generator=g).float()
        return torch.where(hit, torch.sign(w) * big, w).to(dtype).to(device)
    return make


# --weights: the weight distribution the judge draws (the scored run uses trained_like, as SPEC says)
WEIGHTS = {"trained": trained_like, "gaussian": gaussian, "heavy": heavy_tailed, "rowscaled": row_scaled,
           "colscaled": col_scaled}


def fresh_x(m, K, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, K, generator=g).to(torch.bfloat16).to(device)


SPECIALS = {  # bf16 bit patterns
    "+0": 0x0000, "-0": 0x8000, "+subnormal": 0x0001, "-subnormal": 0x807F, "+inf": 0x7F80, "-inf": 0xFF80,
    "nan": 0x7FC0, "+max": 0x7F7F, "-max": 0xFF7F, "+min_normal": 0x0080,
}


def special_weights(N, K, seed, device, random_rows=2):
    """Trained-looking weights with one special value per row in the first rows (so no row can overflow
    fp32 differently from float64), and `random_rows` rows of random bit patterns."""
    w = trained_like(N, K, seed).view(torch.int16).clone()
    g = torch.Generator().manual_seed(seed + 1)
    cols = torch.randint(0, K, (len(SPECIALS),), generator=g)
    for i, (name, bits) in enumerate(SPECIALS.items()):
        w[i, cols[i]] = bits - 65536 if bits >= 32768 else bits
    for r in range(random_rows):
        w[len(SPECIALS) + r] = torch.randint(-32768, 32767, (K,), generator=g, dtype=torch.int16)
    return w.view(torch.bfloat16).to(device)


def random_bits(N, K, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-32768, 32767, (N, K), generator=g, dtype=torch.int16).view(torch.bfloat16).to(device)


# ===================================================================================================
# Checkers (pure torch: CPU tests exercise them)
# ===================================================================================================
class CheckFailed(Exception):
    pass


def reference(x, w):
    return x.double() @ w.double().t()


def check_close(out, ref, fp32_out, what):
    """SPEC tolerances; raises CheckFailed naming the first bad element."""
    if out.shape != ref.shape:
        raise CheckFailed(f"{what}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    o = out.double()
    ref_nan = torch.isnan(ref)
    if fp32_out:
        exp = ref.float().double()                    # a correctly rounded fp32 result (overflow -> inf)
    else:
        exp = ref.to(torch.bfloat16).double()         # what a correctly rounded bf16 result is
    bad_nan = torch.isnan(o) != torch.isnan(exp)
    if bool(bad_nan.any()):
        i, j = [int(v) for v in bad_nan.nonzero()[0]]
        raise CheckFailed(f"{what}: [{i}, {j}] is {float(o[i, j])}, reference {float(ref[i, j])} (NaN mismatch)")
    inf = torch.isinf(exp)
    bad_inf = inf & (o != exp)
    if bool(bad_inf.any()):
        i, j = [int(v) for v in bad_inf.nonzero()[0]]
        raise CheckFailed(f"{what}: [{i}, {j}] is {float(o[i, j])}, reference rounds to {float(exp[i, j])}")
    fin = torch.isfinite(exp) & ~ref_nan
    if bool((fin & ~torch.isfinite(o)).any()):
        i, j = [int(v) for v in (fin & ~torch.isfinite(o)).nonzero()[0]]
        raise CheckFailed(f"{what}: [{i}, {j}] is {float(o[i, j])}, reference {float(ref[i, j])}")
    if ref.numel() == 0:
        return 0.0
    r = torch.where(fin, ref, torch.zeros_like(ref))
    d = torch.where(fin, o - ref, torch.zeros_like(ref))
    if fp32_out:
        num = d.norm(dim=1)
        den = r.norm(dim=1)
        rel = num / torch.clamp(den, min=1e-300)
        bad = rel > 1e-5
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise CheckFailed(f"{what}: row {i} normwise relative error {float(rel[i]):.3g} > 1e-5")
        return float(rel.max()) if rel.numel() else 0.0
    tol = 2.0 ** -7 * r.abs() + 2.0 ** -10 * r.abs().amax(dim=1, keepdim=True)
    bad = d.abs() > tol
    if bool(bad.any()):
        i, j = [int(v) for v in bad.nonzero()[0]]
        raise CheckFailed(f"{what}: [{i}, {j}] = {float(o[i, j])}, reference {float(ref[i, j])}, "
                          f"|diff| {float(d[i, j].abs()):.3g} > tol {float(tol[i, j]):.3g}")
    return float((d.abs() / torch.clamp(tol, min=1e-300)).max())


def no_overflow_rows(x, w):
    """Output columns (weight rows) whose fp32 partial sums cannot overflow, whatever the summation order:
    sum_k |x| |W| < 2**127. Random-bit weights make other rows differ between any two correct GEMMs."""
    bound = x.double().abs() @ torch.nan_to_num(w.double().abs(), nan=0.0, posinf=1e300).t()
    return (bound < 2.0 ** 127).all(dim=0)


def check_probe(out_row, w_col, fp32_out, what):
    """A one-hot row of x must return W[:, k]: bit-exact for bf16 (NaN matches NaN), 2**-16 relative for fp32."""
    if fp32_out:
        o, e = out_row.double(), w_col.double()
        both_nan = torch.isnan(o) & torch.isnan(e)
        bad = ~both_nan & ~((o - e).abs() <= 2.0 ** -16 * e.abs())
        bad &= ~(o == e)
    else:
        ob, eb = out_row.view(torch.int16), w_col.view(torch.int16)
        bad = (ob != eb) & ~(torch.isnan(out_row) & torch.isnan(w_col))
    if bool(bad.any()):
        n = int(bad.nonzero()[0])
        raise CheckFailed(f"{what}: row {n} returns {float(out_row[n])}, W = {float(w_col[n])} "
                          f"({int(bad.sum())} rows differ)")


def probe_expected(w, k):
    """What a one-hot x at column k must return: W[:, k], except NaN in rows that hold a non-finite weight
    at another column (0 x Inf = NaN, as in the float64 reference)."""
    nonfinite = ~torch.isfinite(w)
    others = nonfinite.sum(dim=1) - nonfinite[:, k].int()
    col = w[:, k].clone()
    col[others > 0] = float("nan")
    return col


def poison(t):
    return t.fill_(float("nan"))


# ===================================================================================================
# The GPU correctness suite
# ===================================================================================================
class Suite:
    def __init__(self, sub, device, log=print):
        self.sub, self.device, self.log = sub, device, log
        self.failures = []
        self.passed = 0

    def run(self, what, fn, *a, **k):
        try:
            fn(*a, **k)
            self.passed += 1
            return True
        except CheckFailed as e:
            self.failures.append(str(e))
            self.log(f"  FAIL {e}")
        except Exception as e:  # a crash is a failure with its message
            self.failures.append(f"{what}: {type(e).__name__}: {e}")
            self.log(f"  FAIL {what}: {type(e).__name__}: {e}")
        return False

    def call(self, x, L):
        out = torch.empty((x.shape[0], L.N), dtype=L.out_dtype, device=x.device)
        poison(out)
        return self.sub.kernel_fn(x, L, out=out)

    # -- the checks ----------------------------------------------------------------------------------
    def accuracy(self, L, w, m, seed, tag, overflow_safe_rows_only=False):
        x = fresh_x(m, L.K, seed, self.device)
        out = self.call(x, L)
        ref = reference(x, w)
        if overflow_safe_rows_only:
            keep = no_overflow_rows(x, w)       # random bits: often no row at all is overflow-safe
            out, ref = out[:, keep], ref[:, keep]
        check_close(out, ref, L.dual, f"{tag} m={m} accuracy")

    def determinism(self, L, m, seed, tag):
        x = fresh_x(m, L.K, seed, self.device)
        a = self.call(x, L).clone()
        b = self.call(x, L)
        if not torch.equal(a.view(torch.int16 if not L.dual else torch.int32),
                           b.view(torch.int16 if not L.dual else torch.int32)):
            raise CheckFailed(f"{tag} m={m} determinism: two runs on the same x differ")

    def probes(self, L, w, m, seed, tag):
        g = torch.Generator().manual_seed(seed)
        cols = list(L.exception_columns())
        rnd = torch.randint(0, L.K, (max(m, 4),), generator=g).tolist()
        cols = cols[:256] + rnd
        for c0 in range(0, len(cols), m):
            cs = cols[c0:c0 + m]
            x = torch.zeros(m, L.K, dtype=torch.bfloat16, device=self.device)
            for i in range(m):
                x[i, cs[i % len(cs)]] = 1.0
            out = self.call(x, L)
            for i in range(m):
                k = cs[i % len(cs)]
                check_probe(out[i], probe_expected(w, k), L.dual, f"{tag} m={m} probe column {k}"
                            f"{' (exception column)' if k in L.exception_columns() else ''}")

    def graph_replay(self, L, m, seed, tag, replays=50):
        x = fresh_x(m, L.K, seed, self.device)
        eager = self.call(x, L).clone()
        static_x = x.clone()
        g, static_out = capture(lambda: self.sub.kernel_fn(static_x, L))
        for r in range(replays):
            poison(static_out)
            g.replay()
            torch.cuda.synchronize()
            if not torch.equal(static_out, eager) and not _nan_equal(static_out, eager):
                raise CheckFailed(f"{tag} m={m} graph replay {r}: differs from the eager result")
        x2 = fresh_x(m, L.K, seed + 7, self.device)
        static_x.copy_(x2)
        poison(static_out)
        g.replay()
        torch.cuda.synchronize()
        fresh = self.call(x2, L)
        if not torch.equal(static_out, fresh) and not _nan_equal(static_out, fresh):
            raise CheckFailed(f"{tag} m={m} graph replay with fresh x: differs from the eager result on that x")

    def multi_graph(self, layers_ws, m, seed):
        """Several layers (and a chain y = B(A(x)) where shapes allow) captured in one graph."""
        xs = [fresh_x(m, L.K, seed + i, self.device) for i, (L, _) in enumerate(layers_ws)]
        eager = [self.call(x, L).clone() for x, (L, _) in zip(xs, layers_ws)]
        g, outs = capture(lambda: [self.sub.kernel_fn(x, L) for x, (L, _) in zip(xs, layers_ws)])
        for r in range(3):
            for o in outs:
                poison(o)
            g.replay()
            torch.cuda.synchronize()
            for (L, _), o, e in zip(layers_ws, outs, eager):
                if not torch.equal(o, e) and not _nan_equal(o, e):
                    raise CheckFailed(f"multi-layer graph m={m} replay {r}: layer '{L.name}' differs from eager")

    def chain_graph(self, LA, LB, m, seed, replays=200):
        """y = kernel_fn(kernel_fn(x, A), B) in one graph: B reads what A wrote (PDL must wait for it)."""
        x = fresh_x(m, LA.K, seed, self.device)
        eager = self.sub.kernel_fn(self.sub.kernel_fn(x, LA), LB).clone()
        g, y = capture(lambda: self.sub.kernel_fn(self.sub.kernel_fn(x, LA), LB))
        for r in range(replays):
            poison(y)
            g.replay()
        torch.cuda.synchronize()
        if not torch.equal(y, eager):
            raise CheckFailed(f"chain graph '{LA.name}' -> '{LB.name}' m={m}: differs from eager after {replays} replays")


def capture(fn):
    """Run fn once on a side stream (warm-up, outside capture), then capture it in a CUDA graph.
    Returns (graph, what fn returned during capture: the graph's static outputs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def _nan_equal(a, b):
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


PREPARE_KW = {}   # prepare()'s options for every layer the judge prepares (--no-tables, --tune set them)


def correctness(sub, device, layers, ms, log=print, seed=1234, specs=None, weights="trained", extras=True):
    """The whole SPEC correctness suite; returns (passed, failures, prepared layers {name: (L, w)}). specs: the shape
    set the layer names come from (default the scored layers); weights: a WEIGHTS key; extras: the special-value and
    unknown-shape checks, which belong to the scored run."""
    specs = LAYERS if specs is None else specs
    S = Suite(sub, device, log)
    prepared = {}
    t0 = time.time()
    for li, name in enumerate(layers):
        d = specs[name]
        dt = torch.float32 if d["dtype"] == "fp32" else torch.bfloat16
        w = WEIGHTS[weights](d["N"], d["K"], seed + li, device, dt)
        L = sub.prepare(name, w, **PREPARE_KW)
        prepared[name] = (L, w)
        log(f"[correctness] {name}: {L.describe()}")
        for m in ms + [mm for mm in ODD_M if mm not in ms]:
            tag = f"{name}"
            S.run(f"{tag} m={m} accuracy", S.accuracy, L, w, m, seed + 100 * m, tag)
            if m in ms:
                S.run(f"{tag} m={m} determinism", S.determinism, L, m, seed + 3 * m, tag)
                S.run(f"{tag} m={m} probes", S.probes, L, w, m, seed + 5 * m, tag)
                S.run(f"{tag} m={m} graph", S.graph_replay, L, m, seed + 11 * m, tag)
        log(f"[correctness] {name} done ({time.time() - t0:.0f} s)")
    names = list(prepared)
    if len(names) >= 2:
        for m in (1, 8, 32):
            S.run(f"multi-layer graph m={m}", S.multi_graph, [prepared[n] for n in names], m, seed)
    # a chain y = B(A(x)): the first pair of bf16 layers with N_A == K_B (pooler -> unpooler in the scored set)
    Ls = {n: prepared[n][0] for n in names}
    pair = next(((a, b) for a in names for b in names
                 if a != b and Ls[a].N == Ls[b].K and not Ls[a].dual and not Ls[b].dual), None)
    if pair:
        for m in (1, 16):
            S.run(f"chain {pair[0]}->{pair[1]} m={m}", S.chain_graph, Ls[pair[0]], Ls[pair[1]], m, seed)
    # the same layer twice in a row with different x, and split-K layers back to back, in one graph
    for name in names:
        S.run(f"{name} twice in one graph", S.multi_graph, [prepared[name], prepared[name]], 4, seed + 99)
    if extras:
        special(S, sub, device, names, seed, log)
        unknown_shapes(S, sub, device, seed, log)
    return S.passed, S.failures, prepared


def special(S, sub, device, names, seed, log):
    """Special values (+-0, subnormals, +-Inf, NaN, +-max) one per row are exact on the path the layer takes,
    and the 12-bit format itself takes them exactly (forced where the layer's plans do not use it); with
    random-bit rows added, or random bits everywhere, the layer falls back to plain."""
    for name in names:
        d = LAYERS[name]
        for random_rows in (0, 2):
            w = special_weights(d["N"], d["K"], seed, device, random_rows=random_rows)
            if d["dtype"] == "fp32":
                w = w.float()
            tag = f"{name} special-values{' + random rows' if random_rows else ''}"
            L = sub.prepare(name, w, **PREPARE_KW)
            log(f"[special] {tag}: 12-bit format {L.z_note}; m=1 {L.plan(1).path}")
            checked = [(L, tag)]
            if d["dtype"] == "bf16" and not random_rows and L.z is None:
                try:
                    checked.append((sub.prepare(name, w, path="compressed"), tag + " (compressed forced)"))
                except ValueError as e:
                    S.failures.append(f"{tag}: not compressed ({e}); forced, the format takes any exact weights")
            for Lc, t in checked:
                for m in (1, 8, 32):
                    S.run(f"{t} m={m}", S.accuracy, Lc, w, m, seed + m, t, random_rows > 0)
                if Lc.z is not None:
                    S.run(f"{t} probes", S.probes, Lc, w, 8, seed, t)
        if d["dtype"] == "bf16":
            wr = random_bits(d["N"], d["K"], seed, device)
            Lr = sub.prepare(name, wr, **PREPARE_KW)
            if any(p.path == "compressed" for p in Lr.plans[1:]):
                S.failures.append(f"{name} random bits: still compressed ({Lr.z_note})")
            S.run(f"{name} random-bits m=1", S.accuracy, Lr, wr, 1, seed, f"{name} random-bits", True)
            S.run(f"{name} random-bits determinism", S.determinism, Lr, 4, seed, f"{name} random-bits")


def unknown_shapes(S, sub, device, seed, log):
    """Shapes in no table: a sound default; shapes the kernels cannot take fall back (and say so); a tabled shape under
    another name takes that shape's rows (the real judge may name its layers otherwise)."""
    cases = [("mystery", 1040, 3072, torch.bfloat16), ("mystery_fp32", 528, 1536, torch.float32),
             ("odd_k", 256, 4160, torch.bfloat16), ("unsupported", 100, 1000, torch.bfloat16),
             ("renamed_o_proj", 8192, 2048, torch.bfloat16)]     # o_proj's shape under another name: its rows
    for name, N, K, dt in cases:
        w = trained_like(N, K, seed, device, dt)
        L = sub.prepare(name, w, **PREPARE_KW)
        log(f"[unknown shape] {L.describe().splitlines()[0]}; m=1: {L.plan(1).path} [{L.plan(1).why}]")
        for m in (1, 5, 17, 32, 40):
            S.run(f"{name} m={m}", S.accuracy, L, w, m, seed + m, f"{name} (no table)")
        S.run(f"{name} probes", S.probes, L, w, 3, seed, f"{name} (no table)")
        S.run(f"{name} graph", S.graph_replay, L, 3, seed, f"{name} (no table)", replays=5)


# ===================================================================================================
# Timing
# ===================================================================================================
def time_graph(fns, replays, warmup=3):
    """Median ms of one replay of a graph that runs every fn once, back to back, over `replays` replays."""
    g, _ = capture(lambda: [f() for f in fns])
    for _ in range(warmup):
        g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    del g
    times.sort()
    return times[len(times) // 2], times


def per_call_us(kernel_fn, Ls, x, replays, **kw):
    """SPEC's time of one call, us: the median replay of one graph of kernel_fn(x, L) for every prepared copy L, back
    to back, divided by the number of copies. kw goes to time_graph (warmup)."""
    ms, _ = time_graph([lambda L=L: kernel_fn(x, L) for L in Ls], replays, **kw)
    return ms * 1e3 / len(Ls)


def time_isolated(fn, flush, reps=20):
    """Median us of one call after an L2 flush (one call per replay)."""
    g, _ = capture(fn)
    ts = []
    for _ in range(reps):
        flush.add_(1)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def copies_for(nbytes):
    return max(2, math.ceil(TARGET_BYTES / nbytes))


# Issue #4: a compressed row should be at least this much (percent of the plain time) faster than the plain path.
Z_GAIN_PCT = 12
# issue #4's comparison alternates the two paths this many times each and compares medians: one timing of a
# compressed row moved by 0.1-0.3 us between preparations and between passes over the same copies (FINDINGS.md,
# session 15: tools/ab.py --preps), so one draw of each decided o_proj m=16 anywhere between 9% and 15%
PLAIN_ROUNDS = 3


def plan_source(plan):
    """Where a plan's config came from: 'table' (a tuned row of CTABLE / ZTABLE), 'tuned' (set_config, or
    prepare(tune=True): timed on the device, or its cache), or 'planner' (the planner's PLANNER rules or the default
    rule, for a shape no table covers); None for the fallback."""
    if plan.path == "fallback":
        return None
    return "table" if plan.why.startswith(("CTABLE", "ZTABLE")) else (
        "tuned" if plan.why.startswith(("set_config", "tuned")) else "planner")


def timing(sub, device, layers, ms, replays, log=print, seed=99, pdl_compare=True, isolated=True, plain_compare=True,
           specs=None, weights="trained"):
    """Every (layer, m) as SPEC times it; with plain_compare, each row the tables send to the compressed path is
    also timed on the plain path (same weights, same x, same timing), PLAIN_ROUNDS times each, alternating, and the
    medians compared: issue #4's "at least 12% faster than our plain path", read in the judge's own run. The score
    uses the first timing of each row, as SPEC times it."""
    specs = LAYERS if specs is None else specs
    rows = []
    flush = torch.empty(int(256e6) // 4, dtype=torch.float32, device=device)
    total = len(layers) * len(ms)
    done = 0
    t0 = time.time()
    for name in layers:
        d = specs[name]
        N, K = d["N"], d["K"]
        dual = d["dtype"] == "fp32"
        w = WEIGHTS[weights](N, K, seed, device, torch.float32 if dual else torch.bfloat16)
        bf16_bytes = N * K * 2 * (2 if dual else 1)
        P = copies_for(bf16_bytes)
        Ls = [sub.prepare(name, w, **PREPARE_KW) for _ in range(P)]
        Pc = copies_for(w.numel() * w.element_size())
        wcs = [w.clone() for _ in range(Pc)]
        Lp = None  # the plain path's copies, made when a compressed row needs them
        for m in ms:
            x = fresh_x(m, K, seed + m, device)
            xc = x.float() if dual else x
            L0 = Ls[0]
            plan = L0.plan(m)
            us = per_call_us(sub.kernel_fn, Ls, x, replays)
            us_nopdl = None
            if pdl_compare and plan.path != "fallback":
                L0_pdl = L0.pdl
                for L in Ls:
                    L.pdl = False
                us_nopdl = per_call_us(sub.kernel_fn, Ls, x, replays)
                for L in Ls:
                    L.pdl = L0_pdl
            plain_us = None
            if plain_compare and plan.path == "compressed":
                if Lp is None:
                    Lp = [sub.prepare(name, w, path="plain") for _ in range(P)]
                zr, pr = [us], []
                for k in range(PLAIN_ROUNDS):
                    pr.append(per_call_us(sub.kernel_fn, Lp, x, replays))
                    if k + 1 < PLAIN_ROUNDS:
                        zr.append(per_call_us(sub.kernel_fn, Ls, x, replays))
                plain_us, z_us = statistics.median(pr), statistics.median(zr)
            us_iso = time_isolated(lambda: sub.kernel_fn(x, L0), flush) if isolated else None
            ms_cb, _ = time_graph([lambda wc=wc: torch.nn.functional.linear(xc, wc) for wc in wcs], replays)
            cublas_us = ms_cb * 1e3 / Pc
            read = L0.bytes_read(m)
            floor_us = bf16_bytes / FLOOR_BPS * 1e6
            row = {"layer": name, "N": N, "K": K, "m": m, "path": plan.path, "source": plan_source(plan),
                   "config": None if plan.config is None else dict(plan.config._asdict()),
                   "why": plan.why, "us": round(us, 3), "us_nopdl": None if us_nopdl is None else round(us_nopdl, 3),
                   "us_isolated": None if us_iso is None else round(us_iso, 3), "cublas_us": round(cublas_us, 3),
                   "floor_us": round(floor_us, 3), "bytes_read": read, "speedup": round(cublas_us / us, 3),
                   "pct_floor": round(100 * floor_us / us, 1), "tbps": round(read / us / 1e6, 3),
                   "copies": P, "correct": None}
            if plain_us is not None:
                row["plain_us"] = round(plain_us, 3)
                row["compressed_median_us"] = round(z_us, 3)
                row["vs_plain_rounds_us"] = {"compressed": [round(v, 3) for v in zr], "plain": [round(v, 3) for v in pr]}
                row["vs_plain_pct"] = round(100 * (plain_us - z_us) / plain_us, 1)
            if us < read / FLOOR_BPS * 1e6:
                row["error"] = f"faster than its own bytes at 4.8 TB/s ({read / FLOOR_BPS * 1e6:.2f} us): measurement error"
            rows.append(row)
            done += 1
            el = time.time() - t0
            log(f"[timing {done}/{total}] {fmt_row(row)}   ({el:.0f} s, ~{el / done * (total - done):.0f} s left)")
        del Ls, wcs, Lp
        torch.cuda.empty_cache()
    return rows


# ===================================================================================================
# Report
# ===================================================================================================
HEADER = (f"{'layer':<9} {'m':>2}  {'path':<10} {'source':<7} {'config':<30} {'us':>7} {'noPDL':>7} {'iso':>7} "
          f"{'cuBLAS':>7} {'speedup':>7} {'%floor':>6} {'TB/s':>5}")


def fmt_cfg(c):
    return "-" if c is None else "(" + ", ".join(f"{k}={v}" for k, v in c.items()) + ")"


def fmt_row(r):
    f = lambda v: "-" if v is None else f"{v:.2f}"
    return (f"{r['layer']:<9} {r['m']:>2}  {r['path']:<10} {r.get('source') or '-':<7} {fmt_cfg(r['config']):<30} {f(r['us']):>7} "
            f"{f(r.get('us_nopdl')):>7} {f(r.get('us_isolated')):>7} {f(r['cublas_us']):>7} "
            f"{r['speedup']:>6.2f}x {r['pct_floor']:>5.0f}% {r['tbps']:>5.2f}")


def score(rows):
    """Geometric mean of cuBLAS time / our time over the rows."""
    if not rows:
        return float("nan")
    return math.exp(sum(math.log(r["cublas_us"] / r["us"]) for r in rows) / len(rows))


def submission_sha():
    """sha1 (12 hex) of submission.py as it is on disk: names the exact file a run measured, tables included
    (a copy's .git may be stale: the device's reported an old HEAD as '-dirty' in session 3)."""
    import hashlib
    with open(os.path.join(ROOT, "submission.py"), "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()[:12]


def git_sha():
    """The short commit of this checkout when submission.py is that commit's; else 'file-' + submission_sha() (outside
    a git checkout, or where the file differs from HEAD: the device tool's copy carries the session's first .git, so
    its HEAD names an older commit, session 16)."""
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            d = subprocess.run(["git", "status", "--porcelain", "submission.py"], cwd=ROOT, capture_output=True,
                               text=True)
            if not d.stdout.strip():
                return r.stdout.strip()
    except OSError:
        pass
    return "file-" + submission_sha()


def make_result(device_name, rows, correct, failures, extra=None):
    res = {"device": device_name, "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "commit": git_sha(), "submission_sha1": submission_sha(),
           "score": None if not rows else round(score(rows), 4),
           "correct": correct, "failures": failures, "rows": rows}
    if rows and all(r.get("us_nopdl") for r in rows):
        res["score_nopdl"] = round(math.exp(sum(math.log(r["cublas_us"] / r["us_nopdl"]) for r in rows) / len(rows)), 4)
    if extra:
        res.update(extra)
    return res


def write_result(res, path=None, tag=""):
    """results/judge-<date>-<sha><tag>.json (--shapes public: shapes-<date>-<sha><tag>.json) and its PNG."""
    os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
    if path is None:
        kind = {"public": "shapes", "holdout": "holdout"}.get(res.get("shapes"), "judge")
        path = os.path.join(ROOT, "results", f"{kind}-{res['date'][:10]}-{res['commit']}{tag}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    png = os.path.splitext(path)[0] + ".png"
    try:
        plot(res, png)
    except ImportError:
        png = None
    return path, png


def plot(res, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.45), 4.5))
    xs = range(len(rows))
    ax.bar([i - 0.2 for i in xs], [r["us"] for r in rows], width=0.4, label="ours (back to back)")
    ax.bar([i + 0.2 for i in xs], [r["cublas_us"] for r in rows], width=0.4, label="cuBLAS", alpha=0.6)
    ax.scatter(list(xs), [r["floor_us"] for r in rows], marker="_", s=200, color="k", label="bf16 floor 4.8 TB/s", zorder=3)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r['layer']}\nm={r['m']}" for r in rows], fontsize=6, rotation=90)
    ax.set_ylabel("us per call")
    ax.set_title(f"{res['device']} {res['date'][:10]} {res['commit']}: score {res['score']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def compare(rows, old_path, log=print):
    old = {(r["layer"], r["m"]): r for r in json.load(open(old_path))["rows"]}
    log(f"\ncompare with {old_path}:")
    for r in rows:
        o = old.get((r["layer"], r["m"]))
        if o:
            log(f"  {r['layer']:<9} m={r['m']:>2}: {o['us']:7.2f} -> {r['us']:7.2f} us ({r['us'] - o['us']:+.2f})")


# ===================================================================================================
# CPU mode
# ===================================================================================================
def cpu_checks(sub, layers, log=print):
    """What a CPU can check: the checkers catch planted faults; the 12-bit format of every layer."""
    ok = True
    w = trained_like(64, 256, 1)
    x = fresh_x(4, 256, 2, "cpu")
    ref = reference(x, w)
    good = (x.float() @ w.float().t()).to(torch.bfloat16)
    check_close(good, ref, False, "self-test exact")
    for what, bad in (("unwritten element", good.clone().index_put_((torch.tensor([1]), torch.tensor([5])),
                                                                   torch.tensor(float("nan"), dtype=torch.bfloat16))),):
        try:
            check_close(bad, ref, False, what)
            log(f"[cpu] checker MISSED a planted {what}")
            ok = False
        except CheckFailed:
            log(f"[cpu] checker catches a planted {what}")
    lossy = (w.view(torch.int16) & ~1).view(torch.bfloat16)
    k = int((w.view(torch.int16) & 1).nonzero()[0][1])
    try:
        check_probe(lossy[:, k], w[:, k], False, "lossy probe")
        log("[cpu] probe checker MISSED a lossy weight")
        ok = False
    except CheckFailed:
        log("[cpu] probe checker catches a weight whose last mantissa bit was dropped")
    for name in layers:
        d = LAYERS[name]
        for m in SCORED_M:
            comp = True if d["dtype"] == "bf16" else "fp32 weights take the DUAL plain path"
            p = sub.plan_for(name, d["N"], d["K"], m, d["dtype"] == "fp32", comp)
            log(f"[cpu] plan {name:<9} m={m:>2}: {p.path:<10} {p.config} [{p.why}]")
        if d["dtype"] == "bf16":
            rows = min(d["N"], 512)
            wz = trained_like(rows, d["K"], 7)
            z = sub.pack_z(wz)
            rate = z.n_exc / wz.numel()
            log(f"[cpu] 12-bit format of {name} (first {rows} rows, trained-looking): row windows start at class "
                f"{int(z.zbase.min())}..{int(z.zbase.max())}, exceptions {100 * rate:.4f}%, at most {z.capr} in a "
                f"row, windows + side table {sub.side_table_bits(z, rows, d['K']):.4f} bit/w")
    return ok


# ===================================================================================================
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", choices=tuple(SHAPE_SETS), default="scored",
                    help="scored: the 30 shapes and the full correctness suite (default); public: layer shapes from "
                         "public model configs, in no table, at m = 1, 8, 16, 32 (results/shapes-<date>-<sha>.json); "
                         "holdout: more such shapes, never used to fit the planner (results/holdout-<date>-<sha>.json)")
    ap.add_argument("--layers", default=None, help="comma list of the set's layers (default: all of them)")
    ap.add_argument("--m", default=None, help="comma list of m (default: 1,2,4,8,16,32; public: 1,8,16,32)")
    ap.add_argument("--weights", choices=tuple(WEIGHTS), default="trained",
                    help="the weight distribution (default: trained-looking, as SPEC's judge draws them)")
    ap.add_argument("--no-tables", action="store_true",
                    help="ignore the tuned tables: every shape takes the planner (the default rule); the JSON name "
                         "ends in -notables")
    ap.add_argument("--tune", action="store_true",
                    help="prepare(tune=True): the planner's cheapest candidates timed on the device and cached "
                         "(submission.tune_cache_path()); the JSON name ends in -tuned")
    ap.add_argument("--quick", action="store_true", help="15 replays instead of 40; no isolated / no-PDL / plain-path times")
    ap.add_argument("--replays", type=int, default=None)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-correctness", action="store_true", help="timing only (not a valid judge run)")
    ap.add_argument("--json", default=None, help="result path (default results/judge-<date>-<sha>.json)")
    ap.add_argument("--compare", default=None, help="an older result JSON: print per-shape deltas")
    args = ap.parse_args(argv)
    specs = SHAPE_SETS[args.shapes]
    layers = list(specs) if args.layers is None else [l for l in args.layers.split(",") if l]
    for l in layers:
        if l not in specs:
            ap.error(f"unknown layer {l!r} in --shapes {args.shapes}; known: {', '.join(specs)}")
    ms = [int(v) for v in args.m.split(",") if v] if args.m else (SCORED_M if args.shapes == "scored" else PUBLIC_M)
    t_start = time.time()
    import submission as sub
    global PREPARE_KW
    PREPARE_KW = {}
    if args.no_tables:
        PREPARE_KW.update(ctable={}, ztable={})
    if args.tune:
        PREPARE_KW["tune"] = True
    tag = "".join(t for t, on in (("-notables", args.no_tables), ("-tuned", args.tune),
                                  (f"-{args.weights}", args.weights != "trained")) if on)
    if not torch.cuda.is_available():
        print("[judge] no CUDA device: running the CPU checks only")
        ok = cpu_checks(sub, [l for l in layers if l in LAYERS])
        print("[judge] timing and the GPU correctness suite need a Hopper GPU, an H100 or H200 (CUDA not available "
              f"here); CPU checks {'passed' if ok else 'FAILED'}")
        return 0 if ok else 1
    device = torch.device("cuda")
    dev_name = torch.cuda.get_device_name()
    print(f"[judge] {dev_name}, torch {torch.__version__}, commit {git_sha()}, PDL default "
          f"{'on' if sub.pdl_default() else 'off'}, shapes {args.shapes}, weights "
          f"{args.weights}{', tables ignored' if args.no_tables else ''}")
    correct, failures = None, []
    if not args.no_correctness:
        t0 = time.time()
        passed, failures, _ = correctness(sub, device, layers, ms, specs=specs, weights=args.weights,
                                          extras=args.shapes == "scored")
        correct = not failures
        print(f"[judge] correctness: {passed} checks passed, {len(failures)} failed ({time.time() - t0:.0f} s)")
        for f in failures:
            print(f"[judge] FAIL {f}")
        torch.cuda.empty_cache()
    rows = []
    if not args.no_timing:
        replays = args.replays or (15 if args.quick else 40)
        scored = args.shapes == "scored"
        rows = timing(sub, device, layers, ms, replays, pdl_compare=not args.quick and scored,
                      isolated=not args.quick and scored,
                      plain_compare=not args.quick and scored and not args.no_tables,
                      specs=specs, weights=args.weights)
        for r in rows:
            r["correct"] = correct
            if "error" in r:
                failures.append(f"{r['layer']} m={r['m']}: {r['error']}")
        print("\n" + HEADER)
        for r in rows:
            print(fmt_row(r))
        sc = score(rows)
        print(f"\nscore (geometric mean speedup over cuBLAS, {len(rows)} shapes): {sc:.3f}")
        if all(r.get("us_nopdl") for r in rows):
            print(f"score with PDL off: {math.exp(sum(math.log(r['cublas_us'] / r['us_nopdl']) for r in rows) / len(rows)):.3f}")
        zrows = [r for r in rows if "vs_plain_pct" in r]
        if zrows:
            print(f"\ncompressed against our plain path (same weights, x and timing; medians of {PLAIN_ROUNDS} alternating "
                  f"timings each; issue #4 asks >= {Z_GAIN_PCT}%):")
            for r in zrows:
                rr = r["vs_plain_rounds_us"]
                print(f"  {r['layer']:<9} m={r['m']:<2} compressed {r['compressed_median_us']:6.2f} us  plain "
                      f"{r['plain_us']:6.2f} us  {r['vs_plain_pct']:+5.1f}%"
                      f"{'' if r['vs_plain_pct'] >= Z_GAIN_PCT else f'   < {Z_GAIN_PCT}%'}   (rounds "
                      f"{' / '.join(f'{v:.2f}' for v in rr['compressed'])} against "
                      f"{' / '.join(f'{v:.2f}' for v in rr['plain'])})")
        if args.compare:
            compare(rows, args.compare)
    res = make_result(dev_name, rows, correct, failures, {"total_s": round(time.time() - t_start, 1),
                                                          "shapes": args.shapes,
                                                          "weights": args.weights, "tables": not args.no_tables,
                                                          "tune": args.tune})
    path, png = write_result(res, args.json, tag)
    print(f"[judge] wrote {os.path.relpath(path, ROOT)}{' and ' + os.path.relpath(png, ROOT) if png else ''}; "
          f"total {time.time() - t_start:.0f} s")
    if failures:
        print(f"[judge] {len(failures)} failure(s): exit 1")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
