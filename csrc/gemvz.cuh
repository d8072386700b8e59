// gemvz.cuh: the lossless 12-bit format on the GPU: decz (one fragment), the stream's loader, gemvz_kernel with its
// exception warp, and unpackz_kernel (prepare's decode check).
#pragma once
#include "common.cuh"

#ifndef INSTRUMENTS
constexpr bool kSkipCorrections = false;  // csrc/instruments.cuh's timing-only build sets it: the corrections left out
#endif

// ---- the 12-bit format ----------------------------------------------------------------------------
// Each row r has its own window: the 8 consecutive classes zbase[r] .. zbase[r] + 7 (class = bf16 bits 14..8).
// A weight is stored as its low byte verbatim, a 3-bit window index i (class = zbase[r] + i) and its sign.
// decz: one m16n8k16 A fragment (8 bf16, element j = 0..7 in mma16816's register order: j0, j1 and j4, j5 on the
// lane's row g, j2, j3 and j6, j7 on row g + 8) from
//   lo0, lo1: verbatim low bytes of j0..j3 and j4..j7 (exponent bit 0 + 7 mantissa bits), byte i = j_i
//   c:        the code word; byte b = idx(j_b) in bits 0..2, idx(j_b+4) in bits 4..6, sign(j_b) in bit 7 and
//             sign(j_4+(b+3)%4) in bit 3, placed so that c and c rotated right by 4 each hold 4 indices in bits
//             0..2 and their signs in bit 7 of every byte
//   B:        the lane's two windows as bytes {zbase[g], zbase[g], zbase[g + 8], zbase[g + 8]} (zrow_word)
// A high byte is (index | sign) + base: base <= 120 and index <= 7 never carry into the sign bit. 9 integer
// instructions per 8 weights (1 SHF, 2 LOP3, 2 adds: IMAD.IADD in the SASS, 4 PRMT), no branches, no table.
// Lab: labs/lab3_compress.py.
__device__ __forceinline__ uint4 decz(uint32_t lo0, uint32_t lo1, uint32_t c, uint32_t B) {
  const uint32_t h0 = (c & 0x87878787u) + B;
  const uint32_t h1 = (__funnelshift_r(c, c, 4) & 0x87878787u) + B;
  uint4 f;
  f.x = prmt(lo0, h0, 0x5140u);  // {lo j0, hi j0, lo j1, hi j1}
  f.y = prmt(lo0, h0, 0x7362u);  // {lo j2, hi j2, lo j3, hi j3}
  f.z = prmt(lo1, h1, 0x5140u);
  f.w = prmt(lo1, h1, 0x7362u);
  return f;
}

// decz's B for the lane of row g (0..7) of the 16-row block whose first row is row0
__device__ __forceinline__ uint32_t zrow_word(const uint8_t* __restrict__ zbase, int row0, int g) {
  return (uint32_t)__ldg(zbase + row0 + g) * 0x0101u | (uint32_t)__ldg(zbase + row0 + g + 8) * 0x01010000u;
}

// One batch of UG 64-wide groups of the 12-bit format for each of R row blocks: units A0, A1, C (codes) at
// +0, +32, +64 (512 B per warp load each).
template <int UG, int R>
__device__ __forceinline__ void load_zbatch(uint4 (&z)[UG][R][3], const uint4* wp, size_t rstride, int i) {
#pragma unroll
  for (int u = 0; u < UG; u++)
#pragma unroll
    for (int r = 0; r < R; r++) {
      const uint4* p = wp + r * rstride + (size_t)(i + u) * 96;
      z[u][r][0] = ld_stream(p);
      z[u][r][1] = ld_stream(p + 32);
      z[u][r][2] = ld_stream(p + 64);
    }
}

