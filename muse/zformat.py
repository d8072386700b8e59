"""The lossless 12-bit weight format: the packer, the GPU decode check, and when prepare compresses a layer.

A bf16 is s | e7..e0 | m6..m0. Its low byte (e0 + 7 mantissa bits) is stored verbatim (8 bits). Its high byte minus
the sign, the "class" e7..e1 (7 bits, a factor-4 range of magnitudes), is stored as a 3-bit index into its row's
window, and the sign as a 4th bit: 12 bits per weight, fixed rate. A row's window is 8 consecutive classes
zbase[r] .. zbase[r] + 7 (16 binades), the run that holds most of the row's weights, so rows of different scale each
get the binades they use.

Every weight is stored as index clamp(class - zbase, 0, 7), its own sign and low byte: in-window weights decode to
themselves, out-of-window weights (exceptions) to v, the nearest window class with W's sign and low byte. An fp32
correction c = fl(W - v) in a side table restores them: pack_z takes a row's best window only if fl(v + c) == W bit for
bit for every exception of the row (true when W is within 16 binades of the window; otherwise it tries the row's other
windows, most weights first; if none works, e.g. a subnormal next to normal weights, it refuses the matrix and the
layer runs plain). Zeros are exceptions whose v + c is +0: the sign of a zero weight is not kept, which no GEMV output
can observe (every sum starts from +0, and a product with -0 adds nothing to it). So the stream never branches, and a
one-hot probe on an exception column returns v + c = W exactly.

Layout per (16-row block rb, 64-wide group G): 96 units of 16 B = 1536 B (vs 2048 B of bf16)
  units  0..31  A0[lane]: low bytes of fragment f0 (j0..j7) then f1 (j0..j7)
  units 32..63  A1[lane]: low bytes of f2, f3
  units 64..95  C[lane]:  code words of f0, f1, f2, f3 (one 32-bit word per fragment)
where f = 2*kb2 + s is mma step s of K block kb = 2G + kb2, i.e. fragment f of a lane holds exactly what pack_plain
puts in unit (kb, s, lane). Code word (decz): byte b holds the index of j_b in bits 0..2, of j_b+4 in bits 4..6, the
sign of j_b in bit 7 and of j_4+(b+3)%4 in bit 3 (ZIDX_BIT, ZSIGN_BIT). zbase: uint8 [N], 8 bits per row. Side table,
CSR: eptr int32 [N + 1] (row r's exceptions are entries eptr[r] .. eptr[r+1]-1) and esc int32 [n_exc, 2] = {k, fp32
bits of c}, row-major, each row's k ascending: 64 bits per exception + 32 per row.
Lab: labs/lab3_compress.py emulates the packer and the decoder bit for bit.
"""
import collections

import torch

from .extension import raw_stream, shipped_extension
from .families import GemvtzConfig, config_misfit, coop_twin
from .packing import pack_plain

ZIDX_BIT = (0, 8, 16, 24, 4, 12, 20, 28)      # code-word bit where fragment element j's 3-bit index starts
ZSIGN_BIT = (7, 15, 23, 31, 11, 19, 27, 3)    # code-word bit that holds the sign of fragment element j
ZBASES = 121                                  # window starts 0 .. 120 (class + 7 <= 127)

# moved: rows whose window is not their fullest run of 8 classes (the fullest left an exception inexact)
ZPack = collections.namedtuple("ZPack", "stream zbase eptr esc capr n_exc exc_cols moved")


def side_table_bits(z, N, K):
    """Bits per weight beyond the 12 of the stream: the windows (8 per row) and the exception side table (CSR:
    eptr [N + 1] int32 + esc [n_exc] int2)."""
    return (64 * z.n_exc + 32 * (N + 1) + 8 * N) / (N * K)


