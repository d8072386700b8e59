// gemv.cuh: the plain BF16 GEMV (LOOP 0..2) and its weight loader.
#pragma once
#include "common.cuh"

// One batch of U K-blocks of fragment-ordered weights (2 units of 16 B per lane per block) for each of
// the warp's R row blocks (rstride units apart), for the hi matrix and, with NH = 2, the router's lo.
// Lab: labs/lab2_fragments.py, part 2.
template <int U, int NH, int R>
__device__ __forceinline__ void load_wbatch(uint4 (&a)[NH][U][R][2], const uint4* wp, const uint4* wp2,
                                            size_t rstride, int i) {
#pragma unroll
  for (int u = 0; u < U; u++)
#pragma unroll
    for (int r = 0; r < R; r++) {
      const size_t o = r * rstride + (size_t)(i + u) * 64;
      a[0][u][r][0] = ld_stream(wp + o);
      a[0][u][r][1] = ld_stream(wp + o + 32);
      if constexpr (NH == 2) {
        a[1][u][r][0] = ld_stream(wp2 + o);
        a[1][u][r][1] = ld_stream(wp2 + o + 32);
      }
    }
}

// ---- gemv_kernel: the plain BF16 tensor-core GEMV -------------------------------------------------
// Contract: x bf16 [M, K] row-major, 16-byte aligned; w (and w2, the router's lo half) bf16 [N, K]
// repacked by pack_plain into fragment order: [N/16][K/32][2 steps][32 lanes][8 bf16]; out [M, N],
// bf16, or fp32 when DUAL; ws >= N/(16R) * S * R*NB*32 float4; sem >= N/(16R) ints, zero between calls.
// Requires N % (16R) == 0, K/32 % (S*NW*U) == 0, M <= NB*8.
//
//   grid (N/(16R), S): CTA (rg, sidx) = row blocks rg*R .. rg*R+R-1 x K blocks [sidx*KB/S, (sidx+1)*KB/S);
//   cl = 2: clusters (1, S), split-K reduced in the leader's shared memory (cluster_combine), ws/sem unused
//   CTA: NW warps; warp w streams K blocks kb0 + [0, KBW) of the slice for all R row blocks, U per trip
//   lane (g = lane>>2, t = lane&3): A fragment = rows g, g+8 of a block; B = x[token 8nb+g][8t..8t+7]
//   end: warps -> smem red[NW][R*NB*32] -> sum over warps -> split-K combine -> store
//
// Why R: every CTA reads its K slice of x once from L2, so x costs (N/16R) * m * K * 2 bytes of L2->SM
// traffic: at R = 1 and m = 32 that is twice the weight bytes, and the L2 path, not HBM, sets the time
// (FINDINGS 6.1). R row blocks per warp reuse each x fragment R times from registers.
// LOOP: 0 load a batch of U blocks, then compute it; 1 software-pipelined, the next batch's weights issued before
// this batch's mma; 2 the same with the next batch's x issued with its weights, one trip ahead (registers for a
// second x batch: at m >= 16 a warp otherwise waits on its x loads, FINDINGS "gemv_kernel"). MB: the occupancy the
// compiler must keep (__launch_bounds__' minimum CTAs an SM; 0: none). The first batch (and, pf = 1, an L2
// prefetch of the warp's whole slice) is issued before pdl_wait: weights are constant after prepare, so under PDL
// it overlaps the previous kernel's tail. Lab: labs/lab2_fragments.py, lab5.
template <int NW, int U, int NB, int R, bool DUAL, int LOOP, int MB>
__global__ void __launch_bounds__(NW * 32, MB)
gemv_kernel(const __grid_constant__ GemvArgs args) {
  static_assert(LOOP >= 0 && LOOP <= 2, "LOOP is 0..2");
  const bf16* __restrict__ x = static_cast<const bf16*>(args.x);
  const uint4* __restrict__ w = static_cast<const uint4*>(args.w);
  const uint4* __restrict__ w2 = static_cast<const uint4*>(args.w2);
  void* __restrict__ out = args.out;
  float4* __restrict__ ws = static_cast<float4*>(args.ws);
  int* __restrict__ sem = static_cast<int*>(args.sem);
  const int M = args.M, N = args.N, K = args.K, S = args.S, pf = args.pf, cl = args.cl;
  constexpr int NH = DUAL ? 2 : 1;
  constexpr int P = R * NB * 32, NT = NW * 32, J = (P + NT - 1) / NT;
  extern __shared__ float4 cbuf[];  // cl: [S - 1][P], the other CTAs' partials (in the leader)
  MuseTrace tr_;  // trace builds: thread 0's timestamps
  TR_G(0) TR_C(0)
  pdl_trigger();
  cluster_start<P>(cl, S);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rg = blockIdx.x, sidx = blockIdx.y;
  const int KB = K / 32, KBS = KB / S, KBW = KBS / NW;
  const int kb0 = sidx * KBS + warp * KBW;
  const size_t rstride = (size_t)KB * 64;
  const size_t woff = ((size_t)rg * R * KB + kb0) * 64 + lane;
  const uint4* wp = w + woff;
  const uint4* wp2 = DUAL ? (w2 + woff) : nullptr;

  if (pf && lane == 0) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      prefetch_l2(wp + r * rstride, (uint32_t)KBW * 1024u);
      if (DUAL) prefetch_l2(wp2 + r * rstride, (uint32_t)KBW * 1024u);
    }
  }
  uint4 a[NH][U][R][2];
  load_wbatch<U, NH, R>(a, wp, wp2, rstride, 0);
  pdl_wait();
  TR_G(1) TR_C(1)

  const bf16* xr[NB];
