"""The machine code (SASS) of kernel instantiations, on a CPU machine: nvcc compiles them as tune.py's builder does
(same renaming and flags as the shipped build), and the cuobjdump that ships inside the triton wheel
(triton/backends/nvidia/bin, triton 3.7.1 carries CUDA 13.1's, which reads sm_90a cubins) disassembles them.

    python tools/sass.py gemvz:8,1,1,2,2,2,0                   # summary of the working tree's kernel
    python tools/sass.py --define MUSE_SKIP_CORRECTIONS gemvz:8,1,1,2,2,2,0 --out /tmp/k.sass

For each kernel asked for: instructions, global loads (and how many are predicated rather than branched around),
branches, barriers, and the position of every griddepcontrol.wait (ACQBULK). For gemvz_kernel also the exception
warp's part: from its griddepcontrol.wait (the second ACQBULK) to the first BAR.SYNC after it.
Instantiations are written family:template args in today's order (same_code's --extra), for every version: --rev
reads an older version too. --define (a variant of csrc/instruments.cuh, as the tools' builds) puts that header in front.
The instantiations are compiled in one file with the shipped build's own, as the shipped extension and
tools/same_code.py compile them: the same template compiled in another company comes out a few instructions
different. --alone compiles only the ones asked for (faster).

Why: rewrites of gemvz's exception walk that issue the same loads lost by up to 1.8 us, and their code differed from
the shipped walk's in shape (branches around the x loads instead of predicated loads): read the code before spending
device time (FINDINGS, "the exception warp").
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import types

os.environ.setdefault("MUSE_BUILD", "0")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import submission as sub  # noqa: E402
import same_code  # noqa: E402


def cuobjdump():
    """Path of triton's cuobjdump; SystemExit naming what is missing."""
    try:
        import triton
    except ImportError:
        raise SystemExit("[sass] needs the triton package (its wheel carries cuobjdump): pip install triton==3.7.1 "
                         "(README's CPU command)")
    p = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.access(p, os.X_OK):
        raise SystemExit(f"[sass] no cuobjdump at {p}")
    return p


def sass_of(kernel_src, insts, mod=None):
    """{kernel name: [SASS lines]} of kernel_src (a version's kernel source, maybe with #define lines and a head first)
    compiled with exactly insts ((family, args) in today's form); mod: the version's submission module (default the
    working tree's)."""
    with tempfile.TemporaryDirectory() as d:
        mod = mod or sub
        src = (mod.variant_source((), insts, kernel_src=kernel_src) if same_code.is_table_layout(kernel_src) else
               same_code.version_source(types.SimpleNamespace(KERNEL_SRC=kernel_src), insts))
        cubin = same_code.build_cubin(src, sub.NVCC_FLAGS, d, tag="sass")
        r = subprocess.run([cuobjdump(), "-sass", cubin], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"[sass] cuobjdump failed:\n{r.stderr[-3000:]}")
    out, name = {}, None
    for line in r.stdout.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name and re.search(r"/\*[0-9a-f]{4,}\*/", line):
            out[name].append(re.sub(r"\s*/\* 0x[0-9a-f]+ \*/", "", line).strip())
    return out


def kernel_matches(name, inst, table_layout=True):
    """Does the mangled kernel name belong to instantiation inst (today's form; an older version's kernels are named
    with PIPE: same_code.to_pipe)?"""
    if not table_layout:
        inst = same_code.to_pipe(*inst) or ("none", ())
        if inst[0] == "none":
            return False
    kind, args = inst
    base = sub.family_named(kind).kernel
    tmpl = "".join("Lb1E" if v is True else "Lb0E" if v is False else f"Li{v}E" for v in args)
    return re.search(r"\d" + base + "I" + tmpl + "E", name) is not None


def counts(lines):
    has = lambda pat: sum(1 for l in lines if re.search(pat, l))
    return dict(instructions=len(lines), ldg=has(r"\bLDG"), ldg_predicated=has(r"@!?U?P\d+ LDG"), bra=has(r"\bBRA\b"),
                bar=has(r"\bBAR\."), acqbulk=[i for i, l in enumerate(lines) if "ACQBULK" in l])


