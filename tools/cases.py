"""The case spec the tools share (ncu_case, sweep_field, trace_chain): 'layer:m[:plain|compressed][:field=value...]',
a scored layer at m, optionally forced onto one CUDA path, its tabled config with fields replaced; the field dbg sets
the layer's debug switch instead (dbg=1: gemvz skips the corrections)."""
import torch

import judge
import submission as S


def parse(spec):
    """'pooler:1:compressed:pf=1' -> ('pooler', 1, 'compressed', {'pf': 1}); SystemExit naming what is wrong."""
    name, *rest = spec.split(":")
    if name not in judge.LAYERS or not rest or not rest[0].isdigit():
        raise SystemExit(f"case {spec!r}: expected 'layer:m[:plain|compressed][:field=value...]' with a layer "
                         f"in {', '.join(judge.LAYERS)}")
    m, rest = int(rest[0]), rest[1:]
    path = next((r for r in rest if r in ("plain", "compressed")), None)
    bad = [r for r in rest if r not in ("plain", "compressed") and "=" not in r]
    if bad:
        raise SystemExit(f"case {spec!r}: cannot read {bad}")
    try:
        fields = {k: int(v) for k, v in (r.split("=", 1) for r in rest if "=" in r)}
    except ValueError:
        raise SystemExit(f"case {spec!r}: field values must be integers") from None
    return name, m, path, fields


def prepare(spec, copies=None, seed=7):
    """The case's layer prepared `copies` times (None: SPEC's P copies, >= 2 GB of weights) on trained-looking
    weights, with the fields replaced in every copy's plan for m. Returns (layers, m, x)."""
    name, m, path, fields = parse(spec)
    d = judge.LAYERS[name]
    dual = d["dtype"] == "fp32"
    w = judge.trained_like(d["N"], d["K"], seed, "cuda", torch.float32 if dual else torch.bfloat16)
    n = judge.copies_for(d["N"] * d["K"] * 2 * (2 if dual else 1)) if copies is None else copies
    Ls = [S.prepare(name, w, path=path) for _ in range(n)]
    dbg = fields.pop("dbg", None)                   # dbg=1: gemvz skips the corrections (wrong results: timing only)
    for L in Ls:
        if fields:
            L.set_config(m, L.plan(m).config._replace(**fields))
        if dbg is not None:
            L.dbg = dbg
    return Ls, m, judge.fresh_x(m, d["K"], 11 + m, "cuda")


def time_interleaved(Ls, x, spec, choices, apply, label, replays, tag, check=True):
    """Each choice in two interleaved rounds: apply(choice) sets it up, the output of the first copy is checked
    against the float64 reference with SPEC's tolerance (any choice may change the summation order), then the
    P copies are timed as SPEC times them (check=False: no check, for choices that are wrong on purpose). Returns
    {choice: [us round 1, us round 2]}; SystemExit on a wrong result, naming the case and the choice."""
    P = len(Ls)
    ref = judge.reference(x, Ls[0].weight) if check else None
    res = {c: [] for c in choices}
    for _ in range(2):
        for c in choices:
            apply(c)
            try:
                if check:
                    judge.check_close(S.kernel_fn(x, Ls[0]), ref, Ls[0].dual, f"{spec} {label(c)}")
            except judge.CheckFailed as e:
                raise SystemExit(f"[{tag}] wrong result: {e}") from None
            ms, _ = judge.time_graph([lambda L=L: S.kernel_fn(x, L) for L in Ls], replays)
            res[c].append(ms * 1e3 / P)
    return res


def summary(res, label):
    """'label: round1/round2  ...' and the choice with the lowest time of any round."""
    cols = "  ".join(f"{label(c)}: {t[0]:.2f}/{t[1]:.2f}" for c, t in res.items())
    return cols, min(res, key=lambda c: min(res[c]))
