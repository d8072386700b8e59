"""submission.Linear, submission.patch and the muse::gemv custom op (muse/nn.py).

CPU half: prepare needs CUDA, so the module's own work (shapes, bias, checks, the patcher's choices and report, the
registry, the op's fake function, dynamo tracing) runs against a stand-in: the `fake` fixture swaps submission's
prepare and kernel_fn for a CPU layer that computes x @ W.T and checks kernel_fn's contract (2-D, contiguous, bf16,
16-byte aligned). GPU half (skipped without CUDA): the real layers against F.linear within SPEC's tolerance, every m
path, freed originals, torch.compile(fullgraph=True) and a CUDA graph capture of a patched model."""
import gc
import importlib.util
import json
import os
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import judge
import submission as S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16 = torch.bfloat16
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (an H100 or H200)")


# ---- the CPU stand-in ---------------------------------------------------------------------------------------------
class FakeLayer:
    """What Linear and patch read of a prepared layer (N, K, out_dtype, device, describe()), holding its own copy of
    the weight as the real one will, on the CPU."""

    def __init__(self, name, weight, kwargs):
        self.name, self.kwargs = name, kwargs
        self.w = weight.detach().clone()
        self.N, self.K = weight.shape
        self.out_dtype = torch.float32 if weight.dtype == torch.float32 else BF16
        self.device = weight.device

    def describe(self):
        return (f"layer '{self.name}' [{self.N} x {self.K}] (fake)\n  12-bit format: not used: fake\n"
                f"  m=1..16   plain gemv_kernel GemvConfig(...)  [fake]\n"
                f"  m=17..32  compressed gemvz_kernel GemvzConfig(...)  [fake]\n  m>32      fallback cuBLAS  [m > 32]")

    def plan(self, m):
        return S.PlanEntry("plain" if m <= 16 else "compressed", None, "fake")

    def bytes_held(self):
        return self.w.untyped_storage().nbytes()


class Fake:
    """The fixture's handle: calls (the x of every kernel_fn call) and prepared (name -> FakeLayer)."""

    def __init__(self):
        self.calls, self.prepared, self.refuse = [], {}, set()

    def prepare(self, name, weight, **kwargs):
        assert not weight.requires_grad, "Linear must hand prepare a detached weight"
        if name in self.refuse:
            raise ValueError(f"layer '{name}' cannot be compressed: fake refusal")
        layer = FakeLayer(name, weight, kwargs)
        self.prepared[name] = layer
        return layer

    def kernel_fn(self, x, layer):
        assert isinstance(layer, FakeLayer)
        assert x.dtype == BF16 and x.dim() == 2 and x.is_contiguous() and x.data_ptr() % 16 == 0, (x.shape, x.stride())
        assert x.shape[1] == layer.K and x.shape[0] >= 1
        self.calls.append(tuple(x.shape))
        return (x.double() @ layer.w.double().t()).to(layer.out_dtype)


@pytest.fixture
def fake(monkeypatch):
    f = Fake()
    monkeypatch.setattr(S, "prepare", f.prepare)
    monkeypatch.setattr(S, "kernel_fn", f.kernel_fn)
    monkeypatch.setattr(S, "PATCH_DEVICES", ("cuda", "cpu"))
    return f


def _ref(x, w, b=None):
    y = x.double() @ w.double().t()
    return y if b is None else y + b.double()


