"""The Triton path of submission.py (tri_gemv, our chapter 9), on its own buffers.

CPU: the kernels under the Triton interpreter (in a subprocess: TRITON_INTERPRET must be set before the kernel
is decorated), small shapes, both modes, both dtypes, split-K 1/2/4; the launcher's validation; and the real
(non-interpreted) kernel compiled for sm_90 with Triton's bundled ptxas: no GPU needed, no spills allowed.
GPU (skipped without CUDA): the scored shapes, probes, determinism, CUDA graphs, a PDL chain.
The interpreter rounds fp32 -> bf16 by truncation (the GPU: to nearest even); the SPEC tolerance accepts both.

    python3 tests/test_triton.py --interpret     # what the CPU fixture runs: prints one JSON line of results
"""
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback

import pytest
import torch

triton = pytest.importorskip("triton")   # requirements.txt does not list it: skip, not a collection error
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import submission as T  # noqa: E402  (after the sys.path line: this file also runs as a script)

TC = T.TritonConfig
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (run on the H200)")

# name: (N, K, dual)
LAYERS = {"router": (256, 8192, True), "qkv_gate": (2304, 8192, False), "o_proj": (8192, 2048, False),
          "pooler": (4096, 8192, False), "unpooler": (8192, 4096, False)}
# Suggested starting configs, about 256..288 programs each; all compile for sm_90 without spills at BM 16 and 32.
START = {
    "router": [TC(32, 128, 32, 4, 3, "ticket"), TC(16, 128, 16, 4, 3, "atomic")],
    "qkv_gate": [TC(32, 256, 4, 4, 3, "ticket"), TC(64, 128, 8, 8, 3, "atomic")],
    "o_proj": [TC(32, 256, 1, 4, 3, "ticket"), TC(64, 128, 2, 8, 4, "atomic")],
    "pooler": [TC(32, 256, 2, 4, 3, "ticket"), TC(64, 128, 4, 8, 4, "atomic")],
    "unpooler": [TC(32, 256, 1, 4, 3, "ticket"), TC(64, 128, 2, 8, 4, "ticket")],
}


# ---------------------------------------------------------------------------------------------------
# Inputs, reference, SPEC checks (shared by the interpreter, compile and GPU halves)
# ---------------------------------------------------------------------------------------------------
def make_weights(N, K, dual, seed, device):
    """(w, w2, exact weight in float64): bf16 W, or the router's hi / lo halves of an fp32 W. Seeded, nonzero."""
    g = torch.Generator().manual_seed(seed)
    w32 = torch.randn(N, K, generator=g) * (0.02 * torch.exp(0.1 * torch.randn(N, 1, generator=g)))
    if not dual:
        w = w32.to(torch.bfloat16)
        return w.to(device), None, w.double().to(device)
    hi = w32.to(torch.bfloat16)
    lo = (w32 - hi.float()).to(torch.bfloat16)   # w32 - hi is exact in fp32
    return hi.to(device), lo.to(device), w32.double().to(device)


def make_x(m, K, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, K, generator=g).to(torch.bfloat16).to(device)


def check_close(out, ref, dual, what):
    """SPEC: bf16 within 2**-7 |ref| + 2**-10 max|ref_row|; fp32 rows within 1e-5 normwise."""
    o = out.double()
    assert bool(torch.isfinite(o).all()), f"{what}: non-finite output (an element left unwritten?)"
    if dual:
        rel = (o - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-300)
        assert float(rel.max()) <= 1e-5, f"{what}: row {int(rel.argmax())} normwise error {float(rel.max()):.3g}"
        return
    tol = 2.0 ** -7 * ref.abs() + 2.0 ** -10 * ref.abs().amax(dim=1, keepdim=True)
    bad = (o - ref).abs() > tol
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise AssertionError(f"{what}: [{i}, {j}] = {float(o[i, j])}, reference {float(ref[i, j])}")


