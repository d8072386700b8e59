"""Lab 6 (gemvt_kernel (GemvtConfig): pack_tma, the 128-byte swizzle, the x box, the kernel in miniature; part 4:
gemvtz_kernel, pack_z's 12-bit stream in the ring with x permuted) runs, agrees with submission.pack_tma, gemvt_smem /
gemvt_misfit and judge.check_close, and its negative cases fail (CPU only: MUSE_BUILD=0)."""
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


def test_lab6_part4_prints_the_gemvtz_verifications(lab6_run):
    _assert_printed(lab6_run, (
        "# Part 4: gemvtz_kernel",
        "verified: tz_k: the 4 k16 steps x 16 columns of register A hold each natural k of the 64-group once",
        "verified: M=32 NW=8 KA=2: boxes at groups 6..7 permuted by each warpgroup (permute_x, 128 jobs)",
        "verified: negative: no transpose (chunks copied as they are) gives wrong B in every token row",
        "verified: negative: the transpose without the XOR swizzle gives wrong B in exactly the token rows with n & 3",
        "verified: NW=8 KA=2: the stage image's W part",
        "verified: gemvtz_emulate trained-looking + planted M=9 NW=8 KA=2 S=3: within the SPEC tolerance",
        "verified: gemvtz_emulate row-scaled M=32 NW=8 KA=2 S=3: within the SPEC tolerance",
        "verified: negative: gemvtz_emulate M=9 NW=8 KA=2 S=3 with the corrections left out fails the SPEC check",
        "verified: probe on exception column 1 (NW=4 KA=1 S=3): y[5] == W[:, 1] bit for bit",
    ))


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
    # lab6's stage image (KA tiles of 16 NW rows, then KA x boxes of 8 NB tokens) is gemvt_smem's per-stage term;
    # with cl the leader's cbuf comes on top (S - 1 partials of NW NB 32 float4)
    for nw in (4, 8, 12, 16):
        for nb in (1, 2, 4):
            for st, ka in ((1, 1), (4, 1), (8, 2), (3, 4)):
                assert submission.gemvt_smem(nw, st, nb, ka) == 1024 + st * lab6.stage_bytes(nw, nb, ka)
                for s in (2, 5):
                    assert submission.gemvt_smem(nw, st, nb, ka, s, 0) == submission.gemvt_smem(nw, st, nb, ka)
                    assert submission.gemvt_smem(nw, st, nb, ka, s, 2) == \
                        1024 + st * lab6.stage_bytes(nw, nb, ka) + (s - 1) * nw * nb * 32 * 16


@pytest.mark.parametrize("N,K,M,nw,ka,s", [(96, 256, 1, 4, 1, 1), (192, 256, 1, 8, 1, 1), (128, 256, 1, 4, 3, 1),
                                           (128, 256, 1, 4, 1, 5), (128, 256, 33, 4, 1, 1), (128, 256, 1, 6, 1, 1)])
