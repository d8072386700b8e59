"""The planner's fixed rules and the defaults, as data; and which instantiations they and the tables can reach.

What is compiled in is exactly what a table row, the planner or the default rule can ask for (reachable_instances,
which build.py calls). The cost model's fitted constants are not here: tools/plan_fit.py writes them to
tables/plan_models.json, and build.py generates PLAN_MODELS into the upload from that file.

This module imports only the standard library and muse/families.py: build.py imports it.
"""
import collections

from .families import RING_CONFIGS, GemvConfig, GemvzConfig, coop_twin, instance_of

# ---- the default rule: a (layer, m) no table row and no planner family covers -------------------------------------
# The first config of the list that fits, at the smallest power-of-two S giving two CTAs an SM that still fits
# (default_config). Every one is compiled for every NB (and DUAL).
DEFAULT_GEMV = (GemvConfig(nw=4, s=1, u=1, r=1, loop=1, mb=2, pf=0),
                GemvConfig(nw=2, s=1, u=1, r=1, loop=1, mb=2, pf=0))
DEFAULT_GEMVZ = (GemvzConfig(nw=4, s=1, ug=1, r=1, loop=1, mb=2, walk=0, pf=0),)

# ---- the planner's rules where no cost model class runs ------------------------------------------------------------
# One kernel family per (path, dtype, m range): the instantiation the tuned rows of tables/ share in that range, and the
# CTA count their S fills; for a new shape the rule keeps the family and picks the S whose grid comes closest to that
# count (planner_rule). FINDINGS has the rows each rule was read from.
# cards: the cards whose timings the rule rests on (None: every card); on another card the rule does not apply
PlannerRule = collections.namedtuple("PlannerRule", "path dual m_max config ctas source cards", defaults=(None,))
PLANNER = (
    PlannerRule("plain", False, 8, GemvConfig(nw=8, s=1, u=2, r=2, loop=0, mb=0, pf=0), 512,
                "the tuned m <= 8 plain rows (o_proj, unpooler: 512 CTAs)"),
    PlannerRule("plain", False, 16, GemvConfig(nw=4, s=1, u=2, r=2, loop=2, mb=0, pf=0), 512,
                "the tuned m = 16 plain row of o_proj (512 CTAs)"),
    PlannerRule("plain", True, 8, GemvConfig(nw=16, s=1, u=2, r=2, loop=0, mb=1, pf=0), 64,
                "the router's tuned m <= 8 rows (64 CTAs)"),
    PlannerRule("plain", True, 16, GemvConfig(nw=16, s=1, u=2, r=2, loop=0, mb=0, pf=1), 64,
                "the router's tuned m = 16 row (64 CTAs)"),
    PlannerRule("plain", True, 32, GemvConfig(nw=8, s=1, u=1, r=1, loop=2, mb=0, pf=0), 128,
                "the router's tuned m = 32 row (128 CTAs)"),
)

# ---- the cost model's domain ---------------------------------------------------------------------------------------
# The model (muse/planner.py, plan_cost) prices each family of a class at every split S that fits. Its constants come
# from tables/plan_models.json (tools/plan_fit.py); these bound what it prices to the domain it was fit on.
PlanFamily = collections.namedtuple("PlanFamily", "config occ r R bw")
PlanModel = collections.namedtuple("PlanModel", "path nb t0 cl0 cl1 tk0 tk1 families")
PLAN_MAX_S = 8            # splits priced: the fit saw S <= 8
PLAN_UNEVEN = "needed"    # gemvz's uneven splits: priced only for a family with no even S > 1 ('always': every one)
PLAN_SPLIT_WAVES = 3      # a split (S > 1) is priced while its grid has at most this many waves of one CTA an SM
                          # (gemvt: two thirds of it): the fit's domain
PLAIN_GEMVT_MIN_BYTES = 16e6   # plain bf16 m <= 16 takes gemvt only above this many weight bytes (plain_gemvt)


def plan_models_from_json(d, config_from_fields):
    """PLAN_MODELS (a tuple of PlanModel) from tables/plan_models.json's dict; ValueError naming a bad entry."""
    out = []
    for i, md in enumerate(d.get("models", [])):
        fams = []
        for j, fd in enumerate(md["families"]):
            cfg, why = config_from_fields(fd["config"], None, md["path"])
            if why:
                raise ValueError(f"tables/plan_models.json model {i} family {j}: {why}")
            fams.append(PlanFamily(cfg, int(fd["occ"]), float(fd["r"]), float(fd["R"]), float(fd["bw"])))
        out.append(PlanModel(md["path"], int(md["nb"]), *(float(md[k]) for k in ("t0", "cl0", "cl1", "tk0", "tk1")),
                             tuple(fams)))
    return tuple(out)


def reachable_instances(table_configs, models):
    """(family, template args) of every instantiation a table row, the planner or the default rule can ask for.

    table_configs: [(config, m, dual)] of the table rows; models: PLAN_MODELS. The cost model's gemvt families are
    compiled at every NB (plain bf16 m <= 16 takes them too: plain_gemvt), its register families at their class's NB;
    each PLANNER rule at its m range's NB; the defaults at every NB (and DUAL); and every compressed config also with
    the cooperative exception walk, which prepare takes for a layer whose worst row is long (muse/zformat.py, walk_for).
    """
    cfgs = list(table_configs)
    cfgs += [(rule.config, rule.m_max, rule.dual) for rule in PLANNER]
    cfgs += [(fam.config, 8 * nb, False) for model in models for fam in model.families
             for nb in ((1, 2, 4) if isinstance(fam.config, RING_CONFIGS) else (model.nb,))]
    cfgs += [(c, 8 * nb, dual) for nb in (1, 2, 4) for c in DEFAULT_GEMV for dual in (False, True)]
    cfgs += [(c, 8 * nb, False) for nb in (1, 2, 4) for c in DEFAULT_GEMVZ]
    cfgs += [(coop_twin(c), m, dual) for c, m, dual in cfgs if isinstance(c, GemvzConfig)]
    return sorted({instance_of(c, m, dual) for c, m, dual in cfgs})

