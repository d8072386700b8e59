"""The per-call path: kernel_fn (host-side checks, then one launch on the current stream) and the cuBLAS fallback for
what the kernels do not run (m > 32, shapes they do not take)."""
import torch

from .extension import raw_stream
from .families import MAX_M
from .layer import Layer


def fallback_matmul(x, w, out):
    """out = x @ w.T through cuBLAS for what our kernels do not run (m > MAX_M, shapes they do not take): bf16 weights
    by cuBLAS's bf16 GEMM with its split-K partial sums kept in fp32 (torch lets cuBLAS reduce them in bf16 by default,
    which can miss SPEC's tolerance), fp32 weights by the fp32 GEMM (TF32 is
    off by torch's default). It runs as fast as torch's default F.linear and passes SPEC's check at m = 33..512
    (tools/fallback_bench.py; FINDINGS, "the m > 32 fallback")."""
    if w.dtype == torch.float32:
        torch.mm(x.float(), w.t(), out=out)
        return
    flags = torch.backends.cuda.matmul
    old = flags.allow_bf16_reduced_precision_reduction
    flags.allow_bf16_reduced_precision_reduction = False
    try:
        torch.mm(x, w.t(), out=out)
    finally:
        flags.allow_bf16_reduced_precision_reduction = old


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
        fallback_matmul(x, layer.weight, out)
        return out
    layer.launch(m)(x.data_ptr(), out.data_ptr(), m, raw_stream(x.device), layer.pdl and p.config.pdl == 1)
    return out
