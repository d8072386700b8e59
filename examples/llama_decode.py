"""Llama decode end to end: bf16 torch against the same model with every Linear patched to submission.Linear.

A Llama-architecture model (Llama-3-8B dims by default: hidden 4096, intermediate 14336, 32 heads, 8 KV heads,
32 layers, vocab 128256; random bf16 weights made on the GPU) is measured twice, (a) as bf16 torch and (b) after
submission.patch(model):
  * greedy decode at batch 1, 8, 16, 32 under CUDA graphs: one decode step on Hugging Face's StaticCache, compiled
    with torch.compile(mode="reduce-overhead", fullgraph=True) (cudagraph trees); ms per step is the median of --steps
    steps timed with CUDA events, tokens/s = batch / step time. The unpatched model is compiled first: a compile
    failure there is the model's, not ours. Also one eager decode step at batch 1 (what HF's default generate runs);
  * prefill of 512 and 2048 tokens at batch 1, eager, logits of the last token only (as generate asks), median of 5;
  * the GPU bytes held by the Linear weights: the nn.Linear weights for (a); for (b) patch's report (the bytes of
    every prepared layer's tensors) and torch.cuda.memory_allocated before and after patch, with the originals freed;
  * the logits error of one eager decode step at batch 1 and 32: max |logits - fp32| / max |fp32|, against an fp32
    forward of the same weights (run first, the weights then cast back to bf16, exactly, and the fp32 copy freed),
    mean over --seeds random prompts.
It prints a table and writes results/e2e-<date>.json.

    python3 examples/llama_decode.py                       # Llama-3-8B dims: 16 GB of bf16 weights, 32 GB in fp32
    python3 examples/llama_decode.py --layers 2 --steps 20 --batches 1,8 --prefill 512   # a quick run
    python3 examples/llama_decode.py --config-dir DIR      # a local config.json, random weights
    python3 examples/llama_decode.py --checkpoint DIR      # a local checkpoint, its weights

Needs a Hopper GPU and transformers (optional for this project, not in requirements.txt: pip install transformers;
written against 5.17). Run from the repository root or anywhere: it imports submission.py from the root.
"""
import argparse
import datetime
import gc
import json
import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- arguments and the model's dims -------------------------------------------------------------------------------
def _positive_ints(text):
    """'1,8,16' -> [1, 8, 16]; argparse's error for anything else."""
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return vals


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--config-dir", help="a directory with a Hugging Face config.json (random weights)")
    src.add_argument("--checkpoint", help="a local checkpoint directory (its weights)")
    p.add_argument("--layers", type=int, help="number of decoder layers (default: the config's; 32 for Llama-3-8B)")
    p.add_argument("--batches", type=_positive_ints, default=[1, 8, 16, 32], help="decode batch sizes (1,8,16,32)")
    p.add_argument("--prefill", type=_positive_ints, default=[512, 2048], help="prefill lengths at batch 1 (512,2048)")
    p.add_argument("--logits-batches", type=_positive_ints, default=[1, 32], help="batches of the logits check (1,32)")
    p.add_argument("--steps", type=int, default=50, help="timed decode steps per batch (median reported)")
    p.add_argument("--warmup", type=int, default=5, help="decode steps before timing (compile, graph capture)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens before the decode steps")
    p.add_argument("--seeds", type=int, default=3, help="prompts (seeds) the logits error is averaged over")
    p.add_argument("--path", choices=["plain", "compressed"], help="prepare's path= for every layer (default: planned)")
    p.add_argument("--two-copies", action="store_true", help="prepare with one_copy=False: the fastest plan of every m "
                   "and the copies it needs (default: patch's one copy, the 12-bit stream at every m)")
    p.add_argument("--no-fp32", action="store_true", help="skip the fp32 reference (and the logits error)")
    p.add_argument("--out", help="the JSON to write (default: results/e2e-<date>.json)")
    args = p.parse_args(argv)
    for name in ("steps", "warmup", "prompt_len", "seeds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def llama3_8b_config(layers=None):
    """LlamaConfig's arguments for Llama-3-8B's dims (layers: fewer decoder layers for a quick run)."""
    return dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                num_hidden_layers=32 if layers is None else layers, vocab_size=128256, rope_theta=500000.0,
                max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False)