def buffers(N, m, cfg, device, guard=64):
    """ws / sem of exactly tri_workspace's size (zeroed) followed by a guard that no call may touch."""
    ws_n, sem_n = T.tri_workspace(N, m, cfg)
    ws = torch.cat([torch.zeros(ws_n), torch.full((guard,), float("nan"))]).to(device)
    sem = torch.cat([torch.zeros(sem_n, dtype=torch.int32), torch.full((guard,), 12345, dtype=torch.int32)])
    return ws, sem.to(device), ws_n, sem_n


def run(x, w, w2, cfg, dual, ws, sem, reverse=False, pdl=True):
    """One call into a NaN-poisoned out that has a guard row below it; returns out."""
    m, N = x.shape[0], w.shape[0]
    big = torch.full((m + 1, N), float("nan"), dtype=torch.float32 if dual else torch.bfloat16, device=x.device)
    T.tri_gemv(x, w, w2, big[:m], ws, sem, cfg, dual, pdl=pdl, reverse=reverse)
    assert bool(torch.isnan(big[m]).all()), "a store went past out's last row"
    return big[:m]


def check_buffers(cfg, ws, sem, ws_n, sem_n, what):
    """sem back to zero, the atomic buffer back to zero, guards untouched."""
    assert int(sem[:sem_n].abs().sum()) == 0, f"{what}: sem not reset: {sem[:sem_n].tolist()}"
    assert bool((sem[sem_n:] == 12345).all()), f"{what}: sem guard overwritten"
    assert bool(torch.isnan(ws[ws_n:]).all()), f"{what}: ws guard overwritten"
    if cfg.mode == "atomic":
        assert bool((ws[:ws_n] == 0).all()), f"{what}: the atomic buffer is not all zeros after the call"


def bits(t):
    """The raw bits of a bf16 / fp32 tensor: equal bits, not merely equal values (-0 vs +0, NaN payloads)."""
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def check_probes(w, w2, wref, K, m, cfg, dual, ws, sem, seed, what):
    """One-hot rows of x return W[:, k]: bit-exact for bf16, hi + lo within 2**-16 of fp32 W for DUAL."""
    g = torch.Generator().manual_seed(seed)
    cols = torch.randperm(K, generator=g)[:m]
    x = torch.zeros(m, K, dtype=torch.bfloat16)
    x[torch.arange(m), cols] = 1.0
    out = run(x.to(w.device), w, w2, cfg, dual, ws, sem)
    exp = wref[:, cols.to(w.device)].t()
    if dual:
        ok = (out.double() - exp).abs() <= 2.0 ** -16 * exp.abs()
    else:
        ok = out.double() == exp
    if not bool(ok.all()):
        i, j = (int(v) for v in (~ok).nonzero()[0])
        raise AssertionError(f"{what}: probe row {i} (k={int(cols[i])}) col {j}: {float(out[i, j])} "
                             f"!= W {float(exp[i, j])}")


def check_case(N, K, m, cfg, dual, seed, device, weights=None):
    """Accuracy, buffers reset, probes; ticket: bit-identical on a second call and (split K) with REVERSE."""
    what = f"N={N} K={K} m={m} {cfg} dual={dual}"
    w, w2, wref = weights or make_weights(N, K, dual, seed, device)
    x = make_x(m, K, seed + 1, device)
    ws, sem, ws_n, sem_n = buffers(N, m, cfg, device)
    out = run(x, w, w2, cfg, dual, ws, sem)
    check_close(out, x.double() @ wref.t(), dual, what)
    check_buffers(cfg, ws, sem, ws_n, sem_n, what)
    if cfg.mode == "ticket":
        again = run(x, w, w2, cfg, dual, ws, sem)
        assert torch.equal(bits(again), bits(out)), f"{what}: two calls differ"
    if cfg.mode == "ticket" and cfg.s > 1:
        rev = run(x, w, w2, cfg, dual, ws, sem, reverse=True)
        assert torch.equal(bits(rev), bits(out)), f"{what}: REVERSE program order changed the ticket result"
        check_buffers(cfg, ws, sem, ws_n, sem_n, what + " (reverse)")
    check_probes(w, w2, wref, K, m, cfg, dual, ws, sem, seed + 2, what)
    check_buffers(cfg, ws, sem, ws_n, sem_n, what + " (probes)")