def _zrow_counts(cls, chunk=1024):
    """[N, ZBASES] int64: how many of each row's weights a window starting at class b holds."""
    N = cls.shape[0]
    hist = torch.zeros((N, 128), dtype=torch.int64, device=cls.device)
    for r0 in range(0, N, chunk):                       # row chunks: the bincount keys stay small
        c = cls[r0:r0 + chunk]
        key = (torch.arange(c.shape[0], device=cls.device)[:, None] * 128 + c).flatten()
        hist[r0:r0 + c.shape[0]] = torch.bincount(key, minlength=c.shape[0] * 128).view(-1, 128)
    csum = torch.nn.functional.pad(torch.cumsum(hist, 1), (1, 0))
    return csum[:, 8:] - csum[:, :ZBASES]


def _bf16_values(bits):
    """bf16 bit patterns held as int32 0..65535 -> their fp32 values."""
    return (bits - ((bits >> 15) << 16)).to(torch.int16).view(torch.bfloat16).float()


def _restores(back, w):
    """Whether v + c (fp32 back) gives the weight w back as the format accepts it: bit for bit, NaN for NaN, or +0 for
    a zero weight of either sign (no GEMV output can observe the sign of a zero weight: every sum starts from +0)."""
    return (back.view(torch.int32) == w.view(torch.int32)) | (torch.isnan(back) & torch.isnan(w)) | \
        ((w == 0) & (back == 0))


def _zdecode_exact(bits, base):
    """For weights bits (int32 [..., K]) stored with windows base (int [..., 1] or broadcastable): the index each is
    stored with, whether it is an exception, whether v + c gives W back (True for in-window weights), and c."""
    d = ((bits >> 8) & 0x7F) - base
    exc = (d < 0) | (d > 7)
    idx = d.clamp(0, 7)
    v = _bf16_values((((bits >> 15) & 1) << 15) | ((base + idx) << 8) | (bits & 0xFF))
    w = _bf16_values(bits)
    corr = w - v
    return idx, exc, _restores(v + corr, w) | ~exc, corr


