"""A bare streaming read, timed as SPEC times our kernels, with the one constraint our GEMVs have and the PDL
anchor (docs/anchors/pdl-read-h200-2026-11-30.json) does not: x may be written by the previous kernel, so a
GEMV can read only its weights before griddepcontrol.wait. How fast can any kernel under that rule read the
bytes, and how much does loading more of them before the wait give back?

    python tools/pdl_probe.py                      (all sizes; ~30 s compile, ~30 s of runs)
    python tools/pdl_probe.py --sizes pooler_z --replays 40

Variants (each one kernel launch per copy; P copies >= 2 GB back to back in one CUDA graph; median of replays):
  end      every load before the wait, which sits just before the store (the anchor's probe)
  top      the wait first, then every load (a kernel that cannot start its stream before the wait)
  regN     N batches (U = 4 loads of 16 B per thread) issued into registers before the wait, the rest after
  smemK    K KB of the CTA's slice bulk-copied (cp.async.bulk, 16 KB per copy, thread 0) into shared memory
           before the wait, the rest streamed into registers after it; smemKw: the same in 1.5 KB copies issued
           by lane 0 of every warp (the reverted gemvz sp issued one copy per warp and row block)
  l2pK     K KB per CTA prefetched into L2 (cp.async.bulk.prefetch.L2) before the wait, all of it then streamed
  ...-u1   top / smemK with U = 1 (two 16-byte loads per thread in flight, about gemvz's depth)
  ...-nopdl the same launch without the PDL attribute
Every variant folds each 16-byte unit of its CTA's slice into one xor per CTA, and that xor is checked against
numpy before the variant is timed: a probe that skipped or repeated bytes would fail there.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import judge  # noqa: E402

# The device code, free of torch headers (tests/test_compile.py compiles it with nvcc alone).
PROBE_CU = r"""
#include <cstdint>
#include <cuda_runtime.h>

// the weight load of submission.py's kernels, the same instruction
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Each CTA reads units [blockIdx.x * per_cta, +per_cta) of 16 B: the first sm_units through shared memory
// (one bulk copy per 16 KB, issued by thread 0 before the wait), then nb batches of U units per thread
// (thread tid, batch j, load u: unit sm_units + (j * U + u) * T + tid, so each warp load is 512 contiguous bytes),
// PRE of them issued before the wait. WAIT_END: the wait sits just before the store instead (the anchor).
template <int U, int PRE, bool WAIT_END>
__global__ void __launch_bounds__(512, 2) probe_kernel(const uint4* __restrict__ w, int nb, int sm_units, int chunk,
                                                    int per_warp, int l2p, uint32_t* __restrict__ out) {
  extern __shared__ uint4 sbuf[];
  __shared__ unsigned long long bar;
  __shared__ uint32_t cta_x;
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int T = blockDim.x, tid = threadIdx.x;
  const uint4* base = w + (size_t)blockIdx.x * ((size_t)nb * U * T + sm_units);
  const uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar);
  if (tid == 0) {
    cta_x = 0;
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    if (sm_units)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(sm_units * 16) : "memory");
  }
  __syncthreads();
  // the copies: chunks of `chunk` units, issued by thread 0 (per_warp = 0) or by lane 0 of every warp in turn
  if (sm_units && (per_warp ? (tid & 31) == 0 : tid == 0)) {
    const int first = per_warp ? (tid >> 5) * chunk : 0, step = per_warp ? (T >> 5) * chunk : chunk;
    for (int c = first; c < sm_units; c += step) {
      const int n = min(chunk, sm_units - c);
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   ::"r"((uint32_t)__cvta_generic_to_shared(sbuf + c)), "l"(base + c), "r"(n * 16), "r"(b)
                   : "memory");
    }
  }
  if (l2p && tid == 0)  // an L2 prefetch of the first l2p units the registers will stream (no smem, no registers)
    for (int c = 0; c < l2p; c += 1024)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + sm_units + c), "r"(min(1024, l2p - c) * 16)
                   : "memory");
  const uint4* wp = base + sm_units + tid;
  uint4 pre[PRE > 0 ? PRE : 1][U];
#pragma unroll
  for (int p = 0; p < PRE; p++)
#pragma unroll
    for (int u = 0; u < U; u++) pre[p][u] = ld_stream(wp + (size_t)(p * U + u) * T);
  if (!WAIT_END) asm volatile("griddepcontrol.wait;" ::: "memory");
  uint32_t acc = 0;
  uint4 cur[U];
  int j = PRE;
  if (j < nb) {
#pragma unroll
    for (int u = 0; u < U; u++) cur[u] = ld_stream(wp + (size_t)(j * U + u) * T);
  }
#pragma unroll
  for (int p = 0; p < PRE; p++)
