// instruments.cuh: timing-only and trace code for variant builds of tools/ and tests/, never the shipped build
// (build.py does not inline it into submission.py). A tool passes this file's text as the head of a variant build,
// build_extension(defines=(NAME, ...), head=<this file>), and the defines pick what it turns on:
//   MUSE_TRACE             a per-CTA timeline in the workspace (tools/trace_chain.py)
//   MUSE_SKIP_CORRECTIONS  gemvz's exception warp adds nothing: wrong results, times what the corrections cost
//   MUSE_TZ_EMPTY          gemvtz's consumers only wait for each stage and free it: the ring alone (wrong results)
//   MUSE_ABL_NOX           no x load, constant fragments: wrong on purpose (tools/ab.py's router ablations)
//   MUSE_ABL_NOWAIT        no griddepcontrol.wait: no dependency on the previous launch
//   MUSE_ABL_NOCOMB        no split-K combine, no cluster handshake: CTA 0 of a row group stores its part
// It defines INSTRUMENTS and the hooks its defines turn on; the kernel source (ptx.cuh, common.cuh, gemvz.cuh, gemvtz.cuh)
// leaves every other hook empty.
#pragma once
#include <stdint.h>
#define INSTRUMENTS 1

#ifdef MUSE_ABL_NOX
#define HOOK_LD_X(p) return make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, (uint32_t)(size_t)(p) & 0x3f803f80u);
#endif
#ifdef MUSE_ABL_NOWAIT
#define HOOK_PDL_WAIT return;
#endif
#ifdef MUSE_ABL_NOCOMB
#define HOOK_CLUSTER_START return;
#define HOOK_COMBINE(...) (sidx == 0)
#endif
#ifdef MUSE_SKIP_CORRECTIONS
constexpr bool kSkipCorrections = true;
#else
constexpr bool kSkipCorrections = false;
#endif
#ifdef MUSE_TZ_EMPTY
constexpr bool kRingAlone = true;
#else
constexpr bool kRingAlone = false;
#endif

// ---- MUSE_TRACE ------------------------------------------------------------------------------------------------
// Thread 0 of every CTA records when it starts, passes pdl_wait, has its first batch of weights and then its first x
// in registers, has its partials in shared memory, passes the CTA barrier, is through the split-K combine, and is
// done (%globaltimer at 3 points, clock64 at all 8), with the CTA's coordinates, its SM and whether it stored, and
// (gemvz) when its exception warp reached the CTA barrier (clock64; 0 elsewhere). The slot (14 u64) is the CTA's
// own, in the layer's workspace after the split-K area any config of the layer may use (N/16 x S x 128 float4):
// plain stores at the CTA's end, no atomics. trace_chain.py grows every copy's workspace to hold the slots of all
// its CTAs.
#ifdef MUSE_TRACE
#define MUSE_HAVE_TRACE 1
struct MuseTrace { unsigned long long g[3], c[8], e = 0; };  // e: gemvz's exception warp at the CTA barrier
__device__ __forceinline__ unsigned long long muse_gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// clock64 once v is in its register: the read is predicated on a compare of v, so it cannot issue before v lands.
__device__ __forceinline__ unsigned long long muse_after(uint32_t v) {
  unsigned long long t = 0;
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %1, 0x7fc00123;\n @q mov.u64 %0, %%clock64;\n"
               " @!q mov.u64 %0, %%clock64;\n}" : "+l"(t) : "r"(v) : "memory");
  return t;
}
__device__ __forceinline__ void muse_trace_flush(const MuseTrace& tr, float4* ws, int N, int S, bool stored) {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  unsigned long long* o = reinterpret_cast<unsigned long long*>(ws + (size_t)(N / 16) * S * 128) +
                          ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * 14;
  for (int i = 0; i < 3; i++) o[i] = tr.g[i];
  for (int i = 0; i < 8; i++) o[3 + i] = tr.c[i];
  o[11] = blockIdx.x | ((unsigned long long)blockIdx.y << 16) | ((unsigned long long)sm << 32) |
          ((unsigned long long)stored << 48);
  o[12] = tr.e;
  o[13] = 0;
}
#define TR_G(i) if (threadIdx.x == 0) tr_.g[i] = muse_gtimer();
#define TR_C(i) if (threadIdx.x == 0) tr_.c[i] = clock64();
#define TR_ARRIVED(first, wv, xv) \
  if ((first) && threadIdx.x == 0) { tr_.c[6] = muse_after(wv); tr_.c[7] = muse_after(xv); }
#define TR_FLUSH(stored) if (threadIdx.x == 0) muse_trace_flush(tr_, ws, N, S, stored);
// gemvz: the exception warp's lane 0 notes when it reaches the CTA barrier; thread 0 reads it after the barrier
#define TR_EXC_DECL __shared__ unsigned long long tr_exc_;
#define TR_EXC_END if (lane == 0) tr_exc_ = clock64();
#define TR_EXC_READ if (threadIdx.x == 0) tr_.e = tr_exc_;
#endif