def default_out(date=None):
    return os.path.join(ROOT, "results", f"e2e-{date or datetime.date.today().isoformat()}.json")


def load_model(args, transformers):
    """The model on the GPU in bf16 (sdpa attention), eval mode, and a short description for the report."""
    kw = dict(dtype=torch.bfloat16, attn_implementation="sdpa")
    if args.checkpoint:
        config = transformers.AutoConfig.from_pretrained(args.checkpoint)
        if args.layers is not None:
            config.num_hidden_layers = args.layers
        model = transformers.AutoModelForCausalLM.from_pretrained(args.checkpoint, config=config, **kw).cuda()
        name = args.checkpoint
    else:
        if args.config_dir:
            config = transformers.AutoConfig.from_pretrained(args.config_dir)
            if args.layers is not None:
                config.num_hidden_layers = args.layers
            name = args.config_dir
        else:
            config = transformers.LlamaConfig(**llama3_8b_config(args.layers))
            name = "Llama-3-8B dims, random weights"
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = transformers.AutoModelForCausalLM.from_config(config, **kw)
    model.eval()
    c = model.config
    desc = {"name": name, "hidden": c.hidden_size, "intermediate": c.intermediate_size,
            "heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads, "layers": c.num_hidden_layers,
            "vocab": c.vocab_size, "tied_embeddings": bool(getattr(c, "tie_word_embeddings", False))}
    return model, desc


# ---- measurements -------------------------------------------------------------------------------------------------
def linear_weight_bytes(model):
    """Bytes of every nn.Linear's weight and bias (each storage once)."""
    seen, total = set(), 0
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            for t in (mod.weight, mod.bias):
                if t is not None and t.untyped_storage().data_ptr() not in seen:
                    seen.add(t.untyped_storage().data_ptr())
                    total += t.untyped_storage().nbytes()
    return total


def free_cuda():
    """Drop compiled graphs (their CUDA graph pools) and cached blocks, so memory readings mean what they say."""
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def logits_cases(args, vocab):
    """(batch, seed, prompt [B, prompt_len], next token [B, 1]) for the logits check, on the GPU."""
    out = []
    for b in args.logits_batches:
        for seed in range(args.seeds):
            g = torch.Generator().manual_seed(1000 * b + seed)
            prompt = torch.randint(0, vocab, (b, args.prompt_len + 1), generator=g).cuda()
            out.append((b, seed, prompt[:, :-1], prompt[:, -1:]))
    return out


def decode_logits(model, prompt, nxt):
    """fp32 logits [B, vocab] of one eager decode step after prefilling prompt (a DynamicCache): the Linears see
    m = B rows, the decode shape."""
    cache = model(input_ids=prompt, use_cache=True, logits_to_keep=1).past_key_values
    return model(input_ids=nxt, past_key_values=cache, use_cache=True).logits[:, -1].float()


def fp32_reference(model, cases):
    """The logits of every case from an fp32 forward of the model's own weights: the parameters are cast to fp32 in
    place, run, and cast back (bf16 -> fp32 -> bf16 is exact), so the fp32 copy is freed before anything else runs."""
    params = list(model.parameters())
    for p in params:
        p.data = p.data.float()
    try:
        refs = [decode_logits(model, prompt, nxt) for _, _, prompt, nxt in cases]
    finally:
        for p in params:
            p.data = p.data.to(torch.bfloat16)
        gc.collect()
        torch.cuda.empty_cache()
    return refs


def logits_error(model, cases, refs):
    """{batch: mean over seeds of max |logits - fp32| / max |fp32|}."""
    errs = {}
    for (b, _, prompt, nxt), ref in zip(cases, refs):
        got = decode_logits(model, prompt, nxt)
        errs.setdefault(str(b), []).append(float((got - ref).abs().max() / ref.abs().max()))
    return {b: statistics.mean(v) for b, v in errs.items()}


def _median_ms(events):
    times = [a.elapsed_time(b) for a, b in events]
    return statistics.median(times), min(times), max(times)


