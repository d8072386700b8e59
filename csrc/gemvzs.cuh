// gemvzs.cuh: gemvz PIPE 6..8 (gemvzs_kernel), the 12-bit GEMV for m = 9..32: warps that split rows, the CTA's K slice
// of x staged once in shared memory and read by every warp, and the exception walk with x from shared memory.
#pragma once
#include "gemvz.cuh"

// Groups of x the helper warp keeps in flight while it stages the slice (it waits for group c - ZS_XAHEAD before it
// issues group c): enough for the stream's need (x is a third of the weight bytes at m = 32, 128 rows a CTA), without
// asking L2 for every CTA's whole slice at the release.
#if defined(MUSE_ZS_XALL)
constexpr int ZS_XAHEAD = 1 << 20;  // timing variant: every group's copies at once
#elif defined(MUSE_ZS_X4)
constexpr int ZS_XAHEAD = 4;        // timing variant
#else
constexpr int ZS_XAHEAD = 16;
#endif
// Timing-only variant (wrong results): MUSE_ZS_NOXWAIT, the streaming warps never wait for x.
#ifdef MUSE_ZS_NOXWAIT
constexpr bool kZsWaitX = false;
#else
constexpr bool kZsWaitX = true;
#endif

// The most 64-wide groups one CTA's slice holds (cta_slice: T = K/64/UG units over S CTAs, a or a + 1 each).
__host__ __device__ constexpr int zs_groups(int KG, int UG, int S) { return (KG / UG + S - 1) / S * UG; }

// Dynamic shared memory of one gemvzs CTA: [cbuf: the leader's (S - 1) P float4 with cl][x: G groups x 8 NB tokens
// x 128 B][one mbarrier per group].
__host__ __device__ constexpr size_t zs_smem(int NW, int NB, int R, int G, int S, int cl) {
  return (cl ? (size_t)(S - 1) * R * NB * NW * 32 * 16 : 0) + (size_t)G * 8 * NB * 128 + (size_t)G * 8;
}

// Byte offset of x[token tok][k 8 ch .. 8 ch + 7] of staged group c: group-major, 128 B per token; the 16-byte piece ch
// of an odd token sits at ch ^ 4, so a quarter warp's loads (tokens g, g + 1 x pieces t = 0..3, or 4..7) fall in
// eight different 16-byte bank groups.
__device__ __forceinline__ uint32_t zs_xoff(int c, int tok, int ch, int TOK) {
  return (uint32_t)(((c * TOK + tok) * 8 + (ch ^ ((tok & 1) << 2))) * 16);
}

