"""Tests of tools/: the case and variant specs (cases.py), the A/B timer's choices, checks and summary (ab.py),
trace_chain's build and analysis, pdl_probe's kernels and sizes, same_code. CPU; the GPU parts skip without CUDA.
The core CPU suite (dispatch, tables, build.py, validation) is tests/test_cpu.py."""
import json
import os
import re
import shutil
import subprocess
import types

import pytest
import torch

import cases
import judge
import submission as S

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
needs_nvcc = pytest.mark.skipif(NVCC is None and not os.environ.get("MUSE_REQUIRE_NVCC"),
                                reason="nvcc not installed (CI sets MUSE_REQUIRE_NVCC=1 and has it)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def builds(monkeypatch):
    """What the tools ask build_extension for, as (defines, insts), on a machine that pretends to have CUDA; the
    "extension" built is ('built', *defines). A variant (defines) must come with csrc/instruments.cuh as its head, where
    its macros live; the shipped source with none."""
    calls = []

    def build_extension(defines=(), insts=None, head=""):
        assert head == (cases.instruments() if defines else ""), (defines, head[:80])
        calls.append((defines, insts))
        return ("built",) + tuple(defines)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(S, "build_extension", build_extension)
    return calls


def _inst(spec, **fields):
    """The instantiation of the case's planned config with fields replaced."""
    p = cases.planned(spec)
    return cases.inst_of(p.config._replace(**fields), p.m, p.dual)


# ---- cases.py: the case and variant specs ------------------------------------------------------------
def test_tool_case_specs_parse_or_say_what_is_wrong():
    assert cases.parse("pooler:1") == ("pooler", 1, None, {})
    assert cases.parse("router:16:plain:nw=8:cl=0") == ("router", 16, "plain", {"nw": 8, "cl": 0})
    assert cases.parse("o_proj:32:st=8:wseed=99") == ("o_proj", 32, None, {"st": 8, "wseed": 99})
    for bad, msg in (("poolr:1", "with a layer in"), ("pooler", "expected"), ("pooler:1:fast", "cannot read"),
                     ("pooler:1:pf=x", "integers"), ("pooler:1:dbg=1", r"unknown field\(s\) \['dbg'\]"),
                     ("pooler:1:co=-1", r"unknown field\(s\) \['co'\]"), ("pooler:1:pipe=2", r"\['pipe'\]")):
        with pytest.raises(SystemExit, match=msg):
            cases.parse(bad)


def test_case_plan_on_the_cpu_is_plan_for_with_the_fields_replaced():
    # what ab / trace_chain / ncu_case compile before any GPU work: prepare's plan, found the way prepare finds it
    p = cases.planned("pooler:1:plain:pf=1:xseed=3")
    want = S.plan_for("pooler", 4096, 8192, 1, False, True, "plain").config._replace(pf=1)
    assert p == cases.Planned(want, 4096, 8192, 1, False)
    r = cases.planned("router:8")
    assert r.dual and isinstance(r.config, S.GemvConfig)
    # a public-config shape (judge.py --shapes public) is a case too, planned by the planner (no table row)
    g = cases.planned("gemma-2b.down:1:compressed:loop=0:mb=0")
    d = judge.SHAPE_SETS["public"]["gemma-2b.down"]
    want = S.plan_for("gemma-2b.down", d["N"], d["K"], 1, False, True, "compressed")
    assert want.why.startswith("planner")
    assert g == cases.Planned(want.config._replace(loop=0, mb=0), d["N"], d["K"], 1, False)
    with pytest.raises(SystemExit, match=r"has no field\(s\) \['ug'\]"):
        cases.planned("router:8:ug=2")                 # the router is plain (DUAL): a GemvConfig has no ug


def test_case_with_another_kernel_family_builds_its_config_from_the_fields():
    # e.g. a plain m <= 16 shape timed on another family than the one the planner sends it to
    assert cases.parse("o_proj:8:plain:gemvt:s=2") == ("o_proj", 8, "plain", {"s": 2, "kind": "gemvt"})
    p = cases.planned("qwen2-7b.down:1:plain:gemvt:nw=4:st=4:ka=2:s=3:cl=2")
    assert p.config == S.GemvtConfig(nw=4, s=3, st=4, ka=2, cl=2) and (p.N, p.K) == (3584, 18944)
    assert cases.inst_of(p.config, p.m, p.dual) == ("gemvt", (4, 4, 1, 2))
    same = cases.planned("llama3-8b.down:1:plain:gemv:s=4")          # the plan's own family: fields replaced as usual
    assert same.config == cases.planned("llama3-8b.down:1:plain").config
    for bad, msg in (("llama3-8b.down:1:plain:gemvt:nw=4:s=3", r"needs the field\(s\) \['ka', 'st'\]"),
                     ("llama3-8b.down:1:plain:gemvt:nw=4:st=4:ka=2:s=3:ug=1", r"has no field\(s\) \['ug'\]")):
        with pytest.raises(SystemExit, match=msg):
            cases.planned(bad)
    with pytest.raises(SystemExit, match="cannot read"):
        cases.parse("o_proj:8:gemv:gemvt")


def test_instantiation_of_each_config_kind_names_its_kernel_and_template_args():
    assert cases.inst_of(S.GemvConfig(8, 4, 2, 1, 0, 1, 0), 16, True) == ("gemv", (8, 2, 2, 1, True, 0, 1))
    assert cases.inst_of(S.GemvzConfig(4, 1, 2, 2, 2, 2, 0, 0), 1, False) == ("gemvz", (4, 2, 1, 2, 2, 2, 0))
    assert cases.inst_of(S.GemvzConfig(4, 1, 2, 2, 2, 2, 1, 0), 1, False) == ("gemvz", (4, 2, 1, 2, 2, 2, 1))
    assert cases.inst_of(S.GemvtConfig(4, 2, 8, 2), 32, False) == ("gemvt", (4, 8, 4, 2))
    assert cases.inst_of(None, 1, False) is None       # the fallback path


def test_variant_names_become_defines_or_say_what_is_wrong():
    assert cases.variant_defines("") == ()
    assert cases.variant_defines("MUSE_TRACE+MUSE_SKIP_CORRECTIONS") == ("MUSE_TRACE", "MUSE_SKIP_CORRECTIONS")
    with pytest.raises(SystemExit, match="not a macro name"):
        cases.variant_defines("X=1")
    with pytest.raises(SystemExit, match="mentions MUSE_SKIP_CORECTIONS"):   # a typo would time shipped code
        cases.variant_defines("MUSE_SKIP_CORECTIONS")


def test_balanced_rows_is_a_permutation_that_evens_the_exceptions_per_group():
    # cases.py's bal=G (session 15): a row order in which every G rows hold about as many out-of-window weights
    w = judge.trained_like(256, 1024, 3)
    tiny = torch.tensor([2.0 ** -(60 + j % 40) for j in range(128)], dtype=torch.bfloat16)
    w[:32, ::8] = tiny                        # far below the window, 40 classes: 128 exceptions in each of 32 rows
    per_group = lambda w: S.pack_z(w).eptr.diff().view(-1, 32).sum(1)
    before = per_group(w)
    assert before[0] >= 32 * 128 and before[0] > 10 * before[1:].max()
    perm = cases.balanced_rows(w, 32)
    assert sorted(perm.tolist()) == list(range(256))
    after = per_group(w[perm])
    assert after.sum() == before.sum() and after.max() - after.min() <= 128 + before[1:].max()
    assert after.max() < before.max() / 4
    with pytest.raises(SystemExit, match="divisor"):
        cases.balanced_rows(w, 48)


# ---- ab.py: choices, checks, summary ---------------------------------------------------------------
def test_ab_choices_are_variants_by_field_values_by_placements():
    import ab
    args = ab.parse_args(["--variant", "", "--variant", "MUSE_SKIP_CORRECTIONS", "--field", "pf=0,1",
                          "--preps", "2", "--xallocs", "1", "o_proj:1"])
    cs = ab.choices(args)
    assert len(cs) == 2 * 2 * 3 and len(set(cs)) == len(cs)
    assert {c.variant for c in cs} == {(), ("MUSE_SKIP_CORRECTIONS",)} and {c.value for c in cs} == {0, 1}
    # the placements: preparations 0 and 1 with their own x, then preparation 0 with x in a fresh allocation
    assert [(c.prep, c.xalloc) for c in cs[:3]] == [(0, None), (1, None), (0, 0)]
    label = ab.labeler(args)
    assert label(cs[2]) == "shipped pf=0 prep 0 x 0" and label(cs[-1], place=False) == "MUSE_SKIP_CORRECTIONS pf=1"
    one = ab.parse_args(["o_proj:1"])                   # nothing varies: one choice, the shipped build
    assert ab.choices(one) == [ab.Choice((), None, 0, None)] and ab.labeler(one)(ab.choices(one)[0]) == "shipped"


@pytest.mark.parametrize("argv,msg", [
    (["--field", "pf", "o_proj:1"], "expected NAME=V1,V2"),
    (["--field", "pf=0,x", "o_proj:1"], "expected NAME=V1,V2"),
    (["--variant", "X=1", "o_proj:1"], "not a macro name"),
    (["--preps", "0", "o_proj:1"], "--preps >= 1"),
    (["poolr:1"], "with a layer in"),
])
def test_ab_rejects_arguments_it_cannot_read_naming_them(argv, msg):
    import ab
    with pytest.raises(SystemExit, match=msg):
        ab.parse_args(argv)


def test_ab_field_values_that_do_not_fit_are_skipped_with_the_reason():
    import ab
    p = cases.planned("router:1")
    fit, why = ab.swept(p, ("pf", [0, 1, 2]))
    assert fit == {0: p.config._replace(pf=0), 1: p.config._replace(pf=1)} and list(why) == [2] and "pf" in why[2]
    fit, why = ab.swept(p, ("ug", [1]))
    assert fit == {} and "has no field 'ug'" in why[1]
    assert ab.swept(p, None) == ({None: p.config}, {})


def test_ab_build_only_builds_each_variant_with_the_instantiations_of_its_cases(builds):
    import ab
    assert ab.main(["--build-only", "--variant", "", "--variant", "MUSE_SKIP_CORRECTIONS", "--field", "u=1,2",
                    "router:1", "o_proj:1:plain"]) == 0
    want = sorted({_inst("router:1", u=1), _inst("router:1", u=2), _inst("o_proj:1:plain", u=1),
                   _inst("o_proj:1:plain", u=2)})
    assert len(want) == 4 and builds == [((), want), (("MUSE_SKIP_CORRECTIONS",), want)]


def test_a_compressed_case_builds_its_cooperative_walk_twin_too(builds):
    # prepare takes walk = 1 where the case's weights have a long row (submission.walk_for), which the CPU's plan
    # cannot see: the build holds both walks of every compressed config (S23: ab stopped on llama3-8b.gate_up:1)
    import ab
    assert ab.main(["--build-only", "--field", "s=1,2", "o_proj:1:compressed", "o_proj:1:plain"]) == 0
    z = cases.planned("o_proj:1:compressed").config
    assert isinstance(z, S.GemvzConfig) and z.walk == 0 and S.coop_twin(z) == z._replace(walk=1)
    zi, ti = _inst("o_proj:1:compressed"), cases.inst_of(S.coop_twin(z), 1, False)
    assert ti == ("gemvz", (*zi[1][:-1], 1))                   # WALK: gemvz's last template argument
    (_, insts), = builds
    assert zi in insts and ti in insts and _inst("o_proj:1:plain") in insts
    assert sum(k == "gemvz" for k, _ in insts) == 2            # S does not change the instantiation
    p = cases.planned("o_proj:1:plain").config
    assert S.coop_twin(p) is p and S.coop_twin(S.coop_twin(z)) == S.coop_twin(z)


def test_ab_sweeps_the_cooperative_walk_when_prepare_took_it(builds, fake_gpu, monkeypatch, capsys):
    # a case whose weights took the cooperative walk: every swept value is timed with the walk prepare chose
    import ab
    spec = "o_proj:1:compressed"
    base = cases.planned(spec).config
    seen = []

    class Copy(_Layer):
        def __init__(self):
            self.cfg = S.coop_twin(base)

        def plan(self, m):
            return S.PlanEntry("compressed", self.cfg, "planner: ...; cooperative exception walk: 90 exceptions")

        def set_config(self, m, cfg):
            self.cfg = cfg
            seen.append(cfg)
    monkeypatch.setattr(cases, "prepare", lambda s, ext=None: ([Copy()], 1, torch.ones(1, 8)))
    assert ab.main(["--field", "s=1,2", "--rounds", "1", spec]) == 0
    assert base.walk == 0 and {(c.s, c.walk) for c in seen} == {(1, 1), (2, 1)}
    assert "its weights take the cooperative walk" in capsys.readouterr().out


def test_tool_summary_lists_every_round_and_the_fastest():
    import ab
    cols, best, drift = ab.summary({1: [2.0, 1.5], 2: [1.7, 1.8]}, lambda v: f"cl={v}")
    assert cols == "cl=1: 2.00/1.50  cl=2: 1.70/1.80" and best == 1 and drift == pytest.approx(0.5)
    cols, best, _ = ab.summary({"a": [2.0, 2.1, 1.9], "b": [1.0, 1.2, 1.1]}, str, lambda c: c == "a")
    assert cols == "a: 2.00/2.10/1.90  b: 1.00/1.20/1.10 UNCHECKED" and best == "b"


def test_ab_placement_spread_per_variant_and_value():
    import ab
    args = ab.parse_args(["--variant", "", "--variant", "MUSE_SKIP_CORRECTIONS", "--preps", "3", "--xallocs", "2",
                          "o_proj:16"])
    res = {c: [10.0 + c.prep + (0 if c.xalloc is None else 0.1 * (c.xalloc + 1)) + (5 if c.variant else 0), 99.0]
           for c in ab.choices(args)}
    assert ab.placement_spread(res, ab.labeler(args)) == [
        "shipped: preparations median 11.00 us, range 2.00; x allocations range 0.10",
        "MUSE_SKIP_CORRECTIONS: preparations median 16.00 us, range 2.00; x allocations range 0.10"]
    assert ab.placement_spread({ab.Choice((), None, 0, None): [1.0]}, ab.labeler(ab.parse_args(["o_proj:1"]))) == []


class _Layer:
    dual, weight = False, torch.zeros(16, 64, dtype=torch.bfloat16)


@pytest.fixture
def fake_gpu(monkeypatch):
    """kernel_fn, the reference and the graph timer replaced: every choice times 1.0 us per call; check_close records
    what it checks in .checked, and fails every check once .wrong is set."""
    gpu = types.SimpleNamespace(checked=[], wrong=False)

    def check_close(out, ref, fp32_out, what):
        gpu.checked.append(what)
        if gpu.wrong:
            raise judge.CheckFailed("off by a lot")
    monkeypatch.setattr(judge, "reference", lambda x, w: None)
    monkeypatch.setattr(judge, "check_close", check_close)
    monkeypatch.setattr(judge, "time_graph", lambda fns, replays: (len(fns) * 1e-3, None))
    monkeypatch.setattr(S, "kernel_fn", lambda x, layer: None)
    return gpu


def test_tool_interleaved_timing_checks_each_choice_unless_told_not_to(fake_gpu, capsys):
    # a choice that is wrong on purpose is timed unchecked; any other wrong choice stops the run before it is timed
    import ab
    seen = []
    setup = lambda c: (seen.append(c), ([_Layer(), _Layer()], None))[1]
    res = ab.time_interleaved("t:1", ["a", "b"], setup, str, 3, lambda c: False)
    assert res == {"a": [1.0, 1.0], "b": [1.0, 1.0]} and seen == ["a", "b", "a", "b"] and fake_gpu.checked == []
    assert "[ab] t:1 round 2 b: 1.00 us" in capsys.readouterr().out
    fake_gpu.wrong = True
    with pytest.raises(SystemExit, match=r"\[ab\] wrong result: off by a lot"):
        ab.time_interleaved("t:1", ["a"], setup, str, 3, lambda c: True)


def test_ab_checks_every_variant_but_the_unchecked_ones_in_every_round(fake_gpu):
    # MUSE_SKIP_CORRECTIONS is wrong on purpose, alone or with other macros; --unchecked names more such macros
    import ab
    args = ab.parse_args(["--variant", "", "--variant", "MUSE_SKIP_CORRECTIONS", "--variant", "MUSE_TRACE",
                          "--variant", "MUSE_TRACE+MUSE_SKIP_CORRECTIONS", "--rounds", "3", "o_proj:1"])
    label, is_checked = ab.labeler(args), ab.checker(args)
    assert [is_checked(c) for c in ab.choices(args)] == [True, False, True, False]
    ab.time_interleaved("o_proj:1", ab.choices(args), lambda c: ([_Layer()], None), label, 3, is_checked, rounds=3)
    assert fake_gpu.checked == ["o_proj:1 shipped", "o_proj:1 MUSE_TRACE"] * 3
    told = ab.parse_args(["--unchecked", "MUSE_TRACE", "--variant", "", "--variant", "MUSE_TRACE", "o_proj:1"])
    assert [ab.checker(told)(c) for c in ab.choices(told)] == [True, False]


def test_ab_times_each_choice_on_its_own_build_config_and_placement(builds, fake_gpu, monkeypatch, capsys):
    # run_case's wiring: each preparation its own copies, x allocations on preparation 0, the variant's build and the
    # field's config set on every copy before the choice is checked (unless UNCHECKED) and timed
    import ab
    spec = "o_proj:1:plain"
    base = cases.planned(spec).config

    class Copy(_Layer):
        def __init__(self, ext):
            self.cfg, self.ext = base, ext

        def plan(self, m):
            return S.PlanEntry("plain", self.cfg, "test")

        def set_config(self, m, cfg):
            self.cfg = cfg

    preps, calls, timings = [], [], []

    def prepare(s, ext=None):
        preps.append(([Copy(ext), Copy(ext)], 1, torch.arange(8.0).view(1, 8)))
        return preps[-1]

    def time_graph(fns, replays):                      # one timing: the calls it made; the skipping build is faster
        start = len(calls)
        for f in fns:
            f()
        timings.append(calls[start:])
        return len(fns) * 1e-3 * (1.0 if "MUSE_SKIP_CORRECTIONS" in calls[-1][2] else 2.0), None
    monkeypatch.setattr(cases, "prepare", prepare)
    monkeypatch.setattr(judge, "time_graph", time_graph)
    monkeypatch.setattr(S, "kernel_fn", lambda x, L: calls.append((x, L, L.ext, L.cfg)))
    argv = ["--variant", "", "--variant", "MUSE_SKIP_CORRECTIONS", "--field", "pf=0,1,2", "--preps", "2",
            "--xallocs", "1", "--rounds", "1", spec]
    assert ab.main(argv) == 0
    chosen = [c for c in ab.choices(ab.parse_args(argv)) if c.value != 2]     # pf=2 does not fit: skipped
    assert len(preps) == 2 and len(timings) == len(chosen) == 12
    x0 = preps[0][2]
    for c, runs in zip(chosen, timings):
        Ls, _, x = preps[c.prep]
        assert [L for _, L, _, _ in runs] == Ls
        assert {(e, cfg.pf) for _, _, e, cfg in runs} == {(("built",) + c.variant, c.value)}
        for xt, _, _, _ in runs:
            assert xt is x if c.xalloc is None else torch.equal(xt, x0) and xt.data_ptr() != x0.data_ptr()
    assert fake_gpu.checked == [f"{spec} shipped pf={v} prep {p}" for v in (0, 1) for p in ("0", "1", "0 x 0")]
    out = capsys.readouterr().out
    assert f"{spec}: pf=2 skipped:" in out
    assert "best MUSE_SKIP_CORRECTIONS pf=0 prep 0\n" in out         # one round: no change between rounds to show
    assert "MUSE_SKIP_CORRECTIONS pf=1 prep 1: 1.00 UNCHECKED" in out and "shipped pf=1 prep 1: 2.00  " in out
    assert "shipped pf=1: preparations median 2.00 us, range 0.00; x allocations range 0.00" in out


@needs_cuda
def test_ab_times_the_exception_cost_on_the_gpu(capsys):
    import ab
    assert ab.main(["--variant", "", "--variant", "MUSE_SKIP_CORRECTIONS", "--rounds", "1", "--replays", "3",
                    "o_proj:1:compressed"]) == 0
    out = capsys.readouterr().out
    line = [l for l in out.splitlines() if " best " in l]
    assert len(line) == 1 and "compressed" in line[0], out
    assert re.search(r"shipped: [\d.]+  MUSE_SKIP_CORRECTIONS: [\d.]+ UNCHECKED", line[0]), line[0]


# ---- trace_chain.py --------------------------------------------------------------------------------
def test_trace_chain_builds_traced_and_untraced_with_the_cases_instantiations(builds):
    import trace_chain as T
    assert T.main(["--build-only", "--define", "MUSE_SKIP_CORRECTIONS", "router:1", "o_proj:16:plain"]) == 0
    insts = sorted({_inst("router:1"), _inst("o_proj:16:plain")})
    assert builds == [(("MUSE_TRACE", "MUSE_SKIP_CORRECTIONS"), insts), (("MUSE_SKIP_CORRECTIONS",), insts)]
    with pytest.raises(SystemExit, match="expected cases"):
        T.main(["--build-only"])


def test_trace_chain_sources_and_analysis():
    import trace_chain as T
    # the slot the kernels write (MUSE_TRACE, csrc/instruments.cuh: not in the upload) is the one read here
    assert f"blockIdx.x) * {T.SLOT_U64};" in cases.instruments() and "MUSE_TRACE" not in S.KERNEL_SRC
    L = S.Layer("x", torch.zeros(256, 8192))
    L.plans = [None] + [S.PlanEntry("plain", S.GemvConfig(8, 4, 1, 2, 0, 1, 0, 1, 2), "test")] * S.MAX_M
    assert T.trace_region(L, 1) == (256 // 16 * 4 * 128, 256 // 32 * 4)   # after the split-K area; 8 x 4 CTAs
    launches = []
    for i in range(3):                      # launch i: released 500 ns after launch i-1's last CTA ended
        rows = []
        for c in range(2):
            g0, g1, g2 = 3000 * i - 1000, 3000 * i + 500 + 10 * c, 3000 * (i + 1) - 100 * c
            c1 = 2 * g1
            rows.append([g0, g1, g2, 2 * g0, c1, c1 + 1000, c1 + 1100, c1 + 1400, 2 * g2, c1 + 200 * c, c1 + 600,
                         c | ((c == 0) << 48), 0, 0])
        launches.append(torch.tensor(rows))
    a = T.analyse(launches)
    assert (a["launches"], a["period"], a["gap"], a["crit"], a["early"]) == (3, 3000, 500, 2500, 1500)
    assert (a["loop"], a["barrier"], a["combine_store"], a["ns_per_cycle"]) == (500, 50, 150, 0.5)
    assert (a["weights_in"], a["weights_in_p90"], a["x_in"], a["loop_rest"]) == (50, 100, 250, 200)
    assert a["sm_end"] == {2: (2500, 1.0)} and a["sm_tail"] == 0     # both CTAs on SM 0 (word 11 bits 32..47)
    for t in launches:                      # CTA 1 on SM 3 instead: two SMs of one CTA; CTA 0's SM ends last
        t[1, 11] |= 3 << 32
    a = T.analyse(launches)
    assert a["sm_end"] == {1: (2450, 2.0)} and a["sm_tail"] == 50
    assert a["exc"] == []                   # word 12 = 0: no exception warp (gemv)
    for t in launches:                      # gemvz: its exception warp at the barrier 1050 cycles after the release
        t[:, 12] = t[:, 4] + 1050
    a = T.analyse(launches)                 # warp 0's partials at +1000, the barrier at +1100
    assert (a["exc"], a["exc_to_bar"], a["w0_to_bar"]) == ([25.0] * 6, [25.0] * 6, [50.0] * 6)
    # occupancy by registers: 92 registers x 9 warps fit twice in 65536, 114 (allocated as 120) only once
    assert (T.ctas_by_registers(92, 288), T.ctas_by_registers(114, 288), T.ctas_by_registers(72, 160)) == (2, 1, 5)

    class Ext:
        def __init__(self, regs):
            self.regs = regs

        def attrs(self, family, t):
            assert (S.FAMILIES[family].name, t) == ("gemvz", [8, 1, 1, 2, 2, 0, 0])
            return [self.regs, 0, 0, 1024]

    plan = S.PlanEntry("compressed", S.GemvzConfig(8, 1, 1, 2, 2, 0, 0, 0), "test")
    assert T.occupancy_note(Ext(92), Ext(96), plan, 1, False) == ""
    assert "2 / 1 CTAs per SM" in T.occupancy_note(Ext(92), Ext(114), plan, 1, False)


# ---- pdl_probe.py, same_code.py --------------------------------------------------------------------
@needs_nvcc
def test_pdl_probe_compiles_without_spills(tmp_path):
    # tools/pdl_probe.py's five kernels fit 64 registers (two CTAs of 512 threads per SM, like gemvz's m=1 plan)
    import pdl_probe
    (tmp_path / "probe.cu").write_text(pdl_probe.PROBE_CU)
    r = subprocess.run([NVCC, "-O3", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "-c", str(tmp_path / "probe.cu"),
                        "-o", str(tmp_path / "probe.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    regs = [int(n) for n in re.findall(r"Used (\d+) registers", r.stderr)]
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert len(regs) == 5 and max(regs) <= 64 and set(spills) == {"0"}, r.stderr[-3000:]


def test_pdl_probe_sizes_are_whole_batches():
    import pdl_probe as pp
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
    import same_code
    insts = [("gemvt", (4, 4, 4, 2))]
    src = S.variant_source((), insts)
    changed = src.replace("createpolicy.fractional.L2::evict_first", "createpolicy.fractional.L2::evict_last")
    assert changed != src
    runs = []
    for i, s in enumerate((src, src, changed)):
        d = tmp_path / str(i)
        d.mkdir()
        runs.append(same_code.kernel_text(s, S.NVCC_FLAGS, str(d)))
    assert set(runs[0]) == {("gemvt", (4, 4, 4, 2)), "unpackz_kernel"}   # by family and template args, or the name
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_same_code_reads_the_layout_before_csrc():
    # a commit from before csrc/ wrote gemvt_kernel as a C3 line with PIPE 6 and had gemvtz_kernel as Z3 PIPE 6 (a
    # removed kernel: left out); every old PIPE is read as today's (LOOP, MB), and gemvz PIPE 8..13 as WALK = 1
    import same_code
    old = ("C3(4, 4, 1, 2, false, 6) \\\n  C3(2, 1, 1, 1, true, 2) \\\n  Z3(4, 2, 2, 2, 6) \\\n  Z3(8, 1, 1, 2, 5)"
           " \\\n  Z3(8, 1, 1, 2, 13)")
    assert same_code.table_insts(old) == sorted([("gemvt", (4, 4, 1, 2)), ("gemv", (2, 1, 1, 1, True, 1, 2)),
                                                 ("gemvz", (8, 1, 1, 2, 2, 2, 0)), ("gemvz", (8, 1, 1, 2, 2, 2, 1))],
                                                key=str)
    # today's layout, the generated kernel table: every entry, typed as instance_of gives them (DUAL a bool)
    table = S.kernel_table_source([("gemv", (2, 1, 1, 1, True, 1, 2)), ("gemvz", (8, 1, 1, 2, 2, 2, 1)),
                                   ("gemvt", (4, 4, 1, 2))])
    assert same_code.table_insts(table) == sorted([("gemv", (2, 1, 1, 1, True, 1, 2)), ("gemvz", (8, 1, 1, 2, 2, 2, 1)),
                                                   ("gemvt", (4, 4, 1, 2))], key=str)
    assert same_code.parse_extra("gemv:4,1,1,1,1,1,2") == ("gemv", (4, 1, 1, 1, True, 1, 2))


# ---- plan_grid / plan_fit (the planner's data and fit) -----------------------------------------------------------
def test_plan_grid_times_exactly_what_the_planner_prices():
    import plan_grid
    for sset in ("public", "holdout"):
        for name, d in judge.SHAPE_SETS[sset].items():
            for m in (1, 16, 32):
                path = "plain" if m > 16 else "compressed"
                want = [c for _, _, c in S.plan_candidates(d["N"], d["K"], m, path)]
                got = plan_grid.candidates(d["N"], d["K"], m, list(plan_grid.FAMILIES))
                assert [c for _, c in got] == want, (name, m)
                extra = plan_grid.candidates(d["N"], d["K"], m, list(plan_grid.FAMILIES), plain=True)
                plain = S.planner_rule(d["N"], d["K"], m, "plain")[0] if m <= 16 else None
                if plain is not None:   # --plain adds the PLANNER rule's gemv plan (plain_gemvt's alternative)
                    assert extra == got + [("plain", plain)]
                else:
                    assert extra == got
                if m <= 16:             # --plain-gemvt 3: the 3 cheapest gemvt that fit at m, plain_gemvt's pick first
                    t16 = [c for f, c in plan_grid.candidates(d["N"], d["K"], m, [], plain_gemvt=3) if f == "t16"]
                    assert len(t16) <= 3 and all(not S.config_misfit(c, d["N"], d["K"], m) for c in t16)
                    pick = S.plain_gemvt(d["N"], d["K"], m, None)
                    if pick is not None:
                        assert t16[0] == pick[0], (name, m)


def test_plan_fit_prices_with_the_shipped_formula_and_writes_the_literal_back():
    import plan_fit
    rows = plan_fit.priced_only(plan_fit.load([os.path.join(os.path.dirname(S.__file__), "results", f) for f in
                                               ("plangrid-2026-12-02-s19call1.json",
                                                "plangrid-2026-12-02-s20call1-uneven.json")]))   # as fit: --priced
    assert rows and all(not r.get("bad") for _, r in rows)
    for md in S.PLAN_MODELS:
        fams = sorted((f.config for f in md.families), key=repr)
        byf = {f.config: f for f in md.families}
        p = ([md.t0, md.cl0, md.cl1, md.tk0, md.tk1] + [byf[f].r for f in fams] + [byf[f].R for f in fams] +
             [byf[f].bw for f in fams])
        back = plan_fit.unpack(p, md.path, md.nb, fams, {f: byf[f].occ for f in fams})
        crows = plan_fit.classes(rows)[md.path, md.nb]
        for c, r in crows[:20]:
            fam = next(f for f in md.families if f.config == plan_fit.fam_key(c))
            assert plan_fit.predict(back, c, r) == S.plan_cost(md, fam, c, r["N"], r["K"], r["m"])
        ratios, err = plan_fit.pick_loss(back, crows)
        assert max(ratios) < 1.10 and 0 < err < 0.5
        entry = json.loads(json.dumps(plan_fit.model_json(back)))   # what --write puts in tables/plan_models.json
        again, = S.plan_models_from_json({"models": [entry]}, S.config_from_fields)   # the model, to its rounding
        assert again.path == md.path and again.nb == md.nb and len(again.families) == len(md.families)
        for f in again.families:
            assert abs(f.r - byf[f.config].r) < 0.01 and f.occ == byf[f.config].occ


def test_plan_grid_widens_the_domain_on_request():
    import plan_grid
    fams = list(plan_grid.FAMILIES)
    base = plan_grid.candidates(2560, 10240, 1, fams)                      # phi-2.fc2: even splits only
    wide = plan_grid.candidates(2560, 10240, 1, fams, max_s=12, max_ctas=800, uneven=True)
    assert set(base) < set(wide)
    assert any(not S.even_split(c, 10240) for _, c in wide) and max(c.s for _, c in wide) > S.PLAN_MAX_S
    tick = plan_grid.candidates(2560, 10240, 1, fams, ticket=True)          # the ticket beside each cluster split
    clustered = [c for _, c in base if c.cl]
    assert clustered and [c for _, c in tick[len(base):]] == [c._replace(cl=0) for c in clustered]