def time_decode(model, transformers, batch, args):
    """Greedy decode at this batch under CUDA graphs: a StaticCache prefilled eagerly with a random prompt, then the
    decode step (model forward + argmax) compiled with mode="reduce-overhead", fullgraph=True; --warmup steps, then
    --steps steps each between two CUDA events. {ms_per_step (median), ms_min, ms_max, tokens_per_s}. The caller
    frees the compiled step and its graph pool (free_cuda) once this returns."""
    g = torch.Generator().manual_seed(batch)
    prompt = torch.randint(0, model.config.vocab_size, (batch, args.prompt_len), generator=g).cuda()
    cache = transformers.StaticCache(config=model.config, max_cache_len=args.prompt_len + args.warmup + args.steps + 1)
    tok = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(
        -1, keepdim=True)

    def step(tok):
        return model(input_ids=tok, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)

    step = torch.compile(step, mode="reduce-overhead", fullgraph=True, dynamic=False)
    for _ in range(args.warmup):
        torch.compiler.cudagraph_mark_step_begin()
        tok = step(tok).clone()
    events = []
    for _ in range(args.steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.compiler.cudagraph_mark_step_begin()
        a.record()
        tok = step(tok).clone()
        b.record()
        events.append((a, b))
    torch.cuda.synchronize()
    med, lo, hi = _median_ms(events)
    return {"ms_per_step": med, "ms_min": lo, "ms_max": hi, "tokens_per_s": batch * 1000.0 / med}


def time_eager_decode(model, args, batch=1):
    """One eager decode step (no graph: HF's default generate) on a DynamicCache, median of --steps. The whole decode
    runs twice and the second is timed: the cache grows every step, and the first pass pays the allocator's first
    cudaMalloc of every new size (seen on the H100: 56 ms a step for 2 layers on a fresh process, 2.8 ms after)."""
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, model.config.vocab_size, (batch, args.prompt_len), generator=g).cuda()
    for _ in range(2):
        out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
        cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        events = []
        for i in range(args.warmup + args.steps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            tok = model(input_ids=tok, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
            b.record()
            if i >= args.warmup:
                events.append((a, b))
        torch.cuda.synchronize()
        del out, cache
    med, lo, hi = _median_ms(events)
    return {"ms_per_step": med, "ms_min": lo, "ms_max": hi, "tokens_per_s": batch * 1000.0 / med}


def time_prefill(model, n, reps=5):
    """An eager forward of n tokens at batch 1, logits of the last one; median of reps after one warm-up."""
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=g).cuda()
    model(input_ids=ids, use_cache=False, logits_to_keep=1)
    events = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        b.record()
        events.append((a, b))
    torch.cuda.synchronize()
    med, lo, hi = _median_ms(events)
    return {"ms": med, "ms_min": lo, "ms_max": hi, "tokens_per_s": n * 1000.0 / med}


def measure(model, transformers, args, cases, refs, log):
    """Decode (graphs, every batch; eager at batch 1), prefill and the logits error of one variant."""
    out = {"decode": {}, "prefill": {}, "logits": {}}
    if refs is not None:
        out["logits"] = logits_error(model, cases, refs)
        log(f"  logits error vs fp32: {out['logits']}")
    for b in args.batches:
        try:
            out["decode"][str(b)] = time_decode(model, transformers, b, args)
        except Exception as e:          # a benchmark reports what failed and goes on
            out["decode"][str(b)] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        free_cuda()                     # this batch's compiled step, its graph pool and its cache
        log(f"  decode b={b}: {out['decode'][str(b)]}")
    out["decode"]["1 eager"] = time_eager_decode(model, args)
    log(f"  decode b=1 eager: {out['decode']['1 eager']}")
    for n in args.prefill:
        out["prefill"][str(n)] = time_prefill(model, n)
        log(f"  prefill {n}: {out['prefill'][str(n)]}")
    return out


# ---- the report ---------------------------------------------------------------------------------------------------
def _cell(d, key, fmt):
    if d is None:
        return "-"
    if "error" in d:
        return "error"
    return fmt(d[key])


def _ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def results_table(res):
    """The table main() prints: one row per measurement, bf16 torch and patched side by side, and their ratio (a
    speedup for times: torch / patched; patched / torch for bytes and the logits error)."""
    rows = [("", "bf16 torch", "patched", "ratio", "")]
    dec, pre = res.get("decode", {}), res.get("prefill", {})
    t, p = dec.get("torch", {}), dec.get("patched", {})
    for b in dict.fromkeys(list(t) + list(p)):
        a, c = t.get(b), p.get(b)
        ok = a and c and "error" not in a and "error" not in c
        rows.append((f"decode b={b} ms/step", _cell(a, "ms_per_step", "{:.3f}".format),
                     _cell(c, "ms_per_step", "{:.3f}".format),
                     _ratio(a["ms_per_step"], c["ms_per_step"]) if ok else "-", "speedup"))
        rows.append((f"decode b={b} tokens/s", _cell(a, "tokens_per_s", "{:.0f}".format),
                     _cell(c, "tokens_per_s", "{:.0f}".format), "", ""))
    t, p = pre.get("torch", {}), pre.get("patched", {})
    for n in dict.fromkeys(list(t) + list(p)):
        a, c = t.get(n), p.get(n)
        rows.append((f"prefill {n} ms", _cell(a, "ms", "{:.2f}".format), _cell(c, "ms", "{:.2f}".format),
                     _ratio(a["ms"], c["ms"]) if a and c else "-", "speedup"))
    w = res.get("weights", {})
    wt, wp = w.get("torch", {}).get("bytes"), w.get("patched", {}).get("bytes")
    if wt or wp:
        rows.append(("Linear weights GB", f"{wt / 1e9:.3f}" if wt else "-", f"{wp / 1e9:.3f}" if wp else "-",
                     _ratio(wp, wt), "x bf16"))
        measured = w.get("patched", {}).get("measured_bytes")
        if measured:
            rows.append(("  measured (memory_allocated)", "", f"{measured / 1e9:.3f}", _ratio(measured, wt), "x bf16"))
    lg = res.get("logits", {})
    t, p = lg.get("torch", {}), lg.get("patched", {})
    for b in dict.fromkeys(list(t) + list(p)):
        a, c = t.get(b), p.get(b)
        rows.append((f"logits err b={b}", f"{100 * a:.2f}%" if a is not None else "-",
                     f"{100 * c:.2f}%" if c is not None else "-", _ratio(c, a), "x torch"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    head = f"{res.get('model', {}).get('name', '')} on {res.get('device', '?')}"
    return head + "\n" + "\n".join(
        "  ".join(r[i].ljust(widths[i]) if i == 0 else r[i].rjust(widths[i]) for i in range(5)).rstrip() for r in rows)


def write_results(res, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    return path


# ---- main ---------------------------------------------------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    try:
        import transformers
    except ImportError:
        sys.exit("this example needs transformers (an optional dependency, not in requirements.txt): "
                 "python3 -m pip install transformers")
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA GPU (Hopper: H100 / H200)")
    sys.path.insert(0, ROOT)
    import submission

    log = lambda s: print(s, file=sys.stderr, flush=True)   # noqa: E731
    res = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "transformers": transformers.__version__, "args": vars(args)}
    with torch.no_grad():
        model, res["model"] = load_model(args, transformers)
        log(f"[e2e] {res['model']}")
        cases = logits_cases(args, model.config.vocab_size)
        refs = None if args.no_fp32 else fp32_reference(model, cases)
        free_cuda()
        bf16_bytes = linear_weight_bytes(model)
        res["weights"] = {"torch": {"bytes": bf16_bytes}}
        log("[e2e] bf16 torch")
        torch_res = measure(model, transformers, args, cases, refs, log)
        free_cuda()
        log("[e2e] patch")
        kw = dict({"path": args.path} if args.path else {}, one_copy=not args.two_copies)
        report = submission.patch(model, **kw)
        delta = report.allocated_after - report.allocated_before
        res["weights"]["patched"] = {"bytes": report.bytes_held, "measured_bytes": bf16_bytes + delta,
                                     "allocated_before": report.allocated_before,
                                     "allocated_after": report.allocated_after}
        res["patch"] = report.to_dict()
        log("[e2e] patched")
        patched_res = measure(model, transformers, args, cases, refs, log)
    for key in ("decode", "prefill", "logits"):
        res[key] = {"torch": torch_res[key], "patched": patched_res[key]}
    path = write_results(res, args.out or default_out())
    print(results_table(res))
    print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
