"""Lab 6: PIPE 6 (gemvt_kernel), its shared-memory images byte by byte, and the kernel in miniature (numpy, CPU).

    python labs/lab6_tma.py

Part 1 mirrors pack_tma (tiles of 64 rows x 64 k, the 16-byte chunks of row r XORed with r & 7) and the hardware's
128-byte swizzle. A tile's bytes, bulk-copied verbatim to a 1024-byte aligned address, read back through wgmma's
K-major descriptor (wg_desc; k16 step j starts 32 j bytes in) give W for every row, step and k.
Part 2 emulates the TMA box of x (64 k x 8 NB tokens, the same swizzle, rows past M filled with zeros).
Part 3 runs gemvt_kernel's loops: the uneven split-K, the stage image (per warpgroup KA tiles, then KA x boxes),
4 KA wgmma per stage and warpgroup with fp32 accumulators, the split-K sum in the order 0..S-1, bf16 rounding.
It checks the result against a float64 reference with the SPEC tolerance (judge.check_close's rule).
Part 4 is the compressed PIPE 6 (gemvtz_kernel): pack_tz_np (lab3's 12-bit stream of W with each 64-group's columns
permuted so that decz's fragment f is wgmma's register A for k16 step f in x's natural order, the side table in
natural k, the per-lane patch lists, the stream in 6 KB tiles of 4 row blocks), and gemvtz_emulate: decz into
registers, each lane's exceptions patched into them (W's bf16 bits), the A tile those registers hold, wgmma against the
x box, split-K, bf16; bit for bit gemvt_emulate's result; a one-hot probe on an exception column.
Independent oracle: this file shares no code with submission.py (tests/test_lab6.py compares the packers). It uses
lab3's format (pack_z_np, frag_pos, decz, trained_like_np).
"""
import sys

import numpy as np

import lab3_compress as lab3
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


# %% Layout: pack_tz, the 12-bit stream in tiles for the compressed PIPE 6 ---------------------------------
# gemvtz_kernel keeps gemvt's ring (x through TMA boxes, weights through bulk copies) but the weights are lab3's
# 12-bit stream: a consumer warp loads its lane's A0, A1, B units from the stage, decodes 4 fragments with decz, and
# passes fragment f to wgmma as the register A of k16 step f, with B = the x box read through the descriptor in
# natural k. wgmma's register A is, per warp, mma.m16n8k16's A layout: element j of lane (g, t) is row
# g + 8 ((j >> 1) & 1), k 2 t + (j & 1) + 8 (j >> 2) of the step. lab3's stream keeps element j of fragment f at
# column frag_pos(lane, f, j) = 32 (f >> 1) + 8 t + 4 (f & 1) + 2 p + e (p = j >> 2, e = j & 1) of the group. So
# pack_tz compresses W[:, perm]: stream column c holds the natural k that wgmma's step reads from there.
# The exceptions decode to an in-window v, not W: the consumer warp patches them. The lane that holds element (row r
# of the warp's 16-row block, natural column kk of group a) writes W's bf16 bits over it before the wgmma, so the
# tensor cores see W itself. The patch table is one list per lane of each row block's warp, G ascending: each lane
# walks its own list, in the order it meets the groups.
TZ_TILE = 4 * 1536      # one compressed tile: 4 row blocks x (A0 | A1 | B: 32 lanes x 16 B each), 64 rows x 64 k


def wgmma_a_pos(lane, j):
    """(row, k) in a warp's 16 x 16 A of one k16 step for register element j of lane (g, t): the m16n8k16 A layout
    (register j >> 1, half j & 1)."""
    g, t = lane >> 2, lane & 3
    return g + 8 * ((j >> 1) & 1), 2 * t + (j & 1) + 8 * (j >> 2)