// ---- gemvzs_kernel --------------------------------------------------------------------------------------------
// Contract: x, w, zbase, eptr, esc, out, ws, sem as gemvz_kernel (the same 12-bit stream and side table); 1 <= M <= 8 NB.
// Requires N % (16 NW R) == 0, K/64 % UG == 0, K/64 / UG >= S.
//
//   grid (N / (16 NW R), S): CTA (rg, sidx) = the NW R row blocks (rg NW + w) R + r x K slice sidx (cta_slice: the
//     split of any S, in units of UG groups)
//   warp NW (the helper): reads its rows' side-table offsets and prefetches their first entries to L1 before
//     griddepcontrol.wait; then stages x's slice, group by group (8 NB tokens x 128 B, tokens past M as zeros), 16-byte
//     cp.async from every lane, each group counted on its own mbarrier (32 arrivals, cp.async.mbarrier.arrive), with
//     ZS_XAHEAD groups in flight; then walks the exceptions: lane -> row lane & 15 of each of the CTA's NW R blocks,
//     tokens p, p + 2, .. (p = lane >> 4), entries of [klo, khi) in k order, x from shared memory once its group has
//     landed, corrections into ecorr.
//   warps 0..NW-1 stream their R row blocks over the whole slice: a ring of DEPTH + 1 trips of UG groups in registers
//     (DEPTH = PIPE - 5 trips loaded ahead, the first DEPTH before the wait); per group a wait on its x mbarrier, two
//     16-byte x loads from shared memory per token block (k 8t..8t+7 and 32 + 8t.. of token g: gemvz's k order), decz
//     and 4 NB mma16816 per row block. Every x value serves the NW R row blocks of the CTA; no reduction between warps.
//   end: one CTA barrier; each warp adds ecorr to its rows; split-K (ticket or cluster, positions p = j NT + tid,
//     j = r NB + nb); the store.
// Why (issue #27): gemvz's warps split K, so at m = 16 / 32 each warp loads its own x through L1 (x bytes 0.7 / 1.3 x
// the weight bytes at R = 2, L1TEX 79%) and the exception warp reads x from L2 per entry. Here 128-row CTAs read x
// once (0.17 / 0.33 x), and the weights in flight cost registers only (DEPTH), not x.
// PDL: weights, windows and side-table offsets before griddepcontrol.wait; x, out, ws, sem after it.
template <int NW, int UG, int NB, int R, int PIPE>
__global__ void __launch_bounds__((NW + 1) * 32, PIPE == 6 ? 2 : 1)
gemvzs_kernel(const __grid_constant__ GemvArgs args) {
  static_assert(PIPE >= 6 && PIPE <= 8, "gemvzs is gemvz PIPE 6..8");
  constexpr int DEPTH = PIPE == 8 ? 3 : 2, NS = DEPTH + 1;
  constexpr int NT = NW * 32, J = R * NB, P = J * NT, RB = NW * R, TOK = 8 * NB;
  constexpr int EC = 4;  // side-table entries loaded at once by the walk
  const bf16* __restrict__ x = static_cast<const bf16*>(args.x);
  const uint4* __restrict__ w = static_cast<const uint4*>(args.w);
  const int* __restrict__ eptr = static_cast<const int*>(args.eptr);
  const int2* __restrict__ esc = static_cast<const int2*>(args.esc);
  const uint8_t* __restrict__ zbase = static_cast<const uint8_t*>(args.zbase);
  float4* __restrict__ ws = static_cast<float4*>(args.ws);
  int* __restrict__ sem = static_cast<int*>(args.sem);
  const int M = args.M, N = args.N, K = args.K, S = args.S, cl = args.cl;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rg = blockIdx.x, sidx = blockIdx.y, KG = K / 64;
  const int2 slice = cta_slice<UG>(KG, S, sidx);
  const int g0 = slice.x, G = slice.y - slice.x, T = G / UG;
  extern __shared__ float4 zsm[];
  float4* cbuf = zsm;
  unsigned char* xs = reinterpret_cast<unsigned char*>(zsm + (cl ? (S - 1) * P : 0));
  unsigned long long* xbar = reinterpret_cast<unsigned long long*>(xs + (size_t)zs_groups(KG, UG, S) * TOK * 128);
  __shared__ float ecorr[RB * 16][TOK + 1];  // +1: the 16 rows of a block land in 16 different banks
  pdl_trigger();
  cluster_start<P>(cl, S);
  if (tid == NT) {
    for (int c = 0; c < G; c++) mbar_init(&xbar[c], 32);
  }
  __syncthreads();  // the x barriers are initialised before anyone arrives or waits

  float acc[R][NB][4];
  if (warp == NW) {
    const int rl = lane & 15, p = lane >> 4;
    const int klo = g0 * 64, khi = slice.y * 64;
    // every row's first EC entries (the side table is constant after prepare), in registers before the wait: the
    // walk's first round trip to L2 is then off the critical path, for all RB blocks at once
    int beg[RB], end[RB];
    int2 e0[RB][EC];
#pragma unroll
    for (int b = 0; b < RB; b++) {
      const int row = (rg * RB + b) * 16 + rl;
      beg[b] = __ldg(eptr + row);
      end[b] = kSkipCorrections ? beg[b] : __ldg(eptr + row + 1);
#pragma unroll
      for (int c = 0; c < EC; c++) e0[b][c] = beg[b] + c < end[b] ? __ldg(esc + beg[b] + c) : make_int2(khi, 0);
    }
    pdl_wait();
    // stage the slice: piece f = j 32 + lane of a group is token f >> 3, 16-byte piece f & 7 (8 lanes a 128-B line)
    for (int c = 0; c < G; c++) {
      if (c >= ZS_XAHEAD) mbar_wait(&xbar[c - ZS_XAHEAD], 0);
#pragma unroll
      for (int j = 0; j < TOK / 4; j++) {
        const int f = j * 32 + lane, tok = f >> 3, ch = f & 7;
        cp_async16(smem_u32(xs + zs_xoff(c, tok, ch, TOK)), x + (size_t)min(tok, M - 1) * K + (g0 + c) * 64 + ch * 8,
                   tok < M ? 16u : 0u);
      }
      cp_async_arrive(&xbar[c]);
    }
    // the walk: a row's entries in k order, EC at a time; those outside [klo, khi) add nothing
    auto fma_entries = [&](float (&ea)[TOK / 2], const int2 (&e)[EC]) {
#pragma unroll
      for (int c = 0; c < EC; c++) {
        if (e[c].x >= klo && e[c].x < khi) {
          const int kl = e[c].x - klo, grp = kl >> 6;
          mbar_wait(&xbar[grp], 0);
          const float d = __int_as_float(e[c].y);
          const unsigned char* xe = xs + zs_xoff(grp, p, (kl >> 3) & 7, TOK) + (kl & 7) * 2;
#pragma unroll
          for (int q = 0; q < TOK / 2; q++)  // token p + 2q: same parity as p, so the same swizzle
            ea[q] += d * __bfloat162float(*reinterpret_cast<const bf16*>(xe + 2 * q * 128));
        }
      }
    };
#pragma unroll
    for (int b = 0; b < RB; b++) {
      float ea[TOK / 2];
#pragma unroll
      for (int q = 0; q < TOK / 2; q++) ea[q] = 0.f;
      fma_entries(ea, e0[b]);
      if (e0[b][EC - 1].x < khi) {  // the row may go on in this CTA's slice: the rest, EC at a time
        for (int j = beg[b] + EC; j < end[b]; j += EC) {
          int2 e[EC];
#pragma unroll
          for (int c = 0; c < EC; c++) e[c] = j + c < end[b] ? __ldg(esc + j + c) : make_int2(khi, 0);
          fma_entries(ea, e);
          if (e[EC - 1].x >= khi) break;  // k ascending: the rest of the row is past this CTA's slice
        }
      }
#pragma unroll
      for (int q = 0; q < TOK / 2; q++) ecorr[b * 16 + rl][p + 2 * q] = ea[q];
    }
  } else {
    const int rb0 = (rg * NW + warp) * R;  // the warp's first row block
    const size_t rstride = (size_t)KG * 96;
    const uint4* wp = w + ((size_t)rb0 * KG + g0) * 96 + lane;
    if (args.pf && lane == 0) {
#pragma unroll
      for (int r = 0; r < R; r++) prefetch_l2(wp + r * rstride, (uint32_t)G * 1536u);
    }
    uint4 z[NS][UG][R][3];
#pragma unroll
    for (int s = 0; s < DEPTH; s++)
      if (s < T) load_zbatch<UG, R>(z[s], wp, rstride, s * UG);
    uint32_t B[R];
#pragma unroll
    for (int r = 0; r < R; r++) B[r] = zrow_word(zbase, (rb0 + r) * 16, g);
    {
      uint32_t chk = 0;
#pragma unroll
      for (int r = 0; r < R; r++) chk ^= B[r];
#pragma unroll
      for (int u = 0; u < UG; u++)
#pragma unroll
        for (int r = 0; r < R; r++) chk ^= z[0][u][r][0].x ^ z[0][u][r][1].x ^ z[0][u][r][2].x;
      land_before_wait(chk);
    }
    pdl_wait();
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int nb = 0; nb < NB; nb++) acc[r][nb][0] = acc[r][nb][1] = acc[r][nb][2] = acc[r][nb][3] = 0.f;
    const uint32_t xa_off = ((t ^ ((g & 1) << 2)) + g * 8) * 16, xb_off = (((4 + t) ^ ((g & 1) << 2)) + g * 8) * 16;
    for (int i0 = 0; i0 < T; i0 += NS) {
#pragma unroll
      for (int s = 0; s < NS; s++) {
        const int i = i0 + s;
        if (i < T) {
          if (i + DEPTH < T) load_zbatch<UG, R>(z[(s + DEPTH) % NS], wp, rstride, (i + DEPTH) * UG);
#pragma unroll
          for (int u = 0; u < UG; u++) {
            const int c = i * UG + u;
            if (kZsWaitX) mbar_wait(&xbar[c], 0);
            const unsigned char* xc = xs + (size_t)c * TOK * 128;
            uint4 xa[NB], xb[NB];
#pragma unroll
            for (int nb = 0; nb < NB; nb++) {
              xa[nb] = *reinterpret_cast<const uint4*>(xc + nb * 8 * 128 + xa_off);
              xb[nb] = *reinterpret_cast<const uint4*>(xc + nb * 8 * 128 + xb_off);
            }
#pragma unroll
            for (int r = 0; r < R; r++) mma_zgroup<NB>(acc[r], z[s][u][r], xa, xb, B[r]);
          }
        }
      }
    }
  }
  __syncthreads();  // ecorr is complete

  float4 res[J];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
      if (warp < NW) {
        const int row = (warp * R + r) * 16 + g, tok = nb * 8 + 2 * t;
        res[r * NB + nb] = make_float4(acc[r][nb][0] + ecorr[row][tok], acc[r][nb][1] + ecorr[row][tok + 1],
                                       acc[r][nb][2] + ecorr[row + 8][tok], acc[r][nb][3] + ecorr[row + 8][tok + 1]);
      } else {
        res[r * NB + nb] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  const bool store = cl ? cluster_combine<J, P, NT>(res, cbuf, S, cl) : splitk_combine<J, P, NT>(res, ws, sem, rg, sidx, S);
  if (store && warp < NW) {
    bf16* __restrict__ out = static_cast<bf16*>(args.out);
#pragma unroll
    for (int j = 0; j < J; j++) {
      const int r = j / NB, nb = j % NB;
      const int row = ((rg * NW + warp) * R + r) * 16 + g, tok = nb * 8 + 2 * t;
      const float v[4] = {res[j].x, res[j].y, res[j].z, res[j].w};
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const int tq = tok + (q & 1);
        if (tq < M) out[(size_t)tq * N + row + 8 * (q >> 1)] = __float2bfloat16_rn(v[q]);
      }
    }
  }
}