# ---------------------------------------------------------------------------------------------------
# CPU: the interpreter, in a subprocess
# ---------------------------------------------------------------------------------------------------
INTERP_N, INTERP_K = 64, 512
# s -> (bn, bk): two to four K steps per program, one to four column blocks
INTERP_TILES = {1: (64, 128), 2: (16, 128), 4: (32, 64)}


def interp_cases():
    """{case id: (m, cfg, dual)} for the interpreter run."""
    cases = {}
    for dual in (False, True):
        for mode in T.TRI_MODES:
            for s, (bn, bk) in INTERP_TILES.items():
                for m in (1, 3, 16, 17, 32):
                    cfg = TC(bn, bk, s, 4, 2, mode)
                    cases[f"{'dual' if dual else 'bf16'}-{mode}-s{s}-m{m}"] = (m, cfg, dual)
    return cases


def shared_buffers_case():
    """Layers of different N, K, dtype and config one after another on one ws / sem (ticket mode)."""
    calls = [(64, 512, TC(16, 64, 4, 4, 2, "ticket"), False), (128, 256, TC(32, 64, 2, 4, 2, "ticket"), True),
             (32, 1024, TC(16, 128, 8, 4, 2, "ticket"), False)]
    ws = torch.zeros(max(T.tri_workspace(n, 32, c)[0] for n, _, c, _ in calls))
    sem = torch.zeros(max(T.tri_workspace(n, 32, c)[1] for n, _, c, _ in calls), dtype=torch.int32)
    for rep in range(2):
        for i, (N, K, cfg, dual) in enumerate(calls):
            w, w2, wref = make_weights(N, K, dual, 50 + i, "cpu")
            x = make_x(5, K, 60 + 10 * rep + i, "cpu")
            check_close(run(x, w, w2, cfg, dual, ws, sem), x.double() @ wref.t(), dual, f"shared {N}x{K} {cfg}")
            assert int(sem.abs().sum()) == 0


def kernel_fn_case():
    """kernel_fn's Triton branch (no re-validation per call) on a Layer planned by hand: bf16 and DUAL weights,
    split K, both modes; buffers as Layer._alloc_workspace sizes them."""
    for dual, cfg in ((False, TC(16, 128, 2, 4, 2, "ticket")), (True, TC(32, 64, 4, 4, 2, "atomic"))):
        w, _, wref = make_weights(INTERP_N, INTERP_K, dual, 70, "cpu")
        L = T.Layer("t", wref.float() if dual else w)
        L.plans = [None] + [T.PlanEntry("triton", cfg, "test")] * T.MAX_M
        L._pack_triton()
        L._alloc_workspace()
        for m in (1, 17):
            x = make_x(m, INTERP_K, 80 + m, "cpu")
            check_close(T.kernel_fn(x, L), x.double() @ wref.t(), dual, f"kernel_fn {cfg} dual={dual} m={m}")
        assert int(L.tsem.abs().sum()) == 0 and bool((L.twa == 0).all())


def interpreter_main():
    """Runs every interpreter case; prints {case id: "ok" | traceback} as one JSON line."""
    assert T._TRI_INTERPRET, "run with TRITON_INTERPRET=1"
    results = {}
    jobs = {cid: functools.partial(check_case, INTERP_N, INTERP_K, m, cfg, dual, 100 + i, "cpu")
            for i, (cid, (m, cfg, dual)) in enumerate(interp_cases().items())}
    jobs["shared-buffers"] = shared_buffers_case
    jobs["kernel_fn"] = kernel_fn_case
    for cid, job in jobs.items():
        try:
            job()
            results[cid] = "ok"
        except Exception:
            results[cid] = traceback.format_exc()[-2000:]
    print(json.dumps(results))


@pytest.fixture(scope="module")
def interp_results():
    env = {**os.environ, "TRITON_INTERPRET": "1", "MUSE_BUILD": "0"}
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--interpret"], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"interpreter run failed:\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", [*interp_cases(), "shared-buffers", "kernel_fn"])
def test_interpreter(interp_results, case):
    assert interp_results[case] == "ok", interp_results[case]


