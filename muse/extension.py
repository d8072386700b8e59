"""The CUDA extension: the kernel source as one string, variant builds for tools and tests, the build at import.

KERNEL_SRC (csrc/kernels.cu with its headers inlined) and BIND_SRC (csrc/bind.cpp with csrc/args.h) are written into
the upload by build.py. load_inline compiles them once per source text, cached by torch under $TORCH_EXTENSIONS_DIR
(default ~/.cache/torch_extensions/<python>_<cuda>/muse_gemv_<hash>). MUSE_BUILD=0 skips the build (CPU tools).
"""
import hashlib
import inspect
import os
import sys
import time

import torch

from ._generated import BIND_SRC, KERNEL_SRC
from .families import (H200, KERNEL_TABLE_BEGIN, KERNEL_TABLE_END, Hardware, kernel_table_source,
                       replace_region, set_hardware)

# sm_90a: the wgmma instructions of gemvt_kernel exist only on the arch-specific target (an H100 / H200 build).
NVCC_FLAGS = ["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a"]


def variant_source(defines=(), insts=None, head="", kernel_src=None):
    """KERNEL_SRC (or kernel_src) as a variant build compiles it: `#define NAME` lines first, then head (text placed
    before the kernels: the tools' csrc/instruments.cuh), and with insts (a list of (family, template args)) only
    those instantiations."""
    src = KERNEL_SRC if kernel_src is None else kernel_src
    for d in defines:
        if not d.replace("_", "").isalnum():
            raise ValueError(f"define {d!r} is not a macro name")
    if insts is not None:
        src = replace_region(src, KERNEL_TABLE_BEGIN, KERNEL_TABLE_END, kernel_table_source(insts))
    return "".join(f"#define {d}\n" for d in defines) + head + src


def build_extension(defines=(), insts=None, head="", verbose=False):
    """Compile variant_source(defines, insts, head) and the glue with load_inline as muse_gemv_<hash of the sources and
    flags>; returns the module. The shipped build is build_extension(). A variant (tools, tests) gets its own cached
    build; with insts it compiles only those configs (seconds instead of the shipped build's tens of seconds). Prints
    a line before and after a cold build."""
    from torch.utils import cpp_extension
    src = variant_source(defines, insts, head)
    name = "muse_gemv_" + hashlib.sha1((src + BIND_SRC + " ".join(NVCC_FLAGS)).encode()).hexdigest()[:12]
    try:
        bdir = cpp_extension._get_build_directory(name, verbose=False)
    except Exception:  # a private helper, used only for the progress message
        bdir = os.path.join(cpp_extension.get_default_build_root(), name)
    cached = os.path.exists(os.path.join(bdir, name + ".so"))
    # no_implicit_headers (torch >= 2.7): no torch header in the glue or the kernels, which need none; an older torch
    # prepends them, and the build only takes longer.
    lean = {"no_implicit_headers": True} if "no_implicit_headers" in inspect.signature(
        cpp_extension.load_inline).parameters else {}
    t0 = time.time()
    if not cached:
        what = "the shipped configs" if insts is None else f"{len(insts)} configs"
        extra = f" ({'+'.join(defines)})" if defines else ""
        print(f"[muse] compiling CUDA extension {name}{extra}: {what}, cached afterwards in {bdir}"
              f"{'' if lean else ' (this torch prepends its own headers: slower)'}", file=sys.stderr, flush=True)
    mod = cpp_extension.load_inline(name=name, cpp_sources=[BIND_SRC], cuda_sources=[src],
                                    extra_cuda_cflags=NVCC_FLAGS, extra_cflags=["-O2"], verbose=verbose, **lean)
    if not cached:
        print(f"[muse] compiled in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    return mod


def device_hardware(device=0):
    """The Hardware of a CUDA device: its SM count and shared memory limits (the H200's where torch does not say)."""
    p = torch.cuda.get_device_properties(device)
    return Hardware(p.name, p.multi_processor_count,
                    getattr(p, "shared_memory_per_block_optin", H200.smem_cta),
                    getattr(p, "shared_memory_per_multiprocessor", H200.smem_sm))


_SHIPPED = None
if torch.cuda.is_available():
    set_hardware(device_hardware())
    if os.environ.get("MUSE_BUILD", "1") != "0":
        _SHIPPED = build_extension()


def shipped_extension():
    """The extension built at import from the shipped source (prepare's default)."""
    if _SHIPPED is None:
        raise RuntimeError("the CUDA extension is not built: this needs a CUDA device (and MUSE_BUILD != 0)")
    return _SHIPPED


# torch's own accessor of the current stream's handle (no Stream object per call); None where a torch lacks it
_CURRENT_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def raw_stream(device):
    """The current CUDA stream of device as an integer handle (what the glue launches on; a graph capture's stream
    while capturing)."""
    if _CURRENT_RAW_STREAM is not None:
        return _CURRENT_RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream
