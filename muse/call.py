"""The per-call path: kernel_fn (host-side checks, then one launch on the current stream) and the cuBLAS fallback for
what the kernels do not run (m > 32, shapes they do not take)."""
import contextlib

import torch

from .extension import raw_stream
from .families import MAX_M
from .layer import Layer


@contextlib.contextmanager
def full_precision_sums():
    """cuBLAS's bf16 GEMMs with their split-K partial sums kept in fp32 (torch lets cuBLAS reduce them in bf16 by
    default, which can miss SPEC's tolerance), restored afterwards."""
    flags = torch.backends.cuda.matmul
    old = flags.allow_bf16_reduced_precision_reduction
    flags.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        flags.allow_bf16_reduced_precision_reduction = old


def fallback_matmul(x, w, out):
    """out = x @ w.T through cuBLAS for what our kernels do not run (m > MAX_M, shapes they do not take): bf16 weights
    by cuBLAS's bf16 GEMM with its split-K partial sums kept in fp32 (torch lets cuBLAS reduce them in bf16 by default,
    which can miss SPEC's tolerance), fp32 weights by the fp32 GEMM (TF32 is
    off by torch's default). It runs as fast as torch's default F.linear and passes SPEC's check at m = 33..512
    (tools/fallback_bench.py; FINDINGS, "the m > 32 fallback")."""
    if w.dtype == torch.float32:
        torch.mm(x.float(), w.t(), out=out)
        return
    with full_precision_sums():
        torch.mm(x, w.t(), out=out)


DENSE_SLICE_BYTES = 8 * 1024 ** 2   # rows of W rebuilt at a time: a slice cuBLAS reads back from L2, not from HBM


def dense_matmul(x, layer, out):
    """out = x @ W.T for a layer that holds only its own copy (prepare(one_copy=True)): W rebuilt a slice of rows at
    a time (layer.dense: the 12-bit stream decoded by the kernels' decz, or a packed copy permuted back), each slice
    multiplied by cuBLAS with fp32 sums into its rows of out's transpose, then out = that transpose. The m > 32 path
    (prefill) of such a layer; its cost beyond fallback_matmul is the decode of each slice (not yet measured)."""
    N, K, m = layer.N, layer.K, x.shape[0]
    step = max(64, DENSE_SLICE_BYTES // (K * (4 if layer.dual else 2)) // 64 * 64)
    out_t = torch.empty((N, m), dtype=out.dtype, device=x.device)
    xt = (x.float() if layer.dual else x).t()
    with full_precision_sums():
        for r0 in range(0, N, step):
            r1 = min(N, r0 + step)
            torch.mm(layer.dense(r0, r1), xt, out=out_t[r0:r1])
    out.copy_(out_t.t())


def kernel_fn(x, layer, out=None):
    """y = x @ W.T for a prepared layer. x: CUDA bf16 [m, K], contiguous, 16-byte aligned, m >= 1.
    Returns [m, N] (bf16; fp32 for fp32 weights). out: optional preallocated result (tests poison it).
    Host-side checks only; launches on torch.cuda.current_stream(); safe to capture in a CUDA graph."""
    if not isinstance(layer, Layer):
        raise TypeError(f"layer must come from submission.prepare, got {type(layer).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x must be torch.bfloat16, got {x.dtype} (layer '{layer.name}')")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [m, K], got shape {tuple(x.shape)} (layer '{layer.name}')")
    m, k = x.shape
    if k != layer.K:
        raise ValueError(f"x has K={k} but layer '{layer.name}' has K={layer.K}")
    if m == 0:
        raise ValueError(f"x has m=0 rows; expected m >= 1 (layer '{layer.name}')")
    if x.device != layer.device:
        raise ValueError(f"x is on {x.device} but layer '{layer.name}' is on {layer.device}")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous, got strides {x.stride()} (layer '{layer.name}')")
    if x.data_ptr() % 16:
        raise ValueError(f"x must be 16-byte aligned, got address {x.data_ptr():#x} (layer '{layer.name}')")
    N = layer.N
    if out is None:
        out = torch.empty((m, N), dtype=layer.out_dtype, device=x.device)
    elif out.shape != (m, N) or out.dtype != layer.out_dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {layer.out_dtype} [{m}, {N}] on {x.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    p = layer.plans[m] if m <= MAX_M else None
    if p is None or p.path == "fallback":
        if layer.weight is not None:
            fallback_matmul(x, layer.weight, out)
        else:
            dense_matmul(x, layer, out)
        return out
    layer.launch(m)(x.data_ptr(), out.data_ptr(), m, raw_stream(x.device), layer.pdl and p.config.pdl == 1)
    return out