# ---------------------------------------------------------------------------------------------------
# CPU: validation, tri_misfit, tri_workspace (nothing is launched)
# ---------------------------------------------------------------------------------------------------
def _args(m=4, N=64, K=512, dual=False, cfg=TC(32, 64, 2, 4, 2, "ticket")):
    w, w2, _ = make_weights(N, K, dual, 1, "cpu")
    out = torch.empty(m, N, dtype=torch.float32 if dual else torch.bfloat16)
    ws = torch.zeros(max(T.tri_workspace(N, 32, cfg)[0], 1))
    sem = torch.zeros(max(T.tri_workspace(N, 32, cfg)[1], 1), dtype=torch.int32)
    return dict(x=make_x(m, K, 2, "cpu"), w=w, w2=w2, out=out, ws=ws, sem=sem, cfg=cfg, dual=dual)


def _bad(**change):
    a = _args()
    a.update(change)
    return a


BAD = {
    "x dtype": (TypeError, r"x: expected dtype torch.bfloat16, received torch.float16",
                lambda: _bad(x=_args()["x"].half())),
    "x dims": (ValueError, r"x: expected 2 dims", lambda: _bad(x=_args()["x"].reshape(-1))),
    "x strided": (ValueError, r"x: expected a contiguous", lambda: _bad(x=make_x(4, 1024, 2, "cpu")[:, ::2])),
    "m=33": (ValueError, r"m=33 is outside 1\.\.32", lambda: _args(m=33)),
    "w K": (ValueError, r"w: expected shape \[N, 512\], received \(64, 256\)",
            lambda: _bad(w=make_weights(64, 256, False, 1, "cpu")[0])),
    "w2 missing": (TypeError, r"w2: expected a torch.Tensor, received NoneType",
                   lambda: {**_args(dual=True), "w2": None}),
    "w2 unexpected": (ValueError, r"w2: expected None", lambda: _bad(w2=_args()["w"])),
    "out dtype": (TypeError, r"out: expected dtype torch.float32, received torch.bfloat16",
                  lambda: {**_args(dual=True), "out": torch.empty(4, 64, dtype=torch.bfloat16)}),
    "out shape": (ValueError, r"out: expected shape \(4, 64\), received \(4, 32\)",
                  lambda: _bad(out=torch.empty(4, 32, dtype=torch.bfloat16))),
    "N % bn": (ValueError, r"N=80 is not a multiple of bn=32", lambda: _args(N=80)),
    "K % s*bk": (ValueError, r"K=512 is not a multiple of s\*bk=4\*256=1024",
                 lambda: _bad(cfg=TC(32, 256, 4, 4, 2, "ticket"))),
    "bn pow2": (ValueError, r"bn=48 must be a power of two", lambda: _bad(cfg=TC(48, 64, 2, 4, 2, "ticket"))),
    "mode": (ValueError, r"mode 'fast' is not one of", lambda: _bad(cfg=TC(32, 64, 2, 4, 2, "fast"))),
    "ws small": (ValueError, r"ws / sem: expected at least 512 / 2 elements, received 511 / 2",
                 lambda: _bad(ws=torch.zeros(511))),
    "sem dtype": (TypeError, r"sem: expected dtype torch.int32, received torch.int64",
                  lambda: _bad(sem=torch.zeros(2, dtype=torch.int64))),
    "cfg type": (TypeError, r"cfg: expected a TritonConfig, received tuple",
                 lambda: _bad(cfg=(32, 64, 2, 4, 2, "ticket"))),
    "dual type": (TypeError, r"dual: expected a bool, received int", lambda: _bad(dual=0)),
}


@pytest.mark.parametrize("name", list(BAD))
def test_launcher_rejects_bad_calls(name):
    exc, msg, make = BAD[name]
    with pytest.raises(exc, match=msg):
        T.tri_gemv(**make())