def pack_z(w):
    """Compress bf16 W [N, K] (N % 16 == 0, K % 64 == 0) to the 12-bit format; torch ops, CPU or GPU.

    Returns ZPack(stream uint8 [N/16, K/64, 1536], zbase uint8 [N], eptr int32 [N + 1], esc int32
    [max(n_exc, 1), 2], capr, n_exc, exc_cols (sorted unique k of exceptions), moved).
    Row r's window is classes zbase[r] .. zbase[r] + 7: the run of 8 holding most of its weights (ties: the
    smaller start) among those that leave every exception of the row exact as v + c. The side table is CSR:
    row r's exceptions are esc[eptr[r]:eptr[r + 1]] = {k, fp32 bits of the correction}, k ascending; capr is
    the largest count of one row.
    NaN weights come back as NaN at the same positions (a signalling NaN's payload comes back quiet: the
    correction W - v is computed in fp32), zeros as +0; no GEMV output can observe either. Raises ValueError
    when a row has no exact window (e.g. subnormals next to normal weights).
    """
    N, K = w.shape
    if w.dtype != torch.bfloat16:
        raise TypeError(f"pack_z needs a bf16 weight, got {w.dtype}")
    if N % 16 or K % 64:
        raise ValueError(f"pack_z needs N % 16 == 0 and K % 64 == 0, got N={N}, K={K}")
    dev = w.device
    bits = w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    counts = _zrow_counts((bits >> 8) & 0x7F)
    base = torch.argmax(counts, 1)                      # the first maximum: ties to the smaller start
    idx, exc, ok, corr = _zdecode_exact(bits, base[:, None])
    bad = torch.nonzero(~ok.all(1)).flatten().tolist()
    for r in bad:                                       # rare: try the row's other windows, fullest first
        cand = torch.arange(ZBASES, device=dev)[:, None]
        good = _zdecode_exact(bits[r][None, :].expand(ZBASES, K), cand)[2].all(1)
        if not bool(good.any()):
            raise ValueError(f"row {r}: no window of 8 classes leaves its out-of-window weights exact as v + c "
                             f"(classes {sorted(set(((bits[r] >> 8) & 0x7F).tolist()))})")
        base[r] = int(torch.argmax(torch.where(good, counts[r], torch.full_like(counts[r], -1))))
    if bad:
        idx, exc, ok, corr = _zdecode_exact(bits, base[:, None])
        assert bool(ok.all())

    # exception table, CSR: the exceptions in row-major order (each row's k ascending) and the row offsets
    ex_r, ex_k = torch.nonzero(exc, as_tuple=True)
    n_exc = int(ex_r.numel())
    per_row = torch.bincount(ex_r, minlength=N) if n_exc else torch.zeros(N, dtype=torch.int64, device=dev)
    capr = int(per_row.max()) if n_exc else 0
    eptr = torch.zeros(N + 1, dtype=torch.int32, device=dev)
    eptr[1:] = torch.cumsum(per_row, 0).to(torch.int32)
    esc = torch.zeros((max(n_exc, 1), 2), dtype=torch.int32, device=dev)
    if n_exc:
        esc[:n_exc, 0] = ex_k.to(torch.int32)
        esc[:n_exc, 1] = corr[ex_r, ex_k].view(torch.int32)
    exc_cols = torch.unique(ex_k).tolist() if n_exc else []

    # fragment order, as pack_plain: [RB, KB, 2 (s), 32 (lane), 8 (j)] -> [RB, KG, 4 (f = 2 kb2 + s), 32, 8]
    RB, KG = N // 16, K // 64
    lo_f = pack_plain((bits & 0xFF).to(torch.uint8)).view(RB, KG, 4, 32, 8)
    idx_f = pack_plain(idx.to(torch.int64)).view(RB, KG, 4, 32, 8)
    sgn_f = pack_plain(((bits >> 15) & 1).to(torch.int64)).view(RB, KG, 4, 32, 8)
    shift_idx = torch.tensor(ZIDX_BIT, device=dev, dtype=torch.int64)
    shift_sgn = torch.tensor(ZSIGN_BIT, device=dev, dtype=torch.int64)
    word = ((idx_f << shift_idx) | (sgn_f << shift_sgn)).sum(-1)                    # [RB, KG, 4, 32]
    word = torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)
    codes = word.permute(0, 1, 3, 2).contiguous().view(torch.uint8)                   # [RB, KG, 32, 16]
    a = lo_f.view(RB, KG, 2, 2, 32, 8).permute(0, 1, 2, 4, 3, 5).reshape(RB, KG, 2, 32, 16)
    stream = torch.cat([a[:, :, 0], a[:, :, 1], codes], dim=2).reshape(RB, KG, 1536).contiguous()
    return ZPack(stream, base.to(torch.uint8), eptr, esc, capr, n_exc, exc_cols, len(bad))


