"""The kernel source compiles with nvcc alone (no torch headers) for sm_90a, every instantiation, no spills."""
import importlib
import os
import pathlib
import re
import shutil
import subprocess

import pytest

import submission

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
needs_nvcc = pytest.mark.skipif(NVCC is None and not os.environ.get("MUSE_REQUIRE_NVCC"),
                                reason="nvcc not installed (CI sets MUSE_REQUIRE_NVCC=1 and has it)")
TOOLS = pathlib.Path(__file__).resolve().parents[1] / "tools"


def _tool(name):
    """A module of tools/ (same_code, sass); conftest.py puts tools/ on sys.path."""
    return importlib.import_module(name)


def _ptxas(d, cu_text, flags=None, name="k"):
    """nvcc -Xptxas -v -c of cu_text in directory d (submission's flags unless given): the CompletedProcess, whose
    stderr holds ptxas' register and spill report."""
    cu = d / f"{name}.cu"
    cu.write_text(cu_text)
    return subprocess.run([NVCC, *(submission.NVCC_FLAGS if flags is None else flags), "-Xptxas", "-v", "-c", str(cu),
                           "-o", str(d / f"{name}.o")], capture_output=True, text=True)


CSRC = pathlib.Path(__file__).resolve().parents[1] / "csrc"


def _nvcc_csrc(d, defines=(), name="kernels"):
    """nvcc -Xptxas -v -c of csrc/kernels.cu itself (the files, not submission.py's copy) with -D defines."""
    return subprocess.run([NVCC, *submission.NVCC_FLAGS, *(f"-D{x}" for x in defines), "-Xptxas", "-v", "-c",
                           str(CSRC / "kernels.cu"), "-o", str(d / f"{name}.o")], capture_output=True, text=True)


def _entries(report):
    return re.findall(r"Compiling entry function '(\w+)' for 'sm_90a'", report)


def _spill_lines(report):
    """{entry: (spill stores, spill loads)} from a ptxas -v report."""
    out = {}
    for b in re.split(r"ptxas info\s+: Compiling entry function ", report)[1:]:
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", b)
        out[b.split("'")[1]] = (m.group(2), m.group(3)) if m else None
    return out


@pytest.fixture(scope="module")
def ptxas_report(tmp_path_factory):
    assert NVCC, "nvcc is required (MUSE_REQUIRE_NVCC=1) but was not found"
    r = _nvcc_csrc(tmp_path_factory.mktemp("nvcc"))
    assert r.returncode == 0, f"nvcc failed:\n{r.stderr[-4000:]}"
    return r.stderr


@needs_nvcc
def test_kernel_source_compiles_for_sm90_with_every_instantiation(ptxas_report):
    insts = _tool("same_code").table_insts(submission.KERNEL_SRC)
    entries = _entries(ptxas_report)
    for kind in [f.name for f in submission.FAMILIES]:
        n = sum(1 for e in entries if re.search(r"\d" + kind + r"_kernelI", e))
        assert n == sum(1 for k, _ in insts if k == kind), (kind, n)
    assert any("unpackz_kernel" in e for e in entries)


@needs_nvcc
def test_no_instantiation_spills_registers(ptxas_report):
    spills = _spill_lines(ptxas_report)
    assert spills
    for name, s in spills.items():
        assert s == ("0", "0"), f"{name} spills: {s}"


def _mangled(kind, t):
    """The mangled entry name of one instantiation (t: its template arguments as instance_of gives them)."""
    args = "".join(f"Lb{int(v)}E" if isinstance(v, bool) else f"Li{v}E" for v in t)
    return f"_Z{len(kind) + 7}{kind}_kernelI{args}E"