// One 64-wide group of one row block: decode its 4 fragments from the A0, A1, C units with the rows' window
// word B, and run them against the token blocks' x (xa: k 0..31 of the group, xb: k 32..63), 4 NB mma.
template <int NB>
__device__ __forceinline__ void mma_zgroup(float (&acc)[NB][4], const uint4 (&z)[3], const uint4 (&xa)[NB],
                                           const uint4 (&xb)[NB], uint32_t B) {
  const uint4 f0 = decz(z[0].x, z[0].y, z[2].x, B);
  const uint4 f1 = decz(z[0].z, z[0].w, z[2].y, B);
  const uint4 f2 = decz(z[1].x, z[1].y, z[2].z, B);
  const uint4 f3 = decz(z[1].z, z[1].w, z[2].w, B);
#pragma unroll
  for (int nb = 0; nb < NB; nb++) {
    mma16816(acc[nb], f0, xa[nb].x, xa[nb].y);
    mma16816(acc[nb], f1, xa[nb].z, xa[nb].w);
    mma16816(acc[nb], f2, xb[nb].x, xb[nb].y);
    mma16816(acc[nb], f3, xb[nb].z, xb[nb].w);
  }
}

// ---- the cooperative walk (gemvz WALK = 1) -------------------------------------------------------------------
// The CTA's rows' entries are one contiguous run of the side table, esc[roff[0] .. roff[16 R]). Lane l takes the l-th
// of 32 equal contiguous pieces of that run, with all 8 NB tokens, so a row with many out-of-window weights is walked by
// several lanes at once. The per-row walk gives a row to one lane, and that lane's chain of chunks sets the CTA's time
// once a row holds a few dozen (FINDINGS 10.5). A row inside one lane's piece is summed there in k order; a row split
// between lanes is summed per lane, then over the lanes in lane order, so every call gives the same bits. roff, part
// and prow are the exception warp's shared memory; ecorr as gemvz_kernel's. prepare takes it where the worst row is
// over CAPR_LIMITS (muse/zformat.py walk_for): flat in the worst row, but slower than the per-row walk where no row is
// long (it walks the rows' entries of all K: FINDINGS 10.6). Lab: labs/lab3_compress.py coop_pieces.
template <int NB, int R, int EC>
__device__ __forceinline__ void coop_walk(float (&ecorr)[R * 16][NB * 8 + 1], const int* roff, float (&part)[32][2][NB * 8],
                                          int (&prow)[32][2], const int2* __restrict__ esc, const bf16* __restrict__ x,
                                          int M, int K, int klo, int khi, int lane) {
  constexpr int RB = R * 16, TK = NB * 8;
  const int E0 = roff[0], n = roff[RB] - E0, c = (n + 31) >> 5;
  const int a = E0 + min(lane * c, n), b = E0 + min(lane * c + c, n);
  for (int r = lane; r < RB; r += 32)
#pragma unroll
    for (int q = 0; q < TK; q++) ecorr[r][q] = 0.f;
  prow[lane][0] = prow[lane][1] = -1;
  __syncwarp();
  if (!kSkipCorrections && a < b) {
    int lo = 0, hi = RB;  // the row that holds entry a: the last r with roff[r] <= a (roff[RB] > a)
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (roff[mid] <= a) lo = mid;
      else hi = mid;
    }
    const int first = lo;
    int cur = lo;
    float ea[TK];
#pragma unroll
    for (int q = 0; q < TK; q++) ea[q] = 0.f;
    auto flush = [&](int row) {  // a row inside the piece goes to ecorr, a split one to the lane's part slot
      if (roff[row] >= a && roff[row + 1] <= b) {
#pragma unroll
        for (int q = 0; q < TK; q++) ecorr[row][q] = ea[q];
      } else {
        const int sl = row == first ? 0 : 1;
        prow[lane][sl] = row;
#pragma unroll
        for (int q = 0; q < TK; q++) part[lane][sl][q] = ea[q];
      }
#pragma unroll
      for (int q = 0; q < TK; q++) ea[q] = 0.f;
    };
    for (int j = a; j < b; j += EC) {
      int2 e[EC];
#pragma unroll
      for (int cc = 0; cc < EC; cc++) e[cc] = ld_esc_if(esc + j + cc, j + cc < b, make_int2(khi, 0));
      float xv[EC][TK];
#pragma unroll
      for (int cc = 0; cc < EC; cc++)
#pragma unroll
        for (int q = 0; q < TK; q++)
          xv[cc][q] = ld_x1_if(x + (size_t)q * K + e[cc].x, e[cc].x >= klo && e[cc].x < khi && q < M);
#pragma unroll
      for (int cc = 0; cc < EC; cc++) {
        if (j + cc < b) {
          while (j + cc >= roff[cur + 1]) {
            flush(cur);
            cur++;
          }
          if (e[cc].x >= klo && e[cc].x < khi) {
            const float d = __int_as_float(e[cc].y);
#pragma unroll
            for (int q = 0; q < TK; q++) ea[q] += d * xv[cc][q];  // tok >= M: x read as 0, never stored
          }
        }
      }
    }
    flush(cur);
  }
  __syncwarp();
  for (int r = lane; r < RB; r += 32) {  // the split rows: their lanes' sums added in lane order
    bool any = false;
    float sum[TK];
#pragma unroll
    for (int q = 0; q < TK; q++) sum[q] = 0.f;
    for (int l = 0; l < 32; l++)
#pragma unroll
      for (int sl = 0; sl < 2; sl++)
        if (prow[l][sl] == r) {
          any = true;
#pragma unroll
          for (int q = 0; q < TK; q++) sum[q] += part[l][sl][q];
        }
    if (any)
#pragma unroll
      for (int q = 0; q < TK; q++) ecorr[r][q] = sum[q];
  }
}

