"""Weight packing for the bf16 kernels: fragment order (gemv_kernel), swizzled TMA tiles (gemvt_kernel), and the
router's fp32 weight as hi + lo bf16 halves (the DUAL path). Torch ops, CPU or GPU; labs/lab2_fragments.py and
labs/lab6_tma.py emulate them."""
import torch


def pack_plain(w):
    """Reorder W [N, K] (any 2-byte dtype) into fragment order; returns a tensor of shape [N/16, K/32, 64, 8].

    One m16n8k16 A fragment = 16 rows x 16 k; lane = 4g + t holds 8 values j = 0..7:
    j = 4p + 2h + e  ->  row g + 8h,  mma k 2t + 8p + e.
    The K relabelling: mma step s (0, 1) of 32-wide K block kb uses physical k = 32kb + 8t + 4s + 2p + e,
    so a lane's x for both steps is ONE 16-byte load of x[tok, 32kb + 8t .. 32kb + 8t + 7] (words 0, 1
    feed step 0; words 2, 3 step 1). The same permutation of k is applied to W and x: the dot product
    is unchanged.

        packed[rb][kb][s*32 + lane][j] = W[16rb + g + 8h][32kb + 8t + 4s + 2p + e]

        per (rb, kb): 1024 bytes = 64 units of 16 B
        unit:   0 .. 31  step 0, lanes 0..31  -> one 512 B warp load (ld_stream(wp + kb*64))
               32 .. 63  step 1, lanes 0..31  -> one 512 B warp load (ld_stream(wp + kb*64 + 32))
        unit bytes (lane g,t; step s):  j0 j1 | j2 j3 | j4 j5 | j6 j7
                                     row g  | g+8   | g     | g+8
                                    k 8t+4s+{0,1}   | 8t+4s+{2,3}
    Lab: labs/lab2_fragments.py emulates these loads lane by lane.
    """
    N, K = w.shape
    if N % 16 or K % 32:
        raise ValueError(f"pack_plain needs N % 16 == 0 and K % 32 == 0, got N={N}, K={K}")
    v = w.reshape(N // 16, 2, 8, K // 32, 4, 2, 2, 2)            # rb, h, g, kb, t, s, p, e
    return v.permute(0, 3, 5, 2, 4, 6, 1, 7).reshape(N // 16, K // 32, 64, 8).contiguous()


def pack_tma(w):
    """W [N, K] (bf16) as gemvt_kernel reads it: tiles of 64 rows x 64 k, tile (rt, kt) at index
    rt * K/64 + kt, each 8 KB in the 128-byte swizzle of its shared-memory image: row r is 128 B, and its 16-byte
    chunk c (k 8c .. 8c + 7 of the tile) sits at chunk position c ^ (r & 7). Returns [N/64, K/64, 64, 64].

        packed[rt][kt][r][8 (c ^ (r & 7)) + i] = W[64 rt + r][64 kt + 8 c + i]

    A warpgroup's KA tiles of one stage are contiguous (one bulk copy); wgmma reads the tile through a descriptor
    with the 128-byte swizzle, which undoes the XOR. Lab: labs/lab6_tma.py checks this layout against the
    hardware's swizzle rule (the address bits 4-6 XOR bits 7-9 of a 1024-byte aligned tile)."""
    N, K = w.shape
    if N % 64 or K % 64:
        raise ValueError(f"pack_tma needs N % 64 == 0 and K % 64 == 0, got N={N}, K={K}")
    v = w.reshape(N // 64, 64, K // 64, 8, 8).permute(0, 2, 1, 3, 4)   # rt, kt, r, c, i
    r = torch.arange(64, device=w.device)
    pos = torch.arange(8, device=w.device)
    src = pos[None, :] ^ (r[:, None] & 7)                               # chunk that lands at position pos of row r
    return v[:, :, r[:, None], src, :].reshape(N // 64, K // 64, 64, 64).contiguous()


def unpack_plain(packed, rb0=0, rb1=None):
    """pack_plain's inverse for row blocks rb0 .. rb1 - 1: W[16 rb0 : 16 rb1] as [rows, K] (the m > 32 path of a
    layer that holds only its packed copy)."""
    RB, KB = packed.shape[:2]
    rb1 = RB if rb1 is None else rb1
    # pack_plain's permute took (rb, h, g, kb, t, s, p, e) to (rb, kb, s, g, t, p, h, e); this one takes it back
    v = packed[rb0:rb1].reshape(rb1 - rb0, KB, 2, 8, 4, 2, 2, 2)           # rb, kb, s, g, t, p, h, e
    return v.permute(0, 6, 3, 1, 4, 2, 5, 7).reshape(16 * (rb1 - rb0), 32 * KB)


def unpack_tma(packed, rt0=0, rt1=None):
    """pack_tma's inverse for row tiles rt0 .. rt1 - 1: W[64 rt0 : 64 rt1] as [rows, K]."""
    RT, KT = packed.shape[:2]
    rt1 = RT if rt1 is None else rt1
    r = torch.arange(64, device=packed.device)
    c = torch.arange(8, device=packed.device)
    pos = c[None, :] ^ (r[:, None] & 7)                                  # where chunk c of row r sits
    v = packed[rt0:rt1].reshape(rt1 - rt0, KT, 64, 8, 8)[:, :, r[:, None], pos, :]   # rt, kt, r, c, i
    return v.permute(0, 2, 1, 3, 4).reshape(64 * (rt1 - rt0), 64 * KT)


def split_hi_lo(w32):
    """The router's fp32 weight as two bf16 halves: hi = bf16(W), lo = bf16(W - hi) (W - hi is exact in fp32).

    hi + lo carries 16 significant bits; the fused DUAL kernel sums x.hi + x.lo into one set of fp32
    accumulators. Non-finite weights keep lo = 0 (Inf - Inf would be NaN); finite weights above the bf16
    range take hi = the largest bf16 of their sign (truncation) so that lo stays finite.
    """
    w32 = w32.float()
    hi = w32.to(torch.bfloat16)
    over = torch.isinf(hi) & torch.isfinite(w32)
    if bool(over.any()):
        trunc = (w32.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
        hi = torch.where(over, trunc, hi)
    lo = (w32 - hi.float()).to(torch.bfloat16)
    lo = torch.where(torch.isfinite(w32), lo, torch.zeros_like(lo))
    return hi, lo