def decode_rows(z, r0, r1, ext=None):
    """Rows r0 .. r1 - 1 (multiples of 16) of the 12-bit stream decoded by the kernels' own decz (ext's unpackz_kernel
    on those row blocks, which are contiguous in the stream; default the shipped build): bf16 [r1 - r0, K], W but the
    nearest window value v at out-of-window weights."""
    K = z.stream.shape[1] * 64
    dev = z.stream.device
    out = torch.empty((r1 - r0, K), dtype=torch.bfloat16, device=dev)
    st = z.stream.view(-1)[(r0 // 16) * (K // 64) * 1536:]
    (shipped_extension() if ext is None else ext).unpackz(st.data_ptr(), z.zbase[r0:].data_ptr(), out.data_ptr(),
                                                          r1 - r0, K, raw_stream(dev))
    return out


def exception_entries(z, r0, r1):
    """The side-table entries of rows r0 .. r1 - 1: (row - r0, k, fp32 correction c) as tensors, row-major."""
    e0, e1 = int(z.eptr[r0]), int(z.eptr[r1])
    r = torch.repeat_interleave(torch.arange(r1 - r0, device=z.eptr.device),
                                (z.eptr[r0 + 1:r1 + 1] - z.eptr[r0:r1]).long())
    return r, z.esc[e0:e1, 0].long(), z.esc[e0:e1, 1].view(torch.float32)


def verify_z(w, z, ext=None):
    """Decode z on the GPU with the kernel's own decz (ext's unpackz_kernel; default the shipped build) and compare
    with w bit for bit (exceptions: v + c; a zero weight may come back +0). Returns '' when exact, else a
    description of the first mismatch."""
    N, K = w.shape
    dec = decode_rows(z, 0, N, ext)
    db = dec.view(torch.int16)
    wb = w.view(torch.int16)
    same = db == wb
    if z.n_exc:
        r, k, c = exception_entries(z, 0, N)
        back = dec[r, k].float() + c
        tgt = w[r, k].float()
        ok = _restores(back, tgt)
        if not bool(ok.all()):
            i = int((~ok).nonzero()[0])
            return f"exception at row {int(r[i])}, k {int(k[i])}: v + c = {float(back[i])} != {float(tgt[i])}"
        same[r, k] = True
    if not bool(same.all()):
        r, k = [int(v) for v in (~same).nonzero()[0]]
        return (f"weight [{r}, {k}] decodes to 0x{int(db[r, k]) & 0xFFFF:04x}, expected 0x{int(wb[r, k]) & 0xFFFF:04x}")
    return ""


# ---- when prepare compresses -----------------------------------------------------------------------------------
# The compressed path pays while the exception warp's walk hides under the stream. Two limits, both measured break-evens
# less a margin (FINDINGS, "the exception warp": the tables of timings they were read from):
#   * the share of weights out of window, per m range (EXC_RATE_LIMITS_BY_SHAPE for the tuned shapes, which differ too
#     much for one rule: pooler and qkv_gate have the same K and rate and different break-evens; EXC_RATE_LIMITS for
#     any other shape: the smallest measured). Above it the m range runs plain.
#   * the worst row (CAPR_LIMITS): the walk gives a row to one lane, and past a few dozen exceptions that lane's chain
#     outlasts the CTA's stream. Above it the m range takes the cooperative walk (walk = 1: the CTA's entries dealt to
#     the 32 lanes), and runs plain where even that chain (coop_chain) is over the limit.
# A layer over the limits of every m is not compressed at all (MAX_EXC_RATE, MAX_CAPR). describe() says which m took
# which path and why.
EXC_RATE_LIMITS = ((8, 0.0008), (32, 0.0006))   # (largest m, largest share of exceptions): any shape
EXC_RATE_LIMITS_BY_SHAPE = {                     # (N, K): the tuned shapes' break-evens, less about 10%
    (2304, 8192): ((8, 0.0008), (32, 0.0006)),   # qkv_gate
    (8192, 2048): ((8, 0.0014), (32, 0.0009)),   # o_proj
    (4096, 8192): ((8, 0.0012), (32, 0.0006)),   # pooler
    (8192, 4096): ((8, 0.0023), (32, 0.0012)),   # unpooler
}
MAX_EXC_RATE = max(r for lim in (EXC_RATE_LIMITS, *EXC_RATE_LIMITS_BY_SHAPE.values()) for _, r in lim)
CAPR_LIMITS = ((8, 56), (32, 40))               # (largest m, longest chain of exceptions one lane walks)
MAX_CAPR = max(c for _, c in CAPR_LIMITS)


class NoCompression(Exception):
    """The weight does not compress exactly, or (with the limits) compressed would not pay at any m."""


def exc_rate_limit(N, K, m):
    """The largest share of out-of-window weights at which the compressed path is taken for an N x K layer at m: its
    shape's measured limit (EXC_RATE_LIMITS_BY_SHAPE), else the smallest measured one (EXC_RATE_LIMITS)."""
    return next(r for mm, r in EXC_RATE_LIMITS_BY_SHAPE.get((N, K), EXC_RATE_LIMITS) if m <= mm)


def z_pays(z, m):
    """True, or why the compressed path does not pay at m for this packed weight (plan_for's compressible): the share of
    out-of-window weights. The worst row is walk_for's question, asked of the config the plan takes."""
    N, K = z.zbase.numel(), z.stream.shape[1] * 64
    rate, lim = z.n_exc / (N * K), exc_rate_limit(N, K, m)
    if rate > lim:
        src = "EXC_RATE_LIMITS_BY_SHAPE" if (N, K) in EXC_RATE_LIMITS_BY_SHAPE else "EXC_RATE_LIMITS"
        return f"{100 * rate:.3f}% of weights out of window > {100 * lim:.2f}%, where compressed stops paying at m={m} ({src})"
    return True


def coop_chain(z, r):
    """The longest chain one lane of the cooperative walk follows for CTAs of 16 r rows: the most side-table entries
    of any 16 r-row group, dealt to 32 lanes (coop_walk's contiguous pieces, rounded up). Needs N % (16 r) == 0."""
    g = 16 * r
    e = z.eptr.to(torch.int64)
    return -(-int((e[g::g] - e[:-g:g]).max()) // 32) if z.n_exc else 0


def walk_for(z, cfg, m):
    """The exception walk of a compressed plan: (cfg, '') with the per-row walk while the worst row (capr) is within
    CAPR_LIMITS at m; (cfg with walk = 1, the note) with the cooperative walk where capr is over it and coop_chain is
    within it; else a string saying why neither walk hides under the stream (the m range then runs plain). gemvtz's
    exception warp always walks cooperatively over its 16 nw rows: (cfg, '') while that chain is within the limit."""
    climit = next(c for mm, c in CAPR_LIMITS if m <= mm)
    if isinstance(cfg, GemvtzConfig):
        chain = coop_chain(z, cfg.nw)
        if chain > climit:
            return (f"{chain} exceptions a lane in gemvtz's cooperative walk (CTAs of {16 * cfg.nw} rows) > {climit}, "
                    f"where the walk outlasts the stream at m={m} (CAPR_LIMITS)")
        return cfg, ""
    if z.capr <= climit or cfg.walk:
        return cfg, ""
    chain = coop_chain(z, cfg.r)
    coop = coop_twin(cfg)
    if chain > climit:
        return (f"{z.capr} exceptions in one row and {chain} a lane in the cooperative walk > {climit}, where the walk "
                f"outlasts the stream at m={m} (CAPR_LIMITS)")
    N, K = z.zbase.numel(), z.stream.shape[1] * 64
    bad = config_misfit(coop, N, K, m)
    if bad:
        return f"{z.capr} exceptions in one row > {climit} (CAPR_LIMITS), and the cooperative walk does not fit: {bad}"
    return coop, (f"; cooperative exception walk: {z.capr} exceptions in one row > {climit} "
                  f"(CAPR_LIMITS), {chain} a lane")


def compress_verified(w, ext=None, limits=True):
    """pack_z + the GPU decode check (with ext's unpackz; default the shipped build); raises NoCompression with the
    reason when the format is not exact, or (limits) when it does not pay: MAX_EXC_RATE, MAX_CAPR (the worst row and the
    cooperative walk's chain at R = 1, its shortest, both over it). prepare(path=
    'compressed') lifts the limits: an exact format is then used however many exceptions it has."""
    N, K = w.shape
    try:
        z = pack_z(w)
    except ValueError as e:
        raise NoCompression(str(e))
    rate = z.n_exc / (N * K)
    chain = coop_chain(z, 1) if limits and z.capr > MAX_CAPR else 0
    if chain > MAX_CAPR:
        raise NoCompression(f"{z.capr} exceptions in one row and {chain} a lane in the cooperative walk > "
                             f"MAX_CAPR {MAX_CAPR} ({100 * rate:.3f}% of weights out of window)")
    if limits and rate > MAX_EXC_RATE:
        raise NoCompression(f"{100 * rate:.3f}% of weights out of window > {100 * MAX_EXC_RATE:.2f}%, the largest "
                             f"measured break-even of any shape and m (EXC_RATE_LIMITS_BY_SHAPE; capr {z.capr})")
    bad = verify_z(w, z, ext)
    if bad:
        raise NoCompression(f"decode check failed on the GPU: {bad}")
    return z
