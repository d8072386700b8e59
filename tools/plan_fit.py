"""Fit the planner's cost model (tables/plan_models.json -> submission.PLAN_MODELS) to tools/plan_grid.py's timings,
and say how well it picks.

    python3 tools/plan_fit.py results/plangrid-2026-12-02-s19call1.json [more.json ...] [--lam 1.0] [--loso]
    python3 tools/plan_fit.py ... --warm --priced --write     # the fit goes to tables/plan_models.json

Per model class (path and token blocks: compressed m <= 8, compressed 9..16, gemvt 17..32) the constants are fit by
Nelder-Mead on an objective that asks the model to *pick* well: for every timed case (layer, m), the expected loss
(log of the picked candidate's time over the case's fastest) of a soft pick over the model's predictions, plus lam x the
mean squared log error of the predicted times (so the constants stay physical). The model's formula is the shipped one
(submission.plan_cost), with the trial constants. Prints each class's constants as its tables/plan_models.json entry,
the in-sample pick loss, the rms error of the times, and with --loso the same pick loss with each shape left out of the
fit in turn (how the model does on a shape it was not fit on). --write replaces the fitted classes' entries in
tables/plan_models.json (the others are kept) and records the grids it fit on; then `python3 build.py` writes them into
submission.py. CPU only (numpy, scipy).
"""
import argparse
import collections
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root
os.environ.setdefault("MUSE_BUILD", "0")
import submission as S  # noqa: E402

FAMILY_OF_KIND = {f.config.__name__: f.name for f in S.FAMILIES}
PIPE_TO_LOOP_MB = {0: (0, 0), 1: (1, 0), 2: (1, 2), 3: (0, 1), 4: (2, 0), 5: (2, 2)}
MODELS_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tables", "plan_models.json")


def row_config(kind, fields):
    """A grid row's config; rows of grids timed before session 24 carry PIPE (and co), which are converted."""
    fields = {k: v for k, v in fields.items() if k != "co"}
    if "pipe" in fields:
        p = fields.pop("pipe")
        fields["loop"], fields["mb"] = PIPE_TO_LOOP_MB[p & 7]
        if kind == "GemvzConfig":
            fields["walk"] = 1 if p >= 8 else 0
    cfg, why = S.config_from_fields(fields, S.family_named(FAMILY_OF_KIND[kind]))
    if why:
        raise SystemExit(f"[plan_fit] a grid row's {kind} {fields}: {why}")
    return cfg


def load(paths):
    """The grid rows of every file, as (config, row); rows whose 'bad' flag is set (a timing known to be wrong) left
    out."""
    rows = []
    for p in paths:
        for r in json.load(open(p))["rows"]:
            if not r.get("bad"):
                rows.append((row_config(r["kind"], r["config"]), r))
    return rows


def priced_only(rows):
    """The rows whose config submission.plan_candidates prices for their shape and m."""
    keep, cache = [], {}
    for c, r in rows:
        path = "compressed" if isinstance(c, S.GemvzConfig) else "plain"
        key = (r["N"], r["K"], r["m"], path)
        if key not in cache:
            cache[key] = {cfg for _, _, cfg in S.plan_candidates(*key)}
        if c in cache[key]:
            keep.append((c, r))
    return keep


def fam_key(cfg):
    return cfg._replace(s=1, cl=0)


def classes(rows):
    """{(path, nb): [(config, row)]}: the model classes the rows fall in."""
    out = collections.defaultdict(list)
    for c, r in rows:
        path = "compressed" if isinstance(c, S.GemvzConfig) else "plain"
        out[path, S.nb_of(r["m"])].append((c, r))
    return out


NG = 5   # the class's constants: t0, cl0, cl1, tk0, tk1; then r, R and bw of each family


def unpack(p, path, nb, fams, occs):
    """A PlanModel from the parameter vector p: t0, cl0, cl1, tk0, tk1, then r, R and bw of each family."""
    n = len(fams)
    return S.PlanModel(path, nb, p[0], p[1], p[2], p[3], p[4],
                       tuple(S.PlanFamily(f, occs[f], p[NG + i], p[NG + n + i], p[NG + 2 * n + i])
                             for i, f in enumerate(fams)))


def predict(model, c, r):
    fam = next(f for f in model.families if f.config == fam_key(c))
    return S.plan_cost(model, fam, c, r["N"], r["K"], r["m"])


def objective(model, rows, lam, tau=0.05):
    by = collections.defaultdict(list)
    for c, r in rows:
        by[r["layer"], r["m"]].append((math.log(predict(model, c, r)), math.log(r["us"])))
    loss = err = 0.0
    for cands in by.values():
        best_p, best_t = min(p for p, _ in cands), min(t for _, t in cands)
        w = [math.exp(-(p - best_p) / tau) for p, _ in cands]
        loss += sum(wi * (t - best_t) for wi, (_, t) in zip(w, cands)) / sum(w)
        err += sum((p - t) ** 2 for p, t in cands)
    return loss + lam * err / len(rows)