def _bf16(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(BF16)


# ---- Linear on the CPU ----------------------------------------------------------------------------------------------
def test_linear_keeps_leading_dims_and_calls_kernel_fn_with_m_rows(fake):
    w = _bf16(48, 64)
    lin = S.Linear(w, name="l")
    x = _bf16(2, 3, 64, seed=1)
    y = lin(x)
    assert y.shape == (2, 3, 48) and y.dtype == BF16
    assert fake.calls == [(6, 64)]
    assert torch.equal(y, _ref(x, w).to(BF16))


@pytest.mark.parametrize("m", [1, 17, 33, 512])
def test_every_m_goes_through_kernel_fn_as_one_call(fake, m):
    w = _bf16(32, 128)
    lin = S.Linear(w)
    y = lin(_bf16(m, 128, seed=m))
    assert y.shape == (m, 32) and fake.calls == [(m, 128)]


def test_one_dim_x_gives_one_dim_y(fake):
    lin = S.Linear(_bf16(16, 64))
    assert lin(_bf16(64)).shape == (16,)


def test_bias_is_added_and_kept_in_the_output_dtype(fake):
    w, b = _bf16(32, 64), _bf16(32, seed=5)
    lin = S.Linear(w, b)
    assert lin.bias.dtype == BF16 and not lin.bias.requires_grad
    x = _bf16(4, 64, seed=2)
    judge.check_close(lin(x), _ref(x, w, b), False, "bias")
    w32 = w.float()
    router = S.Linear(w32, torch.ones(32, dtype=BF16))       # fp32 weight: fp32 out, so the bias is kept in fp32
    assert router.out_dtype == torch.float32 and router.bias.dtype == torch.float32
    y = router(x)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), _ref(x, w32) + 1.0)


def test_bias_of_the_wrong_shape_names_both_shapes(fake):
    with pytest.raises(ValueError, match=r"shape \(32,\), got \(31,\)"):
        S.Linear(_bf16(32, 64), _bf16(31))


def test_non_contiguous_and_misaligned_x_are_copied_once(fake):
    w = _bf16(16, 64)
    lin = S.Linear(w)
    xt = _bf16(64, 5, seed=3).t()                     # [5, 64], not contiguous
    torch.testing.assert_close(lin(xt).double(), _ref(xt, w).to(BF16).double())
    buf = _bf16(1, 3 * 64 + 1, seed=4)
    xm = buf[0, 1:65].view(1, 64)                     # contiguous, 2 bytes off 16-byte alignment
    assert xm.data_ptr() % 16
    torch.testing.assert_close(lin(xm).double(), _ref(xm, w).to(BF16).double())
    assert fake.calls == [(5, 64), (1, 64)]


def test_empty_x_gives_empty_y_without_a_call(fake):
    lin = S.Linear(_bf16(16, 64))
    y = lin(torch.empty(0, 3, 64, dtype=BF16))
    assert y.shape == (0, 3, 16) and fake.calls == []


def test_grad_enabled_input_raises_the_inference_only_error(fake):
    lin = S.Linear(_bf16(16, 64))
    x = _bf16(2, 64).requires_grad_()
    with pytest.raises(RuntimeError, match="inference-only.*torch.inference_mode"):
        lin(x)
    with torch.no_grad():
        assert lin(x).shape == (2, 16)
    with torch.inference_mode():
        assert lin(x.detach()).shape == (2, 16)


def test_a_bias_that_asks_for_grad_raises_the_inference_only_error(fake):
    lin = S.Linear(_bf16(16, 64), _bf16(16))
    lin.bias.requires_grad_(True)
    with pytest.raises(RuntimeError, match="inference-only, but its bias requires grad"):
        lin(_bf16(2, 64))


def test_wrong_dtype_names_expected_and_received(fake):
    lin = S.Linear(_bf16(16, 64), name="q")
    with pytest.raises(TypeError, match=r"'q'.*torch\.bfloat16, got torch\.float16"):
        lin(torch.zeros(2, 64, dtype=torch.float16))
    router = S.Linear(_bf16(16, 64).float())
    with pytest.raises(TypeError, match="fp32: the kernels take bf16 x"):
        router(torch.zeros(2, 64))
    with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
        lin([1.0])


def test_wrong_last_dim_names_expected_and_received(fake):
    lin = S.Linear(_bf16(16, 64), name="q")
    with pytest.raises(ValueError, match=r"\[\.\.\., 64\].*got shape \(2, 3, 65\)"):
        lin(_bf16(2, 3, 65))
    with pytest.raises(ValueError, match=r"got shape \(\)"):
        lin(torch.tensor(1.0, dtype=BF16))


def test_wrong_device_names_expected_and_received(fake):
    lin = S.Linear(_bf16(16, 64))
    with pytest.raises(ValueError, match="must be on cpu .*got meta"):
        lin(torch.empty(2, 64, dtype=BF16, device="meta"))


