"""The case and variant specs the tools share (ab, ncu_case, trace_chain).

A case is 'layer:m[:plain|compressed][:gemv|gemvz|gemvt|gemvtz][:field=value...]': a scored layer (or a public-config shape of
`judge.py --shapes public`, planned by the planner) at m, optionally forced onto one CUDA path, its planned config with
fields replaced; a kernel family other than the plan's (e.g. 'qwen2-7b.down:1:plain:gemvt:nw=4:st=4:ka=2:s=3') takes a
config of that family built from the fields, its defaults for the fields left out.
Fields that are not config fields (CASE_FIELDS) change the data: wseed / xseed draw the weights / x with another seed
(judge.py's timing uses wseed=99, xseed=99+m); bal=G reorders the weight rows so that every group of G rows (a CTA's
rows: 16 R) holds about as many out-of-window weights (a different matrix with the same values, for timing how the
exceptions' spread over CTAs matters).

A variant is '' (the shipped source) or NAME[+NAME...]: macros that build_extension defines before the kernel
source with csrc/instruments.cuh (the trace and timing-only hooks, which the upload does not carry), a compile-time
variant of the kernels. A tool builds each variant with only the instantiations its cases plan (build): seconds
instead of the shipped build's minute.
"""
import collections
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root: `python3 tools/x.py`
import judge  # noqa: E402
import submission as S  # noqa: E402

CASE_FIELDS = ("wseed", "xseed", "bal")
INSTRUMENTS_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc", "instruments.cuh")
FAMILIES = {f.name: f.config for f in S.FAMILIES}   # a case's kernel family token
# what a case plans at m, found on the CPU (planned): enough to compile its instantiation before any GPU work
Planned = collections.namedtuple("Planned", "config N K m dual")


def layer_spec(name):
    """A case's layer: a scored layer (judge.LAYERS, with its table rows) or a public-config shape of `judge.py --shapes
    public` (judge.SHAPE_SETS['public'], in no table: the planner's plan); None for an unknown name."""
    return next((shapes[name] for shapes in judge.SHAPE_SETS.values() if name in shapes), None)


