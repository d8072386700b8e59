// common.cuh: the pieces gemv_kernel, gemvz_kernel and gemvt_kernel share: x loads, the warps' reduction, the
// split-K combine (global ticket or thread-block cluster), the store, and the (empty) instrument hooks.
// defines: land_before_wait, load_xbatch, sum_warps, splitk_combine, cluster_combine, cluster_start, store_tile,
//          MuseTrace / TR_* / HOOK_* (empty here: csrc/instruments.cuh), combine_store, add_ecorr
#pragma once
#include "args.h"
#include "ptx.cuh"

// ---- instrument hooks --------------------------------------------------------------------------------------------
// Empty in the shipped build: it records and leaves out nothing. tools/ and tests/ compile variants with
// csrc/instruments.cuh in front of this source, which defines them: a per-CTA timeline (MuseTrace, TR_*) and the
// timing-only ablations of the split-K combine (HOOK_CLUSTER_START, HOOK_COMBINE).
#ifndef MUSE_HAVE_TRACE
struct MuseTrace {};  // the per-CTA record of a trace build: an empty argument the compiler drops
#define TR_G(i)
#define TR_C(i)
#define TR_ARRIVED(first, wv, xv)
#define TR_FLUSH(stored)
#define TR_EXC_DECL
#define TR_EXC_END
#define TR_EXC_READ
#endif
#ifndef HOOK_COMBINE
#define HOOK_CLUSTER_START
#define HOOK_COMBINE(...) (__VA_ARGS__)
#endif

// The warp does not reach griddepcontrol.wait before every load of its first batch has landed: chk folds one
// word of each load, and a branch on it cannot issue before they are all in registers (its body is harmless if it
// ever runs). gemvz_kernel does this (it gained there); gemv_kernel does not (the router lost with it). FINDINGS 6.3.
__device__ __forceinline__ void land_before_wait(uint32_t chk) {
  if (chk == 0x7fc00123u) asm volatile("nanosleep.u32 1;");
}

// One batch of x fragments: for each of U trips' K blocks (KS k apart: 32 plain, 64 compressed) and token block
// nb, 16 B at xr[nb] + (i + u) * KS + off.
template <int U, int NB, int KS>
__device__ __forceinline__ void load_xbatch(uint4 (&xv)[U][NB], const bf16* const (&xr)[NB], int i, int off = 0) {
#pragma unroll
  for (int u = 0; u < U; u++)
#pragma unroll
    for (int nb = 0; nb < NB; nb++) xv[u][nb] = ld_x(xr[nb] + (i + u) * KS + off);
}

// gemvz's split-K over the S CTAs of a row group and their NW warps, in whole units of UNIT = UG 64-wide groups, for
// any S. The row's T = KB / UNIT units: CTA sidx takes d = T / S of them, one more for the first r = T % S CTAs,
// contiguous in sidx order; inside the CTA, warp w takes its share of those the same way (wd, one more for the first
// wr warps). Shares differ by at most one unit, CTA to CTA and warp to warp; where S NW divides T it is the even
// split, with the same values. S is then free to fill the SMs instead of dividing K (FINDINGS 9.2). One runtime
// division (T / S; NW is a compile-time constant). Needs T >= S NW (every warp streams at least one unit: the first
// batch is loaded before the loop, and the streaming warps all arrive on the named barrier in their first trip).
// Returns {first block, blocks}, in K blocks. gemv_kernel keeps the even split: this code costs it registers, and
// there a CTA an SM (FINDINGS 9.2). Lab: labs/labkit.py split_units.
template <int UNIT, int NW>
__device__ __forceinline__ int2 split_units(int KB, int S, int sidx, int w) {
  const int T = KB / UNIT, d = T / S, r = T - d * S;
  const int cn = d + (sidx < r), c0 = sidx * d + min(sidx, r);
  const int wd = cn / NW, wr = cn - wd * NW;
  return make_int2((c0 + w * wd + min(w, wr)) * UNIT, (wd + (w < wr)) * UNIT);
}
// CTA sidx's slice {first block, end block}, in K blocks: the union of its warps' split_units shares. Its first
// lines repeat split_units': written through one shared helper, the two changed the machine code of Z(4,2,2,2,1)
// (pooler m=16's row; same size and registers, other bytes, tools/same_code.py), which was timed as it stands.
template <int UNIT>
__device__ __forceinline__ int2 cta_slice(int KB, int S, int sidx) {
  const int T = KB / UNIT, d = T / S, r = T - d * S;
  const int c0 = sidx * d + min(sidx, r);
  return make_int2(c0 * UNIT, (c0 + d + (sidx < r)) * UNIT);
}

