"""Lab 7: window granularity for the 12-bit format (issue #29), measured bit for bit before any kernel is written.

    python labs/lab7_windows.py                   # every check, on small sizes (about 20 s on 2 cores), writes nothing
    python labs/lab7_windows.py --full            # + the full-size study (about 7 minutes on 2 cores), writes the JSON
    python labs/lab7_windows.py --full --out PATH # the same, JSON to PATH

The default run makes every check of the lab (each prints a `verified:` line and exits 1 on a mismatch): part 1,
part 2 on every generator with special values at 512x1024, part 2b at 1024x4096, the round trip of part 2 on the
study's own matrices at 256x2048, and part 3 (the study, whose rows must all be exact) on 256x2048 and 1024x4096
(a shape of the full study: its rows there are the full study's). --full adds the full-size study: the round trip
on the study's matrices at 2304x8192 (8 generators x 7 (granularity, kind): the longest part), part 3 on all 6
shapes (8 generators x 6 shapes x 15), the table at 4096x8192 and 8192x2048, the conclusion on those shapes, and
results/format-study-2026-12-01.json (or --out).

The study is of the table-lookup format shipped until session 17: a code word's nibble j holds the 3-bit index of
fragment element j into a window of 8 classes (any 8, looked up with prmt from two words TL, TH), the signs sit at
ZSIGN_BIT, and a window whose exceptions are not all exact retries with class 0 in it (the zero-class form). "matrix"
granularity is that format as shipped (one window per matrix). The format shipped now (labs/lab3_compress.py,
FINDINGS.md section 8.4) is a window per row, contiguous 8 classes (zbase[r] .. zbase[r] + 7), no zero-class form, and
exactness by moving a row's window rather than retrying with class 0: the "row" granularity with "contiguous"
windows below minus the zero form (tests/test_lab7.py compares the two where they should agree). This file keeps its
own copies of the table-lookup decoder (decz with TL / TH, lop3_or_and, decz_group, choose_window, ZSIGN_BIT), which
lab3 no longer has.

Part 1 checks the decoders: the table-lookup decz with one TL/TH per 16-row block (numpy broadcasting, the same
constants), decz_rows (one window per row: a lane's fragment holds rows g and g + 8, so two table lookups and a byte
merge), and the contiguous window's words (TL/TH from one base class by one multiply-add). Part 2 packs every
generator, with special values injected, at each granularity (the stream layout is the table-lookup pack_z's; only
the window words change), decodes with decz (per block) or decz_rows (per row), applies the CSR corrections and
compares with W bit for bit (NaN == NaN, -0 != +0: this file's same_bits). It also
checks that the histogram accounting of part 3 (exceptions per row, inexact exceptions) equals the element-by-element
count of the packer. Part 3 is the study: 8 weight generators x 6 shapes x 6 granularities x 2 window kinds:
exception rate, the most exceptions in a row and in a 16-row block, bits per weight (12 + windows + side table),
with a table and the conclusion (--full: written to results/format-study-2026-12-01.json). The stream is built and
decoded for all 32 lanes at once (a lane axis in the arrays, FRAG_ROW / FRAG_K; tests/test_lab7.py checks it
against a lane-by-lane loop).
Imports lab3 for what the two formats share (prmt, frag_pos, lane_units, restore_np, f32_of_bf16,
trained_like_np); no torch, no submission.py.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

from labkit import check
import lab3_compress as lab3

USAGE = __doc__[__doc__.index("    python"):__doc__.index("\n\nThe default run")]


# %% Motivation ------------------------------------------------------------------------------------
# The 12-bit format as shipped until session 17 (FINDINGS 8.2) kept a bf16's low byte and its sign, and stored its
# class (bits 14..8, e7..e1: a factor-4 range of magnitudes) as a 3-bit index into ONE window of 8 classes per
# matrix. 8 classes are 16 binades: enough for one Gaussian-like distribution, not for rows whose scales differ by
# 2**8 (per-channel scales or norms folded into W): `randn * 0.02 * 2**u`, u ~ U[-4, 4] per row, puts about 0.35% of
# the weights out of the window and prepare refused it (MAX_EXC_RATE 0.2%). Issue #29: windows per row block or per
# row, side table and windows together within 12.05 bits per weight, <= 0.05% exceptions on row-scaled weights, and
# nothing lost on Gaussian / trained-like weights. This lab measures every granularity on the same weights before a
# kernel exists.
#
# Bits per weight = 12 (stream) + window bits / (N K) + side table (64 per exception + 32 per row pointer, N + 1 of
# them: submission.side_table_bits until session 17; it now also counts the per-row format's 8-bit zbase, which
# this study counts as window bits) / (N K). Window bits per group: 8 classes x 7 bits = 56 ("top8"; the kernel
# loads them as two 32-bit words TL / TH, 64 bits); "contiguous": one base class (7 bits) + one flag bit for the
# class-0 variant (below) = 8 bits. The sorted row orders also pay a 32-bit output row index per row (rowmap).
#
# "matrix" is the format submission.pack_z shipped until session 17 (one window per matrix). What ships now came out
# of this study's "row contiguous" row: one contiguous window per row (8 bits), without the class-0 form, exceptions
# made exact by moving the row's window instead (labs/lab3_compress.py, FINDINGS 8.4). Commit 34e5d9f (made while
# this lab was written) gave every 16-row block its own window and sorted the rows by their most common class where
# that halves the exceptions (its pack_z / compress / row_order / format_bits): the granularity "block16_autosort"
# below.

U32 = np.uint32
OUT_DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                           "format-study-2026-12-01.json")
TARGET_RATE = 0.0005          # issue #29: <= 0.05% exceptions on row-scaled weights
TARGET_BITS = 12.05           # ... with windows and side table within 12.05 bits per weight
WINDOW_BITS = {"top8": 56, "contiguous": 8}
RT_SHAPE = (2304, 8192)                                  # --full: full-size pack + decode of the study's own matrices
RT_SHAPE_SMALL = (256, 2048)                             # default: the same round trip on a default study shape
RT_GRANS = ("matrix", "block16", "block16_autosort", "row")
PART2_SHAPE = (512, 1024)                                # part 2 with special values (default and --full alike)


# %% The table-lookup decoder (lab3's until session 17; lab3 now decodes the per-row contiguous format) -------------
# Code word nibble j (bits 4j .. 4j + 2) = element j's window index; its sign at ZSIGN_BIT[j]. The kernel looked
# the class byte up with prmt from TL (window entries 0..3) and TH (4..7) and or-ed the sign in with one lop3.
ZSIGN_BIT = (7, 15, 23, 31, 3, 11, 19, 27)   # code-word bit of the sign of fragment element j (this format)


def lop3_or_and(a, b, c):
    """lop3.b32 with truth table 0xF8: a | (b & c)."""
    a, b, c = (np.asarray(v, dtype=U32) for v in (a, b, c))
    return a | (b & c)


def decz(lo0, lo1, c, TL, TH):
    """One A fragment (registers x, y, z, w; element j in register j >> 1, half j & 1) from the low bytes of
    j0..j3 (lo0) and j4..j7 (lo1), the code word c and the window words TL, TH: the table-lookup decoder's
    constants (0x7777, 0x80808080, >> 16, << 4; the byte interleave 0x5140 / 0x7362 is lab3's)."""
    c = np.asarray(c, dtype=U32)
    h0 = lop3_or_and(lab3.prmt(TL, TH, c & U32(0x7777)), c, U32(0x80808080))                # classes + signs j0..j3
    h1 = lop3_or_and(lab3.prmt(TL, TH, (c >> U32(16)) & U32(0x7777)), c << U32(4), U32(0x80808080))   # j4..j7
    return (lab3.prmt(lo0, h0, 0x5140), lab3.prmt(lo0, h0, 0x7362),
            lab3.prmt(lo1, h1, 0x5140), lab3.prmt(lo1, h1, 0x7362))


def decz_group(A0, A1, B, TL, TH):
    """The 4 fragments of a lane's 64-wide group (units A0, A1 = low bytes, B = code words), table-lookup decz."""
    return [decz(A0[..., 0], A0[..., 1], B[..., 0], TL, TH), decz(A0[..., 2], A0[..., 3], B[..., 1], TL, TH),
            decz(A1[..., 0], A1[..., 1], B[..., 2], TL, TH), decz(A1[..., 2], A1[..., 3], B[..., 3], TL, TH)]


def choose_window(hist, with_zero):
    """The 8 most frequent classes of a class histogram (ties to the smaller class), ascending; with_zero forces
    class 0 in (the zero-class retry). top8_windows below is this, vectorised over groups."""
    order = [int(c) for c in np.argsort(-np.asarray(hist), kind="stable")]
    chosen = [0] + [c for c in order if c != 0][:7] if with_zero else order[:8]
    return sorted(chosen)


def same_bits(a, b):
    """Bitwise equality of bf16 arrays, except that two NaNs count as equal (this format's acceptance rule). Stricter
    than lab3.same_bits, which also takes -0 for +0 (the per-row format decodes an exceptional -0 as +0): this
    format keeps -0 (in window, or through the zero-class retry), so a -0 that comes back +0 is a failure here."""
    a, b = np.asarray(a, np.uint16), np.asarray(b, np.uint16)
    nan = lambda u: ((u & 0x7F80) == 0x7F80) & ((u & 0x7F) != 0)
    return (a == b) | (nan(a) & nan(b))


# %% Weight generators (seeded; bf16 bit patterns, uint16 [N, K]) --------------------------------------------
def bf16_of_f32(f):
    """float32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(f, np.float32).view(U32)
    return ((u + U32(0x7FFF) + ((u >> U32(16)) & U32(1))) >> U32(16)).astype(np.uint16)


def _gauss(rng, N, K):
    return rng.standard_normal((N, K), dtype=np.float32) * np.float32(0.02)


def gen_gaussian(N, K, rng):
    return bf16_of_f32(_gauss(rng, N, K))


def gen_trained(N, K, rng):
    """lab3's trained-like weights (judge.trained_like's recipe in numpy: per-row scale 0.02 exp(N(0, 0.1)),
    Student-t 6 dof at unit variance, about 1e-4 exact zeros)."""
    return lab3.trained_like_np(N, K, seed=int(rng.integers(2 ** 31)))


def _row_scaled(span):
    def gen(N, K, rng):
        w = _gauss(rng, N, K)
        w *= np.exp2(rng.uniform(-span, span, (N, 1))).astype(np.float32)
        return bf16_of_f32(w)
    gen.__doc__ = f"randn * 0.02 * 2**u, u ~ U[-{span}, {span}] per row (folded per-channel scales)"
    return gen


def gen_student_t3(N, K, rng):
    return bf16_of_f32((rng.standard_t(3, (N, K)) * 0.02).astype(np.float32))


def gen_pruned(N, K, rng):
    w = _gauss(rng, N, K)
    w[rng.random((N, K), dtype=np.float32) < 0.5] = 0.0
    return bf16_of_f32(w)


def gen_col_outliers(N, K, rng):
    w = _gauss(rng, N, K)
    w[:, rng.choice(K, max(1, K // 100), replace=False)] *= np.float32(20.0)
    return bf16_of_f32(w)


def gen_block_scaled(N, K, rng):
    w = _gauss(rng, N, K)
    u = rng.uniform(-4, 4, (N + 63) // 64)
    w *= np.repeat(np.exp2(u).astype(np.float32), 64)[:N, None]
    return bf16_of_f32(w)


GENERATORS = {
    "gaussian": gen_gaussian,              # randn * 0.02
    "trained_like": gen_trained,           # lab3.trained_like_np
    "row_scaled_4": _row_scaled(4),        # u ~ U[-4, 4] per row
    "row_scaled_2": _row_scaled(2),        # u ~ U[-2, 2] per row
    "student_t3": gen_student_t3,          # 0.02 * t(3 dof)
    "pruned_50": gen_pruned,               # 50% exact +0, the rest randn * 0.02
    "col_outliers": gen_col_outliers,      # randn * 0.02, 1% of the K columns x 20
    "block_scaled_64": gen_block_scaled,   # each 64-row group x 2**u, u ~ U[-4, 4]
}
SCORED_SHAPES = [(2304, 8192), (8192, 2048), (4096, 8192), (8192, 4096)]
OTHER_SHAPES = [(14336, 4096), (1024, 4096)]
SMALL_SHAPES = [(256, 2048), (1024, 4096)]    # the default run's study shapes (1024x4096 is also a --full shape)
SPECIALS = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x0040, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0,
            0x7F81, 0x7F7F, 0xFF7F]   # +-0, subnormals, min normal, +-Inf, quiet / signalling NaN, +-max finite


def make_weights(name, N, K, seed=0):
    """Generator `name` at [N, K]; the seed is derived from (name, N, K, seed), so every row of the study is
    reproducible on its own."""
    key = [sum(map(ord, name)), len(name), N, K, seed]
    return GENERATORS[name](N, K, np.random.default_rng(key))


def with_specials(W, seed=0, copies=4):
    """W with `copies` of every special value at random positions (the rows of the check in part 2)."""
    W = W.copy()
    pos = np.random.default_rng(seed + 11).choice(W.size, copies * len(SPECIALS), replace=False)
    W.reshape(-1)[pos] = np.array(SPECIALS * copies, np.uint16)
    return W


# %% Layout: groups of rows and their windows ---------------------------------------------------------------
# A granularity assigns every row to a group; the group's class histogram picks its window. Groups are consecutive
# rows (rows_per_group 0 = the whole matrix, submission.pack_z until session 17; 128 / 64 = a tile; 16 = the
# kernel's row block; 1 = a row) or consecutive rows of a permutation (the kernel writes packed row i to output row
# order[i]: 34e5d9f's rowmap): block16_sorted sorts the rows by their most common class (34e5d9f's row_order key),
# block16_sorted_mean by their mean class over classes >= 1 (a finer key). block16_autosort is 34e5d9f's compress
# rule: block16, and block16_sorted where the own order leaves more than SORT_ABOVE_RATE of the weights out of window
# and sorting keeps at most SORT_GAIN of the exceptions (top8 windows only).
GRANULARITIES = (("matrix", 0), ("tile128", 128), ("tile64", 64), ("block16", 16), ("block16_sorted", 16),
                 ("block16_sorted_mean", 16), ("block16_autosort", 16), ("row", 1))
KINDS = ("top8", "contiguous")
SORTED = {"block16_sorted": "mode", "block16_sorted_mean": "mean"}
SORT_ABOVE_RATE = 0.0002      # 34e5d9f's SORT_ABOVE_RATE
SORT_GAIN = 0.5               # 34e5d9f's SORT_GAIN


def kinds_of(gran):
    return ("top8",) if gran == "block16_autosort" else KINDS


def classes(W):
    return ((np.asarray(W, np.uint16) >> 8) & 0x7F).astype(np.uint8)


def row_hist(cls):
    """[N, 128] int64: how many weights of each class every row holds."""
    N, K = cls.shape
    out = np.empty((N, 128), np.int64)
    step = max(1, (1 << 22) // K)
    for r0 in range(0, N, step):
        c = cls[r0:r0 + step]
        n = c.shape[0]
        flat = (np.arange(n, dtype=np.int64)[:, None] * 128 + c).ravel()
        out[r0:r0 + n] = np.bincount(flat, minlength=n * 128).reshape(n, 128)
    return out


def row_order(rowhist, key="mode"):
    """The sorted granularities' permutation (packed row i is W's row order[i]), stable. "mode": by each row's most
    common class, ties to the smaller class (34e5d9f's row_order: torch.mode); "mean": by its mean class over the
    classes >= 1 (exact zeros ignored)."""
    if key == "mode":
        return np.argsort(np.argmax(rowhist, axis=1), kind="stable")
    c = np.arange(128)
    n = rowhist[:, 1:].sum(1)
    mean = (rowhist[:, 1:] * c[1:]).sum(1) / np.maximum(n, 1)
    return np.argsort(mean, kind="stable")


def group_of_row(N, rows_per_group, order=None):
    """[N] group index of every row (in W's row order)."""
    if rows_per_group == 0:
        return np.zeros(N, np.int64)
    pos = np.arange(N) if order is None else np.argsort(order)     # packed position of each row
    return pos // rows_per_group


def group_hist(rowhist, grp):
    G = int(grp.max()) + 1
    out = np.zeros((G, 128), np.int64)
    np.add.at(out, grp, rowhist)
    return out


def top8_windows(ghist, with_zero):
    """[G, 8] ascending: the 8 most common classes of each group, ties to the smaller class (choose_window above,
    vectorised; submission.zwindow until session 17); with_zero forces class 0 in (first in a stable order, the
    others unchanged)."""
    key = -ghist.astype(np.int64)
    if with_zero:
        key[:, 0] = np.iinfo(np.int64).min
    return np.sort(np.argsort(key, axis=1, kind="stable")[:, :8], axis=1)


def contiguous_windows(ghist, with_zero, zero_form=True):
    """[G, 8] ascending, and [G] flags: a run of 8 consecutive classes b..b+7 (b <= 120), or, flag set, class 0 plus
    a run of 7 (b..b+6, 1 <= b <= 121). Without with_zero the form holding more weights wins (ties: the plain run;
    the plain run holds the mode unless the mode is class 0, as in pruned weights); within a form the run holding
    the most weights, ties to the smaller base. with_zero (the exactness retry) forces the class-0 form.
    zero_form=False (not used by the study) never takes the class-0 form: the plain run holding the most weights,
    which is the first window the per-row format shipped now tries (lab3.pack_z_np; tests/test_lab7.py)."""
    if with_zero and not zero_form:
        raise ValueError("with_zero forces the class-0 form, which zero_form=False excludes")
    G = ghist.shape[0]
    cs = np.concatenate([np.zeros((G, 1), np.int64), np.cumsum(ghist, axis=1)], axis=1)   # cs[b] = sum h[:b]
    run8 = cs[:, 8:129] - cs[:, 0:121]                        # b = 0..120
    run7 = ghist[:, :1] + cs[:, 8:129] - cs[:, 1:122]         # b = 1..121: h[0] + h[b:b+7]
    b8, b7 = np.argmax(run8, axis=1), np.argmax(run7, axis=1) + 1
    zero = np.ones(G, bool) if with_zero else (run7.max(1) > run8.max(1)) & zero_form
    win = np.where(zero[:, None], np.concatenate([np.zeros((G, 1), np.int64), b7[:, None] + np.arange(7)], axis=1),
                   b8[:, None] + np.arange(8))
    return win, zero


def choose_windows(ghist, kind, with_zero):
    if kind == "top8":
        return top8_windows(ghist, with_zero)
    return contiguous_windows(ghist, with_zero)[0]


def membership(win):
    """[G, 128] bool: class c in group g's window."""
    m = np.zeros((win.shape[0], 128), bool)
    np.put_along_axis(m, win, True, axis=1)
    return m


def window_words(win):
    """TL, TH (uint32 [G]) of each window, as the kernel's decz takes them: entry i in byte i & 3 of TL (i < 4)
    or TH."""
    w = win.astype(U32)
    TL = w[:, 0] | w[:, 1] << U32(8) | w[:, 2] << U32(16) | w[:, 3] << U32(24)
    TH = w[:, 4] | w[:, 5] << U32(8) | w[:, 6] << U32(16) | w[:, 7] << U32(24)
    return TL, TH


def contiguous_words(base, zero):
    """TL, TH of a contiguous window from its base class by one multiply-add each (what a kernel storing one byte
    per group would compute): b..b+7, or (zero) 0, b..b+6."""
    b = np.asarray(base, U32)
    TL = np.where(zero, b * U32(0x01010100) + U32(0x02010000), b * U32(0x01010101) + U32(0x03020100)).astype(U32)
    TH = np.where(zero, b * U32(0x01010101) + U32(0x06050403), b * U32(0x01010101) + U32(0x07060504)).astype(U32)
    return TL, TH


# %% Emulation: the exception value and its exactness -----------------------------------------------------------
# An exception decodes to v: +0 when the group's window holds class 0 (it is then window entry 0: windows are
# ascending), else the window's smallest class with W's sign and low byte 0; c = fl32(W - v) goes to the side table
# and must give fl32(v + c) == W bit for bit (NaN == NaN: this format's rule; a signalling NaN's payload comes back
# quiet; -0 must stay -0).
# A group with an inexact exception retries with class 0 forced in (v = +0, c = W: always exact, since -0 is then
# in the window), as pack_z did for the whole matrix until session 17 (the per-row format shipped now has no class-0
# form: it moves a row's window until its exceptions are exact, and takes a -0 back as +0).
#
# FAIL[m, w] says whether bf16 w, as an exception of a group whose window starts at class m (v = sign(w) | m << 8),
# is inexact; row 128 is v = +0. It is exhaustive over the 65536 bf16 values, so counting FAIL over a group's
# exceptions checks every one of them. RISKY[m, c]: some w of class c fails against m (most classes never do).
def _fail_table():
    w = np.arange(65536, dtype=U32)
    wf = (w << U32(16)).view(np.float32)
    vb = np.concatenate([(w & U32(0x8000))[None, :] | (np.arange(128, dtype=U32)[:, None] << U32(8)),
                         np.zeros((1, 65536), U32)], axis=0)
    vf = (vb << U32(16)).view(np.float32)
    with np.errstate(all="ignore"):
        c = (wf[None, :] - vf).astype(np.float32)
        back = (vf + c).astype(np.float32)
    same = (back.view(U32) == wf.view(U32)[None, :]) | (np.isnan(back) & np.isnan(wf)[None, :])
    return ~same


FAIL = _fail_table()                                                    # [129, 65536]
RISKY = FAIL.reshape(129, 2, 128, 256).any(axis=(1, 3))                 # [129, 128] by (v row, class)


def v_row(win):
    """FAIL's row for each group: 128 (v = +0) when class 0 is in the window, else the window's smallest class."""
    return np.where(win[:, 0] == 0, 128, win[:, 0])


def count_inexact(W, cls, rowhist, grp, win):
    """[G]: exceptions whose v + c is not W, per group. Only rows that hold a weight of a RISKY out-of-window class
    are read element by element."""
    inwin = membership(win)
    vr = v_row(win)
    risky = RISKY[vr] & ~inwin                                          # [G, 128]
    rows = np.nonzero((rowhist * risky[grp]).sum(1) > 0)[0]
    bad = np.zeros(win.shape[0], np.int64)
    for i in range(0, rows.size, 256):
        r = rows[i:i + 256]
        g = grp[r]
        exc = ~np.take_along_axis(inwin[g], cls[r].astype(np.intp), axis=1)
        f = FAIL[vr[g][:, None], W[r]] & exc
        bad += np.bincount(g, weights=f.sum(1), minlength=win.shape[0]).astype(np.int64)
    return bad


def analyze(W, gran, kind, cls=None, rowhist=None):
    """One study row: windows per group (with the per-group class-0 retry), the exceptions they leave, and their
    cost. Exceptions per row come from the row histograms (no pass over W), exactness from FAIL (see above)."""
    N, K = W.shape
    cls = classes(W) if cls is None else cls
    rowhist = row_hist(cls) if rowhist is None else rowhist
    if gran == "block16_autosort":                                # 34e5d9f's compress: the one or the other
        a = analyze(W, "block16", kind, cls, rowhist)
        if a["exception_rate"] > SORT_ABOVE_RATE:
            b = analyze(W, "block16_sorted", kind, cls, rowhist)
            if b["n_exc"] <= SORT_GAIN * a["n_exc"]:
                return dict(b, rows_sorted=True)
        return dict(a, rows_sorted=False)
    rpg = dict(GRANULARITIES)[gran]
    order = row_order(rowhist, SORTED[gran]) if gran in SORTED else np.arange(N)
    grp = group_of_row(N, rpg, order if gran in SORTED else None)
    ghist = group_hist(rowhist, grp)
    win = choose_windows(ghist, kind, False)
    n_first = int((rowhist * ~membership(win)[grp]).sum())
    bad0 = count_inexact(W, cls, rowhist, grp, win)
    retry = bad0 > 0
    if retry.any():
        win[retry] = choose_windows(ghist[retry], kind, True)
    bad = count_inexact(W, cls, rowhist, grp, win)
    inwin = membership(win)
    per_row = (rowhist * ~inwin[grp]).sum(1)
    n_exc = int(per_row.sum())
    G = win.shape[0]
    packed = per_row[order]
    blk = np.add.reduceat(packed, np.arange(0, N, 16))
    side = (64 * n_exc + 32 * (N + 1)) / (N * K)
    wbits = G * WINDOW_BITS[kind] / (N * K)
    perm = 32 * N / (N * K) if gran in SORTED else 0.0
    return dict(groups=G, win=win, grp=grp, order=order, per_row=per_row, n_exc=n_exc,
                exception_rate=n_exc / (N * K), exception_rate_first_try=n_first / (N * K),
                max_exc_row=int(per_row.max()), max_exc_block16=int(blk.max()),
                side_bits=side, window_bits=wbits, perm_bits=perm, bits_per_weight=12 + side + wbits + perm,
                bits_per_weight_tlth=12 + side + perm + (G * 64 / (N * K) if kind == "top8" else wbits),
                zero_class_groups=int((win[:, 0] == 0).sum()), retried_groups=int(retry.sum()),
                inexact_8class=int(bad0.sum()), inexact=int(bad.sum()), rows_sorted=gran in SORTED)


# %% Emulation: pack and unpack (the table-lookup stream, a window per group) --------------------------------
# Where lane's fragment f, element j sits in its (16-row block, 64-wide group): lab3.frag_pos for all 32 x 4 x 8 at
# once, so that the stream is built and decoded for every lane together (one numpy call per PTX step instead of 32).
LANES = np.arange(32)
FRAG_ROW, FRAG_K = (np.array([[[lab3.frag_pos(lane, f, j)[i] for j in range(8)] for f in range(4)] for lane in LANES])
                    for i in (0, 1))                                        # [32 lanes, 4 fragments, 8 elements]
assert np.array_equal(np.sort((16 * FRAG_K + FRAG_ROW).ravel()), np.arange(1024))   # each (row, k) exactly once


def build_stream(idx, sgn, lo):
    """The table-lookup format's stream (lab3.pack_z_np's loop until session 17: index in nibble j, sign at
    ZSIGN_BIT) from per-weight window index, sign and low byte (uint32 [N, K]):
    uint8 [N/16, K/64, 1536]. The layout does not depend on the window, so every granularity shares it.
    Per (block, group): 16-byte unit 32 (f >> 1) + lane, bytes 8 (f & 1) + j = the low byte of lane's fragment f,
    element j (units A0, A1); unit 64 + lane, bytes 4f .. 4f + 3 = fragment f's code word (unit C), little-endian.
    All lanes at once (FRAG_ROW / FRAG_K); the loop over lanes, fragments and elements it replaces is the same
    assignment element by element."""
    N, K = idx.shape
    RB, KG = N // 16, K // 64
    idx4, sgn4, lo4 = (a.reshape(RB, 16, KG, 64) for a in (idx, sgn, lo))
    stream = np.zeros((RB, KG, 96, 16), np.uint8)
    # A0 / A1: unit u = 32 (f >> 1) + lane, byte b = 8 (f & 1) + j
    u, b = np.arange(64)[:, None], np.arange(16)[None, :]
    lane, f, j = u & 31, 2 * (u >> 5) + (b >> 3), b & 7
    stream[:, :, :64, :] = lo4[:, FRAG_ROW[lane, f, j], :, FRAG_K[lane, f, j]].transpose(2, 3, 0, 1)   # [64,16,RB,KG]
    # C: fragment f's code word (index in nibble j, sign at ZSIGN_BIT[j]) in bytes 4f .. 4f + 3 of unit 64 + lane
    sh_i = (4 * np.arange(8)).astype(U32)[:, None, None]
    sh_s = np.array(ZSIGN_BIT, U32)[:, None, None]
    word = np.zeros((32, 4, RB, KG), U32)
    for j in range(8):
        r, k = FRAG_ROW[:, :, j], FRAG_K[:, :, j]                         # [32, 4]
        word |= (idx4[:, r, :, k] << sh_i[j]) | (sgn4[:, r, :, k] << sh_s[j])
    for byte in range(4):
        stream[:, :, 64:, byte::4] = ((word >> U32(8 * byte)) & U32(0xFF)).transpose(2, 3, 0, 1)
    return stream.reshape(RB, KG, 1536)


def pack_groups_np(W, gran="block16", kind="top8"):
    """W (bf16 bits [N, K]) -> dict(stream, TL, TH (per group), grp, win, eptr, esc, n_exc, bad, ...).
    Exceptions are found and checked element by element here (fl32(v + c) == W), independently of analyze()."""
    W = np.asarray(W, np.uint16)
    N, K = W.shape
    if N % 16 or K % 64:
        raise ValueError(f"pack needs N % 16 == 0 and K % 64 == 0, got N={N}, K={K}")
    if gran in SORTED or gran == "block16_autosort":
        raise ValueError(f"pack {gran} as pack_groups_np(W[order], 'block16'): see roundtrip_np")
    a = analyze(W, gran, kind)
    grp, win = a["grp"], a["win"]
    G = win.shape[0]
    lut = np.full((G, 128), -1, np.int64)
    np.put_along_axis(lut, win, np.arange(8)[None, :].repeat(G, 0), axis=1)
    bits = W.astype(U32)
    cls = (bits >> U32(8)) & U32(0x7F)
    sgn, lo = bits >> U32(15), bits & U32(0xFF)
    idx = np.take_along_axis(lut[grp], cls.astype(np.intp), axis=1)
    exc = idx < 0
    zero = win[:, 0] == 0                                    # v = +0 (window entry 0 is class 0)
    er, ek = np.nonzero(exc)                                 # row-major: the CSR order
    g = grp[er]
    v_bits = np.where(zero[g], U32(0), (sgn[er, ek] << U32(15)) | (win[g, 0].astype(U32) << U32(8))).astype(U32)
    vf, target = lab3.f32_of_bf16(v_bits), lab3.f32_of_bf16(W[er, ek])
    with np.errstate(all="ignore"):
        corr = (target - vf).astype(np.float32)
        back = (vf + corr).astype(np.float32)
    ok = (back.view(U32) == target.view(U32)) | (np.isnan(back) & np.isnan(target))
    # the exception's stream entry: window index 0 (v's class in both modes), v's sign, low byte 0
    idx = np.where(exc, 0, idx).astype(U32)
    sgn = np.where(exc, np.where(zero[grp][:, None], U32(0), sgn), sgn).astype(U32)
    lo = np.where(exc, U32(0), lo).astype(U32)
    counts = np.bincount(er, minlength=N)
    eptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    esc = np.zeros((max(er.size, 1), 2), np.int32)
    esc[:er.size, 0] = ek
    esc[:er.size, 1] = corr.view(np.int32)
    TL, TH = window_words(win)
    return dict(stream=build_stream(idx, sgn, lo), TL=TL, TH=TH, grp=grp, win=win, eptr=eptr, esc=esc,
                n_exc=int(er.size), bad=int((~ok).sum()), counts=counts, analysis=a)


def decz_rows(lo0, lo1, c, TLa, THa, TLb, THb):
    """decz with one window per row: elements j0, j1, j4, j5 of a fragment are row g (window a), j2, j3, j6, j7 row
    g + 8 (window b). Each half looks up both tables and merges bytes {a0, a1, b2, b3} (prmt 0x7610): 4 more prmt
    per fragment than decz's 6."""
    c = np.asarray(c, dtype=U32)
    s0, s1 = c & U32(0x7777), (c >> U32(16)) & U32(0x7777)
    h0 = lop3_or_and(lab3.prmt(lab3.prmt(TLa, THa, s0), lab3.prmt(TLb, THb, s0), 0x7610), c, U32(0x80808080))
    h1 = lop3_or_and(lab3.prmt(lab3.prmt(TLa, THa, s1), lab3.prmt(TLb, THb, s1), 0x7610), c << U32(4),
                     U32(0x80808080))
    return (lab3.prmt(lo0, h0, 0x5140), lab3.prmt(lo0, h0, 0x7362),
            lab3.prmt(lo1, h1, 0x5140), lab3.prmt(lo1, h1, 0x7362))


def _scatter_frags(frags, RB, KG):
    """The 4 decoded fragments of every lane (frags[f][reg]: uint32 [RB, KG, 32 lanes]) to bf16 bits [RB, 16, KG, 64]:
    element j of fragment f (half j & 1 of register j >> 1) is lane's (FRAG_ROW, FRAG_K). Every (row, k) of a block's
    group is written exactly once (the 32 x 4 x 8 positions are a permutation of the 16 x 64)."""
    F = np.stack([np.stack(fr) for fr in frags])                            # [4 f, 4 reg, RB, KG, 32]
    H = np.stack([(F[:, j >> 1] >> U32(16 * (j & 1))) & U32(0xFFFF) for j in range(8)], axis=1)   # [4, 8, RB, KG, 32]
    out = np.zeros((RB, 16, KG, 64), np.uint16)
    out[:, FRAG_ROW, :, FRAG_K] = H.transpose(4, 0, 1, 2, 3)               # [32, 4, 8, RB, KG]
    return out


def unpack_np(z, N, K):
    """Decode z's stream to bf16 bits [N, K] (exceptions still at v). Groups of >= 16 rows (or the matrix): the
    table-lookup decz with each 16-row block's own TL / TH (broadcast over the block's 64-wide groups); rows:
    decz_rows (lane (g, t) with the words of rows g and g + 8 of its block). Every lane decodes at once: a lane
    axis in the arrays instead of a loop over lanes; each lane's arithmetic is unchanged."""
    RB, KG = N // 16, K // 64
    grp = z["grp"]
    if z["win"].shape[0] == N and N > 1 and np.array_equal(grp, np.arange(N)):       # one window per row
        TLr, THr = z["TL"].reshape(RB, 16), z["TH"].reshape(RB, 16)
        gl = LANES >> 2
        ab = (TLr[:, None, gl], THr[:, None, gl], TLr[:, None, gl + 8], THr[:, None, gl + 8])   # [RB, 1, 32]
        A0, A1, B = lab3.lane_units(z["stream"], LANES)                    # [RB, KG, 32, 4] each
        frags = [decz_rows(A0[..., 0], A0[..., 1], B[..., 0], *ab),
                 decz_rows(A0[..., 2], A0[..., 3], B[..., 1], *ab),
                 decz_rows(A1[..., 0], A1[..., 1], B[..., 2], *ab),
                 decz_rows(A1[..., 2], A1[..., 3], B[..., 3], *ab)]
        return _scatter_frags(frags, RB, KG).reshape(N, K)
    gb = grp[::16]
    if not np.array_equal(np.repeat(gb, 16), grp):
        raise ValueError("groups must be whole 16-row blocks for decz")
    return unpack_blocks_np(z["stream"], N, K, z["TL"][gb], z["TH"][gb])


def unpack_blocks_np(stream, N, K, TLb, THb):
    """Decode the stream with the table-lookup decz, 16-row block rb with its own words TLb[rb], THb[rb] (broadcast
    over the block's 64-wide groups and its 32 lanes), to bf16 bits [N, K] (exceptions still at v)."""
    RB, KG = N // 16, K // 64
    TL, TH = np.asarray(TLb, U32)[:, None, None], np.asarray(THb, U32)[:, None, None]
    frags = decz_group(*lab3.lane_units(stream, LANES), TL, TH)           # every lane at once
    return _scatter_frags(frags, RB, KG).reshape(N, K)


def roundtrip_np(W, gran, kind):
    """pack, decode, apply v + c: (back, z); back == W bit for bit (NaN == NaN) when the format is lossless.
    The sorted granularities (and block16_autosort where it sorts) pack W[order] as block16 and put the decoded rows
    back (the kernel stores packed row i to output row order[i])."""
    N, K = W.shape
    if gran in SORTED or gran == "block16_autosort":
        a = analyze(W, gran, kind)
        if not a["rows_sorted"]:
            return roundtrip_np(W, "block16", kind)
        order = a["order"]
        back, z = roundtrip_np(W[order], "block16", kind)
        out = np.empty_like(back)
        out[order] = back
        z["order"] = order
        return out, z
    z = pack_groups_np(W, gran, kind)
    back = lab3.restore_np(unpack_np(z, N, K), z["eptr"], z["esc"])
    return back, z


# %% Check ---------------------------------------------------------------------------------------------
def part1():
    print("# Part 1: decoders with a window per block / per row")
    rng = np.random.default_rng(70)
    # decz with per-block TL / TH (broadcast) == decz block by block
    RBt, KGt = 6, 5
    wins = np.sort(np.stack([rng.choice(128, 8, replace=False) for _ in range(RBt)]), axis=1)
    TL, TH = window_words(wins)
    A = rng.integers(0, 2 ** 32, (3, RBt, KGt), dtype=np.uint64).astype(U32)
    got = decz(A[0], A[1], A[2], TL[:, None], TH[:, None])
    want = [np.stack([decz(A[0][b], A[1][b], A[2][b], TL[b], TH[b])[i] for b in range(RBt)]) for i in range(4)]
    check(all(np.array_equal(g, w) for g, w in zip(got, want)),
          "decz with one TL / TH per row block (broadcast) == decz block by block")
    # decz_rows: element j of a fragment takes row g's window (j & 2 == 0) or row g + 8's (j & 2 == 2)
    wa, wb = np.sort(rng.choice(128, 8, replace=False)), np.sort(rng.choice(128, 8, replace=False))
    (TLa,), (THa,) = window_words(wa[None])
    (TLb,), (THb,) = window_words(wb[None])
    ok = True
    for _ in range(300):
        wi, lob, sg = rng.integers(0, 8, 8), rng.integers(0, 256, 8), rng.integers(0, 2, 8)
        want = [(sg[j] << 15) | ((wb if j & 2 else wa)[wi[j]] << 8) | lob[j] for j in range(8)]
        c = sum(int(wi[j]) << (4 * j) | int(sg[j]) << ZSIGN_BIT[j] for j in range(8))
        lo0 = sum(int(lob[j]) << (8 * j) for j in range(4))
        lo1 = sum(int(lob[4 + j]) << (8 * j) for j in range(4))
        regs = [int(v) for v in decz_rows(lo0, lo1, c, TLa, THa, TLb, THb)]
        ok &= [(regs[j >> 1] >> (16 * (j & 1))) & 0xFFFF for j in range(8)] == [int(v) for v in want]
    check(bool(ok), "decz_rows (rows g and g + 8 with their own windows, merge prmt 0x7610) rebuilds 300 fragments")
    # contiguous windows: TL / TH from the base by one multiply-add
    base = np.arange(122)
    for zero in (False, True):
        b = base[1:] if zero else base[:121]
        win = np.concatenate([np.zeros((b.size, 1), np.int64), b[:, None] + np.arange(7)], 1) if zero \
            else b[:, None] + np.arange(8)
        tl, th = window_words(win)
        TLc, THc = contiguous_words(b, zero)
        check(np.array_equal(tl, TLc) and np.array_equal(th, THc),
              f"contiguous window{' with class 0' if zero else ''}: TL / TH = base x 0x01010101 + const "
              f"for all {b.size} bases")
    # the exactness table agrees with direct fp32 arithmetic on random (m, w) pairs
    m, w = rng.integers(0, 129, 20000), rng.integers(0, 65536, 20000).astype(U32)
    vb = np.where(m == 128, U32(0), (w & U32(0x8000)) | (m.astype(U32) << U32(8)))
    vf, wf = lab3.f32_of_bf16(vb), lab3.f32_of_bf16(w)
    with np.errstate(all="ignore"):
        back = (vf + (wf - vf).astype(np.float32)).astype(np.float32)
    direct = ~((back.view(U32) == wf.view(U32)) | (np.isnan(back) & np.isnan(wf)))
    check(np.array_equal(direct, FAIL[m, w]), "FAIL table (exhaustive fl32(v + c) != W) == direct fp32 on 20000 draws")
    print(f"  FAIL: {int(FAIL[:128].sum())} of 128 x 65536 (v class, W) pairs are inexact, "
          f"{int(FAIL[128].sum())} with v = +0 (W = -0 only); classes at risk per v class: "
          f"{int(RISKY[:128].sum(1).min())}..{int(RISKY[:128].sum(1).max())} of 128")


def part2(N=512, K=1024, grans=None, specials=True):
    print(f"\n# Part 2: pack + decode + corrections == W bit for bit, every generator"
          f"{' with special values' if specials else ' (the study matrices)'} ({N}x{K})")
    grans = grans or [g for g, _ in GRANULARITIES]
    results = {}
    for name in GENERATORS:
        W = with_specials(make_weights(name, N, K, seed=1)) if specials else make_weights(name, N, K)
        for gran in grans:
            for kind in kinds_of(gran):
                back, z = roundtrip_np(W, gran, kind)
                a = analyze(W, gran, kind)          # the study's accounting, on W in its own row order
                counts = z["counts"] if "order" not in z else z["counts"][np.argsort(z["order"])]
                exact = back == W
                same = same_bits(back, W)           # NaN == NaN only: -0 must come back -0
                quiet = int((~exact).sum())
                results[(name, gran, kind)] = bool(same.all()) and z["bad"] == 0
                check(z["bad"] == 0 and a["inexact"] == 0,
                      f"{name} {gran} {kind}: every exception's fl32(v + c) == W ({z['n_exc']} exceptions, "
                      f"{a['retried_groups']} of {a['groups']} groups retried with class 0"
                      f"{', rows sorted' if a['rows_sorted'] else ''})")
                check(np.array_equal(counts, a["per_row"]) and z["n_exc"] == a["n_exc"],
                      f"{name} {gran} {kind}: histogram accounting == element-by-element exceptions per row")
                check(bool(same.all()), f"{name} {gran} {kind}: decode + corrections == W bit for bit"
                      + (f" ({quiet} signalling NaN(s) come back quiet)" if quiet else ""))
    return results


def part2b():
    """One tiny weight forces a whole matrix into the zero-class window (submission.pack_z until session 17); a
    per-group retry confines it to the group."""
    print("\n# Part 2b: one tiny weight and the class-0 retry (OPEN.md #12: the judge's unpooler)")
    N, K, r, k, tiny = 1024, 4096, 517, 1234, 0x2E63     # 0x2E63 = 5.2e-11, the one inexact weight of the judge's
    W = make_weights("trained_like", N, K)               # unpooler (trained_like(8192, 4096, seed 1238))
    W2 = W.copy()
    W2[r, k] = tiny
    out = {}
    for gran in ("matrix", "block16", "row"):
        a0, a1 = analyze(W, gran, "top8"), analyze(W2, gran, "top8")
        out[gran] = (a0, a1)
        print(f"  {gran:>8} top8: {100 * a0['exception_rate']:.4f}% -> {100 * a1['exception_rate']:.4f}% with the "
              f"tiny weight ({a1['inexact_8class']} inexact in 8-class mode, {a1['retried_groups']} of "
              f"{a1['groups']} groups retried), {a0['bits_per_weight']:.4f} -> {a1['bits_per_weight']:.4f} bits")
    m0, m1 = out["matrix"]
    check(bool(FAIL[v_row(m0["win"])[0], tiny]) and m1["retried_groups"] == 1 and m1["zero_class_groups"] == 1,
          f"0x{tiny:04X} against v class {m0['win'][0, 0]}: W - v spans more than 24 bits, so a per-matrix window "
          f"retries with class 0 and its rate goes {100 * m0['exception_rate']:.4f}% -> "
          f"{100 * m1['exception_rate']:.4f}%")
    for gran in ("block16", "row"):
        g0, g1 = out[gran]
        check(g1["retried_groups"] <= 1 and g1["n_exc"] - g0["n_exc"] < m1["n_exc"] - m0["n_exc"],
              f"{gran}: at most the tiny weight's own group retries ({g1['retried_groups']}; its window starts at "
              f"class {g1['win'][g1['grp'][r], 0]}), +{g1['n_exc'] - g0['n_exc']} exception(s) against "
              f"+{m1['n_exc'] - m0['n_exc']} for the matrix")
    return out


ROW_FIELDS = ("exception_rate", "max_exc_row", "max_exc_block16", "bits_per_weight", "n_exc", "groups", "side_bits",
              "window_bits", "perm_bits", "bits_per_weight_tlth", "exception_rate_first_try", "zero_class_groups",
              "retried_groups", "inexact_8class", "rows_sorted")


def part3(shapes):
    n = sum(len(kinds_of(g)) for g, _ in GRANULARITIES)
    print(f"\n# Part 3: the study, {len(GENERATORS)} generators x {len(shapes)} shapes x {n} (granularity, window "
          f"kind)")
    rows = []
    t0 = time.time()
    for name in GENERATORS:
        for (N, K) in shapes:
            W = make_weights(name, N, K)
            cls = classes(W)
            rh = row_hist(cls)
            for gran, _ in GRANULARITIES:
                for kind in kinds_of(gran):
                    a = analyze(W, gran, kind, cls, rh)
                    row = dict(weights=name, shape=[N, K], granularity=gran, window_kind=kind,
                               exact=a["inexact"] == 0)
                    row.update({f: a[f] for f in ROW_FIELDS})
                    rows.append(row)
            del W, cls, rh
        print(f"  {name}: done ({time.time() - t0:.0f} s)")
    check(all(r["exact"] for r in rows), f"all {len(rows)} study rows: every exception's fl32(v + c) == W "
          "(after the per-group class-0 retry)")
    return rows, time.time() - t0


def _pick(rows, w, g, k, s):
    return next((r for r in rows if r["weights"] == w and tuple(r["shape"]) == tuple(s) and r["granularity"] == g
                 and r["window_kind"] == k), None)


def print_table(rows, shapes):
    grans = [g for g, _ in GRANULARITIES]
    for shape in shapes:
        print(f"\n  {shape[0]}x{shape[1]}: exception rate % / bits per weight (max exceptions per row, per 16-row "
              f"block); block16_autosort: * where it sorts the rows")
        for kind in KINDS:
            gk = [g for g in grans if kind in kinds_of(g)]
            print(f"  [{kind}]")
            print("  " + f"{'weights':<16}" + "".join(f"{g:>26}" for g in gk))
            for name in GENERATORS:
                cells = []
                for g in gk:
                    r = _pick(rows, name, g, kind, shape)
                    cells.append(f"{100 * r['exception_rate']:.4f}/{r['bits_per_weight']:.4f}"
                                 f"{'*' if g == 'block16_autosort' and r['rows_sorted'] else ''}"
                                 f" ({r['max_exc_row']},{r['max_exc_block16']})")
                print("  " + f"{name:<16}" + "".join(f"{c:>26}" for c in cells))


def conclude(rows):
    """Which granularity x kind meets <= 0.05% exceptions at <= 12.05 bits on row-scaled weights (every shape),
    and what it costs on Gaussian / trained-like weights against the per-matrix window (shipped until session 17) and
    against 34e5d9f's rule (block16_autosort)."""
    print("\n# Conclusion (issue #29's target: row-scaled weights <= 0.05% exceptions at <= 12.05 bits/weight)")
    shapes = sorted({tuple(r["shape"]) for r in rows})
    meets = []
    for g, _ in GRANULARITIES:
        for k in kinds_of(g):
            worst = [max(_pick(rows, w, g, k, s)[f] for s in shapes) for w in ("row_scaled_4", "row_scaled_2")
                     for f in ("exception_rate", "bits_per_weight")]
            ok = worst[0] <= TARGET_RATE and worst[1] <= TARGET_BITS and worst[2] <= TARGET_RATE \
                and worst[3] <= TARGET_BITS
            if ok:
                meets.append((g, k))
            cost = {ref: [max(_pick(rows, w, g, k, s)["bits_per_weight"] - _pick(rows, w, ref, "top8", s)
                              ["bits_per_weight"] for s in shapes) for w in ("gaussian", "trained_like")]
                    for ref in ("matrix", "block16_autosort")}
            allw = max(_pick(rows, w, g, k, s)["bits_per_weight"] for w in GENERATORS for s in shapes)
            allr = max(_pick(rows, w, g, k, s)["exception_rate"] for w in GENERATORS for s in shapes)
            print(f"  {g:>19} {k:<10}: row-scaled U[-4,4] worst {100 * worst[0]:.4f}% / {worst[1]:.4f} bits, "
                  f"U[-2,2] {100 * worst[2]:.4f}% / {worst[3]:.4f}; bits over matrix / autosort: gaussian "
                  f"{cost['matrix'][0]:+.4f} / {cost['block16_autosort'][0]:+.4f}, trained-like "
                  f"{cost['matrix'][1]:+.4f} / {cost['block16_autosort'][1]:+.4f}; worst generator "
                  f"{100 * allr:.3f}% / {allw:.4f} bits"
                  + ("   <- meets the target" if ok else ""))
    return meets


def summarize(rows, meets):
    """The printed conclusion (also stored in the JSON): what meets the target, what it costs where one window per
    matrix already works, and how often a per-matrix window falls back to the zero-class window."""
    shapes = sorted({tuple(r["shape"]) for r in rows})
    lines = [f"meets <= {100 * TARGET_RATE:.2f}% at <= {TARGET_BITS} bits/weight on row-scaled weights (U[-4,4] and "
             f"U[-2,2]) on all {len(shapes)} shapes: " + (", ".join(f"{g} {k}" for g, k in meets) or "none")]
    for g, k in meets:
        d = {(w, ref): [_pick(rows, w, g, k, s)["bits_per_weight"] - _pick(rows, w, ref, "top8", s)["bits_per_weight"]
                        for s in shapes]
             for w in ("gaussian", "trained_like") for ref in ("matrix", "block16_autosort")}
        rs = [_pick(rows, w, g, k, s)["exception_rate"] for w in ("row_scaled_4", "row_scaled_2") for s in shapes]
        span = {key: f"{min(v):+.4f}..{max(v):+.4f}" for key, v in d.items()}
        lines.append(f"  {g} {k}: row-scaled {100 * min(rs):.4f}..{100 * max(rs):.4f}%; bits/weight against the "
                     f"per-matrix window: gaussian {span['gaussian', 'matrix']}, trained-like "
                     f"{span['trained_like', 'matrix']}; against block16_autosort: gaussian "
                     f"{span['gaussian', 'block16_autosort']}, trained-like {span['trained_like', 'block16_autosort']}")
    if meets:
        best = min(meets, key=lambda m: max(_pick(rows, w, m[0], m[1], s)["bits_per_weight"]
                                            for w in ("gaussian", "trained_like") for s in shapes))
        lines.append(f"cheapest in bits on gaussian / trained-like among those: {best[0]} {best[1]}")
    zc = [r for r in rows if r["granularity"] == "matrix" and r["window_kind"] == "top8" and r["retried_groups"]]
    lines.append(f"a per-matrix top8 window (shipped until session 17) retries with class 0 (one or two inexact "
                 f"tiny weights) on {len(zc)} of {len(GENERATORS) * len(shapes)} matrices: " + ", ".join(
                     f"{r['weights']} {r['shape'][0]}x{r['shape'][1]} {100 * r['exception_rate_first_try']:.4f}%"
                     f"->{100 * r['exception_rate']:.4f}%" for r in zc))
    srt = [r for r in rows if r["granularity"] == "block16_autosort" and r["rows_sorted"]]
    lines.append(f"block16_autosort sorts the rows of {len(srt)} of {len(GENERATORS) * len(shapes)} matrices: "
                 + ", ".join(sorted({r['weights'] for r in srt})))
    lines.append("decode (emulated bit for bit above): per 16-row block / tile, the table-lookup decz unchanged with "
                 "the block's TL / TH (two more words a block; the sorted orders add an output row index per row); "
                 "per row, decz_rows: a lane's fragment spans rows g and g + 8, so each half looks up two tables and "
                 "merges them (10 prmt a fragment instead of 6); a contiguous window's TL / TH come from its base byte "
                 "by one multiply-add")
    print("\n# Summary")
    for ln in lines:
        print("  " + ln)
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=USAGE,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true",
                    help=f"also the full-size study: the round trip on the study's matrices at {RT_SHAPE[0]}x"
                         f"{RT_SHAPE[1]} and part 3 on all {len(SCORED_SHAPES + OTHER_SHAPES)} shapes; writes the "
                         f"JSON (about 7 minutes on 2 cores, 1.5 GB of memory)")
    ap.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)   # the default; old command lines
    ap.add_argument("--out", default=None, help=f"where --full writes its JSON (default {OUT_DEFAULT})")
    args = ap.parse_args(argv)
    if args.out is not None and not args.full:
        ap.error("--out is where the full study's JSON goes: add --full")
    out = args.out or OUT_DEFAULT
    t0 = time.time()
    part1()
    part2(*PART2_SHAPE)
    part2b()
    rt_shape = RT_SHAPE if args.full else RT_SHAPE_SMALL      # the study's own matrices, at one of its shapes
    rt = part2(*rt_shape, grans=RT_GRANS, specials=False)
    t2 = time.time()
    shapes = SCORED_SHAPES + OTHER_SHAPES if args.full else SMALL_SHAPES
    if not args.full:
        print(f"\n(default run: the study below is on {', '.join(f'{n}x{k}' for n, k in shapes)} only; --full runs "
              f"its {len(SCORED_SHAPES + OTHER_SHAPES)} shapes and writes the JSON)")
    rows, dt = part3(shapes)
    for r in rows:
        r["roundtrip"] = rt.get((r["weights"], r["granularity"], r["window_kind"])) \
            if tuple(r["shape"]) == rt_shape else None
    print_table(rows, [(4096, 8192), (8192, 2048)] if args.full else [shapes[0], shapes[-1]])
    meets = conclude(rows)
    summary = summarize(rows, meets)
    if args.full:
        doc = dict(source="labs/lab7_windows.py", date="2026-12-01", issue=29, target=dict(
            exception_rate=TARGET_RATE, bits_per_weight=TARGET_BITS),
            bits="12 + window bits (top8: 56 per group, contiguous: 8 per group) + side table (64 per exception "
                 "+ 32 x (N + 1)) + the sorted orders' 32-bit row index per row, all / (N K); bits_per_weight_tlth "
                 "counts a top8 window as the 64 bits of TL / TH (34e5d9f's format_bits accounting)",
            granularities=dict(
                matrix="one window per matrix (the format shipped until session 17)", tile128="per 128-row tile",
                tile64="per 64-row tile", block16="per 16-row block, rows as given (34e5d9f's pack_z)",
                block16_sorted="per 16-row block, rows sorted by their most common class (34e5d9f's row_order)",
                block16_sorted_mean="per 16-row block, rows sorted by their mean class over classes >= 1",
                block16_autosort="34e5d9f's compress: block16, or block16_sorted where the own order leaves > 0.02% "
                                 "out of window and sorting keeps <= half the exceptions",
                row="one window per row"),
            window_kinds=dict(top8="the 8 most common classes of the group, ties to the smaller class (56 bits)",
                              contiguous="the run of 8 consecutive classes holding the most weights, or class 0 + a "
                                         "run of 7 where that holds more or an exception is inexact (8 bits)"),
            summary=summary,
            exact="every exception satisfies fl32(v + c) == W bit for bit (NaN == NaN), after the per-group "
                  "class-0 retry",
            roundtrip=f"pack + decz (per block) / decz_rows (per row) + corrections == W bit for bit, run on the "
                      f"study's matrices at {RT_SHAPE[0]}x{RT_SHAPE[1]} for {', '.join(RT_GRANS)}; null elsewhere "
                      f"(part 2 runs every granularity on 512x1024 with special values)",
            meets_target=[list(m) for m in meets], study_seconds=round(dt, 1),
            rows=rows)
        with open(out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"  wrote {out} ({len(rows)} rows)")
    print(f"lab7: all checks passed (part 1-2 {t2 - t0:.1f} s, study {dt:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
