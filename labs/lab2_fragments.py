"""Lab 2: m16n8k16 fragments and the plain GEMV's loads, emulated lane by lane (numpy only, CPU).

    python labs/lab2_fragments.py

Part 1 prints who owns which element of the A (16x16 bf16, row), B (16x8, col) and C (16x8 f32) tiles of
mma.sync.m16n8k16 and checks an mma assembled from the 32 lanes' fragments against numpy matmul.
Part 2 mirrors submission.py's pack_plain, load_wbatch / ld_stream, ld_x, mma16816, the warp reduction,
the split-K sum and store_tile: packs W lane by lane from the ownership map, reads it back through
emulated warp loads, and runs gemv_kernel's loops to show y == x @ W.T.
Independent oracle: this file shares no code with submission.py (tests compare the two packers).
"""
import sys

import numpy as np

from labkit import check, nb_of


# %% Motivation ------------------------------------------------------------------------------------
# One mma16816 multiplies a 16x16 A tile by a 16x8 B tile, but no lane sees a tile: each of the 32
# lanes holds 8 A values, 4 B values and 4 C values. The plain GEMV puts 16 weight rows in A and up to
# 8 tokens in B ("swap A and B"), so a lane's 8 weights must arrive as ONE 16-byte load. pack_plain
# reorders W so that they do, and relabels k so that the lane's x values for both mma steps of a 32-wide
# K block are ONE 16-byte load too. This lab rebuilds both from the PTX ownership table alone.


# %% Layout: the ownership maps (PTX ISA, mma.m16n8k16 .bf16), lane = 4g + t --------------------------
def a_owner(lane, j):
    """A element j (a0..a7; a_{2r}, a_{2r+1} are the halves of 32-bit register r) -> (row, mma k)."""
    g, t = lane >> 2, lane & 3
    reg, e = j >> 1, j & 1
    return g + 8 * (reg & 1), 2 * t + e + 8 * (reg >> 1)


def b_owner(lane, i):
    """B element i (b0..b3; b0, b1 in register 0, b2, b3 in register 1) -> (mma k, n)."""
    g, t = lane >> 2, lane & 3
    return 2 * t + (i & 1) + 8 * (i >> 1), g


def c_owner(lane, i):
    """C/D element i (c0..c3, f32) -> (row, n)."""
    g, t = lane >> 2, lane & 3
    return g + 8 * (i >> 1), 2 * t + (i & 1)


LANES = np.arange(32)
A_ROW, A_K = (np.array([[a_owner(l, j)[c] for j in range(8)] for l in range(32)]) for c in (0, 1))
B_K, B_N = (np.array([[b_owner(l, i)[c] for i in range(4)] for l in range(32)]) for c in (0, 1))
C_ROW, C_N = (np.array([[c_owner(l, i)[c] for i in range(4)] for l in range(32)]) for c in (0, 1))


def k_phys(mk, s):
    """The K relabelling: mma k (0..15) of step s (0, 1) of a 32-wide K block -> physical k in the block.
    mma k = 2t + 8p + e (t, p, e of the lane that owns it in A and in B) -> 8t + 4s + 2p + e."""
    t, p, e = (mk & 7) >> 1, mk >> 3, mk & 1
    return 8 * t + 4 * s + 2 * p + e


def print_map(title, rows, cols, owner, count):
    grid = [["" for _ in range(cols)] for _ in range(rows)]
    for lane in range(32):
        for i in range(count):
            r, c = owner(lane, i)
            grid[r][c] = f"{lane}.{i}"
    print(f"{title}  (entry = lane.element)")
    print("      " + "".join(f"{c:>6}" for c in range(cols)))
    for r in range(rows):
        print(f"  {r:>3} " + "".join(f"{v:>6}" for v in grid[r]))


