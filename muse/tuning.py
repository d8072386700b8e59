"""prepare(tune=True): the planner's cheapest candidates timed on the layer's own weights, the fastest kept and cached.

For each token class (m <= 8, 9..16, 17..32) whose plan the cost model chose (table rows and the fixed rules are left
alone), the TUNE_TOP cheapest candidates of the planned path are timed at the class's largest m the way judge.py
times a call: one CUDA graph of TUNE_CALLS back-to-back calls cycling over enough copies of the weights that they
exceed L2, its median replay divided by the calls, the candidates' graphs replayed in interleaved rounds (a clock or
placement drift then hits every candidate alike). Winners are cached on disk, keyed by device, kernel build, shape,
class and path, so a shape is timed once.
"""
import json
import math
import os
import sys
import time

import torch

from .call import kernel_fn
from .families import MAX_M, config_from_fields, config_misfit, config_short, family_named, family_of, nb_of
from .layer import Layer
from .planner import PlanEntry, plan_priced
from .zformat import walk_for

TUNE_TOP = 3                     # candidates timed per token class: the cost model's cheapest
TUNE_BYTES = 160 * 1024 ** 2     # weight bytes the timing copies hold together: past the 60 MB L2, as SPEC's >= 2 GB
TUNE_MAX_COPIES = 64             #   copies are (one layer's own weights would time from L2); tiny layers cap here
TUNE_CALLS = 64                  # calls a graph, cycling over the copies (SPEC's P >= 2 GB copies give 30-100)
TUNE_WARMUP = 3                  # replays of each graph before any is timed
TUNE_ROUNDS = 3                  # interleaved rounds over the candidates' graphs
TUNE_REPLAYS = 3                 # replays a round: the median of ROUNDS x REPLAYS
PLANNER_MODEL_WHY = "planner (cost model)"   # the plans tune=True may replace: where the cost model priced candidates


def tune_cache_path():
    """Where prepare(tune=True) keeps its winners: $MUSE_TUNE_CACHE, else ~/.cache/muse_gemv/tuned.json."""
    return os.environ.get("MUSE_TUNE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "muse_gemv",
                                                                "tuned.json")


def tune_key(layer, nb, path):
    """The cache key of a tuned class: device, the extension (its name hashes the kernel source and flags), shape and
    dtype, token class, path."""
    dev = torch.cuda.get_device_name(layer.device) if layer.device.type == "cuda" else str(layer.device)
    ext = getattr(layer.ext, "__name__", "?")
    return f"{dev}|{ext}|{layer.N}x{layer.K}|{'fp32' if layer.dual else 'bf16'}|m<={8 * nb}|{path}"


def config_to_json(cfg):
    return {"family": family_of(cfg).name, "fields": cfg._asdict()}


def config_from_json(d):
    """The config of a cache entry, or None for anything unreadable (an old or hand-edited file is not an error)."""
    try:
        cfg, why = config_from_fields(dict(d["config"]["fields"]), family_named(d["config"]["family"]))
        return None if why else cfg
    except (KeyError, TypeError, ValueError, StopIteration):
        return None