def test_linear_keeps_no_reference_to_the_weight(fake):
    src = torch.nn.Linear(64, 32, bias=True, dtype=BF16)
    wref, bref = weakref.ref(src.weight), weakref.ref(src.bias)
    lin = S.Linear.from_linear(src, name="src")
    assert "kwargs" not in vars(lin) and all(v is not src.weight for v in vars(lin).values())
    assert lin.bias.untyped_storage().data_ptr() != src.bias.untyped_storage().data_ptr()   # its own copy
    del src
    gc.collect()
    assert wref() is None and bref() is None


def test_from_linear_passes_prepare_options_and_takes_only_nn_linear(fake):
    S.Linear.from_linear(torch.nn.Linear(64, 16, dtype=BF16), name="opt", path="plain", pdl=False)
    assert fake.prepared["opt"].kwargs == {"path": "plain", "pdl": False, "one_copy": True}   # one copy unless told
    S.Linear.from_linear(torch.nn.Linear(64, 16, dtype=BF16), name="two", one_copy=False)
    assert fake.prepared["two"].kwargs == {"one_copy": False}
    with pytest.raises(TypeError, match="torch.nn.Linear, got Conv1d"):
        S.Linear.from_linear(torch.nn.Conv1d(4, 4, 1))


def test_extra_repr_names_n_k_and_the_paths(fake):
    r = repr(S.Linear(_bf16(48, 64), name="proj"))
    assert "in_features=64, out_features=48, bias=False" in r
    assert "layer 'proj' [48 x 64]" in r and "m=1..16 plain, m=17..32 compressed, m>32 fallback" in r


def test_moving_or_recasting_a_linear_raises_but_a_no_op_to_passes(fake):
    lin = S.Linear(_bf16(16, 64), _bf16(16))
    assert lin.to("cpu") is lin and lin.to(BF16) is lin
    with pytest.raises(RuntimeError, match="cannot move from torch.bfloat16 on cpu to torch.float16"):
        lin.half()


def test_deepcopy_raises_instead_of_sharing_a_layer_id(fake):
    import copy
    with pytest.raises(TypeError, match="cannot be deep-copied"):
        copy.deepcopy(S.Linear(_bf16(16, 64)))


# ---- the custom op ------------------------------------------------------------------------------------------------
def test_op_is_registered_at_import():
    assert hasattr(torch.ops.muse, "gemv")
    assert "gemv(Tensor x, int layer_id) -> Tensor" in str(torch.ops.muse.gemv.default._schema)


def test_fake_function_gives_shape_and_dtype_without_running_the_layer(fake):
    from torch._subclasses.fake_tensor import FakeTensorMode
    lin, router = S.Linear(_bf16(48, 64)), S.Linear(_bf16(16, 64).float())
    with FakeTensorMode():
        x = torch.empty(2, 5, 64, dtype=BF16)
        y = torch.ops.muse.gemv(x, lin.layer_id)
        yr = torch.ops.muse.gemv(x, router.layer_id)
    assert y.shape == (2, 5, 48) and y.dtype == BF16
    assert yr.shape == (2, 5, 16) and yr.dtype == torch.float32
    assert fake.calls == []


def test_op_runs_the_linears_direct_path(fake):
    w = _bf16(48, 64)
    lin = S.Linear(w, _bf16(48))
    x = _bf16(3, 4, 64, seed=9)
    assert torch.equal(torch.ops.muse.gemv(x, lin.layer_id), _ref(x, w).to(BF16))    # bias is not the op's


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_eager_forward_goes_direct_not_through_the_op(fake):
    lin = S.Linear(_bf16(48, 64))
    with _OpLog() as log:
        lin(_bf16(2, 64))
    assert fake.calls == [(2, 64)] and not any("muse" in op for op in log.ops), log.ops


def test_a_freed_linears_id_raises_naming_it(fake):
    lin = S.Linear(_bf16(16, 64))
    i = lin.layer_id
    del lin
    gc.collect()
    assert i not in S.op_registry().layers
    with pytest.raises(RuntimeError, match=f"no live submission.Linear has layer_id {i}"):
        torch.ops.muse.gemv(_bf16(1, 64), i)


