"""The Triton path (tri_gemv), removed from the upload in session 24 (issue #40): slower than the CUDA paths on every
tuned shape (FINDINGS, "the Triton path"; experiments/triton/ttable.json holds its tuned rows, TPICK was empty).

This is the code as it stood in submission.py at commit 4f615bf (the Triton section, tri_default and the tables'
TritonConfig); experiments/triton/test_triton.py is its test file from that commit, which imported it from
submission.py. To run it again, check out 4f615bf, or import this module in place of submission's names.
"""
import collections

import torch

TritonConfig = collections.namedtuple("TritonConfig", "bn bk s warps stages mode pdl", defaults=(1,))
MAX_M = 32
TARGET_CTAS = 264


# ===================================================================================================
# The Triton path (our chapter 9): the same GEMV written in Triton, as a tuned alternative the tables can pick
# (TTABLE / TPICK) and that prepare(path="triton") forces. Weights stay in their natural [N, K] layout (the
# router: its hi / lo bf16 halves). One launch per call, grid (N // bn, s); split-K is reduced inside the
# launch (ticket: deterministic; atomic: not). Triton is optional: without it the CUDA paths work and
# prepare(path="triton") says it is missing.
#
#     ws_elems, sem_count = tri_workspace(N, m_max, cfg)      # the caller allocates, zero-filled, once
#     tri_gemv(x, w, None, out, ws, sem, cfg, dual=False)     # bf16 layer: out bf16 [m, N]
#     tri_gemv(x, hi, lo, out, ws, sem, cfg, dual=True)       # router: out fp32 [m, N]
# ===================================================================================================
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

TRI_MODES = ("ticket", "atomic")
TRI_SMEM_LIMIT = 227 * 1024   # opt-in shared memory of one H100 / H200 CTA


