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
    """A module of tools/ (same_code, sass, pdl_probe, tz_probe); conftest.py puts tools/ on sys.path."""
    return importlib.import_module(name)


def _ptxas(d, cu_text, flags=None, name="k"):
    """nvcc -Xptxas -v -c of cu_text in directory d (submission's flags unless given): the CompletedProcess, whose
    stderr holds ptxas' register and spill report."""
    cu = d / f"{name}.cu"
    cu.write_text(cu_text)
    return subprocess.run([NVCC, *(submission.NVCC_FLAGS if flags is None else flags), "-Xptxas", "-v", "-c", str(cu),
                           "-o", str(d / f"{name}.o")], capture_output=True, text=True)


def _count(block_macro):
    m = re.search(r"#define " + block_macro + r"\((\w+)\)(.*?)\n// ---- END GENERATED", submission.KERNEL_SRC, re.S)
    return len(re.findall(r"\b" + m.group(1) + r"\(", m.group(2)))


@pytest.fixture(scope="module")
def ptxas_report(tmp_path_factory):
    assert NVCC, "nvcc is required (MUSE_REQUIRE_NVCC=1) but was not found"
    r = _ptxas(tmp_path_factory.mktemp("nvcc"), submission.KERNEL_SRC, name="kernels")
    assert r.returncode == 0, f"nvcc failed:\n{r.stderr[-4000:]}"
    return r.stderr


@needs_nvcc
def test_kernel_source_compiles_for_sm90_with_every_instantiation(ptxas_report):
    entries = re.findall(r"Compiling entry function '(\w+)' for 'sm_90a'", ptxas_report)
    n_gemv = sum(1 for e in entries if "gemv_kernel" in e or "gemvt_kernel" in e)   # C3 lines: PIPE 6 is gemvt
    n_gemvz = sum(1 for e in entries if "gemvz_kernel" in e or "gemvtz_kernel" in e)   # Z3 lines: PIPE 6 is gemvtz
    assert n_gemv == _count("GEMV_CONFIGS"), (n_gemv, _count("GEMV_CONFIGS"))
    assert n_gemvz == _count("GEMVZ_CONFIGS"), (n_gemvz, _count("GEMVZ_CONFIGS"))
    assert any("unpackz_kernel" in e for e in entries)


@needs_nvcc
def test_no_instantiation_spills_registers(ptxas_report):
    blocks = re.split(r"ptxas info\s+: Compiling entry function ", ptxas_report)[1:]
    assert blocks
    for b in blocks:
        name = b.split("'")[1]
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", b)
        assert m, f"no spill line for {name}"
        assert m.group(2) == "0" and m.group(3) == "0", f"{name} spills: {m.group(0)}"


def test_kernel_source_has_no_torch_headers():
    assert "torch/" not in submission.KERNEL_SRC and "ATen" not in submission.KERNEL_SRC