@needs_nvcc
def test_cost_model_families_declare_the_occupancy_their_registers_give(ptxas_report):
    # PLAN_MODELS' occ (CTAs an SM holds at S = 1) is what the compiled kernel's registers, threads and shared memory
    # allow (the planner prices waves with it; a kernel change that moves its registers must move occ, or refit)
    regs = {}
    for b in re.split(r"ptxas info\s+: Compiling entry function ", ptxas_report)[1:]:
        name = b.split("'")[1]
        r, sm = re.search(r"Used (\d+) registers", b), re.search(r"(\d+) bytes smem", b)
        regs[name.split("Ev")[0] + "E"] = (int(r.group(1)), int(sm.group(1)) if sm else 0)
    for md in submission.PLAN_MODELS:
        for fam in md.families:
            kind, t = submission.instance_of(fam.config, 8 * md.nb, False)
            nreg, static = next(v for k, v in regs.items() if k.startswith(_mangled(kind, t)))
            threads = 32 * (fam.config.nw + 1)          # + the exception warp (gemvz) or the producer (gemvt)
            per_warp = -(-nreg * 32 // 256) * 256
            dyn = (submission.gemvt_smem(fam.config.nw, fam.config.st, md.nb, fam.config.ka)
                   if kind == "gemvt" else 0)
            occ = min(65536 // (per_warp * (threads // 32)), 2048 // threads, 228 * 1024 // (static + dyn + 1024))
            assert occ == fam.occ, (fam.config, nreg, static, occ)


def test_kernel_source_has_no_torch_headers():
    for src in (submission.KERNEL_SRC, submission.BIND_SRC):
        assert "torch/" not in src and "ATen" not in src


@needs_nvcc
@pytest.mark.parametrize("define", ["MUSE_TRACE", "MUSE_SKIP_CORRECTIONS"])
def test_test_builds_compile(tmp_path, define):
    # the defines of the tools' and tests' variant builds: MUSE_TRACE (tools/trace_chain.py: hooks in every kernel; its
    # timestamps cost registers, and some configs spill: a traced build is for where time goes, not for how much) and
    # MUSE_SKIP_CORRECTIONS (tools/ab.py's exception cost, test_gpu's check that the corrections matter: no spills, so
    # its timings compare with the shipped build's). Their macros live in csrc/instruments.cuh, which a variant build
    # puts in front of the shipped source (tools/cases.py variant_extension): compiled here as such a build is.
    head = _tool("cases").instruments()
    assert define in head and define not in submission.KERNEL_SRC
    r = _ptxas(tmp_path, submission.variant_source((define,), head=head))
    assert r.returncode == 0, r.stderr[-3000:]
    if define == "MUSE_SKIP_CORRECTIONS":
        assert set(_spill_lines(r.stderr).values()) == {("0", "0")}


@needs_nvcc
def test_x_ahead_and_tma_kernels_compile_without_spills(tmp_path):
    # loop 2 (x one trip ahead) and gemvt_kernel (TMA + wgmma) configs may be in no table yet: tune.py compiles them;
    # build them here too, from the source a variant build compiles
    insts = [("gemv", (4, 1, 4, 1, False, 2, 0)), ("gemv", (4, 1, 2, 1, True, 2, 2)), ("gemvz", (4, 1, 4, 1, 2, 0, 0)),
             ("gemvz", (4, 1, 2, 1, 2, 2, 0)), ("gemvt", (4, 4, 4, 1)), ("gemvt", (8, 8, 2, 2)), ("gemvt", (8, 12, 1, 1))]
    r = _ptxas(tmp_path, submission.variant_source((), insts))
    assert r.returncode == 0, r.stderr[-3000:]
    spills = _spill_lines(r.stderr)
    assert len(spills) == len(insts) + 1 and set(spills.values()) == {("0", "0")}, r.stderr[-3000:]
    assert len([e for e in spills if "gemvt_kernel" in e]) == 3, list(spills)


@needs_nvcc
def test_ring_kernels_of_the_12bit_stream_compile_without_spills_or_serialised_wgmma(tmp_path):
    # gemvtz_kernel's configs tune.py and the tests compile (NW 4 / 8, NB 2 / 4, one to four groups a stage), in the
    # shipped build and the timing-only MUSE_TZ_EMPTY build: no spill, and no wgmma that ptxas serialises (its warning
    # says so; the decoded fragments are wgmma's A registers and must stay untouched while a group is in flight)
    insts = [("gemvtz", (4, 8, 4, 2)), ("gemvtz", (8, 4, 4, 2)), ("gemvtz", (4, 6, 2, 2)), ("gemvtz", (8, 8, 2, 1)),
             ("gemvtz", (4, 4, 4, 4)), ("gemvtz", (4, 8, 1, 1))]
    for defines, head in (((), ""), (("MUSE_TZ_EMPTY",), _tool("cases").instruments())):
        r = _ptxas(tmp_path, submission.variant_source(defines, insts, head=head), name=f"tz{len(defines)}")
        assert r.returncode == 0, r.stderr[-3000:]
        assert "wgmma" not in r.stderr.lower(), r.stderr[-3000:]       # e.g. C7510 / C7520 serialisation warnings
        spills = _spill_lines(r.stderr)
        assert len([e for e in spills if "gemvtz_kernel" in e]) == len(insts), list(spills)
        assert set(spills.values()) == {("0", "0")}, r.stderr[-3000:]


@needs_nvcc
def test_gemvtz_frees_a_ring_slot_only_after_its_shared_loads_have_landed():
    # every consumer arrival on a slot's empty barrier comes after an instruction that reads every ld.shared of that
    # slot: the release does not wait for loads whose results are unused, and the producer's next copy then overwrote
    # them (pooler m = 31 / 32 at KA = 2, a few percent of calls wrong, before mbar_arrive_after: FINDINGS 12.7)
    pytest.importorskip("triton")
    sass = _tool("sass")
    for inst in (("gemvtz", (4, 6, 4, 2)), ("gemvtz", (4, 8, 4, 2)), ("gemvtz", (8, 4, 2, 2)), ("gemvtz", (4, 4, 4, 4))):
        code = sass.sass_of(submission.KERNEL_SRC, [inst])
        lines = next(l for n, l in code.items() if sass.kernel_matches(n, inst))
        arrivals = sass.slot_reads_unused_at_release(lines)
        assert len(arrivals) >= 3, (inst, arrivals)                   # the three take() sites of the pipelined loop
        assert all(not bad for _, bad in arrivals), (inst, arrivals)


@needs_nvcc
def test_exception_walk_of_two_row_blocks_is_branch_free(tmp_path):
    # gemvz at R >= 2 (FINDINGS.md: o_proj m=8 7.1 -> 6.7 us) issues its first chunks as predicated loads: the point of
    # that walk (rewrites with branches around their x loads lost, by up to 1.8 us)
    pytest.importorskip("triton")
    sass = _tool("sass")
    code = sass.sass_of(submission.KERNEL_SRC, [("gemvz", (8, 1, 1, 2, 2, 2, 0)), ("gemvz", (8, 1, 1, 1, 2, 2, 0))])
    parts = {}
    for name, lines in code.items():
        for r in (1, 2):
            if sass.kernel_matches(name, ("gemvz", (8, 1, 1, r, 2, 2, 0))):
                parts[r] = sass.counts(sass.exception_part(lines))
    assert parts[2]["ldg"] >= 40 and parts[2]["ldg_predicated"] >= parts[2]["ldg"] - 4, parts[2]
    assert parts[2]["bra"] <= 8, parts[2]
    assert parts[2]["ldg"] > parts[1]["ldg"], parts   # the first chunks of both row blocks at once


@needs_nvcc
def test_exception_walk_starts_after_the_first_trip_at_two_token_blocks():
    # FINDINGS.md (session 14): at NB >= 2 the exception warp syncs on named barrier 1 right after its wait, and the
    # streaming warps arrive on it once (after their first trip); at NB = 1 neither (the walk starts at the wait).
    pytest.importorskip("triton")
    sass = _tool("sass")
    code = sass.sass_of(submission.KERNEL_SRC, [("gemvz", (4, 2, 2, 2, 1, 2, 0)), ("gemvz", (8, 1, 1, 2, 2, 2, 0))])
    seen = set()
    for name, lines in code.items():
        if "gemvz_kernel" not in name:
            continue
        nb2 = sass.kernel_matches(name, ("gemvz", (4, 2, 2, 2, 1, 2, 0)))
        arv = [i for i, l in enumerate(lines) if re.search(r"BAR\.ARV 0x1\b", l)]
        syn = [i for i, l in enumerate(lines) if re.search(r"BAR\.SYNC\S* 0x1\b", l)]
        acq = sass.counts(lines)["acqbulk"]
        if nb2:
            assert len(arv) >= 1 and len(syn) == 1 and len(acq) == 2 and syn[0] > acq[1], (arv, syn, acq)
            part = sass.exception_part(lines)   # its walk, past the go barrier, up to the CTA barrier
            assert part and sass.counts(part)["ldg_predicated"] >= 40, sass.counts(part or [])
        else:
            assert not arv and not syn, (arv, syn)
        seen.add(nb2)
    assert seen == {True, False}


@needs_nvcc
def test_sass_tool_disassembles_and_finds_both_waits_of_gemvz():
    # tools/sass.py: SASS on a CPU machine through the cuobjdump in triton's wheel. gemvz_kernel has two
    # griddepcontrol.wait (ACQBULK): the streaming warps' and the exception warp's; the walk's x loads are counted
    pytest.importorskip("triton")
    sass = _tool("sass")
    code = sass.sass_of(submission.KERNEL_SRC, [("gemvz", (8, 1, 1, 2, 2, 2, 0))])
    (name,) = [k for k in code if "gemvz_kernel" in k]
    c = sass.counts(code[name])
    assert c["instructions"] > 500 and c["ldg"] > 0
    assert len(c["acqbulk"]) == 2, c["acqbulk"]
    text = sass.summary(name, code[name])
    assert "exception warp (its wait .. the next BAR.SYNC 0x0)" in text
    # a source change shows in the counts: without the exception warp's esc prefetch there is no CCTL before its wait
    changed = submission.KERNEL_SRC.replace('asm volatile("prefetch.global.L1 [%0];" ::"l"(esc + beg[r]));', ";")
    assert changed != submission.KERNEL_SRC
    code2 = sass.sass_of(changed, [("gemvz", (8, 1, 1, 2, 2, 2, 0))])
    before = lambda lines: sum(1 for l in lines[:sass.counts(lines)["acqbulk"][1]] if "CCTL" in l)
    assert before(code[name]) >= 1
    assert before(code2[name]) == 0


@needs_nvcc
def test_racecheck_named_barrier_probe_compiles(tmp_path):
    # tools/racecheck_named_barrier.cu (session 14): gemvz's go barrier reduced to two warps, for compute-sanitizer
    src = TOOLS / "racecheck_named_barrier.cu"
    r = subprocess.run([NVCC, "-arch=sm_90", "-o", str(tmp_path / "rnb"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