# %% Emulation: one warp-wide mma from per-lane fragments --------------------------------------------
def mma16816(d, a, b0, b1):
    """D = A.B + C for a whole warp. d: [32, 4] C fragments; a: [32, 8] A fragments (a0..a7);
    b0, b1: [32, 2] the two B registers (b0 b1 | b2 b3). Assembles the tiles from the ownership maps,
    multiplies in float64 and hands back every lane's D fragment [32, 4]."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    C = np.zeros((16, 8))
    A[A_ROW, A_K] = a
    B[B_K, B_N] = np.concatenate([b0, b1], axis=1)
    C[C_ROW, C_N] = d
    return (A @ B + C)[C_ROW, C_N]


# %% bf16 helpers (weights and x travel as uint16 bit patterns, as on the GPU) ------------------------
def bf16_to_f64(u16):
    return (np.asarray(u16, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def f64_to_bf16(f):
    """Values -> float32 -> bf16 bits, round to nearest even (finite inputs; exact for the small integers used here)."""
    u = np.asarray(f, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def as_values(arr):
    """uint16 arrays are bf16 bit patterns; anything else is taken by value."""
    arr = np.asarray(arr)
    return bf16_to_f64(arr) if arr.dtype == np.uint16 else arr.astype(np.float64)


# %% Layout: pack_plain, lane by lane from the ownership map ------------------------------------------
def pack_plain_np(W):
    """W [N, K] (any dtype) -> [N/16, K/32, 64, 8] in fragment order, same dtype.
    Unit s*32 + lane of (rb, kb) holds lane's A fragment for mma step s of K block kb:
    element j sits at A (row, mma k) = a_owner(lane, j), i.e. W[16rb + row][32kb + k_phys(mma k, s)]."""
    W = np.asarray(W)
    N, K = W.shape
    if N % 16 or K % 32:
        raise ValueError(f"pack_plain_np needs N % 16 == 0 and K % 32 == 0, got N={N}, K={K}")
    RB, KB = N // 16, K // 32
    W4 = W.reshape(RB, 16, KB, 32)                      # [rb, row in block, kb, k in block]
    out = np.empty((RB, KB, 64, 8), W.dtype)
    for s in range(2):
        for lane in range(32):
            for j in range(8):
                row, mk = a_owner(lane, j)
                out[:, :, s * 32 + lane, j] = W4[:, row, :, k_phys(mk, s)]
    return out


def ld_stream(units, ptr):
    """One warp-wide 16-byte load: lane l reads unit ptr[l] (8 bf16 values)."""
    return units[ptr]


def unpack_plain_np(packed, N, K):
    """Recover W [N, K] from pack_plain's layout by emulating the warp loads of every (rb, kb):
    unit s*32 + lane is lane's A fragment of step s; scatter its 8 values back to (row, k)."""
    packed = np.asarray(packed)
    RB, KB = N // 16, K // 32
    units = packed.reshape(-1, 8)
    W = np.zeros((N, K), packed.dtype)
    for rb in range(RB):
        for kb in range(KB):
            for s in range(2):
                frag = ld_stream(units, (rb * KB + kb) * 64 + s * 32 + LANES)    # [32 lanes, 8]
                for lane in range(32):
                    for j in range(8):
                        row, mk = a_owner(lane, j)
                        W[16 * rb + row, 32 * kb + k_phys(mk, s)] = frag[lane, j]
    return W


# %% Emulation: gemv_kernel's loops ------------------------------------------------------------------
def ld_x(xflat, ptr):
    """16 bytes of x per lane: 8 consecutive bf16 from element offset ptr[l]."""
    return xflat[ptr[:, None] + np.arange(8)]


def load_wbatch(units, units2, wp, i, U):
    """U K blocks x 2 steps for hi (and lo when units2 is given), as load_wbatch<U, NH>."""
    halves = [units] if units2 is None else [units, units2]
    return [[[ld_stream(h, wp + (i + u) * 64), ld_stream(h, wp + (i + u) * 64 + 32)] for u in range(U)]
            for h in halves]


def store_tile(y, r, rb, M, N):
    """Thread tid < NB*32 holds lane tid & 31's C fragment of token block tid >> 5."""
    for tid in range(r.shape[0]):
        lane, nb = tid & 31, tid >> 5
        g, t = lane >> 2, lane & 3
        for q in range(4):
            tok, row = nb * 8 + 2 * t + (q & 1), rb * 16 + g + ((q >> 1) << 3)
            if tok < M:
                y[tok, row] = r[tid, q]