// Sum the NW streaming warps' partials parked in red[NW][P] (after the barrier): thread tid < NT takes
// positions p = tid + j * NT, in the fixed warp order 0..NW-1.
template <int NW, int P, int NT, int J>
__device__ __forceinline__ void sum_warps(float4 (&res)[J], const float4 (&red)[NW][P]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < J; j++) {
    const int p = tid + j * NT;
    res[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (tid < NT && p < P) {
#pragma unroll
      for (int wi = 0; wi < NW; wi++) {
        const float4 v = red[wi][p];
        res[j].x += v.x; res[j].y += v.y; res[j].z += v.z; res[j].w += v.w;
      }
    }
  }
}

// The CTA's C fragments after the warp reduction: P = R * NB * 32 positions p = (r * NB + nb) * 32 + lane
// (row block r of the group, token block nb, fragment lane); thread tid < NT holds p = tid + j * NT.
// Split-K across the S CTAs of a row group, inside one launch: every CTA parks its partials in ws and
// takes a ticket; the last one sums the S partials in the fixed order s = 0..S-1 (so the result does
// not depend on which CTA finished last) and resets the ticket for the next call / graph replay.
// Returns true in the CTA that must store. All threads of the CTA call it. Lab: labs/lab5_splitk.py.
template <int J, int P, int NT>
__device__ __forceinline__ bool splitk_combine(float4 (&res)[J], float4* __restrict__ ws, int* __restrict__ sem,
                                               int rg, int sidx, int S) {
  __shared__ int s_last;
  if (S == 1) return true;
  const int tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < J; j++) {
    const int p = tid + j * NT;
    if (tid < NT && p < P) ws[((size_t)rg * S + sidx) * P + p] = res[j];
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = (atomicAdd(&sem[rg], 1) == S - 1);
  __syncthreads();
  if (!s_last) return false;
  __threadfence();
#pragma unroll
  for (int j = 0; j < J; j++) {
    const int p = tid + j * NT;
    if (tid < NT && p < P) {
      float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int s = 0; s < S; s++) {
        const float4 v = __ldcg(ws + ((size_t)rg * S + s) * P + p);
        r.x += v.x; r.y += v.y; r.z += v.z; r.w += v.w;
      }
      res[j] = r;
    }
  }
  if (tid == 0) sem[rg] = 0;
  return true;
}

// The same reduction inside a cluster of the S CTAs (cl = 2; grid y = S = cluster size, rank = sidx): CTA rank
// s > 0 sends its partials with st.async into slot s - 1 of the leader's (rank 0) cbuf[S - 1][P] in distributed
// shared memory, counted in bytes on the leader's mbarrier (cluster_mbar, armed at kernel start for (S - 1) P 16
// bytes), and leaves at once; only the leader waits, for the bytes alone. The leader sums its own partial and slots
// 0..S-2 in the order s = 0..S-1 (the ticket path's order: both give the same bits). No global traffic, no fence, no
// ticket. Every thread arrived on the cluster barrier once at kernel start, so the leader runs and its mbarrier is
// armed before any remote store. Returns true in the leader. All threads of the CTA call it.
template <int J, int P, int NT>
__device__ __forceinline__ bool cluster_combine(float4 (&res)[J], float4* cbuf, int S, int cl) {
  const int tid = threadIdx.x;
  const uint32_t rank = cluster_rank();
  if (cl == 2) {
    if (rank != 0) {
      cluster_wait_acquire();                  // the leader runs and its mbarrier is armed
      const uint32_t base = map_shared(cbuf + (rank - 1) * P, 0), rbar = map_shared(cluster_mbar(), 0);
#pragma unroll
      for (int j = 0; j < J; j++) {
        const int p = tid + j * NT;
        if (tid < NT && p < P) st_async(base + 16u * p, res[j], rbar);
      }
      return false;
    }
    mbar_wait0(cluster_mbar());
  } else {
    __trap();                                // cl is 0 or 2 (config_misfit refuses any other value)
  }
#pragma unroll
  for (int j = 0; j < J; j++) {
    const int p = tid + j * NT;
    if (tid < NT && p < P) {
      float4 r = res[j];
      for (int s = 1; s < S; s++) {
        const float4 v = cbuf[(s - 1) * P + p];
        r.x += v.x; r.y += v.y; r.z += v.z; r.w += v.w;
      }
      res[j] = r;
    }
  }
  return true;
}