def test_gemvt_emulate_refuses_configs_that_do_not_fit(N, K, M, nw, ka, s):
    with pytest.raises(ValueError, match="does not fit"):
        lab6.gemvt_emulate(np.zeros((N // 64, K // 64, 64, 64), np.uint16), np.zeros((M, K), np.uint16),
                           N, K, nw, ka, s)
    if M <= 32:                                     # the same shapes gemvt_misfit refuses (m = 33 is not a shape it sees)
        assert submission.gemvt_misfit(submission.GemvtConfig(nw=nw, s=s, st=1, ka=ka), N, K, M) is not None


# ---- gemvt_kernel's config: GemvtConfig and gemvt_misfit -------------------------------------------------------
def test_gemvt_fits_rules():
    c = submission.GemvtConfig(nw=4, s=2, st=4, ka=1, pdl=1, cl=2)
    assert c._fields == ("nw", "s", "st", "ka", "pdl", "cl")
    assert submission.gemvt_misfit(c, 4096, 8192, 32) is None
    assert submission.config_misfit(c, 4096, 8192, 32) is None                       # config_misfit dispatches on the type
    assert "DUAL" in submission.gemvt_misfit(c, 256, 8192, 32, dual=True)
    assert submission.config_misfit(c, 256, 8192, 32, True) == submission.gemvt_misfit(c, 256, 8192, 32, dual=True)
    assert "16*NW=64" in submission.gemvt_misfit(c, 4080, 8192, 32)
    assert "64*KA=128" in submission.gemvt_misfit(c._replace(ka=2), 4096, 8256, 32)
    assert submission.gemvt_misfit(c._replace(s=3), 4096, 8192, 32) is None          # S need not divide K / 64
    assert submission.gemvt_misfit(c._replace(s=128, cl=0), 4096, 8192, 32) is None  # one step a CTA
    assert "S=129" in submission.gemvt_misfit(c._replace(s=129, cl=0), 4096, 8192, 32)
    assert "S=65" in submission.gemvt_misfit(c._replace(s=65, ka=2, cl=0), 4096, 8192, 32)
    for bad in (dict(nw=6), dict(nw=2), dict(nw=20), dict(st=0), dict(ka=0)):
        assert "NW 4, 8, 12 or 16" in submission.gemvt_misfit(c._replace(**bad), 4096, 8192, 32), bad
    assert "2 <= S" in submission.gemvt_misfit(c._replace(s=1), 4096, 8192, 32)      # a cluster of one CTA
    assert submission.gemvt_misfit(c._replace(s=1, cl=0), 4096, 8192, 32) is None
    assert "expected 0 (global ticket) or 2" in submission.gemvt_misfit(c._replace(cl=1), 4096, 8192, 32)   # no cl=1
    assert "shared memory" in submission.gemvt_misfit(c._replace(nw=8, st=12, ka=2), 4096, 8192, 32)


@pytest.mark.parametrize("nw,ka,m", [(4, 1, 1), (4, 2, 16), (8, 2, 32), (16, 1, 9), (12, 4, 32)])
def test_gemvt_fits_stages_up_to_the_opt_in_shared_memory(nw, ka, m):
    # the deepest ring gemvt_misfit takes is the one whose stage images (lab6.stage_bytes), the 1 KB alignment slack and
    # the mbarriers (16 B a stage + 16) fit in 227 KB; one stage more is refused for its shared memory
    nb = lab6.nb_of(m)
    need = lambda st: 1024 + st * lab6.stage_bytes(nw, nb, ka) + 16 * st + 16
    st = max(n for n in range(1, 64) if need(n) <= 227 * 1024)
    c = submission.GemvtConfig(nw=nw, s=1, st=st, ka=ka)
    assert submission.gemvt_misfit(c, 16 * nw * 4, 64 * ka * 8, m) is None, (c, need(st))
    why = submission.gemvt_misfit(c._replace(st=st + 1), 16 * nw * 4, 64 * ka * 8, m)
    assert why is not None and "shared memory" in why and str(need(st + 1)) in why, why


def test_gemv_misfit_refuses_loops_it_lacks_and_instance_of_names_gemvt():
    # the ring is a GemvtConfig, not a loop of gemv_kernel (once PIPE 6): gemv_misfit refuses a loop outside 0..2
    old = submission.GemvConfig(nw=4, s=2, u=4, r=1, loop=6, mb=0, pf=0, pdl=1, cl=2)
    assert "loop=6" in submission.gemv_misfit(old, 4096, 8192, 32)
    assert "loop=6" in submission.config_misfit(old, 4096, 8192, 32)
    c = submission.GemvtConfig(nw=8, s=2, st=6, ka=2, cl=2)
    for m, nb in ((1, 1), (8, 1), (9, 2), (16, 2), (17, 4), (32, 4)):
        assert submission.instance_of(c, m) == ("gemvt", (8, 6, nb, 2)), m
    assert submission.instance_of(submission.GemvConfig(4, 2, 4, 1, 0, 1, 0), 32)[0] == "gemv"


# ---- gemvtz_kernel in miniature (lab 6 part 4): pack_z's stream in the ring, x permuted, A from registers ----------
def _natural_k(fi, kappa):
    """unpackz_kernel's k of the element that register A's column kappa of k16 step fi holds, written from the two
    maps separately (not lab6.tz_k): kappa = 2 t + 8 (j >> 2) + (j & 1) (wgmma's A), k = 32 (fi >> 1) + 8 t
    + 4 (fi & 1) + 2 (j >> 2) + (j & 1) (unpackz_kernel)."""
    for t in range(4):
        for j in range(8):
            if 2 * t + 8 * (j >> 2) + (j & 1) == kappa:
                return 32 * (fi >> 1) + 8 * t + 4 * (fi & 1) + 2 * (j >> 2) + (j & 1)
    raise AssertionError(kappa)


def _planted(N, K, seed):
    return lab6.planted_np(N, K, 21, lab6.tz_plants(N, K, seed=seed))


def _zargs(W):
    z = lab6.lab3.pack_z_np(W)
    return z, (z["stream"], z["zbase"], z["eptr"], z["esc"])


def test_tz_k_is_unpackz_map_read_through_wgmma_a_layout():
    got = [[int(lab6.tz_k(fi, kappa)) for kappa in range(16)] for fi in range(4)]
    assert got == [[_natural_k(fi, kappa) for kappa in range(16)] for fi in range(4)]
    assert sorted(sum(got, [])) == list(range(64))
    for ln in range(32):                           # lab 3's fragment map (pack_z's layout) agrees with both
        for fi in range(4):
            for j in range(8):
                kappa = 2 * (ln & 3) + 8 * (j >> 2) + (j & 1)
                assert lab6.lab3.frag_pos(ln, fi, j) == ((ln >> 2) + 8 * ((j >> 1) & 1), _natural_k(fi, kappa))


@pytest.mark.parametrize("M,nw,ka,gs", [(1, 4, 1, 0), (5, 8, 2, 2), (9, 4, 2, 6), (16, 8, 1, 7), (17, 4, 1, 3),
                                        (32, 8, 2, 4)])
def test_gemvtz_x_permutation_pairs_fragments_with_x(M, nw, ka, gs):
    K = 512
    x = lab6.x_codes(M, K)                          # x[n][k] = n << 10 | k: every value names its place
    nb = lab6.nb_of(M)
    NT, XB = 8 * nb, 8 * nb * 128
    smem, STAGE = lab6.tz_stage(np.zeros((nw, K // 64, 1536), np.uint8), x, 0, nw, ka, gs)
    for g in range(nw // 4):                        # every warpgroup's own permuted buffer
        xp = STAGE + g * ka * XB
        assert xp % 1024 == 0
        for a in range(ka):
            for fi in range(4):
                B = lab6.desc_read(smem, lab6.wg_desc(xp + a * XB + 32 * fi), NT)
                for n in range(NT):
                    for kappa in range(16):
                        want = x[n, 64 * (gs + a) + _natural_k(fi, kappa)] if n < M else 0
                        assert B[n, kappa] == want, (g, a, fi, n, kappa)


def test_gemvtz_without_transpose_fails():
    M, K, ka, gs = 32, 512, 2, 2
    x = lab6.x_codes(M, K)
    want = lab6.tz_x_want(x, gs, 4, ka)
    stream0 = np.zeros((4, K // 64, 1536), np.uint8)
    smem, STAGE = lab6.tz_stage(stream0, x, 0, 4, ka, gs, transpose=False)
    bad = lab6.tz_b_tiles(smem, STAGE, 32, ka) != want
    assert bad.any(axis=(0, 1, 3)).all()            # every token row wrong
    assert bad.mean() == 0.75                       # only the words with t == q land where they should
    N = 128
    W = _planted(N, K, 1)
    _, args = _zargs(W)
    xv = lab6.bf16_normal(np.random.default_rng(2), (5, K))
    ok, worst = lab6.check_close_np(lab6.gemvtz_emulate(*args, xv, N, K, 4, 1, 2, transpose=False), _ref(xv, W))
    assert not ok and worst > 1


def test_gemvtz_transpose_without_xor_fails_in_rows_not_multiple_of_4():
    M, K, ka, gs = 32, 512, 1, 5
    x = lab6.x_codes(M, K)
    smem, STAGE = lab6.tz_stage(np.zeros((4, K // 64, 1536), np.uint8), x, 0, 4, ka, gs, xor=False)
    bad = (lab6.tz_b_tiles(smem, STAGE, 32, ka) != lab6.tz_x_want(x, gs, 4, ka)).any(axis=(0, 1, 3))
    # XOR with n & 7 = 4 swaps the two 32-k halves only, and the transpose never mixes them: those rows come out right
    assert np.flatnonzero(bad).tolist() == [n for n in range(32) if n & 3]
    N = 128
    W = _planted(N, K, 1)
    _, args = _zargs(W)
    xv = lab6.bf16_normal(np.random.default_rng(3), (9, K))
    ok, _ = lab6.check_close_np(lab6.gemvtz_emulate(*args, xv, N, K, 4, 1, 2, xor=False), _ref(xv, W))
    assert not ok


@pytest.mark.parametrize("nw,ka,rg,gs", [(4, 1, 0, 0), (4, 2, 1, 6), (8, 1, 1, 3), (8, 2, 0, 2)])
def test_gemvtz_fragments_are_decoded_weights_at_permuted_k(nw, ka, rg, gs):
    N, K = 256, 512
    W = _planted(N, K, 4)
    z, _ = _zargs(W)
    V = lab6.lab3.unpack_z_np(z["stream"], z["zbase"], N, K)        # lab 3's decoder: v, corrections not applied
    x = lab6.x_codes(3, K)
    smem, STAGE = lab6.tz_stage(z["stream"], x, rg, nw, ka, gs)
    XB = 1024
    assert np.array_equal(smem[ka * XB:STAGE].reshape(nw, ka, 1536), z["stream"][rg * nw:(rg + 1) * nw, gs:gs + ka])
    zB = lab6.lab3.zrow_word(z["zbase"], 16 * (rg * nw + np.arange(nw))[:, None], (np.arange(32) >> 2)[None, :])
    f = lab6.tz_fragments(smem, ka * XB, zB, nw, ka)
    rows = 16 * nw * rg + np.arange(16 * nw)
    for a in range(ka):
        for fi in range(4):
            A = lab6.rs_a_tiles(f[a][fi]).reshape(16 * nw, 16)           # warpgroup g's 64 rows, then g + 1's
            ks = [64 * (gs + a) + _natural_k(fi, kappa) for kappa in range(16)]
            assert np.array_equal(A, V[rows][:, ks]), (a, fi)


def test_gemvtz_stage_is_written_whole_and_1024_aligned():
    for nw in (4, 8):
        for nb in (1, 2, 4):
            for ka in (1, 2, 4):
                assert lab6.tz_stage_bytes(nw, nb, ka) == ka * (8 * nb * 128 + nw * 1536)
                assert lab6.tz_stage_bytes(nw, nb, ka) % 1024 == 0      # ring slots and the W part stay aligned
    N, K = 128, 512
    z, _ = _zargs(_planted(N, K, 1))
    x = lab6.bf16_normal(np.random.default_rng(5), (17, K))
    for nw, ka in ((4, 2), (8, 1)):
        a = lab6.tz_stage(z["stream"], x, 0, nw, ka, 2, fill=0xFF)[0]
        b = lab6.tz_stage(z["stream"], x, 0, nw, ka, 2, fill=0x00)[0]
        assert np.array_equal(a, b)                 # no byte of the stage or of an xp buffer is left unwritten


def test_gemvtz_stage_and_permuted_buffers_match_gemvtz_smem():
    # gemvtz_smem: 1 KB slack + the ring of lab 6's stage images + 3 permuted x buffers (KA XB each) a warpgroup
    if not hasattr(submission, "gemvtz_smem"):
        pytest.skip("submission.py has no gemvtz_smem")
    for nw in (4, 8):
        for nb in (1, 2, 4):
            for st, ka in ((1, 1), (4, 2), (6, 4)):
                xp = 3 * (nw // 4) * ka * 8 * nb * 128
                assert submission.gemvtz_smem(nw, st, nb, ka) == 1024 + st * lab6.tz_stage_bytes(nw, nb, ka) + xp


@pytest.mark.parametrize("kind,N,K,M,nw,ka,s", [
    ("planted", 128, 512, 1, 4, 1, 1),
    ("planted", 256, 512, 9, 8, 2, 3),              # T = 4 steps over 3 CTAs: 1, 1, 2
    ("planted", 128, 1024, 17, 4, 1, 3),            # T = 16: 5, 5, 6
    ("planted", 256, 512, 32, 8, 1, 2),
    ("planted", 128, 512, 16, 4, 2, 4),             # one step a CTA
    ("row_scaled", 128, 512, 5, 4, 2, 3),
    ("row_scaled", 256, 1024, 32, 8, 2, 3),
])
def test_gemvtz_emulation_within_spec_tolerance(kind, N, K, M, nw, ka, s):
    W = _planted(N, K, N + K) if kind == "planted" else lab6.lab3.row_scaled_np(N, K, seed=M)
    z, args = _zargs(W)
    if kind == "planted":
        assert 0.02 <= len({r for r, _, _ in lab6.tz_plants(N, K, seed=N + K)}) / N <= 0.07
    x = lab6.bf16_normal(np.random.default_rng(N + M), (M, K))
    y = lab6.gemvtz_emulate(*args, x, N, K, nw, ka, s)
    ref = _ref(x, W)
    ok, worst = lab6.check_close_np(y, ref)
    assert ok, worst
    judge.check_close(_bf16(y), torch.from_numpy(ref), False, f"lab6 gemvtz M={M} NW={nw} KA={ka} S={s}")


def test_gemvtz_emulation_on_submission_pack_z_bytes():
    # the kernel's own input: submission.pack_z's stream, windows and side table (byte-identical to lab 3's)
    N, K, M = 256, 512, 9
    W = _planted(N, K, 7)
    zp = submission.pack_z(_bf16(W))
    args = (zp.stream.numpy(), zp.zbase.numpy(), zp.eptr.numpy(), zp.esc.numpy())
    x = lab6.bf16_normal(np.random.default_rng(8), (M, K))
    y = lab6.gemvtz_emulate(*args, x, N, K, 8, 1, 3)
    assert np.array_equal(y, lab6.gemvtz_emulate(*_zargs(W)[1], x, N, K, 8, 1, 3))
    assert lab6.check_close_np(y, _ref(x, W))[0]


def test_gemvtz_without_corrections_fails():
    N, K, M = 128, 512, 5
    W = _planted(N, K, 3)
    z, args = _zargs(W)
    assert z["n_exc"] > 0
    x = lab6.bf16_normal(np.random.default_rng(9), (M, K))
    ref = _ref(x, W)
    assert lab6.check_close_np(lab6.gemvtz_emulate(*args, x, N, K, 4, 1, 2), ref)[0]
    ok, worst = lab6.check_close_np(lab6.gemvtz_emulate(*args, x, N, K, 4, 1, 2, corrections=False), ref)
    assert not ok and worst > 10
    with pytest.raises(judge.CheckFailed):
        judge.check_close(_bf16(lab6.gemvtz_emulate(*args, x, N, K, 4, 1, 2, corrections=False)),
                          torch.from_numpy(ref), False, "no corrections")


@pytest.mark.parametrize("nw,ka,s", [(4, 1, 1), (4, 1, 3), (8, 2, 2), (8, 1, 5)])
def test_gemvtz_exception_probe_is_exact(nw, ka, s):
    N, K = 256, 512
    W = _planted(N, K, 6)
    z, args = _zargs(W)
    ks = [z["esc"][z["eptr"][r]:z["eptr"][r + 1], 0].tolist() for r in range(N)]
    plants = lab6.tz_plants(N, K, seed=6)
    zeros = [int(k) for r, k in zip(*np.nonzero(W == 0)) if k in ks[r]]
    for k in [plants[0][1], plants[5][1], plants[-1][1]] + zeros[:1]:
        rows = [r for r in range(N) if k in ks[r]]
        assert rows
        x = np.zeros((9, K), np.uint16)
        x[5, k] = 0x3F80                            # 1.0 on one token
        y = lab6.gemvtz_emulate(*args, x, N, K, nw, ka, s)
        assert np.array_equal(y[5], W[:, k]), k     # v 1 + c 1 = fl(v + c) = W, every row
        assert not y[np.arange(9) != 5].any()
        y0 = lab6.gemvtz_emulate(*args, x, N, K, nw, ka, s, corrections=False)
        assert np.flatnonzero(y0[5] != W[:, k]).tolist() == rows


@pytest.mark.parametrize("N,K,M,nw,ka,s", [(128, 256, 1, 12, 1, 1), (96, 256, 1, 4, 1, 1), (256, 256, 1, 8, 3, 1),
                                           (128, 256, 1, 4, 1, 5), (128, 256, 33, 4, 1, 1)])
def test_gemvtz_emulate_refuses_configs_that_do_not_fit(N, K, M, nw, ka, s):
    with pytest.raises(ValueError, match="does not fit"):
        lab6.gemvtz_emulate(np.zeros((N // 16, K // 64, 1536), np.uint8), np.zeros(N, np.uint8),
                            np.zeros(N + 1, np.int32), np.zeros((1, 2), np.int32), np.zeros((M, K), np.uint16),
                            N, K, nw, ka, s)
