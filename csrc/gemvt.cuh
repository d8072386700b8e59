// gemvt.cuh: gemvt_kernel, the plain path's TMA kernel (its own config type, GemvtConfig): a TMA ring of weight tiles
// and x, and warpgroup MMA from shared memory.
#pragma once
#include "common.cuh"

// ---- gemvt_kernel: a TMA ring of weight tiles and x, warpgroup MMA ---------------------------------------------
// Contract: x bf16 [M, K] row-major, reached through a 2-D TMA descriptor (box 64 k x 8 NB tokens, 128-byte
// swizzle; rows past M read as zeros); wt = pack_tma's tiles: [N/64][K/64][64 rows][64 k], each 8 KB tile already
// in the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r & 7)), so one bulk copy of contiguous bytes
// lands it as wgmma reads it; out bf16 [M, N]; ws / sem as gemv_kernel. Requires N % (16 NW) == 0,
// K % (64 KA) == 0, S <= K / (64 KA), NW % 4 == 0 (S need not divide: the slices differ by at most one step).
//
//   grid (N / (16 NW), S): CTA (rg, sidx) = rows 16 NW rg .. +16 NW x K slice sidx (about K / S wide)
//   warps 0..NW-1 (NW / 4 warpgroups) consume; warp NW produces (its lane 0 issues every copy)
//   ring of ST stages in dynamic shared memory; stage = W [NW / 4 warpgroups][KA atoms][64 rows x 128 B] (one bulk
//     copy of KA tiles per warpgroup: contiguous in wt) then x [KA atoms][8 NB tokens x 128 B] (one TMA box per
//     atom), both in the 128-byte swizzle (8-row groups 1024 B apart)
//   full[s]: the producer's expect_tx of the stage's bytes, completed by the copies; empty[s]: one arrival per
//     consumer warp once its wgmma on the stage are done
//   per stage and warpgroup: 4 KA wgmma.m64n(8NB)k16, A = its 64 weight rows, B = the tokens, both from shared
//     memory; warp w's D fragment = rows 16w..16w+15 as mma16816's C fragments side by side (r = w below)
//   end: D -> red (the ring's memory) -> split-K combine (gemv_kernel's) -> store
// PDL: only weights before griddepcontrol.wait: the producer fills the W part of the first min(ST, steps) stages,
// waits, then copies their x; the consumers wait before the epilogue (out, ws, sem).
// Why: at m = 16 / 32 the register kernels are held by x's trips through L1 (ncu: L1TEX near its peak while DRAM is
// under half of its); here x reaches the tensor cores from shared memory, one TMA copy per stage, and the bytes in
// flight (ST stages) cost no registers. Why tiles: boxes of the natural [N, K] layout read 128 B from each of 64 rows
// 16 KB apart, and streamed slower than contiguous tiles (FINDINGS 11).
// Lab: labs/lab6_tma.py (the tiles, the swizzle the descriptors undo, x's box, the kernel in miniature).

// Dynamic shared memory of one gemvt CTA: 1 KB of alignment slack, the ring, and with cl the leader's cbuf.
__host__ __device__ constexpr size_t gemvt_smem(int NW, int ST, int NB, int KA, int S, int cl) {
  return 1024 + (size_t)ST * KA * (16 * NW + 8 * NB) * 128 + (cl ? (size_t)(S - 1) * NW * NB * 32 * 16 : 0);
}

// ---- the ring: split, barriers, producer, end ----------------------------------------------------------------
// Split-K in whole steps of KA 64-k groups, any S <= K / (64 KA): CTA sidx takes steps [sidx T / S, (sidx + 1) T / S).
template <int KA>
__device__ __forceinline__ void ring_slice(int K, int S, int sidx, int& steps, int& g0) {
  const int T = K / (64 * KA), s0 = (int)((long)sidx * T / S);
  steps = (int)((long)(sidx + 1) * T / S) - s0;
  g0 = s0 * KA;
}

// full[s]: one arrival (the producer's expect_tx), completed by the copies' bytes; empty[s]: one arrival per consumer
// warp. Made visible to the async proxy (TMA) before the CTA barrier. All threads call it.
template <int ST>
__device__ __forceinline__ void ring_init(unsigned long long* full, unsigned long long* empty, int consumers) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < ST; s++) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], consumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// The producer (one thread): the weights of the first min(ST, steps) stages before griddepcontrol.wait (they are
// constant after prepare), then those stages' x, then one stage per slot the consumers free. load_w(sb, i, bar,
// pol) issues step i's weight copies into the stage at sb with the L2 policy pol (evict_first); x's KA boxes
// (64 k x 8 NB tokens) go to sb + xoff + a XB.
template <int ST, int KA, typename LoadW>
__device__ __forceinline__ void ring_produce(const CUtensorMap* tx, unsigned long long* full, unsigned long long* empty,
                                             uint32_t base, uint32_t stage, uint32_t xoff, uint32_t XB, int steps,
                                             int g0, LoadW load_w) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tx)) : "memory");
  const uint64_t pol = policy_evict_first();   // weights are read once: x and the workspace stay in L2
  const int pre = steps < ST ? steps : ST;
  for (int i = 0; i < pre; i++) {
    mbar_expect_tx(&full[i], stage);
    load_w(base + i * stage, i, &full[i], pol);
  }
  pdl_wait();
  for (int i = 0; i < pre; i++)