def test_layer_ids_are_unique_and_never_reused(fake):
    ids = [S.Linear(_bf16(16, 64)).layer_id for _ in range(3)]
    assert len(set(ids)) == 3 and ids == sorted(ids)


def test_registration_twice_does_not_raise():
    reg = S.op_registry()
    assert S.op_registry() is reg
    assert reg.lib is not None or hasattr(torch.ops.muse, "gemv")


def test_a_second_copy_of_submission_shares_the_op_and_registry(fake, monkeypatch):
    spec = importlib.util.spec_from_file_location("submission_second_copy", os.path.join(ROOT, "submission.py"))
    other = importlib.util.module_from_spec(spec)
    monkeypatch.setenv("MUSE_BUILD", "0")
    spec.loader.exec_module(other)                   # defines nothing twice: would raise "already registered"
    assert other.op_registry() is S.op_registry()
    monkeypatch.setattr(other, "prepare", fake.prepare)
    monkeypatch.setattr(other, "kernel_fn", fake.kernel_fn)
    a, b = S.Linear(_bf16(16, 64)), other.Linear(_bf16(32, 64, seed=1))
    assert a.layer_id != b.layer_id
    x = _bf16(2, 64)
    assert torch.ops.muse.gemv(x, b.layer_id).shape == (2, 32)
    assert torch.ops.muse.gemv(x, a.layer_id).shape == (2, 16)


def _toy_stack(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128, dtype=BF16), torch.nn.SiLU(),
                               torch.nn.Linear(128, 64, bias=False, dtype=BF16))


def test_compile_fullgraph_puts_the_op_in_the_graph_and_matches_eager(fake):
    torch._dynamo.reset()
    model = _toy_stack()
    S.patch(model, min_features=0, verbose=False)
    x = _bf16(3, 5, 64, seed=7)
    with torch.no_grad():
        eager = model(x)
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(str(gm.graph))
            return gm.forward

        got = torch.compile(model, fullgraph=True, backend=backend)(x)
        assert len(graphs) == 1 and graphs[0].count("muse.gemv") == 2, graphs
        assert torch.equal(got, eager)
        torch._dynamo.reset()
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(x)     # AOTAutograd: the fake function
        assert torch.equal(got, eager)
    torch._dynamo.reset()