def parse(spec):
    """'pooler:1:compressed:pf=1' -> ('pooler', 1, 'compressed', {'pf': 1}); a family token is the field 'kind' (its
    name: 'o_proj:8:plain:gemvt:s=2' -> ('o_proj', 8, 'plain', {'kind': 'gemvt', 's': 2})). SystemExit naming what is
    wrong."""
    name, *rest = spec.split(":")
    if layer_spec(name) is None or not rest or not rest[0].isdigit():
        raise SystemExit(f"case {spec!r}: expected 'layer:m[:plain|compressed][:{'|'.join(FAMILIES)}][:field=value...]' "
                         f"with a layer in {', '.join(judge.LAYERS)} or a public shape in "
                         f"{', '.join(judge.SHAPE_SETS['public'])}")
    m, rest = int(rest[0]), rest[1:]
    path = next((r for r in rest if r in ("plain", "compressed")), None)
    fams = [r for r in rest if r in FAMILIES]
    bad = [r for r in rest if r not in ("plain", "compressed") and r not in FAMILIES and "=" not in r]
    if bad or len(fams) > 1:
        raise SystemExit(f"case {spec!r}: cannot read {bad or fams}")
    try:
        fields = {k: int(v) for k, v in (r.split("=", 1) for r in rest if "=" in r)}
    except ValueError:
        raise SystemExit(f"case {spec!r}: field values must be integers") from None
    if fams:
        fields["kind"] = fams[0]
    known = set(CASE_FIELDS).union(*(c._fields for c in FAMILIES.values())) | {"kind"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise SystemExit(f"case {spec!r}: unknown field(s) {unknown}; expected one of {', '.join(sorted(known))} "
                         f"(config fields, or {', '.join(CASE_FIELDS)} for the data)")
    return name, m, path, fields


def replaced(spec, cfg, fields):
    """cfg with the case's config fields replaced; with a family ('kind') other than cfg's, a config of that family from
    the fields and its defaults. SystemExit when the config lacks a field, or the family's needs one not given."""
    fields = {k: v for k, v in fields.items() if k not in CASE_FIELDS}
    if "kind" in fields:
        cls = FAMILIES[fields.pop("kind")]
        if not isinstance(cfg, cls):
            need = sorted(set(cls._fields[:len(cls._fields) - len(cls._field_defaults)]) - set(fields))
            if need:
                raise SystemExit(f"case {spec!r}: a {cls.__name__} needs the field(s) {need}")
            extra = sorted(set(fields) - set(cls._fields))
            if extra:
                raise SystemExit(f"case {spec!r}: a {cls.__name__} has no field(s) {extra}")
            return cls(**fields)
    if not fields:
        return cfg
    missing = sorted(set(fields) - set(cfg._fields if cfg is not None else ()))
    if missing:
        raise SystemExit(f"case {spec!r}: the plan's config {cfg} has no field(s) {missing}")
    return cfg._replace(**fields)


def planned(spec):
    """The config prepare plans for the case at m, found on the CPU the way prepare finds it (plan_for; a bf16
    layer's trained-looking weights compress), with the case's fields replaced. Returns a Planned."""
    name, m, path, fields = parse(spec)
    d = layer_spec(name)
    dual = d["dtype"] == "fp32"
    compressible = "fp32 weights take the DUAL plain path" if dual else True
    cfg = S.plan_for(name, d["N"], d["K"], m, dual, compressible, path).config
    return Planned(replaced(spec, cfg, fields), d["N"], d["K"], m, dual)


def inst_of(cfg, m, dual):
    """The (family, template args) that build_extension(insts=) compiles for cfg at m; None for a config that runs
    no CUDA kernel of ours (the fallback). submission.instance_of for the CUDA configs."""
    if isinstance(cfg, (S.GemvConfig, S.GemvzConfig, S.GemvtConfig)):
        return S.instance_of(cfg, m, dual)
    return None


def instruments():
    """csrc/instruments.cuh's text: the head of every variant build (the hooks the upload leaves empty)."""
    with open(INSTRUMENTS_PATH) as f:
        return f.read()


def variant_defines(variant):
    """'' -> (); 'MUSE_A+MUSE_B' -> ('MUSE_A', 'MUSE_B'). SystemExit for a name that is not a macro name or that neither
    the kernel source nor csrc/instruments.cuh mentions (a misspelt variant would time the shipped code under another
    name)."""
    names = tuple(n for n in variant.split("+") if n)
    text = S.KERNEL_SRC + instruments()
    for n in names:
        if not re.fullmatch(r"[A-Za-z_]\w*", n):
            raise SystemExit(f"variant {variant!r}: {n!r} is not a macro name")
        if not re.search(rf"\b{n}\b", text):
            raise SystemExit(f"variant {variant!r}: neither the kernel source nor csrc/instruments.cuh mentions {n}")
    return names


def variant_extension(defines=(), insts=None):
    """build_extension of a variant: the shipped source as it is for no defines, else the defines with
    csrc/instruments.cuh in front (insts: only those instantiations)."""
    return S.build_extension(defines=tuple(defines), insts=insts, head=instruments() if defines else "")


def build(defines, plans):
    """The extension of the kernel source with `defines` (variant_extension), holding the instantiations of the Planned
    configs only, and each compressed one's cooperative-walk twin (walk = 1): prepare takes it where the case's weights
    have a long row (submission.walk_for), which the CPU's plan cannot know (the weights are drawn on the GPU)."""
    insts = {inst_of(p.config, p.m, p.dual) for p in plans} - {None}
    insts |= {inst_of(S.coop_twin(p.config), p.m, p.dual) for p in plans} - {None}
    return variant_extension(defines, sorted(insts))


def prepare(spec, copies=None, seed=7, ext=None):
    """The case's layer prepared `copies` times (None: SPEC's P copies, >= 2 GB of weights) on trained-looking
    weights, launching with ext (None: the shipped build), with the fields replaced in every copy's plan for m.
    Returns (layers, m, x)."""
    name, m, path, fields = parse(spec)
    d = layer_spec(name)
    dual = d["dtype"] == "fp32"
    wseed, xseed, bal = fields.get("wseed", seed), fields.get("xseed", 11 + m), fields.get("bal", 0)
    w = judge.trained_like(d["N"], d["K"], wseed, "cuda", torch.float32 if dual else torch.bfloat16)
    if bal:
        w = w[balanced_rows(w, bal)].contiguous()
    n = judge.copies_for(d["N"] * d["K"] * 2 * (2 if dual else 1)) if copies is None else copies
    Ls = [S.prepare(name, w, path=path, ext=ext) for _ in range(n)]
    cfg = replaced(spec, Ls[0].plan(m).config, fields)
    if cfg != Ls[0].plan(m).config:
        for L in Ls:
            L.set_config(m, cfg)
    return Ls, m, judge.fresh_x(m, d["K"], xseed, "cuda")


def balanced_rows(w, group):
    """A row order of bf16 w [N, K] in which every `group` consecutive rows hold about as many out-of-window weights
    (pack_z's exceptions): rows sorted by their count, dealt to the N / group groups in snake order (0..G-1, then
    G-1..0, ...). Returns the permutation (a LongTensor on w's device)."""
    N = w.shape[0]
    if group <= 0 or N % group:
        raise SystemExit(f"bal={group}: needs a positive divisor of N = {N}")
    cnt = S.pack_z(w).eptr.diff().to(w.device)
    order = torch.argsort(cnt, descending=True, stable=True)
    G = N // group
    i = torch.arange(N, device=w.device)
    rnd, j = i // G, i % G
    dest_group = torch.where(rnd % 2 == 0, j, G - 1 - j)
    slot = dest_group * group + rnd                # each group takes one row per round
    perm = torch.empty_like(order)
    perm[slot] = order
    return perm