#pragma unroll
    for (int a = 0; a < KA; a++) tma_load_2d(base + i * stage + xoff + a * XB, tx, (g0 + i * KA + a) * 64, 0, &full[i]);
  for (int i = ST; i < steps; i++) {
    const int s = i % ST;
    mbar_wait(&empty[s], ((i / ST) - 1) & 1);  // every consumer warp is done with the stage's last use
    const uint32_t sb = base + s * stage;
    mbar_expect_tx(&full[s], stage);
    load_w(sb, i, &full[s], pol);
#pragma unroll
    for (int a = 0; a < KA; a++) tma_load_2d(sb + xoff + a * XB, tx, (g0 + i * KA + a) * 64, 0, &full[s]);
  }
}

// The end of both ring kernels: after the wait (out, ws and sem may belong to the previous kernel until then) and
// once every stage is consumed (the ring's memory is free), the consumer warps' D fragments go through the ring's
// memory to one position per consumer thread (warp w's D = row block w of the CTA: R = NW), then (gemvtz: ecorr, its
// exception warp's corrections, added) gemv_kernel's split-K combine and store.
template <int NW, int NB>
__device__ __forceinline__ void ring_end(const float (&acc)[NB * 4], uint8_t* ring, float4* cbuf, MuseTrace& tr_,
                                         bf16* __restrict__ out, float4* __restrict__ ws, int* __restrict__ sem,
                                         int tid, int lane, int warp, int rg, int sidx, int S, int cl, int M,
                                         int N, const float (*ecorr)[NW * 16][NB * 8 + 1] = nullptr) {
  constexpr int NT = NW * 32, J = NB, P = NW * NB * 32;
  pdl_wait();
  __syncthreads();
  float4* red = reinterpret_cast<float4*>(ring);
  if (warp < NW) {
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
      red[(warp * NB + nb) * 32 + lane] = make_float4(acc[4 * nb], acc[4 * nb + 1], acc[4 * nb + 2], acc[4 * nb + 3]);
  }
  __syncthreads();
  float4 res[J];
#pragma unroll
  for (int j = 0; j < J; j++) res[j] = tid < NT ? red[tid + j * NT] : make_float4(0.f, 0.f, 0.f, 0.f);
  if (ecorr) add_ecorr<NB, J, P, NT>(res, *ecorr);
  combine_store<false, true, NB, NW, J, P, NT>(res, tr_, out, cbuf, ws, sem, rg, sidx, S, cl, M, N);
}

template <int NW, int ST, int NB, int KA>
__global__ void __launch_bounds__(NW * 32 + 32, 1)
gemvt_kernel(const __grid_constant__ GemvArgs args, const __grid_constant__ CUtensorMap tx) {
  static_assert(NW % 4 == 0 && NW >= 4 && NW <= 16, "NW: whole warpgroups");
  constexpr uint32_t TILE = 64 * 128, WB = 16 * NW * 128, XB = 8 * NB * 128, STAGE = KA * (WB + XB);
  constexpr int NWG = NW / 4, P = NW * NB * 32;
  const uint8_t* __restrict__ wt = static_cast<const uint8_t*>(args.w);
  bf16* __restrict__ out = static_cast<bf16*>(args.out);
  float4* __restrict__ ws = static_cast<float4*>(args.ws);
  int* __restrict__ sem = static_cast<int*>(args.sem);
  const int M = args.M, N = args.N, K = args.K, S = args.S, cl = args.cl;
  extern __shared__ uint8_t dsm[];
  __shared__ __align__(8) unsigned long long full[ST], empty[ST];
  const uint32_t dbase = smem_u32(dsm), base = (dbase + 1023u) & ~1023u;
  uint8_t* ring = dsm + (base - dbase);
  float4* cbuf = reinterpret_cast<float4*>(ring + (size_t)ST * STAGE);  // cl: [S - 1][P], after the ring
  MuseTrace tr_{};
  pdl_trigger();
  cluster_start<P>(cl, S);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rg = blockIdx.x, sidx = blockIdx.y;
  int steps, atom0;
  ring_slice<KA>(K, S, sidx, steps, atom0);
  ring_init<ST>(full, empty, NW);

  float acc[NB * 4];
#pragma unroll
  for (int i = 0; i < NB * 4; i++) acc[i] = 0.f;
  if (warp == NW) {
    if (lane == 0) {
      const size_t KT = K / 64;
      // warpgroup g's KA tiles of step i: contiguous in wt, to its part of the stage
      auto load_w = [&](uint32_t sb, int i, unsigned long long* bar, uint64_t pol) {
#pragma unroll
        for (int g = 0; g < NWG; g++)
          bulk_load(sb + g * KA * TILE, wt + (((size_t)rg * NWG + g) * KT + atom0 + i * KA) * TILE, KA * TILE, bar, pol);
      };
      ring_produce<ST, KA>(&tx, full, empty, base, STAGE, KA * WB, XB, steps, atom0, load_w);
    }
  } else {
    const uint32_t wgoff = (uint32_t)(warp >> 2) * KA * TILE;  // this warpgroup's KA tiles of the stage
    for (int i = 0; i < steps; i++) {
      const int s = i % ST;
      mbar_wait(&full[s], (i / ST) & 1);
      const uint32_t sb = base + s * STAGE;
      wg_pin(acc);
      wg_fence();
#pragma unroll
      for (int a = 0; a < KA; a++)
#pragma unroll
        for (int j = 0; j < 4; j++)
          wgmma_ss<NB>(acc, wg_desc(sb + wgoff + a * TILE + 32 * j), wg_desc(sb + KA * WB + a * XB + 32 * j));
      wg_commit();
      wg_wait0();
      wg_pin(acc);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }
  ring_end<NW, NB>(acc, ring, cbuf, tr_, out, ws, sem, tid, lane, warp, rg, sidx, S, cl, M, N);
}