def tz_perm(K):
    """pack_tz's column order, int64 [K]: perm[c] is the natural k whose weight the stream holds at column c, inside
    each 64-group. Built from the two layouts: element j of lane's fragment f sits at lab3.frag_pos(lane, f, j) and
    wgmma's step f reads it as k 16 f + wgmma_a_pos(lane, j)[1] (the rows agree: part 4 checks it)."""
    perm = np.full(64, -1, np.int64)
    for lane in range(32):
        for f in range(4):
            for j in range(8):
                perm[lab3.frag_pos(lane, f, j)[1]] = 16 * f + wgmma_a_pos(lane, j)[1]
    return (np.arange(K // 64, dtype=np.int64)[:, None] * 64 + perm[None, :]).reshape(-1)


def patch_pos(r, kk):
    """Where the register A of a warp holds element (row r of its 16-row block, column kk of a 64-group):
    (fragment kk >> 4, lane 4 (r & 7) + (kk & 7) // 2, element j = 2 d + h with word d = (r >> 3) + 2 ((kk >> 3) & 1),
    half h = kk & 1): wgmma_a_pos's inverse inside k16 step kk >> 4 (part 4 checks it). Works on arrays too.
    A patch entry's low 5 bits are fragment << 3 | j (= f << 3 | d << 1 | h)."""
    return kk >> 4, ((r & 7) << 2) | ((kk & 7) >> 1), 2 * ((r >> 3) | (((kk >> 3) & 1) << 1)) + (kk & 1)


def patch_elem(lane, e):
    """A patch entry e = G << 5 | f << 3 | j of lane's list -> (row in the 16-row block, column in K): the element
    it overwrites, patch_pos's inverse (wgmma_a_pos's (row, k) in step f, plus 16 f + 64 G). Works on arrays too."""
    r, kk = wgmma_a_pos(lane, e & 7)
    return r, 64 * (e >> 5) + 16 * ((e >> 3) & 3) + kk


def patch_table_np(W, eptr, esc, n):
    """The exceptions as gemvtz_kernel's lanes patch them (submission.patch_table): element (row r of 16-row block b,
    column kk of 64-group G) is patched by lane L of block b's warp into fragment f, element j (patch_pos(r, kk)).
    Lane list b 32 + L is pesc[pptr[b 32 + L] .. pptr[b 32 + L + 1]) = int32 pairs {G << 5 | f << 3 | j, W's bf16
    bits}, ordered by (b 32 + L, G, f << 3 | j): G ascending, so each lane meets its entries in stage order.
    W: bf16 bits [N, K]; eptr / esc: its row CSR in natural k. Returns (pptr int32 [N/16 32 + 1],
    pesc int32 [max(n, 1), 2])."""
    W = np.asarray(W, np.uint16)
    N, K = W.shape
    KG = K // 64
    pptr = np.zeros(N // 16 * 32 + 1, np.int32)
    pesc = np.zeros((max(n, 1), 2), np.int32)
    rows = np.repeat(np.arange(N), np.diff(eptr))
    k = np.asarray(esc[:n, 0], np.int64)
    fi, ln, j = patch_pos(rows % 16, k % 64)
    lane = (rows // 16) * 32 + ln                                 # the lane list: row block b, lane L
    sel = fi << 3 | j
    order = np.argsort((lane * KG + k // 64) * 32 + sel, kind="stable")     # keys are unique: one entry per element
    pesc[:n, 0] = ((k // 64) << 5 | sel)[order]
    pesc[:n, 1] = W[rows, k][order]
    pptr[1:] = np.cumsum(np.bincount(lane, minlength=N // 16 * 32))
    return pptr, pesc


def tz_tiles(stream, N, K):
    """lab3's stream [N/16, K/64, 1536] -> tiles [N/64, K/64, TZ_TILE]: tile (rt, G) is row blocks 4 rt .. 4 rt + 3
    of group G one after the other (row block rb at rb 1536), so a warpgroup's groups of a step are one bulk copy."""
    return np.ascontiguousarray(stream.reshape(N // 64, 4, K // 64, 1536).transpose(0, 2, 1, 3)).reshape(
        N // 64, K // 64, TZ_TILE)


def pack_tz_np(W, kperm=True):
    """bf16 bits W [N, K] (N % 64 == 0, K % 64 == 0) -> pack_tz's format, as lab3's dict: lab3.pack_z_np of
    W[:, tz_perm(K)], the side table's k mapped back to the natural column (rows keep their CSR ranges, k ascending
    inside each), exc_cols in natural k, the stream regrouped into tiles [N/64, K/64, TZ_TILE]. kperm=False packs
    W's columns in their own order (the negative case: fragment f then holds the wrong k for wgmma's step f).
    Adds pptr, pesc: the patch table (patch_table_np) of W and the natural-k table."""
    W = np.asarray(W, np.uint16)
    N, K = W.shape
    if N % 64 or K % 64:
        raise ValueError(f"pack_tz_np needs N % 64 == 0 and K % 64 == 0, got N={N}, K={K}")
    perm = tz_perm(K) if kperm else np.arange(K, dtype=np.int64)
    z = lab3.pack_z_np(W[:, perm])
    n = z["n_exc"]
    esc = z["esc"].copy()
    rows = np.repeat(np.arange(N), np.diff(z["eptr"]))
    k = perm[esc[:n, 0]]
    order = np.lexsort((k, rows))                        # by row, then natural k
    esc[:n, 0], esc[:n, 1] = k[order], esc[:n, 1][order]
    pptr, pesc = patch_table_np(W, z["eptr"], esc, n)
    return dict(z, stream=tz_tiles(z["stream"], N, K), esc=esc, exc_cols=sorted(set(int(c) for c in k)), pptr=pptr,
                pesc=pesc)


# %% Emulation: gemvtz_kernel's loops --------------------------------------------------------------------
def ld_shared16(smem, off):
    """ld.shared.v4.u32: the 16 bytes at each offset of off, as [..., 4] little-endian words."""
    b = smem[np.asarray(off)[..., None] + np.arange(16)]
    return np.ascontiguousarray(b).view("<u4")


def rs_a_tiles(regs):
    """decz's registers (x, y, z, w), each [NW, 32] uint32 (consumer warp w, lane) -> the A operand of one k16 step
    per warpgroup, [NW / 4, 64, 16] bf16 bits: warp w's element j of lane at row 16 (w & 3) + wgmma_a_pos's row."""
    nw = regs[0].shape[0]
    A = np.zeros((nw, 16, 16), np.uint16)
    for lane in range(32):
        for j in range(8):
            row, k = wgmma_a_pos(lane, j)
            A[:, row, k] = (regs[j >> 1][:, lane] >> np.uint32(16 * (j & 1))) & np.uint32(0xFFFF)
    return A.reshape(nw // 4, 64, 16)


def gemvtz_emulate(tiles, pptr, pesc, TL, TH, x, N, K, nw, ka, s, patches=True):
    """y [M, N] bf16 bits as gemvtz_kernel<NW=nw, KA=ka> with S = s computes it: grid (N / (16 NW), S); CTA (rg, sidx)
    takes steps [sidx T / S, (sidx + 1) T / S) of T = K / (64 KA) and streams them through a stage image (x's KA
    boxes at a XB, then warpgroup g's KA tiles at KA XB + g KA TZ_TILE; the image starts as 0xFF). Per step and group
    a, consumer warp w (warpgroup w >> 2, row block w & 3 of the tile) loads its lane's A0, A1, B (16 B each at
    rb 1536 + 0 / 512 / 1024 + 16 lane) and decodes f0 = decz(A0.x, A0.y, B.x), f1 = decz(A0.z, A0.w, B.y),
    f2 = decz(A1.x, A1.y, B.z), f3 = decz(A1.z, A1.w, B.w). Then each lane patches the step from its own list
    pesc[pptr[rb 32 + lane] .. pptr[rb 32 + lane + 1]) (rb = rg NW + w; once per CTA it skips the entries with
    G < g0, the groups before its slice): while its next entry {e = G << 5 | f << 3 | d << 1 | h, bits} has
    G - gs < KA (gs: the step's first group), the lane writes bits into half h of word (e >> 1) & 15 of group
    G - gs's fragments (fragment ((e >> 1) & 15) >> 2, word e >> 1 & 3; the kernel's patch_group branches to it)
    and moves on; entries at or past the slice's end are never reached. Warpgroup g's wgmma step f multiplies the
    64 x 16 A its warps' f registers hold by the box's k 16 f .. 16 f + 15 (fp32 accumulators). D is the CTA's
    partial, the split-K sum takes them in the order 0..S-1 (S = 1: the partial as it is), then bf16. tiles: pack_tz's
    [N/64, K/64, TZ_TILE] uint8; pptr, pesc: pack_tz's per-lane patch lists; x: [M, K] bf16 bits, M <= 32;
    patches=False is dbg & 1. The ring depth ST is not modelled: every stage is written whole before a consumer
    reads it; nor the kernel's four entries a lane holds in registers (a window over the same list)."""
    x = np.asarray(x, np.uint16)
    M = x.shape[0]
    NW, KA, S, NB = nw, ka, s, nb_of(M)
    if NW not in (4, 8) or N % (16 * NW) or K % (64 * KA) or not 1 <= S <= K // (64 * KA) or M > 32:
        raise ValueError(f"config NW={NW} KA={KA} S={S} does not fit N={N}, K={K}, M={M}")
    wz = np.ascontiguousarray(tiles, np.uint8).reshape(-1)
    if wz.size != N * K * 3 // 2:
        raise ValueError(f"tiles hold {wz.size} B, a {N}x{K} W packs to {N * K * 3 // 2}")
    T, NWG, NT, KG = K // (64 * KA), NW // 4, 8 * NB, K // 64
    XB = NT * 128
    STAGE = KA * (XB + NWG * TZ_TILE)
    pptr, pesc = np.asarray(pptr, np.int64), np.asarray(pesc, np.int64)
    if pptr.shape != (N // 16 * 32 + 1,):
        raise ValueError(f"pptr has shape {pptr.shape}, a {N}x{K} W has {N // 16 * 32 + 1} entries (32 lane lists "
                         f"a row block)")
    NONE = 0x7FFFFFFF                                           # the kernel's sentinel past a list: G past every slice
    TL, TH = np.uint32(TL), np.uint32(TH)
    w_ = np.arange(NW)
    lane_off = ((w_ >> 2) * KA * TZ_TILE + (w_ & 3) * 1536)[:, None] + 16 * np.arange(32)[None, :]   # [NW, 32]
    y = np.full((M, N), 0x7FC0, np.uint16)
    for rg in range(N // (16 * NW)):                            # blockIdx.x
        ws = np.zeros((S, 16 * NW, NT), np.float32)
        for sidx in range(S):                                   # blockIdx.y
            s0, steps = split_steps(T, S, sidx)
            g0 = s0 * KA                                        # the slice's first 64-group
            li = (rg * NW + w_)[:, None] * 32 + np.arange(32)[None, :]     # [NW, 32]: lane list of warp w's block
            cur = pptr[li].copy()                               # each lane's next entry: its list is [cur, end)
            end = pptr[li + 1] if patches else cur.copy()
            head = lambda: np.where(cur < end, pesc[np.minimum(cur, len(pesc) - 1), 0], NONE)   # next entry's e (e0.x)
            while ((head() >> 5) < g0).any():                   # the entries before this CTA's slice
                cur += (head() >> 5) < g0
            acc = np.zeros((NWG, 64, NT), np.float32)
            for i in range(steps):
                smem = np.full(STAGE, 0xFF, np.uint8)           # producer: one stage
                for g in range(NWG):
                    src = ((rg * NWG + g) * KG + g0 + i * KA) * TZ_TILE
                    bulk_load(smem, KA * XB + g * KA * TZ_TILE, wz[src:src + KA * TZ_TILE])
                for a in range(KA):
                    tma_load_2d(smem, a * XB, x, (g0 + i * KA + a) * 64, 0, NT)
                f = []                                          # consumers: f[a][fragment][word], [NW, 32] uint32
                for a in range(KA):
                    tp = KA * XB + a * TZ_TILE + lane_off
                    A0, A1, B = ld_shared16(smem, tp), ld_shared16(smem, tp + 512), ld_shared16(smem, tp + 1024)
                    f.append([[np.array(r, np.uint32) for r in lab3.decz(lo0, lo1, c, TL, TH)] for lo0, lo1, c in (
                        (A0[..., 0], A0[..., 1], B[..., 0]), (A0[..., 2], A0[..., 3], B[..., 1]),
                        (A1[..., 0], A1[..., 1], B[..., 2]), (A1[..., 2], A1[..., 3], B[..., 3]))])
                gs = g0 + i * KA                                # the step's first group
                mine = (head() >> 5) - gs < KA                  # lanes with a patch in this step
                while mine.any():                               # every lane walks its own list: one pass here
                    # writes each such lane's next entry (lanes never touch each other's words, so the order of the
                    # kernel's independent per-lane loops gives the same fragments)
                    for w, ln in zip(*np.nonzero(mine)):
                        e, bits = int(pesc[cur[w, ln], 0]), int(pesc[cur[w, ln], 1]) & 0xFFFF
                        q = ((e >> 5) - gs) * 16 + ((e >> 1) & 15)
                        if q >= 0:                              # (q < 0: no word of the step; the kernel writes none)
                            sh, v = 16 * (e & 1), f[q >> 4][(q >> 2) & 3][q & 3]
                            v[w, ln] = (int(v[w, ln]) & ~(0xFFFF << sh) & 0xFFFFFFFF) | (bits << sh)
                    cur += mine
                    mine = (head() >> 5) - gs < KA
                for a in range(KA):                             # 4 wgmma per group
                    for j in range(4):
                        A = rs_a_tiles(f[a][j])
                        Bx = desc_read(smem, wg_desc(a * XB + 32 * j), NT)
                        for g in range(NWG):
                            acc[g] = wgmma(acc[g], A[g], Bx)
            ws[sidx] = acc.reshape(16 * NW, NT)
        res = ws[0] if S == 1 else np.zeros((16 * NW, NT), np.float32)
        for sidx in range(S if S > 1 else 0):                   # splitk_combine: 0 + ws[0] + ... + ws[S-1]
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


def planted_np(N, K, seed, plants):
    """lab3's trained-looking bf16 bits [N, K] with the bits b planted at (row, k) for (row, k, b) in plants."""
    W = lab3.trained_like_np(N, K, seed)
    for r, k, b in plants:
        W[r, k] = b
    return W


def part4(rng):
    print("\n# Part 4: the compressed PIPE 6 (gemvtz_kernel): pack_tz's tiles, decz into wgmma's register A")
    perm = tz_perm(128)
    formula = np.empty(64, np.int64)
    for f in range(4):
        for t in range(4):
            for p in range(2):
                for e in range(2):
                    formula[32 * (f >> 1) + 8 * t + 4 * (f & 1) + 2 * p + e] = 16 * f + 2 * t + 8 * p + e
    print("  stream columns 16 r .. 16 r + 15 of a 64-group hold natural k:")
    for r in range(4):
        print(f"    {[int(v) for v in perm[16 * r:16 * r + 16]]}")
    check(np.array_equal(perm[:64], formula) and np.array_equal(perm[64:], formula + 64)
          and sorted(perm[:64]) == list(range(64)),
          "tz_perm (lab3.frag_pos + the m16n8k16 A layout) is a permutation of each 64-group: column "
          "32(f>>1) + 8t + 4(f&1) + 2p + e holds k 16f + 2t + 8p + e")
    check(all(lab3.frag_pos(ln, f, j)[0] == wgmma_a_pos(ln, j)[0] for ln in range(32) for f in range(4)
              for j in range(8)), "lab3's fragment rows are wgmma's register-A rows (g + 8 ((j >> 1) & 1))")
    pos = {(r, kk): patch_pos(r, kk) for r in range(16) for kk in range(64)}
    check(len(set(pos.values())) == 4 * 32 * 8
          and all(fi == kk >> 4 and wgmma_a_pos(ln, j) == (r, kk & 15) for (r, kk), (fi, ln, j) in pos.items()),
          "patch_pos: element (r, kk) of a warp's 16 x 64 group is one register half, fragment kk >> 4, lane "
          "4 (r & 7) + (kk & 7) // 2, element 2 ((r >> 3) + 2 ((kk >> 3) & 1)) + (kk & 1): wgmma's (r, kk & 15)")
    check(all(patch_elem(ln, G << 5 | fi << 3 | j) == (r, 64 * G + kk) for (r, kk), (fi, ln, j) in pos.items()
              for G in (0, 5)), "patch_elem(lane, G << 5 | f << 3 | j) inverts patch_pos: (r, 64 G + kk)")
    N, K = 128, 512
    plants = [(3, 200, 0x7F00), (70, 450, 0xC0C0), (101, 33, 0x3F40), (101, 300, 0xBFC0)]
    W = planted_np(N, K, 21, plants)
    z = pack_tz_np(W)
    pptr, pesc = z["pptr"], z["pesc"]
    print(f"  W {N}x{K} with {[(r, k, hex(b)) for r, k, b in plants]} planted: mode {z['mode']}, "
          f"{z['n_exc']} exceptions, tiles {z['stream'].shape} ({TZ_TILE} B each), patch table "
          f"{int(pptr[-1])} entries in {int((np.diff(pptr) > 0).sum())} of {N // 16 * 32} lane lists")
    stream = z["stream"].reshape(N // 64, K // 64, 4, 1536).transpose(0, 2, 1, 3).reshape(N // 16, K // 64, 1536)
    nat = np.empty_like(W)
    nat[:, tz_perm(K)] = lab3.unpack_z_np(stream, N, K, z["TL"], z["TH"])
    eptr, esc = z["eptr"], z["esc"]
    ks = [list(esc[eptr[r]:eptr[r + 1], 0]) for r in range(N)]
    check(all(k == sorted(k) for k in ks) and all(k in ks[r] for r, k, _ in plants),
          "side table in natural k, ascending per row, the planted columns among the exceptions")
    patched, lists = nat.copy(), []
    for li in range(N // 16 * 32):                  # lane list (row block b, lane L) = b 32 + L
        run = pesc[pptr[li]:pptr[li + 1]]
        lists.append(list(run[:, 0]) == sorted(run[:, 0]))
        for e, bits in run:
            r, k = patch_elem(li % 32, int(e))
            patched[16 * (li // 32) + r, k] = bits
    check(int(pptr[-1]) == z["n_exc"] and all(lists) and np.array_equal(patched, W),
          "tile row block rb at rb*1536, decoded (decz) and un-permuted, with each lane list's bits written at "
          "its element (16 b + row, 64 G + column: patch_elem) == W bit for bit; each list by (G, f, word, half)")
    check(bool(lab3.same_bits(lab3.restore_np(nat, eptr, esc), W).all()),
          "the natural-k row CSR pack_tz still returns (v + c, fp32; the kernel no longer reads it) restores W too")
    Wf = bf16_to_f32(W).astype(np.float64)
    run6 = [(10, kk, 0x3F80 + i) for i, kk in enumerate((2, 3, 10, 11, 18, 19))]   # ~1.0: six patches of one lane
    Wm = planted_np(N, K, 21, [(70, 450, 0xC0C0), (101, 33, 0x3F40), (101, 300, 0xBFC0)] + run6)   # no 1.7e38
    zm = pack_tz_np(Wm)
    ln = patch_pos(10, 2)[1]                        # block 0's lane 9 holds all six (group 0)
    g0s = [split_steps(K // 128, 3, i)[0] * 2 for i in range(3)]
    n9 = int(((zm["pesc"][zm["pptr"][ln]:zm["pptr"][ln + 1], 0] >> 5) < g0s[1]).sum())
    check(n9 >= 6, f"lane {ln} of row block 0 has {n9} patches in group 0: NW=8 KA=2 S=3's CTAs 1 and 2 (g0 = "
                   f"{g0s[1]}, {g0s[2]}) skip more than the four the kernel holds in registers")
    args = (zm["stream"], zm["pptr"], zm["pesc"], zm["TL"], zm["TH"])
    P = pack_tma_np(Wm)
    for M, nw, ka, s in ((1, 4, 1, 1), (9, 8, 2, 3), (17, 4, 1, 3), (32, 8, 1, 8)):
        x = bf16_normal(rng, (M, K))
        ref = bf16_to_f32(x).astype(np.float64) @ bf16_to_f32(Wm).astype(np.float64).T
        y = gemvtz_emulate(*args, x, N, K, nw, ka, s)
        ok, worst = check_close_np(y, ref)
        T = K // (64 * ka)
        print(f"  M={M:2d} NW={nw} KA={ka} S={s}: slices {[split_steps(T, s, i)[1] for i in range(s)]} steps, "
              f"{zm['n_exc']} patches, worst |y - ref| / tol = {worst:.3f}")
        check(ok, f"gemvtz_emulate M={M} NW={nw} KA={ka} S={s}: within the SPEC tolerance of x @ W.T")
        check(np.array_equal(y, gemvt_emulate(P, x, N, K, nw, ka, s)),
              f"gemvtz_emulate M={M} NW={nw} KA={ka} S={s} == gemvt_emulate (pack_tma_np's tiles) bit for bit: the "
              f"patched fragments are W, in the same wgmma order")
    for (r0, k, b) in plants[:2]:                   # the judge's probe: one-hot x (token 5 of 9) on an exception column
        x = np.zeros((9, K), np.uint16)
        x[5, k] = 0x3F80
        y = gemvtz_emulate(z["stream"], pptr, pesc, z["TL"], z["TH"], x, N, K, 4, 1, 3)
        y0 = gemvtz_emulate(z["stream"], pptr, pesc, z["TL"], z["TH"], x, N, K, 4, 1, 3, patches=False)
        rows = [r for r in range(N) if k in ks[r]]
        cta = [i for i in range(3) if split_steps(K // 64, 3, i)[0] * 64 <= k][-1]
        print(f"  probe x[5] = e_{k} (S=3: CTA {cta}'s slice): rows with an exception in column {k}: {rows}; "
              f"row {r0}: W = {Wf[r0, k]:+.6g}, "
              f"y = {float(bf16_to_f32(y[5, r0])):+.6g}, patches skipped {float(bf16_to_f32(y0[5, r0])):+.6g}")
        check(np.array_equal(y[5], W[:, k]) and not y[[0, 1, 2, 3, 4, 6, 7, 8]].any(),
              f"probe on exception column {k}: y[5] == W[:, {k}] bit for bit, the other tokens +0")
        check([int(r) for r in np.flatnonzero(y0[5] != W[:, k])] == rows,
              f"probe on column {k} with the patches skipped (dbg & 1) is wrong in exactly rows {rows}")
    x = bf16_normal(rng, (5, K))
    ref = bf16_to_f32(x).astype(np.float64) @ bf16_to_f32(Wm).astype(np.float64).T
    zp = pack_tz_np(Wm, kperm=False)
    y = gemvtz_emulate(zp["stream"], zp["pptr"], zp["pesc"], zp["TL"], zp["TH"], x, N, K, 4, 1, 3)
    ok, worst = check_close_np(y, ref)
    check(not ok, f"negative: the unpermuted stream (lab3's pack_z order) with x in natural order fails the SPEC "
                  f"check (worst {worst:.0f} x tol)")


def main():
    rng = np.random.default_rng(6)
    part1(rng)
    part2(rng)
    part3(rng)
    part4(rng)
    print("lab6: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