// Kernel start with cl: the leader arms its mbarrier for the other CTAs' (S - 1) P float4, then every thread arrives
// once on the cluster barrier (cluster_combine waits on it before any remote store).
template <int P>
__device__ __forceinline__ void cluster_start(int cl, int S) {
  HOOK_CLUSTER_START
  if (!cl) return;
  if (threadIdx.x == 0 && cluster_rank() == 0) mbar_init_expect(cluster_mbar(), (uint32_t)(S - 1) * P * 16u);
  cluster_arrive_relaxed();
}

// Position p = (r * NB + nb) * 32 + lane of row group rg: value q of the C fragment is
// (row 16 (rg R + r) + g + 8 (q >> 1), token 8 nb + 2t + (q & 1)). Tokens past M were clamped: never stored.
template <bool F32OUT, int NB, int R>
__device__ __forceinline__ void store_tile(void* __restrict__ out, float4 v, int p, int rg, int M, int N) {
  const int lane = p & 31, nb = (p >> 5) % NB, r = (p >> 5) / NB, g = lane >> 2, t = lane & 3;
  const float rr[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; q++) {
    const int tok = nb * 8 + 2 * t + (q & 1);
    const int row = (rg * R + r) * 16 + g + ((q >> 1) << 3);
    if (tok < M) {
      if (F32OUT) ((float*)out)[(size_t)tok * N + row] = rr[q];
      else ((bf16*)out)[(size_t)tok * N + row] = __float2bfloat16_rn(rr[q]);
    }
  }
}

// The end of both GEMVs: the split-K combine (cluster or ticket), then the CTA that holds the sums stores them.
// EXC: the CTA has an exception warp, whose threads (tid >= NT) hold no position. All threads call it.
template <bool F32OUT, bool EXC, int NB, int R, int J, int P, int NT>
__device__ __forceinline__ void combine_store(float4 (&res)[J], MuseTrace& tr_, void* __restrict__ out, float4* cbuf,
                                              float4* __restrict__ ws, int* __restrict__ sem, int rg, int sidx,
                                              int S, int cl, int M, int N) {
  const int tid = threadIdx.x;
  const bool store =
      HOOK_COMBINE(cl ? cluster_combine<J, P, NT>(res, cbuf, S, cl) : splitk_combine<J, P, NT>(res, ws, sem, rg, sidx, S));
  TR_C(4)
  if (store) {
#pragma unroll
    for (int j = 0; j < J; j++)
      if ((!EXC || tid < NT) && tid + j * NT < P) store_tile<F32OUT, NB, R>(out, res[j], tid + j * NT, rg, M, N);
  }
  TR_G(2) TR_C(5) TR_FLUSH(store)
}

// The exception warp's corrections (ecorr[16 R rows][8 NB tokens], +1 pad) added to the CTA's positions before the
// split-K combine: thread tid < NT holds p = tid + j NT = (r NB + nb) 32 + lane, value q of the C fragment is row
// 16 r + g + 8 (q >> 1), token 8 nb + 2 t + (q & 1) (store_tile's map). gemvz_kernel and gemvtz_kernel.
template <int NB, int J, int P, int NT, int ROWS>
__device__ __forceinline__ void add_ecorr(float4 (&res)[J], const float (&ecorr)[ROWS][NB * 8 + 1]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < J; j++) {
    const int p = tid + j * NT;
    if (tid < NT && p < P) {
      const int pl = p & 31, nbo = (p >> 5) % NB, r = (p >> 5) / NB, pg = pl >> 2, pt = pl & 3;
      res[j].x += ecorr[r * 16 + pg][nbo * 8 + 2 * pt];
      res[j].y += ecorr[r * 16 + pg][nbo * 8 + 2 * pt + 1];
      res[j].z += ecorr[r * 16 + pg + 8][nbo * 8 + 2 * pt];
      res[j].w += ecorr[r * 16 + pg + 8][nbo * 8 + 2 * pt + 1];
    }
  }
}
