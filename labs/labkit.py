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


def split_units(T, S, NW, sidx, w):
    """Split-K of the register kernels (csrc/common.cuh split_units): the row's T units (gemv: U 32-wide blocks,
    gemvz: UG 64-wide groups) over the S CTAs x NW warps; warp q = sidx NW + w of Q = S NW takes units
    [q T // Q, (q + 1) T // Q), so shares differ by at most one unit and CTA sidx holds [sidx T // S, (sidx + 1) T // S).
    Returns (first unit, units). Where Q divides T it is the even split."""
    Q, q = S * NW, sidx * NW + w
    u0 = q * T // Q
    return u0, (q + 1) * T // Q - u0


def cta_units(T, S, sidx):
    """CTA sidx's slice [first, end) of the T units: the union of its warps' split_units shares."""
    return sidx * T // S, (sidx + 1) * T // S