// ---- gemvz_kernel: the compressed GEMV with its exception warp ------------------------------------
// Contract: x as gemv_kernel; w = pack_z's stream: [N/16][K/64][A0 32 units | A1 32 units | C 32 units]
// of 16 B; zbase uint8 [N], each row's window; the side table in CSR: row r's exceptions are
// esc[eptr[r] .. eptr[r+1]) = int2 {k, fp32 bits of the correction}, k ascending; out bf16 [M, N].
// Requires N % (16R) == 0, K/64 % UG == 0, K/64 / UG >= S*NW (any S: split_units).
//
//   warps 0..NW-1 stream: per 64-wide group and row block, a lane loads A0, A1, C (48 B) and decodes 4
//     fragments with its rows' window word B (zrow_word, read before the wait): f0 = decz(A0.x, A0.y, C.x),
//     f1 = (A0.z, A0.w, C.y) -> K block 2G, steps 0/1; f2, f3 from A1 -> block 2G+1. Grid, R, LOOP, MB and pf as
//     gemv_kernel.
//   warp NW (the exception warp): lane -> row r = lane & 15 of each of the R blocks, tokens p, p+2, ...
//     (p = lane >> 4); adds correction x x[token][k] for its rows' exceptions in [klo, khi), in k order,
//     into smem ecorr; one barrier; the corrections are added after the warps' reduction, before split-K.
//     The side table is constant after prepare: its row offsets are read, and its first lines prefetched to
//     L1, before pdl_wait. A row's list is walked in chunks of EC entries: the chunk's entries, then all their
//     x values, are loaded before its first FMA (one chain of two loads per chunk, not per entry). R >= 2: the
//     first chunks of all R blocks are loaded at once, every load predicated in the PTX (no branch around it);
//     R = 1: a block at a time (there the predicated form ties or loses). NB >= 2: the walk starts once every
//     streaming warp is through its first trip (named barrier 1: they arrive, it syncs), away from their first x
//     misses; at NB = 1 it starts at the wait (the late start lost there). The walk is never the CTA's last warp at
//     the barrier; what it costs is its L2 requests slowing the stream (FINDINGS 10.2-10.4).
// An out-of-window weight decodes to v, its own sign and low byte with the nearest window class; prepare verified
// fl32(v + correction) == W for every one of them. A timing-only variant build (csrc/instruments.cuh) skips
// the corrections (wrong results: tools/ab.py times what they cost; a GPU test checks that they matter).
// Lab: labs/lab3_compress.py (format, decz, the kernel in miniature).
template <int NW, int UG, int NB, int R, int LOOP, int MB, int WALK>
__global__ void __launch_bounds__((NW + 1) * 32, MB)
gemvz_kernel(const __grid_constant__ GemvArgs args) {
  static_assert(LOOP >= 0 && LOOP <= 2 && (WALK == 0 || WALK == 1), "LOOP is 0..2, WALK 0 or 1");
  constexpr bool COOP = WALK == 1;  // the exception warp's walk: cooperative (coop_walk) or one lane a row
  const bf16* __restrict__ x = static_cast<const bf16*>(args.x);
  const uint4* __restrict__ w = static_cast<const uint4*>(args.w);
  const int* __restrict__ eptr = static_cast<const int*>(args.eptr);
  const int2* __restrict__ esc = static_cast<const int2*>(args.esc);
  bf16* __restrict__ out = static_cast<bf16*>(args.out);
  float4* __restrict__ ws = static_cast<float4*>(args.ws);
  int* __restrict__ sem = static_cast<int*>(args.sem);
  const int M = args.M, N = args.N, K = args.K, S = args.S, pf = args.pf, cl = args.cl;
  const uint8_t* __restrict__ zbase = static_cast<const uint8_t*>(args.zbase);
  constexpr int P = R * NB * 32, NT = NW * 32, J = (P + NT - 1) / NT;
  constexpr int EC = NB == 4 ? 2 : 4;  // exception chunk: EC entries x NB*4 tokens of x in flight per lane
  constexpr bool LATE = NB >= 2;  // the walk starts once every streaming warp is through its first trip
  constexpr bool PWALK = R >= 2;  // the exception warp's walk: predicated first chunks of all row blocks at once
  extern __shared__ float4 cbuf[];  // cl: [S - 1][P], the other CTAs' partials (in the leader)
  MuseTrace tr_;  // trace builds: thread 0's timestamps
  TR_G(0) TR_C(0)
  pdl_trigger();
  cluster_start<P>(cl, S);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rg = blockIdx.x, sidx = blockIdx.y;
  const int KG = K / 64;  // units of UG groups, split over S x NW warps (split_units)
  __shared__ float4 red[NW][P];
  __shared__ float ecorr[R * 16][NB * 8 + 1];  // +1: the 16 rows of a block land in 16 different banks
  TR_EXC_DECL

  if (warp == NW && COOP) {
    if constexpr (COOP) {
      __shared__ int roff[R * 16 + 1];
      __shared__ float part[32][2][NB * 8];
      __shared__ int prow[32][2];
      const int2 slice = cta_slice<UG>(KG, S, sidx);
      for (int i = lane; i <= R * 16; i += 32) roff[i] = __ldg(eptr + rg * R * 16 + i);  // constant: before the wait
      __syncwarp();
      pdl_wait();
      if constexpr (LATE) named_bar_sync1((NW + 1) * 32);
      coop_walk<NB, R, EC>(ecorr, roff, part, prow, esc, x, M, K, slice.x * 64, slice.y * 64, lane);
    }
    TR_EXC_END
  } else if (warp == NW) {
    const int rl = lane & 15, p = lane >> 4;
    const int2 slice = cta_slice<UG>(KG, S, sidx);
    const int klo = slice.x * 64, khi = slice.y * 64;
    int beg[R], end[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int row = (rg * R + r) * 16 + rl;
      beg[r] = __ldg(eptr + row);
      end[r] = __ldg(eptr + row + 1);
      if (!kSkipCorrections && beg[r] < end[r])
        asm volatile("prefetch.global.L1 [%0];" ::"l"(esc + beg[r]));
    }
    pdl_wait();
    if constexpr (LATE) named_bar_sync1((NW + 1) * 32);
    // a chunk's corrections into ea, entries in k order (entries outside [klo, khi) add nothing)
    auto fma_chunk = [&](float (&ea)[NB * 4], const int2 (&e)[EC], const float (&xv)[EC][NB * 4]) {
#pragma unroll
      for (int c = 0; c < EC; c++)
        if (e[c].x >= klo && e[c].x < khi) {
          const float d = __int_as_float(e[c].y);
#pragma unroll
          for (int q = 0; q < NB * 4; q++) ea[q] += d * xv[c][q];  // tok >= M: never stored
        }
    };
    if constexpr (PWALK) {
      // R >= 2: the first chunk of every row block at once after the wait, with every load predicated in the PTX
      // itself (rewrites that came out with branches around their x loads lost: FINDINGS 10.4).
      // Same entries, same order, same FMAs as the walk below.
      auto load_chunk = [&](int2 (&e)[EC], float (&xv)[EC][NB * 4], int j, int end) {
#pragma unroll
        for (int c = 0; c < EC; c++) e[c] = ld_esc_if(esc + j + c, j + c < end, make_int2(khi, 0));
#pragma unroll
        for (int c = 0; c < EC; c++)
#pragma unroll
          for (int q = 0; q < NB * 4; q++) {
            const int tok = p + 2 * q;
            xv[c][q] = ld_x1_if(x + (size_t)tok * K + e[c].x, e[c].x >= klo && e[c].x < khi && tok < M);
          }
      };
      int2 e0[R][EC];
      float xv0[R][EC][NB * 4];
#pragma unroll
      for (int r = 0; r < R; r++) load_chunk(e0[r], xv0[r], beg[r], kSkipCorrections ? beg[r] : end[r]);
#pragma unroll
      for (int r = 0; r < R; r++) {
        float ea[NB * 4];
#pragma unroll
        for (int q = 0; q < NB * 4; q++) ea[q] = 0.f;
        fma_chunk(ea, e0[r], xv0[r]);
        if (e0[r][EC - 1].x < khi) {  // the row may go on in this CTA's slice: the rest, a chunk at a time
          for (int j = beg[r] + EC; j < end[r]; j += EC) {
            int2 e[EC];
            float xv[EC][NB * 4];
            load_chunk(e, xv, j, end[r]);
            fma_chunk(ea, e, xv);
            if (e[EC - 1].x >= khi) break;  // k ascending: the rest of the row is past this CTA's slice
          }
        }
#pragma unroll
        for (int q = 0; q < NB * 4; q++) ecorr[r * 16 + rl][p + 2 * q] = ea[q];
      }
    } else {  // R = 1: a row block at a time, a chunk at a time
#pragma unroll
      for (int r = 0; r < R; r++) {
        float ea[NB * 4];
#pragma unroll
        for (int q = 0; q < NB * 4; q++) ea[q] = 0.f;
        if (!kSkipCorrections) {
          for (int j = beg[r]; j < end[r]; j += EC) {
            int2 e[EC];
            bool use[EC];
#pragma unroll
            for (int c = 0; c < EC; c++) {
              e[c] = j + c < end[r] ? __ldg(esc + j + c) : make_int2(khi, 0);
              use[c] = e[c].x >= klo && e[c].x < khi;
            }
            float xv[EC][NB * 4];
#pragma unroll
            for (int c = 0; c < EC; c++)
#pragma unroll
              for (int q = 0; q < NB * 4; q++) {
                const int tok = p + 2 * q;
                xv[c][q] = use[c] && tok < M ? __bfloat162float(x[(size_t)tok * K + e[c].x]) : 0.f;
              }
            fma_chunk(ea, e, xv);
            if (e[EC - 1].x >= khi) break;  // k ascending: the rest of the row is past this CTA's slice
          }
        }
#pragma unroll
        for (int q = 0; q < NB * 4; q++) ecorr[r * 16 + rl][p + 2 * q] = ea[q];
      }
    }
    TR_EXC_END
  } else {
    const int2 share = split_units<UG, NW>(KG, S, sidx, warp);
    const int g0 = share.x, KGW = share.y;
    const size_t rstride = (size_t)KG * 96;
    const uint4* wp = w + ((size_t)rg * R * KG + g0) * 96 + lane;
    if (pf && lane == 0) {
#pragma unroll
      for (int r = 0; r < R; r++) prefetch_l2(wp + r * rstride, (uint32_t)KGW * 1536u);
    }
    uint4 z[UG][R][3];
    load_zbatch<UG, R>(z, wp, rstride, 0);
    // the rows' windows: constant after prepare, so read before the wait and landed with the first batch (FINDINGS 8.4)
    uint32_t B[R];
#pragma unroll
    for (int r = 0; r < R; r++) B[r] = zrow_word(zbase, (rg * R + r) * 16, g);
    {
      uint32_t chk = 0;
#pragma unroll
      for (int r = 0; r < R; r++) chk ^= B[r];
#pragma unroll
      for (int u = 0; u < UG; u++)
#pragma unroll
        for (int r = 0; r < R; r++) chk ^= z[u][r][0].x ^ z[u][r][1].x ^ z[u][r][2].x;
      land_before_wait(chk);
    }
    pdl_wait();
    TR_G(1) TR_C(1)

    const bf16* xr[NB];
#pragma unroll
    for (int nb = 0; nb < NB; nb++) xr[nb] = x + (size_t)min(nb * 8 + g, M - 1) * K + g0 * 64 + t * 8;
    float acc[R][NB][4];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int nb = 0; nb < NB; nb++) acc[r][nb][0] = acc[r][nb][1] = acc[r][nb][2] = acc[r][nb][3] = 0.f;
    // LATE: every streaming thread arrives on named barrier 1 once, after its first trip's MMAs (its x is in). The
    // arrival waits for the warp's loads in flight (bar.arrive orders them), and the walk's burst needs that pause:
    // a relaxed shared counter as the signal, and other placements, lost (FINDINGS 10.4).
    auto let_exception_warp_go = [&](int i) {
      if constexpr (LATE)
        if (i == 0) named_bar_arrive1((NW + 1) * 32);
    };

    if constexpr (LOOP == 0) {
      for (int i = 0; i < KGW; i += UG) {
        if (i > 0) load_zbatch<UG, R>(z, wp, rstride, i);
#pragma unroll
        for (int u = 0; u < UG; u++) {
          uint4 xa[NB], xb[NB];
#pragma unroll
          for (int nb = 0; nb < NB; nb++) {
            xa[nb] = ld_x(xr[nb] + (i + u) * 64);
            xb[nb] = ld_x(xr[nb] + (i + u) * 64 + 32);
          }
          TR_ARRIVED(i == 0 && u == 0, z[0][0][0].x, xa[0].x)
#pragma unroll
          for (int r = 0; r < R; r++) mma_zgroup<NB>(acc[r], z[u][r], xa, xb, B[r]);
        }
        let_exception_warp_go(i);
      }
    } else {
      constexpr bool XAHEAD = LOOP == 2;
      // x of trip i's groups: xa = k 0..31, xb = k 32..63 of each
      auto load_x = [&](uint4 (&xa_)[UG][NB], uint4 (&xb_)[UG][NB], int i) {
        load_xbatch<UG, NB, 64>(xa_, xr, i);
        load_xbatch<UG, NB, 64>(xb_, xr, i, 32);
      };
      uint4 xa[UG][NB], xb[UG][NB];
      if constexpr (XAHEAD) load_x(xa, xb, 0);
      for (int i = 0; i < KGW; i += UG) {
        if constexpr (!XAHEAD) load_x(xa, xb, i);
        uint4 nz[UG][R][3], nxa[UG][NB], nxb[UG][NB];
        if (i + UG < KGW) {
          load_zbatch<UG, R>(nz, wp, rstride, i + UG);
          if constexpr (XAHEAD) load_x(nxa, nxb, i + UG);
        }
        TR_ARRIVED(i == 0, z[0][0][0].x, xa[0][0].x)
#pragma unroll
        for (int u = 0; u < UG; u++)
#pragma unroll
          for (int r = 0; r < R; r++) mma_zgroup<NB>(acc[r], z[u][r], xa[u], xb[u], B[r]);
        let_exception_warp_go(i);
#pragma unroll
        for (int u = 0; u < UG; u++)
#pragma unroll
          for (int r = 0; r < R; r++) { z[u][r][0] = nz[u][r][0]; z[u][r][1] = nz[u][r][1]; z[u][r][2] = nz[u][r][2]; }
        if constexpr (XAHEAD) {
#pragma unroll
          for (int u = 0; u < UG; u++)
#pragma unroll
            for (int nb = 0; nb < NB; nb++) { xa[u][nb] = nxa[u][nb]; xb[u][nb] = nxb[u][nb]; }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int nb = 0; nb < NB; nb++)
        red[warp][(r * NB + nb) * 32 + lane] = make_float4(acc[r][nb][0], acc[r][nb][1], acc[r][nb][2], acc[r][nb][3]);
    TR_C(2)
  }
  __syncthreads();  // red and ecorr are both complete after this one barrier
  TR_C(3)
  TR_EXC_READ

  float4 res[J];  // threads of the exception warp (tid >= NT) hold no position
  sum_warps<NW, P, NT, J>(res, red);
  add_ecorr<NB, J, P, NT>(res, ecorr);
  combine_store<false, true, NB, R, J, P, NT>(res, tr_, out, cbuf, ws, sem, rg, sidx, S, cl, M, N);
}

// ---- unpackz_kernel: decode the whole 12-bit stream back to bf16 [N, K] ---------------------------
// prepare() runs it on every layer it compresses and compares with the weight, bit for bit, so the
// decoder that runs in gemvz_kernel (decz) is checked on the GPU itself. One thread per (rb, G, lane).
__global__ void unpackz_kernel(const uint4* __restrict__ w, const uint8_t* __restrict__ zbase,
                               uint16_t* __restrict__ out, int N, int K) {
  const int KG = K / 64;
  const size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (id >= (size_t)(N / 16) * KG * 32) return;
  const int lane = (int)(id & 31), g = lane >> 2, t = lane & 3;
  const size_t blk = id >> 5;
  const int rb = (int)(blk / KG), G = (int)(blk % KG);
  const uint4* p = w + blk * 96 + lane;
  const uint4 A0 = p[0], A1 = p[32], C = p[64];
  const uint32_t B = zrow_word(zbase, rb * 16, g);
  const uint4 f[4] = {decz(A0.x, A0.y, C.x, B), decz(A0.z, A0.w, C.y, B),
                      decz(A1.x, A1.y, C.z, B), decz(A1.z, A1.w, C.w, B)};
#pragma unroll
  for (int fi = 0; fi < 4; fi++) {
    const uint32_t regs[4] = {f[fi].x, f[fi].y, f[fi].z, f[fi].w};
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const int row = rb * 16 + g + 8 * ((j >> 1) & 1);
      const int k = G * 64 + 32 * (fi >> 1) + 8 * t + 4 * (fi & 1) + 2 * (j >> 2) + (j & 1);
      out[(size_t)row * K + k] = (uint16_t)(regs[j >> 1] >> (16 * (j & 1)));
    }
  }
}
