// gemvtz.cuh: gemvtz_kernel, the compressed path's TMA kernel (its own config type, GemvtzConfig): the 12-bit stream
// (pack_z's, the same bytes gemvz_kernel reads) and x in a TMA ring, decoded into registers, warpgroup MMA.
#pragma once
#include "gemvz.cuh"
#include "gemvt.cuh"

#ifndef INSTRUMENTS
constexpr bool kRingAlone = false;  // csrc/instruments.cuh's timing-only build sets it: the ring alone, stages only freed
#endif

// ---- gemvtz_kernel: the 12-bit stream in a TMA ring, wgmma with A from registers ---------------------------------
// Contract: x bf16 [M, K] row-major (a 2-D TMA descriptor as gemvt_kernel's: box 64 k x 8 NB tokens, 128-byte
// swizzle, rows past M read as zeros; the pointer itself for the exception warp); w = pack_z's stream [N/16][K/64]
// [A0 | A1 | C: 3 x 512 B], zbase the rows' windows, eptr / esc the side table (all as gemvz_kernel); out bf16 [M, N];
// ws / sem as gemv_kernel. Requires N % (16 NW) == 0, K % (64 KA) == 0, 1 <= S <= K / (64 KA), NW = 4 or 8.
//
//   grid (N / (16 NW), S): CTA (rg, sidx) = rows 16 NW rg .. +16 NW (row blocks rb = NW rg + w) x K slice sidx
//     (ring_slice: whole steps of KA 64-k groups, slices differ by at most one step)
//   warps 0..NW-1 consume (warpgroup wg = w / 4), warp NW applies the exceptions (coop_walk), warp NW + 1 produces
//     (its lane 0 issues every copy)
//   ring of ST stages: stage = x [KA boxes of 8 NB tokens x 128 B] then W [NW row blocks][KA groups][1536 B] (one
//     bulk copy per warp: its row block's KA groups are contiguous in the stream); full[s]: the producer's expect_tx,
//     completed by the copies; empty[s]: one arrival per consumer warp once it has the stage in registers
//   per stage, consumer warp w: ld.shared its KA x 3 units, decz into 4 KA fragments (its rows' windows B, read
//     once); its warpgroup's 128 threads copy the stage's x into one of the warpgroup's three permuted buffers
//     (permute_x); the stage is freed (arrive on empty); fence.proxy.async and the warpgroup's named barrier; then
//     4 KA wgmma.m64n(8NB)k16, A = fragment f, B = the permuted x's k16 step f
//   software-pipelined: stage i + 1 is read, decoded and permuted while stage i's wgmma run (wait_group 1)
//   end: D -> red (the ring's memory) + ecorr (the exception warp's corrections) -> split-K combine -> store
// Why x is permuted and not the weights: inside a 64-group the stream holds k in gemvz's order (x's 16-byte loads
// feed mma16816 directly there), and wgmma reads B in k order. Permuting x (4-byte words: a 4 x 4 transpose in each
// 32-k half, 64 B a thread, about 10 instructions) keeps one copy of the weights for every m: gemvz's rows and this
// ring read the same bytes. Why the stage is freed at the register copy: a GEMV's wide operand is the weights, and
// the ring's depth is what keeps bytes in flight (session 11's ring freed a stage only after the next stage's MMA:
// FINDINGS 12.1, 12.6). Why corrections and not patches: the exception warp and side table are gemvz's, off the
// consumers' path (S11's per-lane patches cost the consumers 1.2-2.4 us at m = 32: FINDINGS 12.1).
// PDL: the producer copies the first min(ST, steps) stages' weights before griddepcontrol.wait, then their x; the
// exception warp waits before reading x, the consumers before the epilogue (out, ws, sem).
// Lab: labs/lab6_tma.py part 4 (the stage image, permute_x, the fragments, the kernel in miniature).

// Dynamic shared memory of one gemvtz CTA: 1 KB of alignment slack, the ring, the warpgroups' permuted x buffers
// (3 a warpgroup), and with cl the leader's cbuf.
__host__ __device__ constexpr size_t gemvtz_smem(int NW, int ST, int NB, int KA, int S, int cl) {
  return 1024 + (size_t)ST * KA * (8 * NB * 128 + NW * 1536) + (size_t)3 * (NW / 4) * KA * 8 * NB * 128 +
         (cl ? (size_t)(S - 1) * NW * NB * 32 * 16 : 0);
}

