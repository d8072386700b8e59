"""prepare: one layer packed, compressed where that pays and is exact (verified on the GPU), every m planned, every
launch built, before any call (kernel_fn, muse/call.py, may then be captured in a CUDA graph)."""
import torch

from .extension import shipped_extension
from .families import MAX_M
from .layer import Layer
from .planner import plan_for
from .tuning import tune_cache_path, tune_layer
from .zformat import NoCompression, compress_verified, walk_for, z_pays


def check_weight(name, weight):
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"weight of layer '{name}' must be torch.bfloat16 or torch.float32, got {weight.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"weight of layer '{name}' must be 2-D [N, K], got shape {tuple(weight.shape)}")
    if weight.numel() == 0:
        raise ValueError(f"weight of layer '{name}' is empty: shape {tuple(weight.shape)}")
    if not weight.is_cuda:
        raise ValueError(f"weight of layer '{name}' must be a CUDA tensor, got device {weight.device}")


def prepare(name, weight, *, path=None, pdl=None, ext=None, ctable=None, ztable=None, tune=False, tune_cache=None,
            one_copy=False):
    """Pack one layer and plan every m. weight: CUDA [N, K], bf16 or fp32 (router: hi + lo, fp32 out).

    path: None (tables and planner decide per m), 'plain' or 'compressed' (force one path for every m <= 32;
          'compressed' takes the 12-bit format whenever it is exact, whatever its exception rate).
    pdl:  None (env MUSE_PDL, default on), True or False.
    ext:  None (the shipped build) or a module from build_extension(...) (a variant build: tools, tests).
    ctable, ztable: tables to plan with instead of CTABLE / ZTABLE (judge.py --no-tables passes empty ones).
    tune: False, or True: where the cost model planned a token class (m <= 8, 9..16, 17..32; not table rows), time its
          cheapest candidates on this layer's weights and keep the fastest; the winner is cached on disk (tune_cache,
          default tune_cache_path(): device, kernel build, shape), so a shape is timed once (a few seconds; a line on
          stderr says what was timed). describe() says "tuned on this device" / "tuned (cached ...)".
    one_copy: False (the fastest plan of every m, whatever copies it needs, and a reference to the caller's tensor for
          m > 32), or True: where the weight compresses, every m <= 32 runs on the 12-bit stream (the compressed config
          of its m; a plain row of the tables is passed over) and m > 32 rebuilds slices of W from that stream
          (dense_matmul), so the layer holds one copy, about 1.5 bytes a weight, and no reference to the caller's
          tensor, which the caller may free. A weight that does not compress keeps its packed plain copy (or copies)
          and drops the tensor where every m can run from them; with path= forced, that path's copy. describe() says
          what the layer holds.
    Runs eagerly (may allocate, synchronize, verify). Returns a Layer; layer.describe() says what each m does.
    """
    check_weight(name, weight)
    if path not in (None, "plain", "compressed"):
        raise ValueError(f"path must be None, 'plain' or 'compressed', got {path!r}")
    if not isinstance(tune, bool):
        raise TypeError(f"tune must be True or False, got {tune!r}")
    if not isinstance(one_copy, bool):
        raise TypeError(f"one_copy must be True or False, got {one_copy!r}")
    ext = shipped_extension() if ext is None else ext
    weight = weight.contiguous()
    L = Layer(name, weight)
    L.ext = ext
    if pdl is not None:
        L.pdl = bool(pdl)
    N, K = L.N, L.K
    shape_ok = N % 16 == 0 and K % 64 == 0

    def plan(m, compressible):
        return plan_for(name, N, K, m, L.dual, compressible, path, ctable, ztable)

    compressible = "fp32 weights take the DUAL plain path" if L.dual else (
        f"shape N={N}, K={K} not a multiple of 16 / 64" if not shape_ok else True)
    # Which paths could be used: compress only if some m would take it (every m, for one copy)
    if (one_copy and path is None and compressible is True) or any(plan(m, compressible).path == "compressed"
                                                                   for m in range(1, MAX_M + 1)):
        try:
            L.z = compress_verified(weight, ext, limits=path != "compressed")
            L.z_note = "ok"
        except NoCompression as e:
            if path == "compressed":
                raise ValueError(f"layer '{name}' cannot be compressed: {e}") from None
            compressible, L.z_note = str(e), f"not used: {e}"   # plan_for says "compressed not used: <why>"
    elif compressible is not True:
        L.z_note = f"not used: {compressible}"
    else:
        L.z_note = "not used: the tables send every m to the plain path"
    whys = []     # why an m range of a compressible layer runs plain anyway (the 12-bit note when none takes it)

    def with_walk(p, m):
        """Compressed plan p with the exception walk its worst rows need, or why none hides under the stream (str)."""
        walk = walk_for(L.z, p.config, m)
        return walk if isinstance(walk, str) else p._replace(config=walk[0], why=p.why + walk[1])

    def plan_m(m):
        if L.z is None or path is not None:
            return plan(m, compressible)
        pays = z_pays(L.z, m)
        p = plan(m, pays)
        if p.path != "compressed":
            whys.append(pays)
            return p
        p = with_walk(p, m)
        if isinstance(p, str):
            whys.append(p)
            return plan(m, p)
        return p

    L.plans = [None] + [plan_m(m) for m in range(1, MAX_M + 1)]
    if one_copy and path is None and L.z is not None:   # the 12-bit stream at every m: no plain copy beside it
        for m in range(1, MAX_M + 1):
            if L.plans[m].path != "plain":
                continue
            try:
                p = with_walk(plan_for(name, N, K, m, L.dual, True, "compressed", ctable, ztable), m)
            except ValueError as e:
                p = f"no compressed config ({e})"
            L.plans[m] = (L.plans[m]._replace(why=f"{L.plans[m].why}; one copy: {p}") if isinstance(p, str) else
                          p._replace(why=f"one copy: {p.why}"))
    if L.z is not None and not any(p.path == "compressed" for p in L.plans[1:]):   # no m takes it: drop the copy
        why = next((r for r in whys if r is not True), "the tables send every m to the plain path")
        L.z_note, L.z = f"not used: {why}", None
    L.pack()
    L._alloc_workspace()
    if tune:
        tune_layer(L, tune_cache or tune_cache_path())
    for m in range(1, MAX_M + 1):       # the launches, here rather than in a first kernel_fn (maybe under capture)
        if L.plans[m].path in ("plain", "compressed"):
            L.launch(m)
    if one_copy and L.can_drop_weight():
        L.weight = None                 # the caller may free its tensor: m > 32 rebuilds W from the layer's own copy
    torch.cuda.synchronize(L.device)
    return L