# ---- patch ----------------------------------------------------------------------------------------------------------
class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(128, 256, bias=False, dtype=BF16)
        self.down = torch.nn.Linear(256, 128, dtype=BF16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class _Toy(torch.nn.Module):
    """Two eligible blocks, a tied lm_head, an odd N, a small layer, an fp16 layer, an nn.MultiheadAttention (its
    out_proj is an nn.Linear subclass) and a module reachable under two names."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(512, 128, dtype=BF16)
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])
        self.odd = torch.nn.Linear(128, 100, dtype=BF16)
        self.small = torch.nn.Linear(64, 64, dtype=BF16)
        self.half = torch.nn.Linear(128, 128, dtype=torch.float16)
        self.mha = torch.nn.MultiheadAttention(128, 4, dtype=BF16)
        self.lm_head = torch.nn.Linear(128, 512, bias=False, dtype=BF16)
        self.lm_head.weight = self.embed.weight
        self.alias = self.blocks[1].up

    def forward(self, tokens):
        h = self.embed(tokens)
        for b in self.blocks:
            h = h + b(h)
        return self.lm_head(h)


def test_patch_replaces_the_eligible_layers_in_place_and_says_why_it_skipped_the_rest(fake):
    model = _Toy()
    w, b = model.blocks[0].down.weight.detach().clone(), model.blocks[0].down.bias.detach().clone()
    report = S.patch(model, verbose=False)
    names = [r.name for r in report.replaced]
    assert names == ["blocks.0.up", "blocks.0.down", "blocks.1.up", "blocks.1.down"]
    assert all(isinstance(model.get_submodule(n), S.Linear) for n in names)
    assert model.alias is model.blocks[1].up                       # both names of one module get the same Linear
    why = {s.name: s.why for s in report.skipped}
    assert set(why) == {"odd", "small", "half", "mha.out_proj", "lm_head"}
    assert "N % 16 == 0" in why["odd"] and "N=100" in why["odd"]
    assert "min_features=128" in why["small"]
    assert "torch.float16" in why["half"]
    assert "subclass of nn.Linear" in why["mha.out_proj"]
    assert "tied to embed.weight" in why["lm_head"] and "tied=True" in why["lm_head"]
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight is model.embed.weight
    x = _bf16(2, 3, 256, seed=3)
    judge.check_close(model.blocks[0].down(x).view(6, 128), _ref(x.view(6, 256), w, b), False, "patched down")
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 512)
    r = report.replaced[1]
    assert (r.N, r.K, r.dtype, r.bias) == (128, 256, "bfloat16", True)
    assert r.paths == ["m=1..16 plain", "m=17..32 compressed", "m>32 fallback"]
    assert r.bytes_before == 128 * 256 * 2 + 128 * 2 and r.bytes_held == 128 * 256 * 2     # the fake's own copy
    json.dumps(report.to_dict())


def test_patch_frees_the_originals(fake):
    model = _Toy()
    refs = {n: weakref.ref(model.get_submodule(n).weight) for n in ("blocks.0.up", "blocks.1.down", "lm_head")}
    mods = {n: weakref.ref(model.get_submodule(n)) for n in ("blocks.0.up", "blocks.1.down")}
    S.patch(model, verbose=False)
    gc.collect()
    assert refs["blocks.0.up"]() is None and refs["blocks.1.down"]() is None
    assert mods["blocks.0.up"]() is None and mods["blocks.1.down"]() is None
    assert refs["lm_head"]() is model.embed.weight                  # tied: kept for the embedding


def test_patch_tied_true_gives_the_lm_head_its_own_copy(fake):
    model = _Toy()
    emb = model.embed.weight
    report = S.patch(model, tied=True, verbose=False)
    assert isinstance(model.lm_head, S.Linear) and model.embed.weight is emb
    assert "lm_head" in [r.name for r in report.replaced]


@pytest.mark.parametrize("skip", ["blocks.0.*", ["blocks.0.up", "blocks.0.down"],
                                  lambda name, mod: name.startswith("blocks.0.")])
def test_patch_skip_takes_names_patterns_or_a_predicate(fake, skip):
    model = _Toy()
    report = S.patch(model, skip=skip, verbose=False)
    assert [r.name for r in report.replaced] == ["blocks.1.up", "blocks.1.down"]
    assert {s.name: s.why for s in report.skipped}["blocks.0.up"] == "skip= matched it"


def test_patch_min_features_and_prepare_kwargs(fake):
    model = _Toy()
    report = S.patch(model, min_features=0, verbose=False, path="plain")
    assert "small" in [r.name for r in report.replaced]
    assert all(layer.kwargs == {"path": "plain", "one_copy": True} for layer in fake.prepared.values())


def test_patch_a_prepare_valueerror_skips_that_layer_with_its_message(fake):
    fake.refuse.add("blocks.1.down")
    model = _Toy()
    report = S.patch(model, verbose=False)
    assert type(model.blocks[1].down) is torch.nn.Linear
    assert {s.name: s.why for s in report.skipped}["blocks.1.down"].startswith("prepare: layer 'blocks.1.down' cannot")


def test_patch_leaves_cpu_weights_alone_without_a_stand_in(fake, monkeypatch):
    monkeypatch.setattr(S, "PATCH_DEVICES", ("cuda",))
    report = S.patch(_Toy(), verbose=False)
    assert report.replaced == [] and "prepare needs a CUDA tensor" in {s.name: s.why for s in report.skipped}["odd"]


def test_patch_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="torch.nn.Module, got dict"):
        S.patch({})


def test_patch_verbose_prints_one_line_per_shape_and_progress_on_stderr(fake, capsys):
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 256 if i % 2 else 128, bias=False, dtype=BF16)
                                  for i in range(24)])
    for i in range(1, 24, 2):
        model[i] = torch.nn.Linear(128, 128, bias=False, dtype=BF16)
    model.append(torch.nn.Linear(128, 100, dtype=BF16))
    S.patch(model)
    out, err = capsys.readouterr()
    lines = out.strip().split("\n")
    assert lines[0].startswith("[muse] patch: replaced 24 Linear layers, skipped 1")
    assert sum("128 x 128" in l for l in lines) == 1 and " 24 " in lines[2]
    assert "skipped 24 [100 x 128]" in out
    assert err.count("layers prepared") == 12 and "24/24 layers prepared" in err


def test_layer_paths_merges_adjacent_ranges_of_one_path():
    class Split:                                      # configs differ at m = 9 and 18: the paths merge across them
        def plan(self, m):
            return S.PlanEntry("compressed" if m <= 16 else "plain", ("A" if m <= 8 else "B") if m <= 16 else
                               ("C" if m == 17 else "D"), "t")
    assert S.layer_paths(Split()) == ["m=1..16 compressed", "m=17..32 plain", "m>32 fallback"]


def test_report_summary_groups_shapes_and_caps_the_skipped_list():
    rep = S.PatchReport()
    rep.replaced = [S.PatchedLayer(f"l{i}", 64, 128, "bfloat16", False, ["m=1..32 plain"], 10, 20) for i in range(3)]
    rep.skipped = [S.SkippedLayer(f"s{i}", 3, 5, "bfloat16", "why") for i in range(12)]
    text = rep.summary(max_skipped=10)
    assert "replaced 3 Linear layers, skipped 12" in text and "(0.50x)" in text
    assert "... and 2 more skipped" in text
    assert rep.bytes_held == 30 and rep.bytes_before == 60


# ---- the example's CPU-testable parts -------------------------------------------------------------------------------
def _example():
    spec = importlib.util.spec_from_file_location("llama_decode", os.path.join(ROOT, "examples", "llama_decode.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_parses_its_flags_and_defaults_to_llama3_8b_dims():
    ex = _example()
    a = ex.parse_args([])
    assert a.batches == [1, 8, 16, 32] and a.prefill == [512, 2048] and a.layers is None
    kw = ex.llama3_8b_config(layers=2)
    assert (kw["hidden_size"], kw["intermediate_size"], kw["num_attention_heads"], kw["num_key_value_heads"],
            kw["num_hidden_layers"], kw["vocab_size"]) == (4096, 14336, 32, 8, 2, 128256)
    a = ex.parse_args(["--layers", "2", "--batches", "1,4", "--prefill", "128", "--steps", "7"])
    assert (a.layers, a.batches, a.prefill, a.steps) == (2, [1, 4], [128], 7)
    with pytest.raises(SystemExit):
        ex.parse_args(["--batches", "0"])
    with pytest.raises(SystemExit):
        ex.parse_args(["--config-dir", "a", "--checkpoint", "b"])


def test_example_table_and_json_writer(tmp_path):
    ex = _example()
    res = {"model": {"name": "toy"}, "device": "cpu",
           "weights": {"torch": {"bytes": 2e9}, "patched": {"bytes": 1.5e9, "measured_bytes": 1.5e9}},
           "decode": {"torch": {"1": {"ms_per_step": 8.0, "tokens_per_s": 125.0}},
                      "patched": {"1": {"ms_per_step": 6.0, "tokens_per_s": 166.7}}},
           "prefill": {"torch": {"512": {"ms": 20.0, "tokens_per_s": 25600.0}},
                       "patched": {"512": {"ms": 21.0, "tokens_per_s": 24381.0}}},
           "logits": {"torch": {"1": 0.0302}, "patched": {"1": 0.0318}}}
    table = ex.results_table(res)
    assert "decode b=1" in table and "1.33x" in table and "prefill 512" in table and "0.75x" in table
    assert "3.02%" in table and "1.05x" in table
    path = ex.write_results(res, str(tmp_path / "out" / "e2e.json"))
    assert json.load(open(path)) == res
    assert ex.default_out("2026-01-02").endswith(os.path.join("results", "e2e-2026-01-02.json"))


# ---- GPU ------------------------------------------------------------------------------------------------------------
DEV = "cuda"


def _gpu_weight(N, K, seed, dtype=BF16):
    return judge.trained_like(N, K, seed, DEV, dtype)


@pytest.fixture(scope="module")
def gpu_pair():
    """An nn.Linear on the GPU (N=1024, K=2048, bias) and its weight and bias copies."""
    torch.manual_seed(0)
    src = torch.nn.Linear(2048, 1024, dtype=BF16, device=DEV)
    with torch.no_grad():
        src.weight.copy_(_gpu_weight(1024, 2048, 3))
    w, b = src.weight.detach().clone(), src.bias.detach().clone()
    return S.Linear.from_linear(src, name="gpu_pair"), w, b


@needs_cuda
@pytest.mark.parametrize("m", [1, 17, 32, 33, 512])
def test_gpu_linear_matches_f_linear_within_spec_at_every_m_path(gpu_pair, m):
    lin, w, b = gpu_pair
    x = judge.fresh_x(m, 2048, m, DEV)
    with torch.no_grad():
        judge.check_close(lin(x), _ref(x, w, b), False, f"Linear m={m}")
        judge.check_close(torch.nn.functional.linear(x, w, b), _ref(x, w, b), False, f"F.linear m={m}")


@needs_cuda
def test_gpu_three_dim_input_and_fp32_router(gpu_pair):
    lin, w, b = gpu_pair
    x = judge.fresh_x(2 * 8, 2048, 4, DEV).view(2, 8, 2048)
    with torch.no_grad():
        y = lin(x)
    assert y.shape == (2, 8, 1024)
    judge.check_close(y.view(16, 1024), _ref(x.view(16, 2048), w, b), False, "3-D")
    w32 = _gpu_weight(128, 2048, 5, torch.float32)
    router = S.Linear(w32, name="router_like")
    x1 = judge.fresh_x(4, 2048, 6, DEV)
    with torch.no_grad():
        judge.check_close(router(x1), _ref(x1, w32), True, "fp32 router")


@needs_cuda
def test_gpu_patch_frees_the_original_weights():
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096, bias=False, dtype=BF16, device=DEV))
    with torch.no_grad():
        model[0].weight.copy_(_gpu_weight(4096, 4096, 8))
    ptr = model[0].weight.untyped_storage().data_ptr()
    gc.collect()
    torch.cuda.empty_cache()
    report = S.patch(model, verbose=False)
    held = report.replaced[0].bytes_held
    ptrs = {v.untyped_storage().data_ptr() for v in vars(model[0].layer).values() if isinstance(v, torch.Tensor)}
    assert ptr not in ptrs, "the prepared layer still holds the caller's weight"
    delta = report.allocated_after - report.allocated_before
    assert abs(delta - (held - 4096 * 4096 * 2)) <= 4 << 20, (delta, held)


@needs_cuda
def test_gpu_compile_fullgraph_of_patched_linears_matches_eager():
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(2048, 1024, dtype=BF16, device=DEV), torch.nn.SiLU(),
                                torch.nn.Linear(1024, 2048, bias=False, dtype=BF16, device=DEV))
    S.patch(model, verbose=False)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        for m in (1, 8, 33):
            x = judge.fresh_x(m, 2048, m, DEV)
            torch.testing.assert_close(compiled(x), model(x), rtol=2 ** -7, atol=2 ** -7)
    torch._dynamo.reset()


@needs_cuda
def test_gpu_cuda_graph_of_a_patched_forward_replays_with_fresh_input():
    model = torch.nn.Sequential(torch.nn.Linear(2048, 1024, dtype=BF16, device=DEV), torch.nn.SiLU(),
                                torch.nn.Linear(1024, 2048, dtype=BF16, device=DEV))
    S.patch(model, verbose=False)
    static_x = judge.fresh_x(4, 2048, 1, DEV).view(2, 2, 2048)
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            model(static_x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = model(static_x)
        for seed in (2, 3, 4):
            static_x.copy_(judge.fresh_x(4, 2048, seed, DEV).view(2, 2, 2048))
            g.replay()
            assert torch.equal(static_y, model(static_x)), seed