#pragma unroll
    for (int u = 0; u < U; u++) acc ^= fold(pre[p][u]);
  if (sm_units) {
    uint32_t done = 0;
    while (!done)
      asm volatile("{\n .reg .pred q;\n mbarrier.try_wait.parity.shared::cta.b64 q, [%1], 0;\n"
                   " selp.u32 %0, 1, 0, q;\n}" : "=r"(done) : "r"(b) : "memory");
#pragma unroll 4
    for (int i = tid; i < sm_units; i += T) acc ^= fold(sbuf[i]);
  }
#pragma unroll 1
  for (; j < nb; j++) {
    uint4 nxt[U];
    if (j + 1 < nb) {
#pragma unroll
      for (int u = 0; u < U; u++) nxt[u] = ld_stream(wp + (size_t)((j + 1) * U + u) * T);
    }
#pragma unroll
    for (int u = 0; u < U; u++) acc ^= fold(cur[u]);
#pragma unroll
    for (int u = 0; u < U; u++) cur[u] = nxt[u];
  }
  atomicXor(&cta_x, acc);
  __syncthreads();
  if (WAIT_END) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (tid == 0) out[blockIdx.x] = cta_x;
}

typedef void (*probe_fn)(const uint4*, int, int, int, int, int, uint32_t*);

// kind: 0 = top-wait (PRE = 0), 1 = PRE 1, 2 = PRE 2, 3 = end-wait, 4 = top-wait with U = 1 (two 16 B loads per
// thread in flight, about gemvz's depth). Returns the cudaError_t of the launch.
int probe_launch(int kind, const void* w, void* out, int grid, int block, int nb, int sm_units, int chunk,
                 int per_warp, int l2p, int pdl, cudaStream_t st) {
  static const probe_fn fns[5] = {probe_kernel<4, 0, false>, probe_kernel<4, 1, false>, probe_kernel<4, 2, false>,
                                  probe_kernel<4, 0, true>, probe_kernel<1, 0, false>};
  if (kind < 0 || kind > 4) return (int)cudaErrorInvalidValue;
  const size_t smem = (size_t)sm_units * 16;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute((const void*)fns[kind], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem);
    if (e != cudaSuccess) return (int)e;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, fns[kind], (const uint4*)w, nb, sm_units, chunk, per_warp, l2p,
                                           (uint32_t*)out);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return (int)e;
}
"""

BINDING = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
int probe_launch(int kind, const void* w, void* out, int grid, int block, int nb, int sm_units, int chunk,
                 int per_warp, int l2p, int pdl, cudaStream_t st);
int launch(torch::Tensor w, int64_t offset, torch::Tensor out, int64_t kind, int64_t grid, int64_t block, int64_t nb,
           int64_t sm_units, int64_t chunk, int64_t per_warp, int64_t l2p, int64_t pdl) {
  return probe_launch((int)kind, (const char*)w.data_ptr() + offset, out.data_ptr(), (int)grid, (int)block, (int)nb,
                      (int)sm_units, (int)chunk, (int)per_warp, (int)l2p, (int)pdl, at::cuda::getCurrentCUDAStream());
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("launch", &launch); }
"""

U = 4
KIND_U = {0: 4, 1: 4, 2: 4, 3: 4, 4: 1}   # loads per thread per batch of each kernel kind
# name: (bytes, grid, block); each CTA's slice must be whole batches of U * block units (batches())
SIZES = {
    "pooler_z": (50331648, 256, 512),   # 50.3 MB, pooler / unpooler at 12 bits; 256 CTAs like gemvz's m=1 plan
    "qkv_z": (28311552, 216, 512),      # 28.3 MB
    "o_proj_z": (25165824, 192, 512),   # 25.2 MB
    "router64": (8388608, 64, 512),     # 8.4 MB, the router's hi + lo over its m <= 8 grid (64 CTAs)
    "router128": (8388608, 128, 512),   # 8.4 MB over 128 CTAs (its m = 32 grid); reg2 = every load before the wait
    # issue #30's >= 100 MB shapes at 12 bits: llama3-8b.gate_up's 176 MB over 256 CTAs (under one wave of 2 a SM) and
    # over 896 (gemvz's S = 1 grid of 32-row CTAs: 3.4 waves); 100.7 MB, the smallest of them (qwen2-7b.down,
    # gemma-2b.gate_up)
    "z176": (176160768, 256, 512),
    "z176g896": (176160768, 896, 512),
    "z100": (100663296, 256, 512),
}