// One stage's x, permuted so that k16 step f of each 64-group pairs with decz's fragment f: thread tw (0..127) of the
// warpgroup takes jobs (token n, group a, 32-k half h); the natural words 4 t + q of the half (chunk t, word q, as the
// TMA box holds them, 128-byte swizzle) go to word 4 q + t (chunk q, word t), the same swizzle. src, dst: 1024-aligned
// shared addresses of the stage's x part and of the buffer. Lab: labs/lab6_tma.py permute_x.
template <int NB, int KA>
__device__ __forceinline__ void permute_x(const uint8_t* src, uint8_t* dst, int tw) {
  constexpr int ROWS = 8 * NB, XB = ROWS * 128, JOBS = ROWS * 2 * KA;
#pragma unroll
  for (int q0 = 0; q0 < JOBS; q0 += 128) {
    const int j = q0 + tw;
    if (JOBS % 128 == 0 || j < JOBS) {
      const int n = j % ROWS, ah = j / ROWS, a = ah >> 1, h = ah & 1, sw = n & 7;
      const int row = a * XB + n * 128;
      uint4 in[4];
#pragma unroll
      for (int t = 0; t < 4; t++) in[t] = *reinterpret_cast<const uint4*>(src + row + (((4 * h + t) ^ sw) << 4));
      *reinterpret_cast<uint4*>(dst + row + (((4 * h + 0) ^ sw) << 4)) = make_uint4(in[0].x, in[1].x, in[2].x, in[3].x);
      *reinterpret_cast<uint4*>(dst + row + (((4 * h + 1) ^ sw) << 4)) = make_uint4(in[0].y, in[1].y, in[2].y, in[3].y);
      *reinterpret_cast<uint4*>(dst + row + (((4 * h + 2) ^ sw) << 4)) = make_uint4(in[0].z, in[1].z, in[2].z, in[3].z);
      *reinterpret_cast<uint4*>(dst + row + (((4 * h + 3) ^ sw) << 4)) = make_uint4(in[0].w, in[1].w, in[2].w, in[3].w);
    }
  }
}