def test_tri_fits_and_workspace():
    assert T.tri_misfit(TC(32, 256, 4, 4, 3, "ticket"), 2304, 8192, 32) is None
    assert "K=2048 is not a multiple" in T.tri_misfit(TC(32, 256, 16, 4, 3, "ticket"), 8192, 2048, 1)
    assert "bk=8 must be a power of two >= 16" in T.tri_misfit(TC(32, 8, 1, 4, 3, "ticket"), 64, 512, 1)
    assert "N*K < 2**31" in T.tri_misfit(TC(32, 64, 1, 4, 3, "ticket"), 65536, 32768, 1)
    assert "warps=3" in T.tri_misfit(TC(32, 64, 1, 3, 3, "ticket"), 64, 512, 1)
    assert "shared memory" in T.tri_misfit(TC(128, 512, 1, 4, 4, "ticket"), 256, 8192, 32, dual=True)
    assert T.tri_workspace(2304, 32, TC(32, 256, 4, 4, 3, "ticket")) == (4 * 32 * 2304, 72)
    assert T.tri_workspace(2304, 8, TC(32, 256, 4, 4, 3, "atomic")) == (8 * 2304, 72)
    assert T.tri_workspace(8192, 32, TC(32, 256, 1, 4, 3, "ticket")) == (0, 0)
    assert T.tri_bm(16) == 16 and T.tri_bm(17) == 32
    assert T.tri_smem(TC(32, 256, 4, 4, 3, "ticket"), 8, False) == 2 * (16 + 32) * 256 * 2