def gemv_emulate(packed, x, N, K, nw, s, u, packed_lo=None, r=1):
    """y [m, N] (float64) = x @ W.T the way gemv_kernel<NW=nw, U=u, NB, R=r, DUAL=packed_lo is not None> with
    S = s computes it: grid (N/(16R), S), NW warps per CTA, each streaming its K blocks for all R row blocks of
    the CTA's group, U K blocks per loop trip, one 16-byte x load per lane per block feeding both mma steps
    of all R row blocks, warp reduction, split-K sum in order s = 0..S-1.
    packed (and packed_lo): pack_plain layout; uint16 means bf16 bits. x: [m, K] (uint16 = bf16 bits)."""
    x = np.asarray(x)
    M = x.shape[0]
    NB, NW, S, U, R = nb_of(M), nw, s, u, r
    KB = K // 32
    if N % (16 * R) or KB % (S * NW * U) or M > 32:
        raise ValueError(f"config NW={NW} S={S} U={U} R={R} does not fit N={N}, K={K}, m={M}")
    KBS, KBW = KB // S, KB // S // NW
    units = as_values(packed).reshape(-1, 8)
    units2 = None if packed_lo is None else as_values(packed_lo).reshape(-1, 8)
    xflat = as_values(x).reshape(-1)
    g, t = LANES >> 2, LANES & 3
    y = np.full((M, N), np.nan)
    for rg in range(N // (16 * R)):                             # blockIdx.x: a group of R row blocks
        ws = np.zeros((S, R, NB * 32, 4))
        for sidx in range(S):                                   # blockIdx.y
            red = np.zeros((NW, R, NB * 32, 4))
            for warp in range(NW):
                kb0 = sidx * KBS + warp * KBW
                wps = [((rg * R + rr) * KB + kb0) * 64 + LANES for rr in range(R)]   # per-lane unit pointers
                xr = [np.minimum(nb * 8 + g, M - 1) * K + kb0 * 32 + t * 8 for nb in range(NB)]
                acc = np.zeros((2, R, NB, 32, 4))   # DUAL, NB = 1: hi into acc[0], lo into acc[1]
                for i in range(0, KBW, U):
                    a = [load_wbatch(units, units2, wp, i, U) for wp in wps]
                    for uu in range(U):
                        for nb in range(NB):
                            xv = ld_x(xflat, xr[nb] + (i + uu) * 32)            # once, for all R blocks
                            for rr in range(R):
                                for h in range(len(a[rr])):
                                    ha = h if NB == 1 else 0
                                    acc[ha, rr, nb] = mma16816(acc[ha, rr, nb], a[rr][h][uu][0], xv[:, 0:2], xv[:, 2:4])
                                    acc[ha, rr, nb] = mma16816(acc[ha, rr, nb], a[rr][h][uu][1], xv[:, 4:6], xv[:, 6:8])
                for rr in range(R):
                    for nb in range(NB):                        # hi + lo once, before the warp reduction
                        red[warp, rr, nb * 32:(nb + 1) * 32] = acc[0, rr, nb] + acc[1, rr, nb]
            res = np.zeros((R, NB * 32, 4))                     # the positions p = (r*NB + nb)*32 + lane
            for wi in range(NW):
                res += red[wi]
            ws[sidx] = res
        if S == 1:
            res = ws[0]
        else:                                                   # splitk_combine: fixed order
            res = np.zeros((R, NB * 32, 4))
            for sidx in range(S):
                res += ws[sidx]
        for rr in range(R):
            store_tile(y, res[rr], rg * R + rr, M, N)
    return y


# %% Check ---------------------------------------------------------------------------------------------
def part1(rng):
    print("# Part 1: mma.m16n8k16 ownership maps (lane = 4g + t, g = lane >> 2, t = lane & 3)")
    print_map("A 16x16 bf16 (row-major), rows x mma k", 16, 16, a_owner, 8)
    print_map("B 16x8 bf16 (col-major), mma k x token n", 16, 8, b_owner, 4)
    print_map("C 16x8 f32, rows x token n", 16, 8, c_owner, 4)
    for name, rr, cc, shape in (("A", A_ROW, A_K, (16, 16)), ("B", B_K, B_N, (16, 8)), ("C", C_ROW, C_N, (16, 8))):
        seen = np.zeros(shape, int)
        np.add.at(seen, (rr, cc), 1)
        check(bool((seen == 1).all()), f"every element of {name} {shape[0]}x{shape[1]} has exactly one owner")
    for trial in range(3):
        A = rng.integers(-8, 9, (16, 16)).astype(np.float64)
        B = rng.integers(-8, 9, (16, 8)).astype(np.float64)
        C = rng.integers(-50, 51, (16, 8)).astype(np.float64)
        breg = B[B_K, B_N]
        d = mma16816(C[C_ROW, C_N], A[A_ROW, A_K], breg[:, 0:2], breg[:, 2:4])
        D = np.zeros((16, 8))
        D[C_ROW, C_N] = d
        check(np.array_equal(D, A @ B + C), f"emulated mma from 32 lanes' fragments == A @ B + C (trial {trial})")


def part2(rng):
    print("\n# Part 2: pack_plain's fragment order, emulated warp loads, gemv_kernel's loops")
    N, K = 48, 512
    W = rng.integers(-65536, 65536, (N, K)).astype(np.uint16)            # any bit pattern: a pure permutation
    P = pack_plain_np(W)
    check(P.shape == (N // 16, K // 32, 64, 8) and P.dtype == np.uint16, f"pack_plain_np shape {P.shape}, dtype uint16")
    check(np.array_equal(unpack_plain_np(P, N, K), W), f"unpack_plain_np(pack_plain_np(W)) == W bit for bit, W {N}x{K}")
    # spot-check the docstring formula packed[rb][kb][s*32+lane][4p+2h+e] = W[16rb+g+8h][32kb+8t+4s+2p+e]
    ok = True
    for _ in range(2000):
        rb, kb, s, lane, p, h, e = (int(rng.integers(n)) for n in (N // 16, K // 32, 2, 32, 2, 2, 2))
        g, t = lane >> 2, lane & 3
        ok &= P[rb, kb, s * 32 + lane, 4 * p + 2 * h + e] == W[16 * rb + g + 8 * h, 32 * kb + 8 * t + 4 * s + 2 * p + e]
    check(bool(ok), "packed[rb][kb][s*32+lane][4p+2h+e] == W[16rb+g+8h][32kb+8t+4s+2p+e] (2000 random spots)")
    # each warp load of 32 lanes is 512 contiguous bytes; the lane's x load covers k 8t..8t+7 of the block,
    # exactly the physical k of its B registers in both steps
    ptr = (1 * (K // 32) + 3) * 64 + LANES
    check(bool((np.diff(ptr) == 1).all()), "ld_stream: lanes 0..31 read 32 consecutive 16-byte units (512 B)")
    ks = {lane: sorted(k_phys(b_owner(lane, i)[0], s) for s in range(2) for i in range(4)) for lane in range(32)}
    check(all(ks[l] == list(range(8 * (l & 3), 8 * (l & 3) + 8)) for l in range(32)),
          "B registers of steps 0 and 1 = x[tok][32kb + 8t .. 8t+7]: one 16-byte ld_x per lane per block")

    # the GEMV on small integers: float64 is exact, so equality is exact
    Wi = f64_to_bf16(rng.integers(-4, 5, (N, K)))
    Pi = pack_plain_np(Wi)
    for (m, nw, s, u, r) in ((1, 2, 2, 2, 1), (3, 4, 1, 4, 1), (13, 2, 4, 2, 1), (32, 4, 2, 2, 1), (31, 8, 1, 2, 1),
                             (8, 4, 2, 1, 3), (32, 2, 1, 2, 3)):
        x = f64_to_bf16(rng.integers(-3, 4, (m, K)))
        y = gemv_emulate(Pi, x, N, K, nw, s, u, r=r)
        ref = bf16_to_f64(x) @ bf16_to_f64(Wi).T
        check(np.array_equal(y, ref), f"gemv_emulate m={m} NW={nw} S={s} U={u} R={r} NB={nb_of(m)}: y == x @ W.T "
                                      f"exactly (integer weights, grid {N // (16 * r)}x{s})")
    # random bf16 weights, float64 x: the same sum in another order, so equal up to float64 rounding
    Wr = f64_to_bf16(rng.standard_normal((N, K)) * 0.02)
    x = rng.standard_normal((5, K))
    y = gemv_emulate(pack_plain_np(Wr), x, N, K, 4, 2, 2)
    ref = x @ bf16_to_f64(Wr).T
    scale = np.abs(x) @ np.abs(bf16_to_f64(Wr)).T
    rel = float(np.max(np.abs(y - ref) / scale))
    check(rel < 1e-12, f"gemv_emulate, random bf16 W and float64 x: "
                       f"max |y - x @ W.T| / (|x| @ |W|.T) = {rel:.1e} < 1e-12")
    # the router's DUAL path: hi and lo halves into their own accumulators, summed before the warp reduction
    hi = f64_to_bf16(rng.integers(-4, 5, (N, K)))
    lo = f64_to_bf16(rng.integers(-4, 5, (N, K)) / 256.0)
    x = f64_to_bf16(rng.integers(-3, 4, (2, K)))
    y = gemv_emulate(pack_plain_np(hi), x, N, K, 4, 2, 2, packed_lo=pack_plain_np(lo))
    ref = bf16_to_f64(x) @ (bf16_to_f64(hi) + bf16_to_f64(lo)).T
    check(np.array_equal(y, ref), "DUAL (router): x.hi + x.lo (separate accumulators, summed once) == x @ (hi + lo).T exactly")


def main():
    rng = np.random.default_rng(2)
    part1(rng)
    part2(rng)
    print("lab2: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
