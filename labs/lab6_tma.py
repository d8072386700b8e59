"""Lab 6: gemvt_kernel (GemvtConfig), its shared-memory images byte by byte, and the kernel in miniature (numpy, CPU).

    python labs/lab6_tma.py

Part 1 mirrors pack_tma (tiles of 64 rows x 64 k, the 16-byte chunks of row r XORed with r & 7) and the hardware's
128-byte swizzle. A tile's bytes, bulk-copied verbatim to a 1024-byte aligned address, read back through wgmma's
K-major descriptor (wg_desc; k16 step j starts 32 j bytes in) give W for every row, step and k.
Part 2 emulates the TMA box of x (64 k x 8 NB tokens, the same swizzle, rows past M filled with zeros).
Part 3 runs gemvt_kernel's loops: the uneven split-K, the stage image (per warpgroup KA tiles, then KA x boxes),
4 KA wgmma per stage and warpgroup with fp32 accumulators, the split-K sum in the order 0..S-1, bf16 rounding.
It checks the result against a float64 reference with the SPEC tolerance (judge.check_close's rule).
Its configs are GemvtConfig's fields: gemvt_emulate takes nw, ka and s; st (the ring's stages) decides only when a
slot is refilled, not what a stage holds, so the emulation builds one stage image per step.
Independent oracle: this file shares no code with submission.py (tests/test_lab6.py compares the packer).
The compressed ring kernel's part (gemvtz_kernel) was removed with the kernel: git show 116d358:labs/lab6_tma.py.
"""
import sys

import numpy as np

from labkit import check, nb_of


# %% Motivation ------------------------------------------------------------------------------------
# gemvt_kernel feeds the tensor cores from shared memory: a producer warp copies weights and x in, and wgmma
# reads both through descriptors. wgmma wants K-major operands in the 128-byte swizzle, which spreads the 8 rows
# of a 1024-byte group over all 32 banks. x gets there through a TMA box that swizzles while it copies. The
# weights come through a plain bulk copy, which copies bytes verbatim, so pack_tma stores each tile already
# swizzled. This lab checks that the two halves fit: the tile pack_tma wrote, read through the descriptor, is W.

TILE = 64 * 128     # one 64-row x 64-k bf16 tile, 8 KB