template <int NW, int ST, int NB, int KA>
__global__ void __launch_bounds__((NW + 2) * 32, 1)
gemvtz_kernel(const __grid_constant__ GemvArgs args, const __grid_constant__ CUtensorMap tx) {
  static_assert(NW == 4 || NW == 8, "NW: one or two warpgroups");
  static_assert(KA == 1 || KA == 2 || KA == 4, "KA: 64-k groups a stage");
  constexpr uint32_t GB = 1536, XB = 8 * NB * 128, STAGE = KA * (XB + NW * GB), XP = KA * XB;
  constexpr int NWG = NW / 4, P = NW * NB * 32;
  constexpr int EC = NB == 4 ? 2 : 4;  // the exception walk's chunk (gemvz's)
  const uint8_t* __restrict__ wz = static_cast<const uint8_t*>(args.w);
  const bf16* __restrict__ x = static_cast<const bf16*>(args.x);
  const int* __restrict__ eptr = static_cast<const int*>(args.eptr);
  const int2* __restrict__ esc = static_cast<const int2*>(args.esc);
  const uint8_t* __restrict__ zbase = static_cast<const uint8_t*>(args.zbase);
  bf16* __restrict__ out = static_cast<bf16*>(args.out);
  float4* __restrict__ ws = static_cast<float4*>(args.ws);
  int* __restrict__ sem = static_cast<int*>(args.sem);
  const int M = args.M, N = args.N, K = args.K, S = args.S, cl = args.cl;
  extern __shared__ uint8_t dsm[];
  __shared__ __align__(8) unsigned long long full[ST], empty[ST];
  __shared__ float ecorr[NW * 16][NB * 8 + 1];  // the exception warp's corrections (+1: rows in different banks)
  __shared__ int roff[NW * 16 + 1];
  __shared__ float part[32][2][NB * 8];
  __shared__ int prow[32][2];
  const uint32_t dbase = smem_u32(dsm), base = (dbase + 1023u) & ~1023u;
  uint8_t* ring = dsm + (base - dbase);
  uint8_t* xperm = ring + (size_t)ST * STAGE;                                        // [NWG][3][XP]
  float4* cbuf = reinterpret_cast<float4*>(xperm + (size_t)NWG * 3 * XP);            // cl: [S - 1][P]
  MuseTrace tr_{};
  pdl_trigger();
  cluster_start<P>(cl, S);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rg = blockIdx.x, sidx = blockIdx.y;
  int steps, g0;  // g0: the slice's first 64-group
  ring_slice<KA>(K, S, sidx, steps, g0);
  ring_init<ST>(full, empty, NW);

  float acc[NB * 4];
#pragma unroll
  for (int i = 0; i < NB * 4; i++) acc[i] = 0.f;
  if (warp == NW + 1) {
    if (lane == 0) {
      const size_t KG = K / 64;
      // warp w's KA groups of step i: contiguous in the stream (row block NW rg + w), to its part of the stage
      auto load_w = [&](uint32_t sb, int i, unsigned long long* bar, uint64_t pol) {
#pragma unroll
        for (int w = 0; w < NW; w++)
          bulk_load(sb + KA * XB + w * KA * GB, wz + (((size_t)rg * NW + w) * KG + g0 + i * KA) * GB, KA * GB, bar, pol);
      };
      ring_produce<ST, KA>(&tx, full, empty, base, STAGE, 0, XB, steps, g0, load_w);
    }
  } else if (warp == NW) {
    // the corrections of the CTA's rows in its K slice, from gemvz's side table and x in global memory, while the
    // consumers stream (the entries are constant: their row offsets are read before the wait)
    for (int i = lane; i <= NW * 16; i += 32) roff[i] = __ldg(eptr + rg * NW * 16 + i);
    __syncwarp();
    pdl_wait();
    coop_walk<NB, NW, EC>(ecorr, roff, part, prow, esc, x, M, K, g0 * 64, (g0 + steps * KA) * 64, lane);
  } else {
    const int wg = warp >> 2, tw = tid & 127;
    const uint32_t B = zrow_word(zbase, (rg * NW + warp) * 16, lane >> 2);  // this lane's rows' windows
    uint8_t* xp = xperm + (size_t)wg * 3 * XP;                                // this warpgroup's permuted buffers
    if constexpr (kRingAlone) {  // timing-only variant: the ring alone, every stage freed as it lands
      for (int i = 0; i < steps; i++) {
        mbar_wait(&full[i % ST], (i / ST) & 1);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[i % ST]);
      }
    } else {
    // stage i into fragments fb and the permuted buffer i % 3, then free its ring slot. The buffer was last read by
    // stage i - 3's wgmma: every warp of the warpgroup passed wait_group 1 after issuing stage i - 2 before the
    // barrier of stage i - 1, so that read is complete.
    auto take = [&](uint4 (&fb)[KA][4], int i) {
      const int s = i % ST;
      mbar_wait(&full[s], (i / ST) & 1);
      const uint8_t* sp = ring + (size_t)s * STAGE;
      uint4 z[KA][3];
#pragma unroll
      for (int a = 0; a < KA; a++)
#pragma unroll
        for (int u = 0; u < 3; u++)
          z[a][u] = *reinterpret_cast<const uint4*>(sp + KA * XB + (warp * KA + a) * GB + u * 512 + lane * 16);
      permute_x<NB, KA>(sp, xp + (i % 3) * XP, tw);
#pragma unroll
      for (int a = 0; a < KA; a++) {
        fb[a][0] = decz(z[a][0].x, z[a][0].y, z[a][2].x, B);
        fb[a][1] = decz(z[a][0].z, z[a][0].w, z[a][2].y, B);
        fb[a][2] = decz(z[a][1].x, z[a][1].y, z[a][2].z, B);
        fb[a][3] = decz(z[a][1].z, z[a][1].w, z[a][2].w, B);
      }
      uint32_t dep = 0;                       // every ld.shared of the slot has landed before the arrival
#pragma unroll
      for (int a = 0; a < KA; a++) dep ^= z[a][0].x ^ z[a][1].x ^ z[a][2].x;
      __syncwarp();
      if (lane == 0) mbar_arrive_after(&empty[s], dep);   // x's loads landed too: the buffer's stores used them
      fence_proxy_async();                    // the buffer's writes, for wgmma's reads
      named_bar_sync(2 + wg, 128);
    };
    auto issue = [&](const uint4 (&fb)[KA][4], int i) {
      const uint32_t xb = smem_u32(xp + (i % 3) * XP);
      wg_pin(acc);
      wg_fence();
#pragma unroll
      for (int a = 0; a < KA; a++)
#pragma unroll
        for (int f = 0; f < 4; f++) wgmma_rs<NB>(acc, fb[a][f], wg_desc(xb + a * XB + 32 * f));
      wg_commit();
    };
    uint4 f0[KA][4], f1[KA][4];
    take(f0, 0);
    for (int i = 0; i < steps; i += 2) {
      issue(f0, i);
      wg_wait1();
      wg_pin(acc);
      if (i + 1 >= steps) break;
      take(f1, i + 1);
      issue(f1, i + 1);
      wg_wait1();
      wg_pin(acc);
      if (i + 2 < steps) take(f0, i + 2);
    }
    wg_wait0();
    wg_pin(acc);
    }
  }
  ring_end<NW, NB>(acc, ring, cbuf, tr_, out, ws, sem, tid, lane, warp, rg, sidx, S, cl, M, N, &ecorr);
}