def variants(nb, block):
    """(label, kind, sm_units, chunk, per_warp, l2p, pdl) for a size whose threads each read nb batches; smem
    variants in whole batches (U * block units) up to 96 KB per CTA, copied in 16 KB chunks by one thread, and
    (suffix w) in 1.5 KB chunks (gemvz's group) by lane 0 of every warp; l2pK: K KB per CTA prefetched into L2
    before the wait (cp.async.bulk.prefetch.L2), all of it then streamed through registers."""
    out = [("end", 3, 0, 0, 0, 0, 1), ("top", 0, 0, 0, 0, 0, 1), ("reg1", 1, 0, 0, 0, 0, 1), ("reg2", 2, 0, 0, 0, 0, 1)]
    batch_units = U * block
    ks = [k for k in (1, 2, 3) if k < nb and k * batch_units * 16 <= 96 * 1024]
    for k in ks:
        kb = k * batch_units * 16 // 1024
        out.append((f"smem{kb}", 0, k * batch_units, 1024, 0, 0, 1))
        out.append((f"smem{kb}w", 0, k * batch_units, 96, 1, 0, 1))
        out.append((f"l2p{kb}", 0, 0, 0, 0, k * batch_units, 1))
    # the same at a shallow register stream (U = 1): does the prefill still pay when few loads are in flight?
    out.append(("top-u1", 4, 0, 0, 0, 0, 1))
    out += [(f"smem{k * batch_units * 16 // 1024}-u1", 4, k * batch_units, 1024, 0, 0, 1) for k in ks[:2]]
    out += [("end-nopdl", 3, 0, 0, 0, 0, 0), ("top-nopdl", 0, 0, 0, 0, 0, 0)]
    return out


def build(verbose=False):
    from torch.utils.cpp_extension import load_inline
    t0 = time.time()
    ext = load_inline("muse_pdl_probe", cpp_sources="", cuda_sources=[PROBE_CU, BINDING],
                      extra_cuda_cflags=["-O3", "-std=c++17", "-arch=sm_90"], verbose=verbose)
    print(f"[probe] built in {time.time() - t0:.1f} s", flush=True)
    return ext


def expected_xor(buf_u32, grid):
    """The xor of every 32-bit word of each CTA's slice (numpy, CPU)."""
    a = buf_u32.cpu().numpy().view(np.uint32).reshape(grid, -1)
    return np.bitwise_xor.reduce(a, axis=1)


def batches(name):
    """(units of 16 B per CTA, U-batches per thread) of a size; ValueError unless the CTAs' slices are equal and
    whole batches."""
    nbytes, grid, block = SIZES[name]
    units = nbytes // 16
    if nbytes % 16 or units % grid or (units // grid) % (U * block):
        raise ValueError(f"size {name}: {nbytes} B over {grid} CTAs of {block} threads is not whole batches of {U}")
    return units // grid, units // grid // (U * block)


def run_size(ext, name, replays):
    nbytes, grid, block = SIZES[name]
    per_cta, nb = batches(name)
    P = judge.copies_for(nbytes)
    buf = torch.randint(-2**31, 2**31 - 1, (P * nbytes // 4,), dtype=torch.int32, device="cuda")
    outs = [torch.empty(grid, dtype=torch.int32, device="cuda") for _ in range(P)]
    want0 = expected_xor(buf[: nbytes // 4], grid)
    wantl = expected_xor(buf[(P - 1) * nbytes // 4:], grid)
    vs = variants(nb, block)
    print(f"[probe] {name}: {nbytes / 1e6:.1f} MB, grid {grid} x {block}, {nb} batches of {U} "
          f"per thread, P = {P} copies", flush=True)

    def launcher(kind, smu, chunk, per_warp, l2p, pdl, i):
        nb = (per_cta - smu) // (KIND_U[kind] * block)
        return lambda: ext.launch(buf, i * nbytes, outs[i], kind, grid, block, nb, smu, chunk, per_warp, l2p, pdl)

    res = {v[0]: [] for v in vs}
    for label, *v in vs:                      # check every variant before any timing
        for i, want in ((0, want0), (P - 1, wantl)):
            outs[i].fill_(0x5A5A5A5A)
            rc = launcher(*v, i)()
            if rc != 0:
                raise SystemExit(f"[probe] {name} {label}: launch failed, cudaError {rc}")
            torch.cuda.synchronize()
            got = outs[i].cpu().numpy().view(np.uint32)
            if not np.array_equal(got, want):
                bad = int(np.flatnonzero(got != want)[0])
                raise SystemExit(f"[probe] {name} {label}: copy {i} CTA {bad} xor {got[bad]:08x}, expected "
                                 f"{want[bad]:08x} (the probe misread its slice)")
    for _ in range(2):                        # two interleaved rounds
        for label, *v in vs:
            fns = [launcher(*v, i) for i in range(P)]
            ms, _ = judge.time_graph(fns, replays)
            res[label].append(ms * 1e3 / P)
    for label, t in res.items():
        print(f"[probe] {name:9s} {label:10s} {t[0]:6.2f} / {t[1]:6.2f} us   "
              f"{nbytes / (min(t) * 1e-6) / 1e12:.2f} TB/s", flush=True)
    return {"bytes": nbytes, "grid": grid, "block": block, "P": P, "us": res}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args(argv)
    sizes = args.sizes.split(",")
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        raise SystemExit(f"[probe] unknown size(s) {bad}; known: {', '.join(SIZES)}")
    ext = build()
    if args.build_only:
        return 0
    if not torch.cuda.is_available():
        print("[probe] needs a CUDA device")
        return 1
    for s in sizes:
        run_size(ext, s, args.replays)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
