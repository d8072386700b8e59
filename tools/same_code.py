"""Does a change to the CUDA source change the machine code? A CPU-only check (nvcc, no GPU, no disassembler).

    python tools/same_code.py                 # the working tree's submission.py against HEAD's
    python tools/same_code.py --base 8868e22  # ... against that commit's
    python tools/same_code.py --extra 'gemvz:4,6,4,2,6' --extra 'gemv:4,8,4,2,0,6'
    python tools/same_code.py --base HEAD~1 --base-define MUSE_EXC_PRED   # a timed variant made the default

Both versions' KERNEL_SRC are compiled (tune.py's source builder) with the instantiations of both versions' C3 / Z3
lines, plus --extra ones (kind:template args, DUAL as 0/1), to one cubin each, and the .text section of every kernel
(its machine code) is compared byte for byte. Exit 0 when every kernel present in both is identical, 1 otherwise.

Why: a refactor of kernel code that the GPU has tested and timed is safe to ship without a device run only if the
compiled code is the same (session 9 used this to share the TMA ring's producer between gemvt_kernel and
gemvtz_kernel; a shared consumer loop changed gemvtz_kernel's code and was not kept).
"""
import argparse
import importlib.util
import os
import re
import struct
import subprocess
import sys
import tempfile

os.environ.setdefault("MUSE_BUILD", "0")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import submission as sub  # noqa: E402
import tune  # noqa: E402


def load_version(rev):
    """submission.py as a module: the working tree's (rev None) or a commit's."""
    if rev is None:
        return sub
    text = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:submission.py"], capture_output=True, text=True,
                          check=True).stdout
    d = tempfile.mkdtemp()
    path = os.path.join(d, "submission_base.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("submission_base", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def table_insts(src):
    """(kind, args) of every C3 / Z3 line of a KERNEL_SRC."""
    c3 = re.findall(r"C3\((\d+), (\d+), (\d+), (\d+), (false|true), (\d+)\)", src)
    z3 = re.findall(r"Z3\((\d+), (\d+), (\d+), (\d+), (\d+)\) \\", src)
    return ([("gemv", (int(a), int(b), int(c), int(d), e == "true", int(f))) for a, b, c, d, e, f in c3] +
            [("gemvz", tuple(int(v) for v in z)) for z in z3])


def parse_extra(s):
    kind, args = s.split(":")
    vals = [int(v) for v in args.split(",")]
    if kind == "gemv" and len(vals) == 6:
        return ("gemv", (vals[0], vals[1], vals[2], vals[3], bool(vals[4]), vals[5]))
    if kind == "gemvz" and len(vals) == 5:
        return ("gemvz", tuple(vals))
    raise argparse.ArgumentTypeError(f"--extra {s!r}: expected gemv:NW,U,NB,R,DUAL,PIPE or gemvz:NW,UG,NB,R,PIPE")


def tune_source(kernel_src, insts):
    """The .cu file tune.py's builder makes of kernel_src with insts (same renaming as the shipped build's)."""
    saved = sub.KERNEL_SRC
    sub.KERNEL_SRC = kernel_src
    try:
        return tune.tune_sources(insts, 1)[0][0]
    finally:
        sub.KERNEL_SRC = saved


def build_cubin(kernel_src, insts, nvcc_flags, d, tag="same_code"):
    """Compile kernel_src with insts to d/k.cubin; returns its path. SystemExit with nvcc's message on failure."""
    cu, cubin = os.path.join(d, "k.cu"), os.path.join(d, "k.cubin")
    with open(cu, "w") as f:
        f.write(tune_source(kernel_src, insts))
    r = subprocess.run(["nvcc", *nvcc_flags, "-cubin", "-o", cubin, cu], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"[{tag}] nvcc failed:\n{r.stderr[-3000:]}")
    return cubin


def kernel_text(kernel_src, insts, nvcc_flags, d):
    """{mangled kernel name: .text bytes} of kernel_src compiled with insts (tune.py's builder: same renaming)."""
    b = open(build_cubin(kernel_src, insts, nvcc_flags, d), "rb").read()
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    stroff = secs[shstrndx][4]
    out = {}
    for sh in secs:
        name = b[stroff + sh[0]:b.index(b"\0", stroff + sh[0])].decode()
        if name.startswith(".text."):
            out[name[6:]] = b[sh[4]:sh[4] + sh[5]]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="the commit to compare the working tree's submission.py with")
    ap.add_argument("--extra", action="append", type=parse_extra, default=[],
                    help="one more instantiation, kind:args (may repeat)")
    ap.add_argument("--define", action="append", default=[], help="#define NAME before the working tree's source")
    ap.add_argument("--base-define", action="append", default=[],
                    help="#define NAME before the base's source (e.g. the A/B variant a change makes the default)")
    args = ap.parse_args(argv)
    base = load_version(args.base)
    defs = lambda names: "".join(f"#define {n}\n" for n in names)
    new_src, old_src = defs(args.define) + sub.KERNEL_SRC, defs(args.base_define) + base.KERNEL_SRC
    insts = sorted(set(table_insts(sub.KERNEL_SRC)) | set(table_insts(base.KERNEL_SRC)) | set(args.extra), key=str)
    print(f"[same_code] {len(insts)} instantiations, working tree{' ' + '+'.join(args.define) if args.define else ''} "
          f"against {args.base}{' ' + '+'.join(args.base_define) if args.base_define else ''}", flush=True)
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        new = kernel_text(new_src, insts, sub.NVCC_FLAGS, d1)
        old = kernel_text(old_src, insts, base.NVCC_FLAGS, d2)
    both = sorted(set(new) & set(old))
    diff = [k for k in both if new[k] != old[k]]
    for k in diff:
        print(f"[same_code] DIFFERS {k} ({len(old[k])} -> {len(new[k])} bytes)")
    for k in sorted(set(new) ^ set(old)):
        print(f"[same_code] only in {'the working tree' if k in new else args.base}: {k}")
    print(f"[same_code] {len(both) - len(diff)} of {len(both)} kernels identical")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
