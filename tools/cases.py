"""The case spec the tools share (ab_define, ncu_case, spread, sweep_field, trace_chain): 'layer:m[:plain|compressed][:field=value...]',
a scored layer at m, optionally forced onto one CUDA path, its tabled config with fields replaced. Fields that are not
config fields: dbg sets the layer's debug switch (dbg=1: gemvz skips the corrections); wseed / xseed draw the weights
/ x with another seed (judge.py's timing uses wseed=99, xseed=99+m); bal=G reorders the weight rows so that every
group of G rows (a CTA's rows: 16 R) holds about as many out-of-window weights (a different matrix with the same
values, for timing how the exceptions' spread over CTAs matters)."""
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
    wseed, xseed, bal = fields.pop("wseed", seed), fields.pop("xseed", 11 + m), fields.pop("bal", 0)
    w = judge.trained_like(d["N"], d["K"], wseed, "cuda", torch.float32 if dual else torch.bfloat16)
    if bal:
        w = w[balanced_rows(w, bal)].contiguous()
    n = judge.copies_for(d["N"] * d["K"] * 2 * (2 if dual else 1)) if copies is None else copies
    Ls = [S.prepare(name, w, path=path) for _ in range(n)]
    dbg = fields.pop("dbg", None)                   # dbg=1: gemvz skips the corrections (wrong results: timing only)
    for L in Ls:
        if fields:
            L.set_config(m, L.plan(m).config._replace(**fields))
        if dbg is not None:
            L.dbg = dbg
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


def time_interleaved(Ls, x, spec, choices, apply, label, replays, tag, check=True):
    """Each choice in two interleaved rounds: apply(choice) sets it up, the output of the first copy is checked
    against the float64 reference with SPEC's tolerance (any choice may change the summation order), then the
    P copies are timed as SPEC times them (check=False: no check, for choices that are wrong on purpose). Returns
    {choice: [us round 1, us round 2]}; SystemExit on a wrong result, naming the case and the choice."""
    ref = judge.reference(x, Ls[0].weight) if check else None
    res = {c: [] for c in choices}
    for _ in range(2):
        for c in choices:
            apply(c)
            if check:
                check_output(Ls, x, ref, f"{spec} {label(c)}", tag)
            res[c].append(judge.per_call_us(S.kernel_fn, Ls, x, replays))
    return res


def check_output(Ls, x, ref, what, tag):
    """The first copy's output against the float64 reference ref (None: computed here) with SPEC's tolerance;
    SystemExit naming `what` on a wrong result."""
    ref = judge.reference(x, Ls[0].weight) if ref is None else ref
    try:
        judge.check_close(S.kernel_fn(x, Ls[0]), ref, Ls[0].dual, what)
    except judge.CheckFailed as e:
        raise SystemExit(f"[{tag}] wrong result: {e}") from None


def summary(res, label):
    """'label: round1/round2  ...' and the choice with the lowest time of any round."""
    cols = "  ".join(f"{label(c)}: {t[0]:.2f}/{t[1]:.2f}" for c, t in res.items())
    return cols, min(res, key=lambda c: min(res[c]))
