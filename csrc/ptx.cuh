// ptx.cuh: one small device function per PTX instruction the kernels use, each with its reason.
// defines: ld_stream, ld_x, ld_x1_if, ld_esc_if, mma16816, prmt, pdl_trigger, pdl_wait,
//          named_bar_arrive1, named_bar_sync1, cluster_arrive_relaxed, cluster_wait_acquire, cluster_rank,
//          map_shared, cluster_mbar, mbar_init_expect, st_async, mbar_wait0, prefetch_l2, smem_u32,
//          mbar_init, mbar_expect_tx, mbar_arrive, mbar_arrive_after, mbar_wait, bulk_load, policy_evict_first, tma_load_2d, wg_fence,
//          wg_commit, wg_wait0, wg_wait1, wg_pin, wg_desc, wgmma_ss, wgmma_rs, fence_proxy_async, named_bar_sync
#pragma once
#include <cuda.h>  // CUtensorMap (gemvt_kernel's TMA descriptors; the driver entry point is fetched at run time)
#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

// Instrument hooks: empty in the shipped build; csrc/instruments.cuh (variant builds of tools/ and tests/) defines
// them to leave x's loads or the wait out for timing.
#ifndef HOOK_LD_X
#define HOOK_LD_X(p)
#endif
#ifndef HOOK_PDL_WAIT
#define HOOK_PDL_WAIT
#endif

// Weights are read exactly once: non-coherent path, no L1 allocation (L1 stays free for x).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// x is read by every CTA of the launch: the cached read-only path (L1 + L2), 16 bytes = 8 tokens' k.
__device__ __forceinline__ uint4 ld_x(const bf16* p) {
  HOOK_LD_X(p)
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// gemvz's exception warp, R >= 2: one x value (0 when !on) and one side-table entry (dflt when !on), each a
// predicated load in the PTX, so no branch goes around it. Both volatile: they stay after pdl_wait (an entry load
// before the wait lengthened the warp's chain: FINDINGS 10.4).
__device__ __forceinline__ float ld_x1_if(const bf16* p, bool on) {
  unsigned short v = 0;
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q ld.global.u16 %0, [%1];\n}" : "+h"(v) : "l"(p), "r"((int)on));
  return __bfloat162float(__ushort_as_bfloat16(v));
}
__device__ __forceinline__ int2 ld_esc_if(const int2* p, bool on, int2 dflt) {
  int a = dflt.x, b = dflt.y;
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %3, 0;\n@q ld.global.nc.v2.s32 {%0, %1}, [%2];\n}"
      : "+r"(a), "+r"(b) : "l"(p), "r"((int)on));
  return make_int2(a, b);
}

// D += A.B on the tensor cores: A = 16 weight rows x 16 k (8 bf16 per lane), B = 16 k x 8 tokens.
__device__ __forceinline__ void mma16816(float (&d)[4], uint4 a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// Byte permute: byte i of the result is byte (sel nibble i & 7) of {b, a}; nibble bit 3 = sign mode.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}


// PDL: let the next kernel of the stream be scheduled now (its CTAs take SMs as ours retire).
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// PDL: wait until the previous kernel has finished and its writes are visible. Everything a previous
// kernel may write or read (x, out, ws, sem) is touched only after this; weights may be read before.
__device__ __forceinline__ void pdl_wait() {
  HOOK_PDL_WAIT
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Named barrier 1 (0 is __syncthreads): n threads in all, arrivals from some warps and a sync in others.
__device__ __forceinline__ void named_bar_arrive1(int n) { asm volatile("bar.arrive 1, %0;" ::"r"(n) : "memory"); }
__device__ __forceinline__ void named_bar_sync1(int n) { asm volatile("bar.sync 1, %0;" ::"r"(n) : "memory"); }

// Thread-block clusters (cl = 2: the S CTAs of a row group form one cluster and reduce through distributed shared
// memory instead of the global workspace). Each thread arrives once per barrier phase; a wait returns when every
// non-exited thread of the cluster has arrived.
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait_acquire() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// The shared::cluster address of our shared-memory object p in the cluster's CTA `rank`.
__device__ __forceinline__ uint32_t map_shared(const void* p, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"((uint32_t)__cvta_generic_to_shared(p)), "r"(rank));
  return r;
}

// cl = 2: the leader's mbarrier counts the bytes the other CTAs send with st.async (one per CTA: a __shared__
// variable of a device function is one object per CTA).
__device__ __forceinline__ unsigned long long* cluster_mbar() {
  __shared__ unsigned long long bar;
  return &bar;
}

// Leader, kernel start: one expected arrival (its own, made here with the byte count it will wait for), then the
// fence that makes the initialised barrier visible to the cluster before the start-up cluster arrive.
__device__ __forceinline__ void mbar_init_expect(unsigned long long* b, uint32_t bytes) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(b);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Store 16 bytes into another CTA's shared memory; their arrival is counted on that CTA's mbarrier (rbar).
__device__ __forceinline__ void st_async(uint32_t addr, float4 v, uint32_t rbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
               ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rbar) : "memory");
}