# ---------------------------------------------------------------------------------------------------
# CPU: the real kernel compiled for sm_90 (Triton's bundled ptxas; no GPU)
# ---------------------------------------------------------------------------------------------------
def compile_sm90(cfg, N, K, bm, dual, pdl):
    """PTX and ptxas -v report of the kernel as tri_gemv would launch it on an H200 (m not 1)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    k = T._tri_gemv_kernel
    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "w2_ptr": "*bf16", "out_ptr": "*fp32" if dual else "*bf16",
           "ws_ptr": "*fp32", "sem_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
    const = dict(BM=bm, BN=cfg.bn, BK=cfg.bk, S=cfg.s, ITERS=K // (cfg.s * cfg.bk), DUAL=dual,
                 ATOMIC=cfg.mode == "atomic", REVERSE=False, USE_GDC=pdl, F32_DOT=False)
    sig.update({c: "constexpr" for c in const})
    # what the launcher's specialization sees: 16-byte aligned pointers, N and K multiples of 16
    attrs = {(T._tri_gemv_kernel.arg_names.index(a),): [["tt.divisibility", 16]]
             for a in ("x_ptr", "w_ptr", "w2_ptr", "out_ptr", "ws_ptr", "sem_ptr", "N", "K")}
    ck = triton.compile(ASTSource(k, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                        options=dict(num_warps=cfg.warps, num_stages=cfg.stages, launch_pdl=pdl))
    ptx = ck.asm["ptx"]
    arch = re.search(r"\.target\s+(\w+)", ptx).group(1)
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [triton.knobs.nvidia.ptxas.path, f"-arch={arch}", "-v", src, "-o", os.path.join(d, "k.o")]
        r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return ptx, r.stderr, ck.metadata.shared


def _compile_cases():
    return [(name, i, bm) for name, cfgs in START.items() for i in range(len(cfgs)) for bm in (16, 32)]


@pytest.mark.skipif(T._TRI_INTERPRET, reason="TRITON_INTERPRET is set in this process")
@pytest.mark.parametrize("name,i,bm", _compile_cases())
def test_start_configs_compile_for_sm90_without_spills(name, i, bm):
    N, K, dual = LAYERS[name]
    cfg = START[name][i]
    assert T.tri_misfit(cfg, N, K, bm, dual) is None
    ptx, report, smem = compile_sm90(cfg, N, K, bm, dual, pdl=bool(cfg.pdl))
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills and spills.groups() == ("0", "0"), report
    assert smem <= T.tri_smem(cfg, bm, dual) <= T.TRI_SMEM_LIMIT
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    assert "prefetch.global.L2" in ptx
    assert "mma.sync" in ptx   # bf16 tensor cores, not an fp32 fallback
    if cfg.s > 1:
        assert "atom.global.gpu.acq_rel.add" in ptx   # the ticket


# ---------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def gpu_weights(name):
    N, K, dual = LAYERS[name]
    return make_weights(N, K, dual, 7 + len(name), "cuda")


def _gpu_cases():
    return [(name, i, m) for name in LAYERS for i in range(len(START[name])) for m in (1, 3, 8, 17, 32)]


@needs_cuda
@pytest.mark.parametrize("name,i,m", _gpu_cases())
def test_gpu_scored_shape(name, i, m):
    N, K, dual = LAYERS[name]
    check_case(N, K, m, START[name][i], dual, 1000 + 37 * m + i, "cuda", gpu_weights(name))


def _graph(calls):
    """Captures calls (a function launching kernels) once in a CUDA graph after an eager warm-up."""
    calls()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        calls()
    torch.cuda.synchronize()
    return g


@needs_cuda
@pytest.mark.parametrize("name,i", [("pooler", 0), ("pooler", 1), ("router", 0), ("router", 1)])
@pytest.mark.parametrize("m", [1, 8, 32])
def test_gpu_graph_replays_with_fresh_x(name, i, m):
    N, K, dual = LAYERS[name]
    cfg = START[name][i]
    w, w2, wref = gpu_weights(name)
    ws, sem, ws_n, sem_n = buffers(N, m, cfg, "cuda")
    x = make_x(m, K, 5, "cuda")
    out = torch.empty(m, N, dtype=torch.float32 if dual else torch.bfloat16, device="cuda")
    g = _graph(lambda: T.tri_gemv(x, w, w2, out, ws, sem, cfg, dual))
    for rep in range(20):
        x.copy_(make_x(m, K, 200 + rep, "cuda"))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        what = f"{name} {cfg} m={m} replay {rep}"
        check_close(out, x.double() @ wref.t(), dual, what)
        eager = run(x, w, w2, cfg, dual, ws, sem)
        if cfg.mode == "ticket":
            assert torch.equal(bits(out), bits(eager)), f"{what}: replay differs from an eager call"
        check_buffers(cfg, ws, sem, ws_n, sem_n, what)


@needs_cuda
@pytest.mark.parametrize("pdl", [True, False])
def test_gpu_graph_pdl_chain_on_shared_buffers(pdl):
    """pooler -> unpooler -> pooler again in one graph: each waits for its input (gdc_wait) and the three share
    one ws / sem, so a semaphore not yet reset or a partial read too early shows up."""
    m = 8
    chain = [("pooler", START["pooler"][0]), ("unpooler", START["unpooler"][1]), ("pooler", START["pooler"][0])]
    ws = torch.zeros(max(T.tri_workspace(LAYERS[n][0], m, c)[0] for n, c in chain) + 1, device="cuda")
    sem = torch.zeros(max(T.tri_workspace(LAYERS[n][0], m, c)[1] for n, c in chain) + 1, dtype=torch.int32,
                      device="cuda")
    x = make_x(m, LAYERS["pooler"][1], 9, "cuda")
    outs = [torch.empty(m, LAYERS[n][0], dtype=torch.bfloat16, device="cuda") for n, _ in chain]

    def calls():
        inp = x
        for (n, cfg), out in zip(chain, outs):
            T.tri_gemv(inp, gpu_weights(n)[0], None, out, ws, sem, cfg, False, pdl=pdl)
            inp = out

    g = _graph(calls)
    for rep in range(20):
        x.copy_(make_x(m, LAYERS["pooler"][1], 300 + rep, "cuda"))
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        got = [o.clone() for o in outs]
        calls()   # eager, same buffers
        torch.cuda.synchronize()
        for (n, _), a, b in zip(chain, got, outs):
            assert torch.equal(bits(a), bits(b)), f"replay {rep}: {n} differs from the eager chain"
        inp = x
        for (n, _), o in zip(chain, got):
            check_close(o, inp.double() @ gpu_weights(n)[2].t(), False, f"chain {n} replay {rep}")
            inp = o
        assert int(sem.abs().sum()) == 0


if __name__ == "__main__" and "--interpret" in sys.argv:
    interpreter_main()