if triton is not None:
    @triton.jit
    def _tri_mma(acc, x, w, F32_DOT: tl.constexpr):
        """acc + x @ w.T in fp32 (bf16 products are exact in fp32)."""
        if F32_DOT:
            # The interpreter multiplies the raw bit patterns of bf16 dot operands (triton-lang/triton#11584);
            # fp32 operands give it the same exact products. Never used on a GPU.
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
        return acc


    @triton.jit
    def _tri_prefetch_l2(ptrs):
        """Fire-and-forget L2 prefetch of the 128-byte lines holding ptrs: no register waits for it."""
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // dummy $0", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)


    @triton.jit(do_not_specialize=["M"])   # one compile per (BM, config), not per m
    def _tri_gemv_kernel(x_ptr, w_ptr, w2_ptr, out_ptr, ws_ptr, sem_ptr, M, N, K,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, S: tl.constexpr, ITERS: tl.constexpr,
                         DUAL: tl.constexpr, ATOMIC: tl.constexpr, REVERSE: tl.constexpr,
                         USE_GDC: tl.constexpr, F32_DOT: tl.constexpr):
        """out[:M, block pid_n] = x @ W[block].T over the K slice pid_s, split-K reduced in this launch.

        ws: ticket mode fp32 partials [N // BN, S, M, BN]; atomic mode a zeroed fp32 buffer [M, N] (left zeroed).
        sem: int32 [N // BN] tickets, zero on entry and on exit. S == 1 touches neither.
        """
        if USE_GDC:
            # let the next kernel of the stream start its prologue now; it waits for us in its gdc_wait
            tl.extra.cuda.gdc_launch_dependents()
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        if REVERSE:
            pid_n = tl.num_programs(0) - 1 - pid_n
            pid_s = S - 1 - pid_s

        rm = tl.arange(0, BM)
        rn = tl.arange(0, BN)
        rk = tl.arange(0, BK)
        k0 = pid_s * (ITERS * BK)   # K // S, written so that the compiler sees it is a multiple of BK
        row_ok = (rm < M)[:, None]
        x_ptrs = x_ptr + rm[:, None] * K + (k0 + rk)[None, :]
        w_offs = (pid_n * BN + rn)[:, None] * K + (k0 + rk)[None, :]

        if USE_GDC:
            # A hint only (nothing is read into registers), so safe before the wait: the first weight tile
            # heads for L2 while the previous kernel finishes.
            lines = (pid_n * BN + rn)[:, None] * K + (k0 + 64 * tl.arange(0, (BK + 63) // 64))[None, :]
            _tri_prefetch_l2(w_ptr + lines)
            if DUAL:
                _tri_prefetch_l2(w2_ptr + lines)
            tl.extra.cuda.gdc_wait()   # x, ws, sem and out may belong to the previous kernel until here
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for i in range(ITERS):
            x = tl.load(x_ptrs + i * BK, mask=row_ok, other=0.0)
            acc = _tri_mma(acc, x, tl.load(w_ptr + w_offs + i * BK, eviction_policy="evict_first"), F32_DOT)
            if DUAL:   # hi and lo into the same fp32 accumulators
                acc = _tri_mma(acc, x, tl.load(w2_ptr + w_offs + i * BK, eviction_policy="evict_first"), F32_DOT)

        out_offs = rm[:, None] * N + (pid_n * BN + rn)[None, :]
        if S == 1:
            tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=row_ok)
        else:
            part_offs = rm[:, None] * BN + rn[None, :]
            if ATOMIC:
                tl.atomic_add(ws_ptr + out_offs, acc, mask=row_ok, sem="relaxed")
            else:
                tl.store(ws_ptr + ((pid_n * S + pid_s) * M) * BN + part_offs, acc, mask=row_ok)
            # Every thread's partial must be issued before the ticket, whose release one thread performs.
            tl.debug_barrier()
            ticket = tl.atomic_add(sem_ptr + pid_n, 1, sem="acq_rel")
            if ticket == S - 1:
                # .cg reads L2, where the other programs' partials are; L1 is not coherent.
                if ATOMIC:
                    tot = tl.load(ws_ptr + out_offs, mask=row_ok, other=0.0, cache_modifier=".cg")
                    # The load and the zeroing store may give an element to different threads (their layouts
                    # differ): without this barrier a thread could zero an element before another has read
                    # it (seen on the H200 at BM = 32 with 8 warps: outputs of exactly 0).
                    tl.debug_barrier()
                    tl.store(ws_ptr + out_offs, tl.zeros((BM, BN), dtype=tl.float32), mask=row_ok)
                else:
                    blk = ws_ptr + (pid_n * S * M) * BN + part_offs
                    tot = tl.load(blk, mask=row_ok, other=0.0, cache_modifier=".cg")
                    for s in tl.static_range(1, S):   # fixed order: the result is independent of who is last
                        tot += tl.load(blk + s * M * BN, mask=row_ok, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + out_offs, tot.to(out_ptr.dtype.element_ty), mask=row_ok)
                tl.store(sem_ptr + pid_n, 0)


# Under TRITON_INTERPRET=1 triton.jit returns an InterpretedFunction: no PDL there, and fp32 dot operands.
_TRI_INTERPRET = triton is not None and not isinstance(_tri_gemv_kernel, triton.runtime.JITFunction)


def _tri_pow2(v):
    return isinstance(v, int) and v > 0 and v & (v - 1) == 0


def tri_bm(m):
    """Rows of the x tile (tl.dot needs at least 16): 16 for m <= 16, else 32."""
    return 16 if m <= 16 else 32


def tri_smem(cfg, m, dual):
    """Shared memory of one program in bytes: Triton 3.6 keeps stages - 1 tiles of x and W (and lo) in flight."""
    return max(cfg.stages - 1, 1) * (tri_bm(m) + cfg.bn * (2 if dual else 1)) * cfg.bk * 2


def tri_misfit(cfg, N, K, m, dual=False):
    """None if cfg can run the shape [m, K] x [N, K]^T (dual: with a lo half too), else a string saying why."""
    if cfg.mode not in TRI_MODES:
        return f"mode {cfg.mode!r} is not one of {TRI_MODES}"
    for name in ("bn", "bk"):
        v = getattr(cfg, name)
        if not _tri_pow2(v) or v < 16:
            return f"{name}={v} must be a power of two >= 16 (tl.dot tile)"
    if not _tri_pow2(cfg.warps) or cfg.warps > 32:
        return f"warps={cfg.warps} must be a power of two <= 32"
    for name in ("s", "stages"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or v < 1:
            return f"{name}={v} must be an int >= 1"
    if cfg.pdl not in (0, 1):
        return f"pdl={cfg.pdl} must be 0 or 1"
    if not 1 <= m <= MAX_M:
        return f"m={m} is outside 1..{MAX_M}"
    if N < 1 or K < 1 or N * K >= 2 ** 31:
        return f"N={N} K={K}: both must be positive and N*K < 2**31 (int32 offsets)"
    if N % cfg.bn:
        return f"N={N} is not a multiple of bn={cfg.bn}"
    if K % (cfg.s * cfg.bk):
        return f"K={K} is not a multiple of s*bk={cfg.s}*{cfg.bk}={cfg.s * cfg.bk}"
    smem = tri_smem(cfg, m, dual)
    if smem > TRI_SMEM_LIMIT:
        return f"the pipeline needs {smem} B of shared memory > {TRI_SMEM_LIMIT} B"
    return None


def tri_workspace(N, m_max, cfg):
    """(ws fp32 elements, sem int32 count) that calls of cfg need for N columns and up to m_max tokens.

    Allocate both zero-filled (torch.zeros) once; every call leaves them so. ticket mode: ws holds the fp32
    partials (scratch, may be shared by layers run one after another on one stream); atomic mode: ws is the
    accumulation buffer, which must stay all zeros between calls: never share it with a ticket-mode ws.
    Configs of one layer can share buffers of the largest size. s == 1 needs neither (sizes 0).
    """
    if cfg.s == 1:
        return 0, 0
    ws = (cfg.s if cfg.mode == "ticket" else 1) * m_max * N
    return ws, N // cfg.bn


def _tri_tensor(name, t, dtype, shape, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, received {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, received {t.dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, received {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (strides {t.stride()})")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, received {t.device}")


def _tri_check(x, w, w2, out, ws, sem, cfg, dual):
    """Validates a tri_gemv call (raises TypeError / ValueError naming the expected and received values)."""
    if not isinstance(cfg, TritonConfig):
        raise TypeError(f"cfg: expected a TritonConfig, received {type(cfg).__name__}")
    if not isinstance(dual, bool):
        raise TypeError(f"dual: expected a bool, received {type(dual).__name__}")
    _tri_tensor("x", x, torch.bfloat16, None, None)
    if x.dim() != 2:
        raise ValueError(f"x: expected 2 dims [m, K], received shape {tuple(x.shape)}")
    m, K = x.shape
    _tri_tensor("w", w, torch.bfloat16, None, x.device)
    if w.dim() != 2 or w.shape[1] != K:
        raise ValueError(f"w: expected shape [N, {K}], received {tuple(w.shape)}")
    N = w.shape[0]
    if dual:
        _tri_tensor("w2", w2, torch.bfloat16, (N, K), x.device)
    elif w2 is not None:
        raise ValueError("w2: expected None when dual is False (it is the router's lo half)")
    _tri_tensor("out", out, torch.float32 if dual else torch.bfloat16, (m, N), x.device)
    _tri_tensor("ws", ws, torch.float32, None, x.device)
    _tri_tensor("sem", sem, torch.int32, None, x.device)
    why = tri_misfit(cfg, N, K, m, dual)
    if why:
        raise ValueError(f"{cfg} cannot run m={m} N={N} K={K}: {why}")
    ws_need, sem_need = tri_workspace(N, m, cfg)
    if ws.numel() < ws_need or sem.numel() < sem_need:
        raise ValueError(f"ws / sem: expected at least {ws_need} / {sem_need} elements, "
                         f"received {ws.numel()} / {sem.numel()}")


def tri_gemv(x, w, w2, out, ws, sem, cfg, dual, pdl=True, reverse=False):
    """out = x @ w.T (bf16 out), or x @ w.T + x @ w2.T in one set of fp32 accumulators (dual, fp32 out).

    x bf16 [m, K], 1 <= m <= 32; w (and w2) bf16 [N, K]; ws / sem as tri_workspace says, zero-filled.
    Launches one kernel on the current stream: no allocation, no sync (CUDA-graph capturable). pdl: launch
    with programmatic dependent launch when cfg.pdl is 1 too: the kernel overlaps the previous one's tail
    and waits for it (griddepcontrol.wait) before reading x or touching out / ws / sem. reverse: maps
    program ids backwards (tests: the ticket result must not depend on program order). Returns out.
    """
    if triton is None:
        raise RuntimeError("the Triton path needs the triton package (pip install triton)")
    _tri_check(x, w, w2, out, ws, sem, cfg, dual)
    return _tri_launch(x, w, w2, out, ws, sem, cfg, dual, pdl, reverse)


def _tri_launch(x, w, w2, out, ws, sem, cfg, dual, pdl, reverse=False):
    """tri_gemv without its checks: kernel_fn's per-call path (the inputs are checked there, the config and the
    buffers at prepare)."""
    (m, K), N = x.shape, w.shape[0]
    use_pdl = bool(pdl and cfg.pdl) and not _TRI_INTERPRET
    # launch_pdl is a compile option as well as a launch attribute: pass it only when on
    extra = {"launch_pdl": True} if use_pdl else {}
    _tri_gemv_kernel[(N // cfg.bn, cfg.s)](
        x, w, w2 if dual else w, out, ws, sem, m, N, K,
        BM=tri_bm(m), BN=cfg.bn, BK=cfg.bk, S=cfg.s, ITERS=K // (cfg.s * cfg.bk), DUAL=dual,
        ATOMIC=cfg.mode == "atomic", REVERSE=bool(reverse), USE_GDC=use_pdl, F32_DOT=_TRI_INTERPRET,
        num_warps=cfg.warps, num_stages=cfg.stages, **extra)
    return out




def tri_default(N, K, m, dual):
    """The Triton default for a (layer, m) TTABLE does not cover: bn = 32 (16 if N needs it), bk = 128 (64 if K
    needs it), 4 warps, 3 stages, ticket mode, s the smallest power of two giving TARGET_CTAS programs that
    divides K. None if nothing fits."""
    for bn, bk in ((32, 128), (16, 128), (32, 64), (16, 64)):
        cfg = TritonConfig(bn, bk, 1, 4, 3, "ticket")
        if tri_misfit(cfg, N, K, m, dual):
            continue
        while N // bn * cfg.s < TARGET_CTAS and not tri_misfit(cfg._replace(s=2 * cfg.s), N, K, m, dual):
            cfg = cfg._replace(s=2 * cfg.s)
        return cfg
    return None


