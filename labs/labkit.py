"""What every lab shares: the pass/fail printer and the token-block rule. Labs run as scripts from the repository
root (`python labs/lab2_fragments.py`), which puts labs/ on sys.path, so `from labkit import ...` works;
tests/test_labs.py adds labs/ to sys.path too. Like the labs, this file shares no code with submission.py."""


def check(ok, what):
    """Print what was verified; on a mismatch print it and exit non-zero."""
    if not ok:
        print(f"MISMATCH: {what}")
        raise SystemExit(1)
    print(f"verified: {what}")


def nb_of(m):
    """8-token blocks per mma K step: 1 for m <= 8, 2 for m <= 16, 4 for m <= 32."""
    return 1 if m <= 8 else 2 if m <= 16 else 4


def cta_units(T, S, sidx):
    """gemvz's split-K (csrc/common.cuh cta_slice): CTA sidx's slice [first, end) of the row's T units (UG 64-wide
    groups): d = T // S units each, one more for the first r = T % S CTAs, in sidx order."""
    d, r = divmod(T, S)
    c0 = sidx * d + min(sidx, r)
    return c0, c0 + d + (sidx < r)


def split_units(T, S, NW, sidx, w):
    """gemvz's split-K (csrc/common.cuh split_units): warp w of CTA sidx shares the CTA's slice with its NW warps the
    same way (wd units each, one more for the first wr warps). Returns (first unit, units). Shares differ by at most
    one unit; where S NW divides T it is the even split."""
    c0, c1 = cta_units(T, S, sidx)
    wd, wr = divmod(c1 - c0, NW)
    return c0 + w * wd + min(w, wr), wd + (w < wr)
