"""Lab 6 (PIPE 6: pack_tma, the 128-byte swizzle, the x box, gemvt_kernel in miniature) runs, agrees with
submission.pack_tma and judge.check_close, and its negative cases fail (CPU only: MUSE_BUILD=0)."""
import os

os.environ.setdefault("MUSE_BUILD", "0")   # before importing submission: no CUDA build on a CPU machine

import importlib.util
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
LABS = REPO / "labs"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(LABS))    # the lab imports labkit
import judge  # noqa: E402
import submission  # noqa: E402

_spec = importlib.util.spec_from_file_location("lab6_tma", LABS / "lab6_tma.py")
lab6 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab6)


def _bf16(u16):
    """numpy uint16 bit patterns -> torch bf16 tensor with the same bits."""
    return torch.from_numpy(np.ascontiguousarray(u16).view(np.int16).copy()).view(torch.bfloat16)


def _u16(t):
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def _bits(seed, shape):
    return np.random.default_rng(seed).integers(0, 65536, shape).astype(np.uint16)


def _ref(x, W):
    return lab6.bf16_to_f32(x).astype(np.float64) @ lab6.bf16_to_f32(W).astype(np.float64).T


@pytest.fixture(scope="module")
def lab6_run():
    """`python labs/lab6_tma.py`, run once for the tests that read its output."""
    return subprocess.run([sys.executable, str(LABS / "lab6_tma.py")], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def _assert_printed(p, lines):
    """lab6 exited 0 and printed every line of lines (and its closing line)."""
    assert p.returncode == 0, f"lab6 exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    for line in lines + ("lab6: all checks passed",):
        assert line in p.stdout, line


def test_lab6_runs_and_prints_its_verifications(lab6_run):
    _assert_printed(lab6_run, (
        "verified: every tile of a 128x256 W, bulk-copied verbatim and read through wg_desc",
        "verified: negative: plain tiles read with the swizzle",
        "verified: M=17: box at k=128 of 32 rows read through the descriptor == x[:, 128:192], rows 17..31",
        "verified: T=16 steps, S=7: slices [2, 2, 2, 3, 2, 2, 3] cover every step once",
        "verified: gemvt_emulate M=17 NW=4 KA=1 S=7: within the SPEC tolerance",
        "verified: negative: tiles packed without the XOR fail the SPEC check",
    ))
    assert "MISMATCH" not in lab6_run.stdout


# ---- pack_tma ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("N,K", [(64, 64), (128, 256), (192, 512)])
def test_pack_tma_matches_lab6_on_random_bits(N, K):
    W = _bits(N + K, (N, K))
    got = _u16(submission.pack_tma(_bf16(W)))
    want = lab6.pack_tma_np(W)
    assert got.shape == want.shape == (N // 64, K // 64, 64, 64)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("N,K", [(32, 64), (96, 64), (64, 96), (64, 32), (100, 200)])
def test_pack_tma_refuses_shapes_not_multiple_of_64(N, K):
    W = _bits(1, (N, K))
    with pytest.raises(ValueError, match="N % 64 == 0 and K % 64 == 0"):
        submission.pack_tma(_bf16(W))
    with pytest.raises(ValueError, match="N % 64 == 0 and K % 64 == 0"):
        lab6.pack_tma_np(W)


# ---- the swizzle and the descriptor read -------------------------------------------------------------
def test_swizzle128_xors_chunk_with_row_in_group():
    o = np.arange(4096)
    s = lab6.swizzle128(o)
    assert np.array_equal(np.sort(s), o)                                   # a permutation
    assert np.array_equal(s >> 7, o >> 7)                                  # each byte stays in its 128-byte row
    assert np.array_equal((s >> 4) & 7, ((o >> 4) & 7) ^ ((o >> 7) & 7))  # chunk c of row r -> c ^ (r & 7)
    assert np.array_equal(s & 15, o & 15)                                  # 16-byte chunks stay whole


def test_descriptor_read_through_swizzle_reproduces_w():
    N, K = 128, 256
    W = _bits(7, (N, K))
    packed = _u16(submission.pack_tma(_bf16(W)))
    for rt in range(N // 64):
        for kt in range(K // 64):
            tile = lab6.as_bytes(packed[rt, kt])                         # the bulk copy: bytes verbatim
            for j in range(4):
                got = lab6.desc_read(tile, lab6.wg_desc(32 * j), 64)     # [r, kk] of k16 step j
                assert np.array_equal(got, W[64 * rt:64 * rt + 64, 64 * kt + 16 * j:64 * kt + 16 * j + 16]), (rt, kt, j)


def test_wrong_swizzle_fails_the_reproduction():
    W = _bits(8, (64, 64))
    packed = _u16(submission.pack_tma(_bf16(W)))[0, 0]
    wrong = lab6.read_tile(lab6.as_bytes(packed), lab6.no_swizzle)       # the XOR left out of the read
    bad = np.flatnonzero((wrong != W).any(axis=1))
    assert bad.tolist() == [r for r in range(64) if r & 7]
    plain = lab6.read_tile(lab6.as_bytes(lab6.pack_tma_np(W, xor=False)[0, 0]))   # left out of the pack
    assert not np.array_equal(plain, W)
    assert np.array_equal(lab6.read_tile(lab6.as_bytes(packed)), W)


def test_desc_read_refuses_a_descriptor_without_the_128_byte_swizzle():
    with pytest.raises(ValueError, match="not the 128-byte swizzle"):
        lab6.desc_read(np.zeros(8192, np.uint8), lab6.wg_desc(0) & ~(3 << 62) | (2 << 62), 64)


# ---- the x box -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("M", [1, 5, 16, 17, 32])
def test_x_box_lands_swizzled_with_zero_fill(M):
    K, k0 = 192, 64
    x = _bits(M, (M, K))
    NT = 8 * lab6.nb_of(M)
    smem = np.full(NT * 128, 0xFF, np.uint8)
    lab6.tma_load_2d(smem, 0, x, k0, 0, NT)
    want = np.zeros((NT, 64), np.uint16)
    want[:M] = x[:, k0:k0 + 64]
    phys = smem.view("<u2").reshape(NT, 8, 8)                             # [row, physical chunk, element]
    for r in range(NT):
        for c in range(8):                                                # chunk c of row r at chunk c ^ (r & 7)
            assert np.array_equal(phys[r, c ^ (r & 7)], want[r, 8 * c:8 * c + 8]), (r, c)
    logical = smem[lab6.swizzle128(np.arange(NT * 128))]                  # undo the swizzle byte by byte
    assert np.array_equal(logical.view("<u2").reshape(NT, 64), want)
    got = np.concatenate([lab6.desc_read(smem, lab6.wg_desc(32 * j), NT) for j in range(4)], axis=1)
    assert np.array_equal(got, want)


# ---- gemvt_kernel in miniature -------------------------------------------------------------------------
@pytest.mark.parametrize("T", [1, 2, 7, 16, 33])
def test_uneven_split_covers_every_step_exactly_once(T):
    for S in range(1, T + 1):
        parts = [lab6.split_steps(T, S, s) for s in range(S)]
        covered = [s0 + i for s0, n in parts for i in range(n)]
        assert covered == list(range(T)), (T, S)
        sizes = [n for _, n in parts]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1, (T, S, sizes)


@pytest.mark.parametrize("N,K,M,nw,ka,s", [
    (128, 256, 1, 4, 1, 1),
    (128, 512, 5, 4, 1, 3),        # T = 8 steps over 3 CTAs: 2, 3, 3
    (256, 1024, 16, 8, 2, 7),      # T = 8 steps over 7 CTAs
    (128, 1024, 17, 8, 1, 16),
    (192, 768, 32, 4, 2, 6),       # T = 6: one step a CTA
    (128, 448, 5, 4, 1, 7),        # K / 64 = 7 atoms: one a CTA
])
def test_gemvt_emulate_within_spec_tolerance(N, K, M, nw, ka, s):
    rng = np.random.default_rng(N * K + M)
    W = lab6.bf16_normal(rng, (N, K), 0.02)
    x = lab6.bf16_normal(rng, (M, K))
    y = lab6.gemvt_emulate(_u16(submission.pack_tma(_bf16(W))), x, N, K, nw, ka, s)
    ref = _ref(x, W)
    ok, worst = lab6.check_close_np(y, ref)
    assert ok, worst
    judge.check_close(_bf16(y), torch.from_numpy(ref), False, f"lab6 M={M} NW={nw} KA={ka} S={s}")


def test_gemvt_emulate_split_k_changes_only_the_rounding():
    N, K, M = 128, 1024, 3
    rng = np.random.default_rng(3)
    W = lab6.bf16_normal(rng, (N, K), 0.02)
    x = lab6.bf16_normal(rng, (M, K))
    P = lab6.pack_tma_np(W)
    ys = [lab6.bf16_to_f32(lab6.gemvt_emulate(P, x, N, K, 4, 1, s)).astype(np.float64) for s in (1, 3, 16)]
    ulp = 2.0 ** (np.floor(np.log2(np.abs(ys[0]))) - 7)                  # one bf16 ulp of y at S = 1
    for y in ys[1:]:
        assert (np.abs(y - ys[0]) <= ulp).all()


def test_gemvt_emulate_fails_the_tolerance_without_the_xor():
    N, K, M = 128, 256, 5
    rng = np.random.default_rng(4)
    W = lab6.bf16_normal(rng, (N, K), 0.02)
    x = lab6.bf16_normal(rng, (M, K))
    ok, worst = lab6.check_close_np(lab6.gemvt_emulate(lab6.pack_tma_np(W, xor=False), x, N, K, 4, 1, 2), _ref(x, W))
    assert not ok and worst > 1
    with pytest.raises(judge.CheckFailed):
        judge.check_close(_bf16(lab6.gemvt_emulate(lab6.pack_tma_np(W, xor=False), x, N, K, 4, 1, 2)),
                          torch.from_numpy(_ref(x, W)), False, "no xor")


def test_stage_bytes_match_gemvt_smem():
    for nw in (4, 8):
        for nb in (1, 2, 4):
            for st, ka in ((4, 1), (8, 2)):
                assert submission.gemvt_smem(nw, st, nb, ka) == 1024 + st * lab6.stage_bytes(nw, nb, ka)


@pytest.mark.parametrize("N,K,M,nw,ka,s", [(96, 256, 1, 4, 1, 1), (192, 256, 1, 8, 1, 1), (128, 256, 1, 4, 3, 1),
                                           (128, 256, 1, 4, 1, 5), (128, 256, 33, 4, 1, 1), (128, 256, 1, 6, 1, 1)])
def test_gemvt_emulate_refuses_configs_that_do_not_fit(N, K, M, nw, ka, s):
    with pytest.raises(ValueError, match="does not fit"):
        lab6.gemvt_emulate(np.zeros((N // 64, K // 64, 64, 64), np.uint16), np.zeros((M, K), np.uint16),
                           N, K, nw, ka, s)


# ---- the compressed PIPE 6 (gemvtz_kernel): pack_tz's column order, tiles and natural-k side table ----------
_spec3 = importlib.util.spec_from_file_location("lab3_compress", LABS / "lab3_compress.py")
lab3 = importlib.util.module_from_spec(_spec3)
_spec3.loader.exec_module(lab3)


def _lane_of(r, kk):
    """(lane, fragment, word, half) of element (row r of a 16-row block, column kk of a 64-group): the formula of
    submission.patch_table (mma16816's A layout), written out here rather than taken from lab6.patch_pos."""
    return (r & 7) * 4 + (kk & 7) // 2, kk >> 4, (r >> 3) + 2 * ((kk >> 3) & 1), kk & 1


def _entry_elem(li, e):
    """Entry e = {G << 5 | f << 3 | d << 1 | h} of lane list li = b 32 + L -> (row, k) of W: the element it patches."""
    b, L, G, f, d, h = li // 32, li % 32, e >> 5, (e >> 3) & 3, (e >> 1) & 3, e & 1
    return 16 * b + (L >> 2) + 8 * (d & 1), 64 * G + 16 * f + 8 * (d >> 1) + 2 * (L & 3) + h


def test_tma_kperm_puts_wgmma_natural_k_in_each_fragment():
    perm = submission.tma_kperm(128).numpy()
    assert sorted(perm[:64]) == list(range(64)) and sorted(perm[64:]) == list(range(64, 128))
    # lab3's fragment position of (lane, f, j) is the stream column; wgmma wants k 16 f + 2 t + 8 (j >> 2) + (j & 1)
    for lane in range(32):
        t = lane & 3
        for f in range(4):
            for j in range(8):
                row, col = lab3.frag_pos(lane, f, j)
                assert perm[col] == 16 * f + 2 * t + 8 * (j >> 2) + (j & 1), (lane, f, j)


@pytest.mark.parametrize("N, K", [(64, 128), (128, 512)])
def test_pack_tz_tiles_decode_to_w_with_the_patches_and_with_the_natural_k_csr(N, K):
    W = lab3.trained_like_np(N, K, seed=11)
    W[3, 5] = 0x7F80                                  # +Inf: out of any window, an exception at a known column
    z = submission.pack_tz(_bf16(W))
    assert z.stream.shape == (N // 64, K // 64, 6144)
    stream = z.stream.view(N // 64, K // 64, 4, 1536).permute(0, 2, 1, 3).reshape(N // 16, K // 64, 1536).numpy()
    dec = lab3.unpack_z_np(stream, N, K, np.uint32(z.TL), np.uint32(z.TH))     # stream columns of W[:, perm]
    perm = submission.tma_kperm(K).numpy()
    nat = np.empty_like(dec)
    nat[:, perm] = dec
    eptr, esc = z.eptr.numpy(), z.esc.numpy()
    assert z.n_exc >= 1 and 5 in z.exc_cols
    for r in range(N):                                 # natural k, ascending inside each row's CSR range
        ks = esc[eptr[r]:eptr[r + 1], 0]
        assert list(ks) == sorted(ks)
    assert lab3.same_bits(lab3.restore_np(nat, eptr, esc), W).all()        # the row CSR (v + c) pack_tz still returns
    pptr, pesc = z.pptr.numpy(), z.pesc.numpy()                            # what the kernel uses: W's bits patched in
    for li in range(N // 16 * 32):
        for e, bits in pesc[pptr[li]:pptr[li + 1]]:
            nat[_entry_elem(li, int(e))] = bits
    assert np.array_equal(nat, W)


# one lane's long run in group 0: row 3 and row 11 of block 0 at columns with (kk & 7) // 2 == 0 are all lane 12's
# (about 1.0: out of a trained-like window); eight entries, more than the four the kernel keeps in registers
_LANE_RUN = [(3, kk, 0x3F80 + i) for i, kk in enumerate((0, 1, 8, 9, 16, 17))] + [(11, 24, 0x3F90), (11, 25, 0x3F91)]


@pytest.mark.parametrize("N, K", [(128, 512), (192, 1024)])
def test_patch_table_holds_every_exception_once_with_w_bits_in_stage_order(N, K):
    # gemvtz_kernel's lane L of row block b's warp walks pesc[pptr[b 32 + L] .. pptr[b 32 + L + 1]), G ascending: it
    # skips the entries before its CTA's g0, then per stage writes each entry's bits over the element decz gave
    W = lab3.trained_like_np(N, K, seed=12)
    rng = np.random.default_rng(3)
    for r, k in zip(rng.integers(0, N, 12), rng.integers(0, K, 12)):
        W[r, k] = rng.choice([0x7F80, 0xFF80, 0x7FC1, 0x7F7F])   # Inf, -Inf, NaN, the largest finite: exceptions
    W[70, 64:70] = 0x3F80 + np.arange(6)              # one row, one group, six entries in lanes 24, 25, 26 (2 each)
    for r, k, b in _LANE_RUN:
        W[r, k] = b
    z = submission.pack_tz(_bf16(W))
    pptr, pesc = z.pptr.numpy(), z.pesc.numpy()
    KG = K // 64
    assert pptr.dtype == pesc.dtype == np.int32 and pesc.shape == (max(z.n_exc, 1), 2)
    assert pptr.shape == (N // 16 * 32 + 1,) and pptr[0] == 0 and pptr[-1] == z.n_exc and (np.diff(pptr) >= 0).all()
    got = {}                                           # (row, k) -> (bits, lane list, entry)
    for li in range(N // 16 * 32):
        run = pesc[pptr[li]:pptr[li + 1]]
        keys = [(int(e) >> 5, int(e) & 31) for e in run[:, 0]]
        assert keys == sorted(keys) and all(G < KG for G, _ in keys), li      # G ascending, then f, d, h
        for e, bits in run:
            r, k = _entry_elem(li, int(e))
            assert 0 <= bits < 65536 and (r, k) not in got, (li, e)
            got[r, k] = (int(bits), li, int(e))
            L, f, d, h = _lane_of(r % 16, k % 64)      # the entry sits where the element is held
            assert (li, int(e)) == ((r // 16) * 32 + L, (k // 64) << 5 | f << 3 | d << 1 | h), (li, e, r, k)
    eptr, esc = z.eptr.numpy(), z.esc.numpy()
    want = {(r, int(esc[j, 0])): int(W[r, esc[j, 0]]) for r in range(N) for j in range(eptr[r], eptr[r + 1])}
    assert len(got) == len(want) == z.n_exc
    assert {rk: v[0] for rk, v in got.items()} == want  # every exception exactly once, with W's bits
    for i in range(6):                                 # several exceptions of one row in one group
        assert got[70, 64 + i][:2] == (0x3F80 + i, 4 * 32 + 24 + i // 2)
    run12 = pesc[pptr[12]:pptr[13]]                    # block 0's lane 12: the planted run, all in group 0
    assert all(got[r, k][:2] == (b, 12) for r, k, b in _LANE_RUN)
    for nw, ka, s in ((4, 1, 3), (8, 2, 3)):           # the emulate tests' configs: CTAs 1, 2 skip more than four
        T = K // (64 * ka)
        for sidx in (1, 2):
            g0 = lab6.split_steps(T, s, sidx)[0] * ka
            assert g0 >= 1 and int(((run12[:, 0] >> 5) < g0).sum()) > 4, (nw, ka, s, sidx)


def test_compressed_pipe6_fits_rules():
    c = submission.GemvzConfig(nw=4, s=3, ug=8, r=2, pipe=6, pf=0, pdl=1, cl=2)
    assert submission.gemvz_fits(c, 4096, 8192, 32) is None
    assert "NW 4 or 8" in submission.gemvz_fits(c._replace(nw=16), 4096, 8192, 32)
    assert "S=65" in submission.gemvz_fits(c._replace(s=65, cl=0), 4096, 8192, 32)
    assert "shared memory" in submission.gemvz_fits(c._replace(nw=8, ug=12), 4096, 8192, 32)
    assert "pf" in submission.gemvz_fits(c._replace(pf=1), 4096, 8192, 32)


def test_plain_pipe6_fits_rules():
    c = submission.GemvConfig(nw=4, s=2, u=4, r=1, pipe=6, pf=0, pdl=1, cl=2)
    assert submission.gemv_fits(c, 4096, 8192, 32) is None
    assert "DUAL" in submission.gemv_fits(c, 256, 8192, 32, dual=True)
    assert "16*NW=64" in submission.gemv_fits(c, 4080, 8192, 32)
    assert submission.gemv_fits(c._replace(s=3), 4096, 8192, 32) is None
    assert "S=129" in submission.gemv_fits(c._replace(s=129, cl=0), 4096, 8192, 32)
    assert "shared memory" in submission.gemv_fits(c._replace(nw=8, u=12, r=2), 4096, 8192, 32)


# ---- lab 6 part 4: the compressed PIPE 6 in miniature (pack_tz_np, gemvtz_emulate) --------------------------
_OUTLIERS = [(3, 40, 0x3F40), (17, 130, 0xBFC0), (40, 5, 0x4100), (40, 70, 0xC0C0)]     # 0.75, -1.5, 8, -6


def _tz_args(z):
    """pack_tz's ZPack (torch, CPU) -> gemvtz_emulate's first five arguments (tiles, the patch table), as numpy."""
    return z.stream.numpy(), z.pptr.numpy(), z.pesc.numpy(), z.TL, z.TH


def test_lab6_part4_prints_its_verifications(lab6_run):
    _assert_printed(lab6_run, (
        "verified: tz_perm (lab3.frag_pos + the m16n8k16 A layout) is a permutation of each 64-group",
        "verified: patch_pos: element (r, kk) of a warp's 16 x 64 group is one register half",
        "verified: patch_elem(lane, G << 5 | f << 3 | j) inverts patch_pos",
        "verified: tile row block rb at rb*1536, decoded (decz) and un-permuted, with each lane list's bits "
        "written at its element (16 b + row, 64 G + column: patch_elem) == W bit for bit",
        "verified: lane 9 of row block 0 has 6 patches in group 0: NW=8 KA=2 S=3's CTAs 1 and 2",
        "verified: the natural-k row CSR pack_tz still returns (v + c, fp32; the kernel no longer reads it)",
        "verified: gemvtz_emulate M=17 NW=4 KA=1 S=3: within the SPEC tolerance",
        "verified: gemvtz_emulate M=9 NW=8 KA=2 S=3 == gemvt_emulate (pack_tma_np's tiles) bit for bit",
        "verified: gemvtz_emulate M=32 NW=8 KA=1 S=8 == gemvt_emulate (pack_tma_np's tiles) bit for bit",
        "verified: probe on exception column 200: y[5] == W[:, 200] bit for bit",
        "verified: probe on column 200 with the patches skipped (dbg & 1) is wrong in exactly rows [3]",
        "verified: negative: the unpermuted stream (lab3's pack_z order) with x in natural order fails",
    ))
    assert "correction" not in lab6_run.stdout


@pytest.mark.parametrize("K", [64, 256, 1024])
def test_tz_perm_equals_tma_kperm(K):
    assert np.array_equal(lab6.tz_perm(K), submission.tma_kperm(K).numpy())


@pytest.mark.parametrize("N,K,plants", [
    (64, 128, [(3, 5, 0x7F80)]),                                          # +Inf
    (128, 512, _OUTLIERS + [(64, 300, 0x7F00), (65, 301, 0xFF7F)]),       # large finite of both signs
    (192, 256, [(7, 9, 0x0001), (100, 200, 0x8040), (150, 3, 0x7FC1)]),   # subnormals, NaN: zero-class mode
    (64, 192, None),                                                      # random bits: ~93% exceptions
])
def test_pack_tz_np_matches_pack_tz(N, K, plants):
    W = _bits(N * K, (N, K)) if plants is None else lab6.planted_np(N, K, N + K, plants)
    got = submission.pack_tz(_bf16(W))             # CPU tensor: pack_tz skips its GPU decode check
    want = lab6.pack_tz_np(W)
    assert got.stream.shape == want["stream"].shape == (N // 64, K // 64, 6144)
    assert np.array_equal(got.stream.numpy(), want["stream"])
    assert np.array_equal(got.eptr.numpy(), want["eptr"])
    assert np.array_equal(got.esc.numpy(), want["esc"])
    assert got.pptr.dtype == got.pesc.dtype == torch.int32 and want["pptr"].dtype == want["pesc"].dtype == np.int32
    assert got.pptr.shape == want["pptr"].shape == (N // 16 * 32 + 1,)
    assert got.pesc.shape == want["pesc"].shape == (max(want["n_exc"], 1), 2)
    assert np.array_equal(got.pptr.numpy(), want["pptr"])
    assert np.array_equal(got.pesc.numpy(), want["pesc"])
    assert (int(got.TL), int(got.TH)) == (int(want["TL"]), int(want["TH"]))
    assert (got.n_exc, got.capr, got.mode, list(got.window), list(got.exc_cols)) == \
        (want["n_exc"], want["capr"], want["mode"], list(want["window"]), want["exc_cols"])
    for _, k, b in plants or []:                    # a planted class outside the window is an exception
        assert (k in want["exc_cols"]) or ((b >> 8) & 0x7F) in want["window"], (k, hex(b))
    if plants and any(b & 0x7F80 == 0 for _, _, b in plants):
        assert want["mode"] == "zero-class" and 0 in want["window"]         # subnormals: v + c cannot restore them


def test_pack_tz_np_refuses_shapes_not_multiple_of_64():
    with pytest.raises(ValueError, match="N % 64 == 0 and K % 64 == 0"):
        lab6.pack_tz_np(_bits(1, (48, 128)))


@pytest.mark.parametrize("N,K,M,nw,ka,s,plants", [
    (128, 512, 1, 4, 1, 1, _OUTLIERS),
    (128, 512, 9, 8, 2, 3, _OUTLIERS),            # T = 4 steps over 3 CTAs: 1, 1, 2
    (192, 640, 17, 4, 1, 3, _OUTLIERS),           # T = 10: 3, 3, 4
    (256, 1024, 32, 8, 2, 3, _OUTLIERS),          # T = 8: 2, 3, 3
    (128, 512, 32, 4, 2, 4, _OUTLIERS),           # one step a CTA
    (128, 1024, 9, 4, 1, 16, _OUTLIERS),          # one group a CTA
    (128, 512, 17, 8, 1, 3, _OUTLIERS + [(90, 77, 0x0001), (91, 500, 0x8003)]),   # subnormals: zero-class mode
])
def test_gemvtz_emulate_within_spec_tolerance(N, K, M, nw, ka, s, plants):
    rng = np.random.default_rng(N * K + M)
    W = lab6.planted_np(N, K, M, plants)
    x = lab6.bf16_normal(rng, (M, K))
    z = submission.pack_tz(_bf16(W))
    assert z.n_exc >= len(plants)
    y = lab6.gemvtz_emulate(*_tz_args(z), x, N, K, nw, ka, s)
    ok, worst = lab6.check_close_np(y, _ref(x, W))
    assert ok, worst
    judge.check_close(_bf16(y), torch.from_numpy(_ref(x, W)), False, f"lab6 gemvtz M={M} NW={nw} KA={ka} S={s}")


@pytest.mark.parametrize("r0,k,b,more", [
    (3, 200, 0x7F00, []),                         # 1.7e38: finite, so 0 * W stays 0 in the other columns
    (70, 450, 0xC0C0, []),                        # -6
    (101, 33, 0xFF7F, []),                        # -max finite
    (20, 301, 0x7F00, [(21, 302, 0x0001)]),       # a subnormal elsewhere: zero-class mode, v = +0, c = W
])
@pytest.mark.parametrize("nw,ka,s", [(4, 1, 3), (8, 2, 2)])
def test_one_hot_probe_on_exception_column_exact_with_patches_wrong_without(r0, k, b, more, nw, ka, s):
    N, K, M, tok = 128, 512, 9, 5
    W = lab6.planted_np(N, K, 21, [(r0, k, b)] + more)
    z = submission.pack_tz(_bf16(W))
    assert z.mode == ("zero-class" if more else "8-class")
    eptr, esc = z.eptr.numpy(), z.esc.numpy()
    rows = [r for r in range(N) if k in esc[eptr[r]:eptr[r + 1], 0]]
    assert r0 in rows
    assert not (W[:, k] == 0x8000).any()           # -0 would come back +0 (the accumulators start at +0)
    x = np.zeros((M, K), np.uint16)
    x[tok, k] = 0x3F80
    y = lab6.gemvtz_emulate(*_tz_args(z), x, N, K, nw, ka, s)
    assert np.array_equal(y[tok], W[:, k])
    assert not np.delete(y, tok, axis=0).any()
    y0 = lab6.gemvtz_emulate(*_tz_args(z), x, N, K, nw, ka, s, patches=False)      # dbg & 1
    assert np.flatnonzero(y0[tok] != W[:, k]).tolist() == rows      # wrong exactly in the exception rows
    assert np.array_equal(np.delete(y0[tok], rows), np.delete(W[:, k], rows))


@pytest.mark.parametrize("nw,ka,s", [(4, 1, 3), (8, 2, 2)])
def test_probe_needs_the_natural_column_in_the_patch_table(nw, ka, s):
    N, K, k = 128, 512, 200                         # natural k 200 sits at stream column 194: tz_perm(512)[194] == 200
    W = lab6.planted_np(N, K, 21, [(3, k, 0x7F00)])
    perm = lab6.tz_perm(K)
    ks = int(np.flatnonzero(perm == k)[0])
    assert ks == 194 and W[3, ks] != W[3, k]
    z = lab6.pack_tz_np(W)
    zs = lab3.pack_z_np(W[:, perm])                 # same stream; its side table in stream columns
    pptr, pesc = lab6.patch_table_np(W[:, perm], zs["eptr"], zs["esc"], zs["n_exc"])   # W's bits at stream columns
    assert pptr[-1] == z["pptr"][-1] and np.array_equal(np.sort(pesc[:, 1]), np.sort(z["pesc"][:, 1]))
    # row 3's patch: natural k 200 (kk 8) is lane 12's, fragment 0, word 2; stream column 194 (kk 2) is lane 13's
    assert [0x7F00, 3 << 5 | 0 << 3 | 2 << 1] in z["pesc"][z["pptr"][12]:z["pptr"][13]][:, ::-1].tolist()
    assert [0x7F00, 3 << 5 | 0 << 3 | 0 << 1] in pesc[pptr[13]:pptr[14]][:, ::-1].tolist()
    for col, want in ((k, W[3, k]), (ks, W[3, ks])):
        x = np.zeros((1, K), np.uint16)
        x[0, col] = 0x3F80
        good = lab6.gemvtz_emulate(z["stream"], z["pptr"], z["pesc"], z["TL"], z["TH"], x, N, K, nw, ka, s)[0]
        assert np.array_equal(good, W[:, col])
        bad = lab6.gemvtz_emulate(z["stream"], pptr, pesc, z["TL"], z["TH"], x, N, K, nw, ka, s)[0]
        assert bad[3] != want                       # the bits land on wgmma's k ks, column k keeps decz's v
    assert bad[3] == W[3, k]                        # probing column ks returns W[3, k]: the patch moved, not lost


def test_inf_weight_propagates_like_the_reference():
    N, K, M = 128, 256, 3
    W = lab6.planted_np(N, K, 5, [(3, 5, 0x7F80)] + _OUTLIERS)          # +Inf: an exception, patched in as +Inf
    z = submission.pack_tz(_bf16(W))
    x = lab6.bf16_normal(np.random.default_rng(5), (M, K))
    with np.errstate(invalid="ignore"):             # Inf - Inf in the reference, the check and the wgmma (patched Inf)
        y = lab6.gemvtz_emulate(*_tz_args(z), x, N, K, 4, 1, 3)
        ok, worst = lab6.check_close_np(y, _ref(x, W))
        assert ok, worst
        assert np.isinf(lab6.bf16_to_f32(y[:, 3])).all()
        # a one-hot probe on another column: 0 * Inf = NaN in row 3, as in the float64 reference; the rest exact
        x = np.zeros((1, K), np.uint16)
        x[0, 40] = 0x3F80
        y = lab6.gemvtz_emulate(*_tz_args(z), x, N, K, 4, 1, 3)
        assert np.isnan(lab6.bf16_to_f32(y[0, 3])) and np.isnan(_ref(x, W)[0, 3])
    assert np.array_equal(np.delete(y[0], 3), np.delete(W[:, 40], 3))


def test_unpermuted_stream_fails_the_tolerance():
    N, K, M = 128, 512, 5
    rng = np.random.default_rng(6)
    W = lab6.planted_np(N, K, 6, _OUTLIERS)
    x = lab6.bf16_normal(rng, (M, K))
    z = lab6.pack_tz_np(W, kperm=False)             # lab3's pack_z order, regrouped into tiles, natural-k patches
    y = lab6.gemvtz_emulate(z["stream"], z["pptr"], z["pesc"], z["TL"], z["TH"], x, N, K, 4, 1, 3)
    ok, worst = lab6.check_close_np(y, _ref(x, W))
    assert not ok and worst > 1
    with pytest.raises(judge.CheckFailed):
        judge.check_close(_bf16(y), torch.from_numpy(_ref(x, W)), False, "unpermuted stream")
    zp = lab6.pack_tz_np(W)                         # the same W and x through the permuted stream pass
    assert lab6.check_close_np(lab6.gemvtz_emulate(zp["stream"], zp["pptr"], zp["pesc"], zp["TL"], zp["TH"], x, N, K,
                                                   4, 1, 3), _ref(x, W))[0]


@pytest.mark.parametrize("N,K,M,nw,ka,s", [(64, 256, 1, 8, 1, 1), (128, 256, 1, 16, 1, 1), (128, 256, 1, 6, 1, 1),
                                           (128, 192, 1, 4, 2, 1), (128, 256, 1, 4, 1, 5), (128, 256, 33, 4, 1, 1)])
def test_gemvtz_emulate_refuses_configs_that_do_not_fit(N, K, M, nw, ka, s):
    with pytest.raises(ValueError, match="does not fit"):
        lab6.gemvtz_emulate(np.zeros((N // 64, K // 64, 6144), np.uint8), np.zeros(N // 16 * 32 + 1, np.int32),
                            np.zeros((1, 2), np.int32), 0, 0, np.zeros((M, K), np.uint16), N, K, nw, ka, s)


def test_gemvtz_emulate_refuses_the_old_per_block_table():
    N, K = 128, 512                                 # pptr of one entry per (row block, group): the format before
    with pytest.raises(ValueError, match="32 lane lists a row block"):
        lab6.gemvtz_emulate(np.zeros((N // 64, K // 64, 6144), np.uint8), np.zeros(N // 16 * (K // 64) + 1, np.int32),
                            np.zeros((1, 2), np.int32), 0, 0, np.zeros((1, K), np.uint16), N, K, 4, 1, 1)


@pytest.mark.parametrize("N,K,M,nw,ka,s,plants", [
    (128, 512, 1, 4, 1, 1, _OUTLIERS),
    (128, 512, 9, 8, 2, 3, _OUTLIERS),            # T = 4 steps over 3 CTAs: 1, 1, 2
    (192, 640, 32, 4, 1, 3, _OUTLIERS),           # T = 10: 3, 3, 4
    (256, 1024, 9, 8, 2, 3, _OUTLIERS),           # T = 8: 2, 3, 3; patch runs cross the stage's two groups
    (128, 1024, 32, 4, 1, 16, _OUTLIERS),         # one group a CTA
    (128, 512, 1, 8, 1, 3, _OUTLIERS + [(90, 77, 0x0001), (91, 500, 0x8003)]),    # zero-class mode: v = +0
    (128, 256, 9, 4, 1, 3, [(3, 5, 0x7F80), (40, 70, 0x7FC1), (41, 71, 0xFF80)]),   # +Inf, NaN, -Inf: NaN rows
    (128, 512, 9, 4, 1, 3, _OUTLIERS + _LANE_RUN),  # T = 8: g0 = 0, 2, 5; CTAs 1, 2 skip lane 12's eight entries
    (128, 512, 17, 8, 2, 3, _OUTLIERS + _LANE_RUN),  # T = 4: g0 = 0, 2, 4; KA = 2: a group G - gs = -1 of a stage
])
def test_gemvtz_emulate_equals_gemvt_emulate_bit_for_bit(N, K, M, nw, ka, s, plants):
    # the patched fragments are W itself and the wgmma steps run in the same order: the compressed PIPE 6 returns
    # the plain PIPE 6's bits (the GPU test of gemvtz_kernel asserts the same of the kernels)
    rng = np.random.default_rng(N + K + M)
    W = lab6.planted_np(N, K, M + s, plants)
    x = lab6.bf16_normal(rng, (M, K))
    z = submission.pack_tz(_bf16(W))
    assert z.n_exc >= len(plants)
    with np.errstate(invalid="ignore", over="ignore"):
        y = lab6.gemvtz_emulate(*_tz_args(z), x, N, K, nw, ka, s)
        yt = lab6.gemvt_emulate(_u16(submission.pack_tma(_bf16(W))), x, N, K, nw, ka, s)
        y0 = lab6.gemvtz_emulate(*_tz_args(z), x, N, K, nw, ka, s, patches=False)
    assert np.array_equal(y, yt)
    assert not np.array_equal(y0, yt)               # without the patches the exceptions' rows differ