#pragma unroll
  for (int nb = 0; nb < NB; nb++) xr[nb] = x + (size_t)min(nb * 8 + g, M - 1) * K + kb0 * 32 + t * 8;
  // DUAL with NB = 1: hi and lo accumulate into separate fp32 accumulators (half the dependent mma chain),
  // summed once at the end (a one-hot probe still returns fl32(hi + lo)). It gains at NB = 1; at NB = 2 it costs
  // registers and time, and at NB = 4 the second set spills: one set there (FINDINGS 7)
  constexpr int NA = DUAL && NB == 1 ? 2 : 1;
  float acc[NA][R][NB][4];
#pragma unroll
  for (int h = 0; h < NA; h++)
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int nb = 0; nb < NB; nb++) acc[h][r][nb][0] = acc[h][r][nb][1] = acc[h][r][nb][2] = acc[h][r][nb][3] = 0.f;

  if constexpr (LOOP == 0) {
    for (int i = 0; i < KBW; i += U) {
      if (i > 0) load_wbatch<U, NH, R>(a, wp, wp2, rstride, i);
#pragma unroll
      for (int u = 0; u < U; u++) {
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
          const uint4 xv = ld_x(xr[nb] + (i + u) * 32);
          TR_ARRIVED(i == 0 && u == 0 && nb == 0, a[0][0][0][0].x, xv.x)
#pragma unroll
          for (int r = 0; r < R; r++)
#pragma unroll
            for (int h = 0; h < NH; h++) {
              mma16816(acc[h % NA][r][nb], a[h][u][r][0], xv.x, xv.y);
              mma16816(acc[h % NA][r][nb], a[h][u][r][1], xv.z, xv.w);
            }
        }
      }
    }
  } else {
    constexpr bool XAHEAD = LOOP == 2;
    uint4 xv[U][NB];
    if constexpr (XAHEAD) load_xbatch<U, NB, 32>(xv, xr, 0);
    for (int i = 0; i < KBW; i += U) {
      if constexpr (!XAHEAD) load_xbatch<U, NB, 32>(xv, xr, i);
      uint4 na[NH][U][R][2], nxv[U][NB];
      if (i + U < KBW) {
        load_wbatch<U, NH, R>(na, wp, wp2, rstride, i + U);
        if constexpr (XAHEAD) load_xbatch<U, NB, 32>(nxv, xr, i + U);
      }
      TR_ARRIVED(i == 0, a[0][0][0][0].x, xv[0][0].x)
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
          for (int r = 0; r < R; r++)
#pragma unroll
            for (int h = 0; h < NH; h++) {
              mma16816(acc[h % NA][r][nb], a[h][u][r][0], xv[u][nb].x, xv[u][nb].y);
              mma16816(acc[h % NA][r][nb], a[h][u][r][1], xv[u][nb].z, xv[u][nb].w);
            }
#pragma unroll
      for (int h = 0; h < NH; h++)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
          for (int r = 0; r < R; r++) { a[h][u][r][0] = na[h][u][r][0]; a[h][u][r][1] = na[h][u][r][1]; }
      if constexpr (XAHEAD) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
          for (int nb = 0; nb < NB; nb++) xv[u][nb] = nxv[u][nb];
      }
    }
  }

  __shared__ float4 red[NW][P];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
      float4 v = make_float4(acc[0][r][nb][0], acc[0][r][nb][1], acc[0][r][nb][2], acc[0][r][nb][3]);
      if constexpr (NA == 2) {
        v.x += acc[1][r][nb][0]; v.y += acc[1][r][nb][1]; v.z += acc[1][r][nb][2]; v.w += acc[1][r][nb][3];
      }
      red[warp][(r * NB + nb) * 32 + lane] = v;
    }
  TR_C(2)
  __syncthreads();
  TR_C(3)
  float4 res[J];
  sum_warps<NW, P, NT, J>(res, red);
  combine_store<DUAL, false, NB, R, J, P, NT>(res, tr_, out, cbuf, ws, sem, rg, sidx, S, cl, M, N);
}