def pick_loss(model, rows):
    """[picked time / fastest time] per case, and the rms log error of the predicted times."""
    by = collections.defaultdict(list)
    for c, r in rows:
        by[r["layer"], r["m"]].append((predict(model, c, r), r["us"]))
    ratios = [min(cands)[1] / min(t for _, t in cands) for cands in by.values()]
    err = math.sqrt(sum(math.log(p / t) ** 2 for cands in by.values() for p, t in cands) / len(rows))
    return ratios, err


def fit(rows, path, nb, fams, occs, lam, p0=None):
    from scipy.optimize import minimize
    n = len(fams)
    p0 = list(p0) if p0 is not None else [0.5, 0.3, 0.3, 0.5, 0.1] + [30.0] * n + [60.0] * n + [4500.0] * n

    def f(p):
        if min(p) < 0 or min(p[NG:]) <= 0:
            return 1e9
        return objective(unpack(p, path, nb, fams, occs), rows, lam)
    best = None
    for _ in range(3):
        res = minimize(f, p0 if best is None else best.x, method="Nelder-Mead",
                       options={"maxiter": 8000, "maxfev": 8000, "adaptive": True})
        if best is None or res.fun < best.fun:
            best = res
    return list(best.x)


def geo(v):
    return math.exp(sum(map(math.log, v)) / len(v))


def model_json(model):
    """A class's tables/plan_models.json entry, rounded as the model is read (times to 1 ns, rates to 10 MB/s)."""
    return {"path": model.path, "nb": model.nb, **{k: round(getattr(model, k), 3) for k in ("t0", "cl0", "cl1", "tk0",
                                                                                          "tk1")},
            "families": [{"config": f.config._asdict(), "occ": f.occ, "r": round(f.r, 2), "R": round(f.R, 2),
                          "bw": float(round(f.bw))} for f in model.families]}


def write_models(models, grids, argv):
    """Replace the fitted classes' entries of tables/plan_models.json, keep the others, record the fit."""
    import datetime
    with open(MODELS_JSON) as f:
        d = json.load(f)
    fitted = {(m["path"], m["nb"]) for m in models}
    d["models"] = [m for m in d["models"] if (m["path"], m["nb"]) not in fitted] + models
    d["models"].sort(key=lambda m: (m["path"] != "compressed", m["nb"]))
    d["fit"] = {"by": "tools/plan_fit.py " + " ".join(a for a in argv if a.startswith("--")), "data": list(grids),
                "date": datetime.date.today().isoformat()}
    with open(MODELS_JSON, "w") as f:
        f.write(json.dumps(d, indent=1) + "\n")
    print(f"[plan_fit] wrote {len(models)} classes to {os.path.relpath(MODELS_JSON)}; run `python3 build.py`")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("grids", nargs="+")
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--loso", action="store_true", help="also fit with each shape left out, and pick on it")
    ap.add_argument("--warm", action="store_true", help="start from submission.PLAN_MODELS' constants")
    ap.add_argument("--priced", action="store_true", help="only the timed configs the planner prices now "
                    "(submission.plan_candidates: a grid that timed past its rule, e.g. --uneven, fits what it picks from)")
    ap.add_argument("--write", action="store_true", help="write the fitted classes to tables/plan_models.json")
    args = ap.parse_args(argv)
    fitted = []
    rows = load(args.grids)
    if args.priced:
        rows = priced_only(rows)
    for (path, nb), crows in sorted(classes(rows).items()):
        fams = sorted({fam_key(c) for c, _ in crows}, key=repr)
        occs = {f: min(r["occ"] for c, r in crows if fam_key(c) == f and c.s == 1) for f in fams}
        old = next((m for m in S.PLAN_MODELS if m.path == path and m.nb == nb), None) if args.warm else None
        p0 = None
        if old is not None and sorted((f.config for f in old.families), key=repr) == fams:
            byf = {f.config: f for f in old.families}
            p0 = ([old.t0, old.cl0, old.cl1, old.tk0, old.tk1] + [byf[f].r for f in fams] + [byf[f].R for f in fams] +
                  [byf[f].bw for f in fams])
        p = fit(crows, path, nb, fams, occs, args.lam, p0)
        model = unpack(p, path, nb, fams, occs)
        ratios, err = pick_loss(model, crows)
        print(f"# {path} nb={nb}: {len(crows)} timings, {len(ratios)} cases; pick / fastest geomean {geo(ratios):.4f}, "
              f"worst {max(ratios):.3f}; rms log error of the times {err:.3f}", flush=True)
        if args.loso:
            held_ratios = []
            for held in sorted({r["layer"] for _, r in crows}):
                pm = unpack(fit([x for x in crows if x[1]["layer"] != held], path, nb, fams, occs, args.lam, p),
                            path, nb, fams, occs)
                held_ratios += pick_loss(pm, [x for x in crows if x[1]["layer"] == held])[0]
            print(f"# {path} nb={nb}: each shape left out of the fit: pick / fastest geomean {geo(held_ratios):.4f}, "
                  f"worst {max(held_ratios):.3f}", flush=True)
        fitted.append(model_json(model))
        print(json.dumps(fitted[-1]), flush=True)
    if args.write:
        write_models(fitted, args.grids, sys.argv[1:] if argv is None else argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