def read_tune_cache(path):
    try:
        with open(path) as f:
            d = json.load(f)
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def write_tune_cache(path, cache):
    """Write the cache whole, through a temporary file (a concurrent reader sees the old or the new file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(cache, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def timing_copy(layer):
    """A Layer with its own copies of layer's packed weights (GPU copies: other addresses, so back-to-back calls over
    several copies read HBM, not L2) and its own split-K buffers; the same plans."""
    c = Layer(layer.name, layer.weight)
    c.ext, c.pdl, c.plans = layer.ext, layer.pdl, list(layer.plans)
    clone = lambda t: None if t is None else t.clone()   # noqa: E731
    c.w, c.wt = clone(layer.w), clone(layer.wt)
    c.w2 = c.w if layer.w2 is layer.w else clone(layer.w2)
    if layer.z is not None:
        c.z = layer.z._replace(stream=clone(layer.z.stream), zbase=clone(layer.z.zbase), eptr=clone(layer.z.eptr),
                               esc=clone(layer.z.esc))
    c._alloc_workspace()
    return c


def time_configs(layer, cfgs, m, x, ref):
    """[(us, cfg)] of the configs that run and pass SPEC's tolerance at m, each timed as judge.per_call_us times a
    call (this module's docstring)."""
    n = max(1, min(TUNE_MAX_COPIES, math.ceil(TUNE_BYTES / max(layer.bytes_read(m), 1))))
    copies = [layer] + [timing_copy(layer) for _ in range(n - 1)]
    calls = max(TUNE_CALLS, n)
    ok = []
    for cfg in cfgs:                               # every workspace grown first: no graph below loses its buffers
        try:
            for c in copies:
                c.set_config(m, cfg)
            y = kernel_fn(x, layer).double()
        except (ValueError, RuntimeError):      # a config that does not fit or is not compiled in: not timed
            continue
        err = (y - ref).abs()
        if bool((err <= 2 ** -7 * ref.abs() + 2 ** -10 * ref.abs().amax(1, keepdim=True)).all()):
            ok.append(cfg)                         # outside SPEC's tolerance: never picked
    graphs = []
    out = torch.empty((m, layer.N), dtype=layer.out_dtype, device=layer.device)   # one output: no pool per graph
    for cfg in ok:
        for c in copies:
            c.set_config(m, cfg)
        run = lambda: [kernel_fn(x, copies[i % n], out=out) for i in range(calls)]   # noqa: E731
        side = torch.cuda.Stream(layer.device)
        side.wait_stream(torch.cuda.current_stream(layer.device))
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream(layer.device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        for _ in range(TUNE_WARMUP):
            g.replay()
        graphs.append((g, cfg, []))
    for _ in range(TUNE_ROUNDS):
        for g, cfg, ts in graphs:
            for _ in range(TUNE_REPLAYS):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                g.replay()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1e3 / calls)
    return [(sorted(ts)[len(ts) // 2], cfg) for _, cfg, ts in graphs]


def tune_layer(layer, cache_path):
    """prepare(tune=True) on a prepared layer: each token class the cost model planned gets the fastest of its planned
    path's TUNE_TOP cheapest candidates, timed at the class's largest m (or the cached winner)."""
    cache = read_tune_cache(cache_path)
    dirty = False
    for nb in (1, 2, 4):
        ms = [m for m in range(1, MAX_M + 1) if nb_of(m) == nb and layer.plans[m].why.startswith(PLANNER_MODEL_WHY)]
        if not ms:
            continue
        path, old = layer.plans[ms[0]].path, layer.plans[ms[0]].config
        ms = [m for m in ms if layer.plans[m].path == path]
        m_top = ms[-1]
        key = tune_key(layer, nb, path)
        hit = config_from_json(cache.get(key))
        if hit is not None and not config_misfit(hit, layer.N, layer.K, m_top, layer.dual):
            cfg, why = hit, (f"tuned (cached in {cache_path}): {config_short(hit)} {cache[key]['us']:.2f} us at "
                             f"m={cache[key]['m']}, fastest of {len(cache[key]['timed'])}")
        else:
            cands = [c for _, c, _ in plan_priced(layer.N, layer.K, m_top, path)][:TUNE_TOP]
            if path == "compressed":   # each with the walk its worst row needs (walk_for; a long row: cooperative)
                cands = [w[0] for w in (walk_for(layer.z, c, m_top) for c in cands) if not isinstance(w, str)]
            t0 = time.time()
            g = torch.Generator().manual_seed(20261202)
            x = torch.randn(m_top, layer.K, generator=g).to(torch.bfloat16).to(layer.device)
            ref = x.double() @ layer.weight.double().t()
            timed = time_configs(layer, cands, m_top, x, ref)
            if not timed:
                raise RuntimeError(f"prepare(tune=True), layer '{layer.name}' m={m_top}: none of the planner's "
                                   f"candidates {[config_short(c) for c in cands]} ran within SPEC's tolerance")
            us, cfg = min(timed, key=lambda t: t[0])
            listing = ", ".join(f"{config_short(c)} {t:.2f}" for t, c in timed)
            print(f"[muse] tuned layer '{layer.name}' [{layer.N} x {layer.K}] m<={m_top} {path}: {listing} us "
                  f"({time.time() - t0:.1f} s)", file=sys.stderr, flush=True)
            cache[key] = {"config": config_to_json(cfg), "us": round(us, 3), "m": m_top,
                          "timed": [[config_short(c), round(t, 3)] for t, c in timed],
                          "date": time.strftime("%Y-%m-%d")}
            dirty = True
            why = f"tuned on this device: {config_short(cfg)} {us:.2f} us at m={m_top}, fastest of {listing} us"
        for m in ms:
            layer.set_config(m, cfg)
            layer.plans[m] = PlanEntry(path, cfg, f"{why} (planner's pick: {config_short(old)})")
    if dirty:
        write_tune_cache(cache_path, cache)
