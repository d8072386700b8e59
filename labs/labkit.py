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