@needs_nvcc
def test_trace_build_compiles(tmp_path):
    # tools/trace_chain.py's MUSE_TRACE build (hooks in both kernels) must compile too
    src = tmp_path / "traced.cu"
    src.write_text("#define MUSE_TRACE\n" + submission.KERNEL_SRC)
    r = subprocess.run([NVCC, *submission.NVCC_FLAGS, "-c", str(src), "-o", str(tmp_path / "t.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]


@needs_nvcc
def test_x_ahead_and_tma_pipes_compile_without_spills(tmp_path):
    # PIPE 4/5 (x one trip ahead) and PIPE 6 (gemvt_kernel, TMA + wgmma) may be in no table yet: tune.py compiles
    # them; build them here too, from the source tune.py compiles
    import tune
    insts = [("gemv", (4, 1, 4, 1, False, 4)), ("gemv", (4, 1, 2, 1, True, 5)), ("gemvz", (4, 1, 4, 1, 4)),
             ("gemvz", (4, 1, 2, 1, 5)), ("gemv", (4, 4, 4, 1, False, 6)), ("gemv", (8, 8, 2, 2, False, 6)),
             ("gemv", (8, 12, 1, 1, False, 6)), ("gemvz", (4, 8, 4, 2, 6)), ("gemvz", (8, 4, 2, 1, 6))]
    r = _ptxas(tmp_path, tune.tune_sources(insts, 1)[0][0])
    assert r.returncode == 0, r.stderr[-3000:]
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert len(spills) >= 10 and set(spills) == {"0"}, r.stderr[-3000:]
    assert len(re.findall(r"Compiling entry function '\w*gemvtz_kernel", r.stderr)) == 2, r.stderr[-3000:]
    assert len(re.findall(r"Compiling entry function '\w*gemvt_kernel", r.stderr)) == 3, r.stderr[-3000:]


@needs_nvcc
def test_exception_walk_of_two_row_blocks_is_branch_free(tmp_path):
    # gemvz at R >= 2 (session 13: o_proj m=8 7.1 -> 6.7 us) issues its first chunks as predicated loads: the point of
    # that walk (session 12's rewrites with branches around their x loads lost). MUSE_EXC_WALK1 (the A/B's old walk
    # at every R) still compiles without spills.
    pytest.importorskip("triton")
    same_code, sass = _tool("same_code"), _tool("sass")
    src = "#define MUSE_EXC_WALK1\n" + submission.KERNEL_SRC
    insts = [i for i in same_code.table_insts(src) if i[0] == "gemvz" and i[1][4] != 6]
    assert insts
    r = _ptxas(tmp_path, same_code.tune_source(src, insts))
    assert r.returncode == 0, r.stderr[-3000:]
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert len(spills) >= len(insts) and set(spills) == {"0"}, r.stderr[-3000:]
    parts = {}
    for walk1 in (False, True):
        code = sass.sass_of(("#define MUSE_EXC_WALK1\n" if walk1 else "") + submission.KERNEL_SRC,
                            [("gemvz", (8, 1, 1, 2, 5))])
        (name,) = [k for k in code if "gemvz_kernel" in k]
        parts[walk1] = sass.counts(sass.exception_part(code[name]))
    assert parts[False]["ldg"] >= 40 and parts[False]["ldg_predicated"] >= parts[False]["ldg"] - 4, parts[False]
    assert parts[False]["bra"] <= 8, parts[False]
    assert parts[False]["ldg"] > parts[True]["ldg"], parts   # the first chunks of both row blocks at once


@needs_nvcc
def test_exception_walk_starts_after_the_first_trip_at_two_token_blocks():
    # session 14 (NOTES.md): at NB >= 2 the exception warp syncs on named barrier 1 right after its wait, and the
    # streaming warps arrive on it once (after their first trip); at NB = 1 neither (the walk starts at the wait).
    pytest.importorskip("triton")
    sass = _tool("sass")
    code = sass.sass_of(submission.KERNEL_SRC, [("gemvz", (4, 2, 2, 2, 2)), ("gemvz", (8, 1, 1, 2, 5))])
    seen = set()
    for name, lines in code.items():
        if "gemvz_kernel" not in name:
            continue
        nb2 = "gemvz_kernelILi4ELi2ELi2ELi2ELi2E" in name
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


def _pdl_probe():
    return _tool("pdl_probe")


@needs_nvcc
def test_pdl_probe_compiles_without_spills(tmp_path):
    # tools/pdl_probe.py's five kernels fit 64 registers (two CTAs of 512 threads per SM, like gemvz's m=1 plan)
    r = _ptxas(tmp_path, _pdl_probe().PROBE_CU, flags=["-O3", "-std=c++17", "-arch=sm_90"])
    assert r.returncode == 0, r.stderr[-3000:]
    regs = [int(n) for n in re.findall(r"Used (\d+) registers", r.stderr)]
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert len(regs) == 5 and max(regs) <= 64 and set(spills) == {"0"}, r.stderr[-3000:]


def test_pdl_probe_sizes_are_whole_batches():
    pp = _pdl_probe()
    for name, (nbytes, grid, block) in pp.SIZES.items():
        per_cta, nb = pp.batches(name)
        assert per_cta * grid * 16 == nbytes and nb * pp.U * block == per_cta, name
        vs = pp.variants(nb, block)
        assert [v[0] for v in vs][:4] == ["end", "top", "reg1", "reg2"]
        for label, kind, smu, chunk, per_warp, l2p, pdl in vs:
            step = pp.KIND_U[kind] * block
            assert smu % step == 0 and (per_cta - smu) % step == 0, (name, label)
            assert smu * 16 <= 96 * 1024 and smu < per_cta, (name, label)
    pp.SIZES["odd"] = (50331648, 255, 512)
    try:
        with pytest.raises(ValueError, match="odd"):
            pp.batches("odd")
    finally:
        del pp.SIZES["odd"]


@needs_nvcc
def test_same_code_tool_tells_identical_from_changed_machine_code(tmp_path):
    # tools/same_code.py: a refactor of GPU-tested kernels ships without a device run only if the code is the same
    same_code = _tool("same_code")
    insts = [("gemv", (4, 4, 4, 2, False, 6))]
    src = submission.KERNEL_SRC
    changed = src.replace("createpolicy.fractional.L2::evict_first", "createpolicy.fractional.L2::evict_last")
    assert changed != src
    runs = []
    for i, s in enumerate((src, src, changed)):
        d = tmp_path / str(i)
        d.mkdir()
        runs.append(same_code.kernel_text(s, insts, submission.NVCC_FLAGS, str(d)))
    (name,) = [k for k in runs[0] if "gemvt_kernel" in k]
    assert runs[0][name] == runs[1][name]
    assert runs[0][name] != runs[2][name]


@needs_nvcc
def test_tz_probe_variants_compile_without_spills(tmp_path):
    # tools/tz_probe.py's timing-only variants of gemvtz_kernel (each drops one part of the consumer loop) must
    # compile, and the shipped variant's source must be KERNEL_SRC itself
    same_code, tz_probe = _tool("same_code"), _tool("tz_probe")
    assert tz_probe.variant_source("") == submission.KERNEL_SRC
    assert all(i[1][-1] == 6 for i in tz_probe.variant_insts("MUSE_TZ_EMPTY"))
    with pytest.raises(SystemExit):
        tz_probe.variant_source("NOT_A_TZ_MACRO")
    insts = [("gemvz", (4, 8, 4, 1, 6)), ("gemvz", (8, 4, 1, 2, 6))]
    for v in tz_probe.VARIANTS[1:]:
        r = _ptxas(tmp_path, same_code.tune_source(tz_probe.variant_source(v), insts))
        assert r.returncode == 0, (v, r.stderr[-3000:])
        assert len(re.findall(r"Compiling entry function '\w*gemvtz_kernel", r.stderr)) == 2, (v, r.stderr[-3000:])
        assert set(re.findall(r"(\d+) bytes spill stores", r.stderr)) == {"0"}, (v, r.stderr[-3000:])


@needs_nvcc
def test_sass_tool_disassembles_and_finds_both_waits_of_gemvz():
    # tools/sass.py: SASS on a CPU machine through the cuobjdump in triton's wheel. gemvz_kernel has two
    # griddepcontrol.wait (ACQBULK): the streaming warps' and the exception warp's; the walk's x loads are counted
    pytest.importorskip("triton")
    sass = _tool("sass")
    code = sass.sass_of(submission.KERNEL_SRC, [("gemvz", (8, 1, 1, 2, 5))])
    (name,) = [k for k in code if "gemvz_kernel" in k]
    c = sass.counts(code[name])
    assert c["instructions"] > 500 and c["ldg"] > 0
    assert len(c["acqbulk"]) == 2, c["acqbulk"]
    text = sass.summary(name, code[name])
    assert "exception warp (its wait .. the next BAR.SYNC 0x0)" in text
    # a source change shows in the counts: without the exception warp's esc prefetch there is no CCTL before its wait
    changed = submission.KERNEL_SRC.replace('asm volatile("prefetch.global.L1 [%0];" ::"l"(esc + beg[r]));', ";")
    assert changed != submission.KERNEL_SRC
    code2 = sass.sass_of(changed, [("gemvz", (8, 1, 1, 2, 5))])
    before = lambda lines: sum(1 for l in lines[:sass.counts(lines)["acqbulk"][1]] if "CCTL" in l)
    assert before(code[name]) >= 1
    assert before(code2[name]) == 0


@needs_nvcc
def test_racecheck_named_barrier_probe_compiles(tmp_path):
    # tools/racecheck_named_barrier.cu (session 14): gemvz's go barrier reduced to two warps, for compute-sanitizer
    src = TOOLS / "racecheck_named_barrier.cu"
    r = subprocess.run([NVCC, "-arch=sm_90", "-o", str(tmp_path / "rnb"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