# %% Layout: pack_tma and the 128-byte swizzle -----------------------------------------------------------
def pack_tma_np(w, xor=True):
    """W [N, K] bf16 bits -> [N/64, K/64, 64, 64] with
        packed[rt][kt][r][8 (c ^ (r & 7)) + i] = W[64 rt + r][64 kt + 8 c + i],
    written as the scatter the formula states (pack_tma gathers). xor=False gives plain tiles, the negative case."""
    w = np.asarray(w)
    N, K = w.shape
    if N % 64 or K % 64:
        raise ValueError(f"pack_tma_np needs N % 64 == 0 and K % 64 == 0, got N={N}, K={K}")
    v = w.reshape(N // 64, 64, K // 64, 8, 8).transpose(0, 2, 1, 3, 4)      # rt, kt, r, c, i
    r, c = np.arange(64)[:, None], np.arange(8)[None, :]
    out = np.empty_like(v)
    out[:, :, r, c ^ (r & 7) if xor else c] = v
    return out.reshape(N // 64, K // 64, 64, 64)


def swizzle128(o):
    """The 128-byte swizzle of a shared-memory address: bits 4-6 (the 16-byte chunk in a 128-byte row) XOR bits 7-9
    (the row in a 1024-byte group). Addresses are offsets from a 1024-byte aligned base, as the kernel's ring is."""
    o = np.asarray(o)
    return o ^ (((o >> 7) & 7) << 4)


def no_swizzle(o):
    """The wrong rule, for the negative checks: addresses used as they are."""
    return np.asarray(o)


def as_bytes(u16):
    """bf16 bits as the little-endian bytes the GPU stores."""
    return np.ascontiguousarray(u16, dtype="<u2").reshape(-1).view(np.uint8)


# %% Emulation: the copies and the descriptor read ------------------------------------------------------
def bulk_load(smem, dst, src):
    """cp.async.bulk: contiguous bytes, verbatim, to smem[dst:]."""
    smem[dst:dst + src.size] = src


def tma_load_2d(smem, dst, x, c0, c1, box_rows):
    """cp.async.bulk.tensor.2d with SWIZZLE_128B: the box of 64 k x box_rows rows at (k = c0, row = c1) of x [M, K]
    (bf16 bits). Logical byte o of the box (row o // 128, byte o % 128) goes to dst + swizzle128(o); rows past M
    read as zeros (the descriptor's bounds, FLOAT_OOB_FILL_NONE)."""
    M = x.shape[0]
    box = np.zeros((box_rows, 64), np.uint16)
    rows = min(box_rows, max(M - c1, 0))
    box[:rows] = x[c1:c1 + rows, c0:c0 + 64]
    smem[swizzle128(dst + np.arange(box_rows * 128))] = as_bytes(box)


def wg_desc(saddr):
    """The shared-memory matrix descriptor of gemvt_kernel: start address >> 4, LBO 1 (unused), SBO 64 (1024 B
    between 8-row groups), bits 62-63 = 1: the 128-byte swizzle."""
    return ((saddr >> 4) & 0x3FFF) | (1 << 16) | (64 << 32) | (1 << 62)


def desc_read(smem, desc, rows, swizzle=swizzle128):
    """The [rows, 16] bf16 slice one wgmma reads through a K-major descriptor: element (r, kk) is at logical address
    start + (r >> 3) SBO + (r & 7) 128 + 2 kk, and the swizzle maps that address to the byte it reads."""
    start, sbo, mode = (desc & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4, desc >> 62
    if mode != 1:
        raise ValueError(f"descriptor 0x{desc:016x}: layout type {mode}, not the 128-byte swizzle")
    r, kk = np.arange(rows)[:, None], np.arange(16)[None, :]
    p = swizzle(start + (r >> 3) * sbo + (r & 7) * 128 + 2 * kk)
    return smem[p].astype(np.uint16) | (smem[p + 1].astype(np.uint16) << 8)


def read_tile(tile_bytes, swizzle=swizzle128):
    """A 64 x 64 tile as the four k16 steps of wgmma see it, from the tile's bytes at a 1024-aligned address."""
    return np.concatenate([desc_read(tile_bytes, wg_desc(32 * j), 64, swizzle) for j in range(4)], axis=1)


# %% bf16 helpers ----------------------------------------------------------------------------------------
def bf16_to_f32(u16):
    return (np.asarray(u16, np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_rne(f32):
    """float32 -> bf16 bits, round to nearest even (store_tile's __float2bfloat16); NaN stays a quiet NaN."""
    f32 = np.asarray(f32, np.float32)
    u = f32.view(np.uint32).astype(np.uint64)
    out = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f32), np.uint16(0x7FC0), out)


def check_close_np(out_bits, ref):
    """judge.check_close for a bf16 output [M, N] against the float64 reference: NaN where the rounded reference is
    NaN, Inf where it is Inf, else |out - ref| <= 2**-7 |ref| + 2**-10 max_n |ref[m, n]| (finite ref of the row).
    Returns (ok, worst |out - ref| / tol)."""
    o = bf16_to_f32(out_bits).astype(np.float64)
    exp = bf16_to_f32(bf16_rne(ref.astype(np.float32))).astype(np.float64)
    if not np.array_equal(np.isnan(o), np.isnan(exp)):
        return False, np.inf
    inf = np.isinf(exp)
    if (o[inf] != exp[inf]).any():
        return False, np.inf
    fin = np.isfinite(exp) & ~np.isnan(ref)
    if (fin & ~np.isfinite(o)).any():
        return False, np.inf
    r = np.where(fin, ref, 0.0)
    d = np.where(fin, o - ref, 0.0)
    tol = 2.0 ** -7 * np.abs(r) + 2.0 ** -10 * np.abs(r).max(axis=1, keepdims=True)
    worst = float((np.abs(d) / np.maximum(tol, 1e-300)).max()) if d.size else 0.0
    return bool((np.abs(d) <= tol).all()), worst


# %% Emulation: gemvt_kernel's loops ---------------------------------------------------------------------
def split_steps(T, S, sidx):
    """CTA sidx's K slice in whole steps, any S <= T: steps [sidx T / S, (sidx + 1) T / S), floors."""
    s0 = sidx * T // S
    return s0, (sidx + 1) * T // S - s0


def stage_bytes(nw, nb, ka):
    """One ring stage: KA atoms of 16 NW weight rows and 8 NB tokens, 128 B each (gemvt_smem's per-stage term)."""
    return ka * (16 * nw + 8 * nb) * 128


def wgmma(d, a, b):
    """wgmma.m64n(8NB)k16 with fp32 accumulators: D [64, NT] += A [64, 16] . B [NT, 16]^T (bf16 bits).
    Products and sums in float32; the tensor core's order within one instruction is not modelled."""
    return (d + bf16_to_f32(a) @ bf16_to_f32(b).T).astype(np.float32)


def gemvt_emulate(packed, x, N, K, nw, ka, s):
    """y [M, N] bf16 bits as gemvt_kernel<NW=nw, KA=ka> with S = s computes it: grid (N / (16 NW), S); CTA (rg, sidx)
    streams its steps through a stage image (warpgroup g's KA tiles at g KA TILE, then the KA x boxes; the image
    starts as 0xFF bytes, a NaN, so a byte no copy wrote would show), each warpgroup runs 4 KA wgmma on it; the
    partials [16 NW rows, NT] go through the split-K sum in the order 0..S-1 (fp32), then to bf16.
    packed: pack_tma's tiles [N/64, K/64, 64, 64] (bf16 bits); x: [M, K] bf16 bits, M <= 32."""
    x = np.asarray(x, np.uint16)
    M = x.shape[0]
    NW, KA, S, NB = nw, ka, s, nb_of(M)
    if NW % 4 or N % (16 * NW) or K % (64 * KA) or not 1 <= S <= K // (64 * KA) or M > 32:
        raise ValueError(f"config NW={NW} KA={KA} S={S} does not fit N={N}, K={K}, M={M}")
    T = K // (64 * KA)
    NWG, NT, KT = NW // 4, 8 * NB, K // 64
    WB, XB, STAGE = 16 * NW * 128, 8 * NB * 128, stage_bytes(NW, NB, KA)
    wt = as_bytes(packed)
    y = np.full((M, N), 0x7FC0, np.uint16)
    for rg in range(N // (16 * NW)):                            # blockIdx.x
        ws = np.zeros((S, 16 * NW, NT), np.float32)
        for sidx in range(S):                                   # blockIdx.y
            s0, steps = split_steps(T, S, sidx)
            atom0 = s0 * KA
            acc = np.zeros((NWG, 64, NT), np.float32)
            for i in range(steps):
                smem = np.full(STAGE, 0xFF, np.uint8)           # producer: one stage (its ring slot is 1024-aligned)
                for g in range(NWG):
                    src = ((rg * NWG + g) * KT + atom0 + i * KA) * TILE
                    bulk_load(smem, g * KA * TILE, wt[src:src + KA * TILE])
                for a in range(KA):
                    tma_load_2d(smem, KA * WB + a * XB, x, (atom0 + i * KA + a) * 64, 0, NT)
                for g in range(NWG):                            # consumers: warpgroup g, warps 4g..4g+3
                    for a in range(KA):
                        for j in range(4):
                            A = desc_read(smem, wg_desc(g * KA * TILE + a * TILE + 32 * j), 64)
                            B = desc_read(smem, wg_desc(KA * WB + a * XB + 32 * j), NT)
                            acc[g] = wgmma(acc[g], A, B)
            ws[sidx] = acc.reshape(16 * NW, NT)                 # warp w's D = rows 16 w .. 16 w + 15
        res = np.zeros((16 * NW, NT), np.float32)
        for sidx in range(S):                                   # the split-K combine: fixed order
            res = (res + ws[sidx]).astype(np.float32)
        y[:, rg * 16 * NW:(rg + 1) * 16 * NW] = bf16_rne(res[:, :M].T)
    return y


# %% Check ---------------------------------------------------------------------------------------------
def random_bits(rng, shape):
    return rng.integers(0, 65536, shape).astype(np.uint16)


def bf16_normal(rng, shape, scale=1.0):
    return bf16_rne((rng.standard_normal(shape) * scale).astype(np.float32))


def part1(rng):
    print("# Part 1: pack_tma's tiles, the 128-byte swizzle and wgmma's descriptor read")
    print("  16-byte chunk c of row r (logical offset 128 r + 16 c) -> physical chunk:")
    for r in range(8):
        phys = [int(swizzle128(128 * r + 16 * c) - 128 * r) // 16 for c in range(8)]
        print(f"    row {r}: {phys}")
    check(all(int(swizzle128(1024 * q + o)) == 1024 * q + int(swizzle128(o)) for q in range(4) for o in range(1024)),
          "swizzle128 permutes each 1024-byte group within itself (rows 8q..8q+7 repeat rows 0..7's pattern)")
    d = wg_desc(32 * 3)
    print(f"  wg_desc(tile + 32*3) = 0x{d:016x}: start {(d & 0x3FFF) << 4} B, LBO {(d >> 16) & 0x3FFF}, "
          f"SBO {((d >> 32) & 0x3FFF) << 4} B, layout type {d >> 62} (128-byte swizzle)")
    N, K = 128, 256
    W = random_bits(rng, (N, K))                                # any bit pattern: a pure permutation
    P = pack_tma_np(W)
    check(P.shape == (N // 64, K // 64, 64, 64), f"pack_tma_np shape {P.shape}")
    ok = True
    for _ in range(2000):
        rt, kt, r, c, i = (int(rng.integers(n)) for n in (N // 64, K // 64, 64, 8, 8))
        ok &= P[rt, kt, r, 8 * (c ^ (r & 7)) + i] == W[64 * rt + r, 64 * kt + 8 * c + i]
    check(bool(ok), "packed[rt][kt][r][8(c ^ (r & 7)) + i] == W[64rt + r][64kt + 8c + i] (2000 random spots)")
    good = all(np.array_equal(read_tile(as_bytes(P[rt, kt])), W[64 * rt:64 * rt + 64, 64 * kt:64 * kt + 64])
               for rt in range(N // 64) for kt in range(K // 64))
    check(good, f"every tile of a {N}x{K} W, bulk-copied verbatim and read through wg_desc(tile + 32 j), j = 0..3, "
                f"== W bit for bit")
    plain = read_tile(as_bytes(pack_tma_np(W, xor=False)[0, 0]))
    unswz = read_tile(as_bytes(P[0, 0]), no_swizzle)
    bad_rows = lambda got: [int(r) for r in np.flatnonzero((got != W[:64, :64]).any(axis=1))]
    check(bad_rows(plain) == bad_rows(unswz) == [r for r in range(64) if r & 7],
          "negative: plain tiles read with the swizzle, or swizzled tiles read without it, are wrong in exactly "
          "the rows with r & 7 != 0")


def part2(rng):
    print("\n# Part 2: the TMA box of x (64 k x 8 NB tokens, 128-byte swizzle, zero fill past M)")
    K = 256
    for M in (1, 5, 16, 17, 32):
        x = random_bits(rng, (M, K))
        NT = 8 * nb_of(M)
        smem = np.full(NT * 128, 0xFF, np.uint8)
        tma_load_2d(smem, 0, x, 128, 0, NT)
        got = np.concatenate([desc_read(smem, wg_desc(32 * j), NT) for j in range(4)], axis=1)
        want = np.zeros((NT, 64), np.uint16)
        want[:M] = x[:, 128:192]
        fill = f"rows {M}..{NT - 1} zeros" if M < NT else "no fill"
        check(np.array_equal(got, want), f"M={M:2d}: box at k=128 of {NT} rows read through the descriptor == "
                                         f"x[:, 128:192], {fill}")


def part3(rng):
    print("\n# Part 3: gemvt_kernel in miniature (uneven split-K, stage images, wgmma, fp32 combine, bf16)")
    for T, S in ((16, 3), (16, 7), (5, 5), (9, 4)):
        parts = [split_steps(T, S, s) for s in range(S)]
        steps = [n for _, n in parts]
        covered = [s0 + i for s0, n in parts for i in range(n)]
        check(covered == list(range(T)) and max(steps) - min(steps) <= 1 and min(steps) >= 1,
              f"T={T:2d} steps, S={S}: slices {steps} cover every step once, sizes differ by at most one")
    N, K = 256, 1024
    W = bf16_normal(rng, (N, K), 0.02)
    P = pack_tma_np(W)
    for M, nw, ka, s in ((1, 4, 1, 1), (5, 8, 2, 3), (17, 4, 1, 7), (32, 8, 2, 8)):
        x = bf16_normal(rng, (M, K))
        ref = bf16_to_f32(x).astype(np.float64) @ bf16_to_f32(W).astype(np.float64).T
        ok, worst = check_close_np(gemvt_emulate(P, x, N, K, nw, ka, s), ref)
        print(f"  M={M:2d} NW={nw} KA={ka} S={s}: NB={nb_of(M)}, grid {N // (16 * nw)} x {s}, "
              f"stage {stage_bytes(nw, nb_of(M), ka)} B, worst |y - ref| / tol = {worst:.3f}")
        check(ok, f"gemvt_emulate M={M} NW={nw} KA={ka} S={s}: within the SPEC tolerance of x @ W.T")
    x = bf16_normal(rng, (5, K))
    ref = bf16_to_f32(x).astype(np.float64) @ bf16_to_f32(W).astype(np.float64).T
    ok, _ = check_close_np(gemvt_emulate(pack_tma_np(W, xor=False), x, N, K, 4, 1, 3), ref)
    check(not ok, "negative: tiles packed without the XOR fail the SPEC check")


def main():
    rng = np.random.default_rng(6)
    part1(rng)
    part2(rng)
    part3(rng)
    print("lab6: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