def exception_part(lines):
    """gemvz_kernel's exception-warp code: from its griddepcontrol.wait (the second ACQBULK) to the next BAR.SYNC on
    barrier 0 (the CTA's barrier; at NB >= 2 the walk first syncs on named barrier 1, the streaming warps' go);
    None when the kernel has no second wait."""
    acq = counts(lines)["acqbulk"]
    if len(acq) < 2:
        return None
    b = next((i for i in range(acq[1], len(lines)) if re.search(r"BAR\.SYNC\S* 0x0\b", lines[i])), len(lines))
    return lines[acq[1]:b]


def slot_reads_unused_at_release(lines):
    """gemvtz_kernel's consumer stages: for every arrival that frees a ring slot (SYNCS.ARRIVE.TRANS64.A1T0 without a
    byte count), the LDS.128 issued since the stage's wait (SYNCS.PHASECHK) whose destination registers no instruction
    reads before that arrival: a slot handed back while such a load may still be in flight (FINDINGS 12.7). Returns
    [(arrival line, [those loads])] for every arrival; an empty inner list is a safe one."""
    ins = [re.sub(r"^/\*[0-9a-f]+\*/\s*", "", l).rstrip(" ;") for l in lines]
    out = []
    for ai, t in enumerate(ins):
        if "SYNCS.ARRIVE.TRANS64.A1T0" not in t:
            continue
        waits = [i for i in range(ai) if "SYNCS.PHASECHK" in ins[i]]
        if not waits:
            continue
        bad = []
        for i in range(waits[-1], ai):
            m = re.search(r"LDS\.128 R(\d+),", ins[i])
            if not m:
                continue
            regs = [f"R{r}" for r in range(int(m.group(1)), int(m.group(1)) + 4)]
            if not any(re.search(r"\b" + rg + r"\b", ins[j].split(" ", 1)[-1]) for j in range(i + 1, ai) for rg in regs):
                bad.append(ins[i])
        out.append((t, bad))
    return out


def summary(name, lines):
    c = counts(lines)
    s = (f"{name}: {c['instructions']} instructions, {c['ldg']} LDG ({c['ldg_predicated']} predicated), "
         f"{c['bra']} BRA, {c['bar']} BAR, griddepcontrol.wait at instruction(s) {c['acqbulk']}")
    part = exception_part(lines) if "gemvz_kernel" in name else None
    if part is not None:
        e = counts(part)
        s += (f"\n    exception warp (its wait .. the next BAR.SYNC 0x0): {e['instructions']} instructions, {e['ldg']} LDG "
              f"({e['ldg_predicated']} predicated), {e['bra']} BRA")
    return s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default=None, help="a commit's submission.py instead of the working tree's")
    ap.add_argument("--define", action="append", default=[], help="a macro prepended to the kernel source")
    ap.add_argument("--out", default=None, help="write the full SASS of the kernels asked for here")
    ap.add_argument("--alone", action="store_true", help="compile only the instantiations asked for")
    ap.add_argument("insts", nargs="+", type=same_code.parse_extra, help="family:template args, e.g. gemvz:8,1,1,2,2,2,0")
    args = ap.parse_args(argv)
    mod = same_code.load_version(args.rev) if args.rev else sub
    head = open(os.path.join(ROOT, "csrc", "instruments.cuh")).read() if args.define else ""
    src = "".join(f"#define {n}\n" for n in args.define) + head + mod.KERNEL_SRC
    insts = list(args.insts) if args.alone else sorted(set(same_code.table_insts(src)) | set(args.insts), key=str)
    code = sass_of(src, insts, mod)
    layout = same_code.is_table_layout(mod.KERNEL_SRC)
    kernels = {k: v for k, v in code.items() if any(kernel_matches(k, i, layout) for i in args.insts)}
    if not kernels:
        raise SystemExit("[sass] no kernel compiled: check the instantiations")
    for k, v in kernels.items():
        print(summary(k, v))
    if args.out:
        with open(args.out, "w") as f:
            for k, v in kernels.items():
                f.write(f"// {k}\n" + "\n".join(v) + "\n")
        print(f"[sass] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