// Wait for phase 0 of our mbarrier (every expected byte has arrived); acquire at cluster scope.
__device__ __forceinline__ void mbar_wait0(unsigned long long* b) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(b);
  uint32_t done;
  do {
    asm volatile("{\n .reg .pred q;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 q, [%1], 0;\n"
                 " selp.u32 %0, 1, 0, q;\n}" : "=r"(done) : "r"(a) : "memory");
  } while (!done);
}

// Ask L2 to fetch [p, p + bytes) from HBM now: one instruction, no registers held until the data is
// used. Weights are constant after prepare, so this may run before pdl_wait (pf = 1: the warp's slice).
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned long long* b, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
// One arrival that also raises the phase's expected transaction count by `bytes` (the copies count them down).
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
// The same arrival, issued only once `dep` is in its register (a compare reads it; both branches arrive). A warp that
// frees a ring slot it read with ld.shared folds one word of every such load into dep: the arrival's release did not
// wait for loads whose results the warp had not used yet, so the producer's next copy could land before them (gemvtz
// at KA = 2 read overwritten weights a few times in a thousand calls: FINDINGS 12.7).
__device__ __forceinline__ void mbar_arrive_after(unsigned long long* b, uint32_t dep) {
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %1, 0x7fc00123;\n @q mbarrier.arrive.shared::cta.b64 _, [%0];\n"
               " @!q mbarrier.arrive.shared::cta.b64 _, [%0];\n}" ::"r"(smem_u32(b)), "r"(dep) : "memory");
}
// Wait until the phase with this parity has completed (acquire, CTA scope).
__device__ __forceinline__ void mbar_wait(unsigned long long* b, uint32_t parity) {
  const uint32_t a = smem_u32(b);
  uint32_t done;
  do {
    asm volatile("{\n .reg .pred q;\n mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2;\n selp.u32 %0, 1, 0, q;\n}"
                 : "=r"(done) : "r"(a), "r"(parity) : "memory");
  } while (!done);
}
// Bulk copy (TMA, no descriptor) of `bytes` contiguous bytes into shared memory at dst; they complete_tx on bar.
// The L2 policy evict_first: weights are read once, x and the workspace stay.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, unsigned long long* bar,
                                          uint64_t policy) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy) : "memory");
}
__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
// TMA: the box at (c0 = k, c1 = row) of map into shared memory at dst; its bytes complete_tx on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, unsigned long long* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
// Keep the compiler from moving accumulator reads or writes across the asynchronous mma.
template <int N>
__device__ __forceinline__ void wg_pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
// Shared memory matrix descriptor: K-major, 128-byte swizzle, 8-row atoms 1024 B apart (SBO), LBO unused (1).
// The k16 step j of an atom starts 32 j bytes in (the swizzle is applied to the address bits).
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
  return (uint64_t)((saddr >> 4) & 0x3FFFu) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
// D[64 rows x 8 NB tokens] += A[64 x 16] . B[16 x 8 NB], both from shared memory (da, db).
template <int NB>
__device__ __forceinline__ void wgmma_ss(float (&d)[NB * 4], uint64_t da, uint64_t db) {
  if constexpr (NB == 4) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "r"(1));
  } else if constexpr (NB == 2) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(da), "l"(db), "r"(1));
  } else {
    static_assert(NB == 1, "NB is 1, 2 or 4");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(da), "l"(db), "r"(1));
  }
}

// D[64 rows x 8 NB tokens] += A[64 x 16] . B[16 x 8 NB], A from registers (this warp's 16 rows: mma16816's A
// fragment, gemvtz's decoded weights), B from shared memory (db). A's registers stay read until the wgmma's group
// completes (wgmma.wait_group): the caller must not write them before.
template <int NB>
__device__ __forceinline__ void wgmma_rs(float (&d)[NB * 4], uint4 a, uint64_t db) {
  if constexpr (NB == 4) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "l"(db), "r"(1));
  } else if constexpr (NB == 2) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "l"(db), "r"(1));
  } else {
    static_assert(NB == 1, "NB is 1, 2 or 4");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "l"(db), "r"(1));
  }
}

// Shared-memory writes of this thread (generic proxy) made visible to the async proxy (wgmma's operand reads, TMA):
// between a thread's st.shared of an operand and the barrier after which a wgmma reads it.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Named barrier `id` (0 is __syncthreads, 1 gemvz's) over n threads, all of which sync: one warpgroup's per-stage
// hand-over in gemvtz.
__device__ __forceinline__ void named_bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
