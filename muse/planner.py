"""The planner: a path and config for every (layer, m). Table rows first (the device's card's CTABLES / ZTABLES rows, by
name or by shape; a device with no card takes none); else the
cost model (the 12-bit path at m <= 16, gemvt at m = 17..32: every candidate family priced at every split S that
fits, the cheapest taken); else one fixed family per m range (PLANNER, muse/rules.py); else the default rule.

The cost model: a CTA streams B / C bytes (B: the layer's bytes, 1.5 per weight compressed, 2 plain; C CTAs); an SM
holds `occ` CTAs at once (registers: the family's constant, checked against ptxas by tests/test_compile.py; shared
memory: computed), so the busiest SM runs L = ceil(C / SMs) of them, in batches of occ; k CTAs resident on one SM
stream min(k r, R) GB/s together (r: one CTA's latency-bound rate, R: the SM's cap); HBM caps the whole at bw (the
family's: how its loads are issued decides how close to the HBM limit all SMs together come). Then
  time = t0 + max(B / bw, the busiest SM's time) + split, split = 0 at S = 1, cl0 + cl1 (S - 1) through a cluster,
  tk0 + tk1 (S - 1) through the global ticket.
Its constants (PLAN_MODELS, from tables/plan_models.json) were fit by tools/plan_fit.py to pick the fastest candidate,
not to predict times: its times are rough, its ranking is what it is for (FINDINGS, "the planner").
"""
import collections
import functools

from ._generated import CARDS, CTABLES, PLAN_MODELS, TABLE_SHAPES, ZTABLES
from .families import (MAX_M, RING_CONFIGS, GemvzConfig, card_of, config_misfit, config_short, cta_smem, hardware,
                       kernel_name, nb_of, rows_per_cta)
from .rules import (DEFAULT_GEMV, DEFAULT_GEMVZ, PLAIN_GEMVT_MIN_BYTES, PLAN_MAX_S, PLAN_SPLIT_WAVES, PLAN_UNEVEN,
                    PLANNER)

PlanEntry = collections.namedtuple("PlanEntry", "path config why")   # path: plain | compressed | fallback


def current_card(hw=None):
    """The card whose tables this device takes (CARDS: the device name and SM count the rows were timed on), or None:
    a device of no card takes the planner for every shape. hw: a Hardware (default: the device's, hardware())."""
    hw = hardware() if hw is None else hw
    return card_of(CARDS, hw.name, hw.sms)


def card_tables(card):
    """(ctable, ztable) of a card; empty for None or a card without rows."""
    return CTABLES.get(card, {}), ZTABLES.get(card, {})


def default_config(N, K, m, compressed):
    """The documented default for a (layer, m) no table row covers: the first config of DEFAULT_GEMV (DEFAULT_GEMVZ)
    that fits, with S the smallest power of two giving two CTAs an SM that still fits, and no L2 prefetch. Every
    default is compiled in (rules.reachable_instances). None if nothing fits."""
    target = 2 * hardware().sms
    for base in (DEFAULT_GEMVZ if compressed else DEFAULT_GEMV):
        if config_misfit(base, N, K, m):
            continue
        c = base
        while N // (16 * c.r) * c.s < target and not config_misfit(c._replace(s=2 * c.s), N, K, m):
            c = c._replace(s=2 * c.s)
        return c
    return None


def plan_occupancy(fam, cfg, m):
    """CTAs of cfg one SM holds at once: the family's count at S = 1 (registers, threads, its own shared memory),
    lowered where the split's cluster buffer (cl) or gemvt's ring leaves fewer in the SM's shared memory (the driver
    reserves 1 KB a CTA)."""
    return max(1, min(fam.occ, hardware().smem_sm // (cta_smem(cfg, m) + 1024)))


def plan_grid_ctas(cfg, N):
    """The grid's CTA count: row groups (16 R rows a register-kernel CTA, 16 NW a ring CTA) x S."""
    return N // rows_per_cta(cfg) * cfg.s


def plan_cost(model, fam, cfg, N, K, m):
    """The cost model's time (us) of cfg, a config of family fam of model, on an [N, K] layer at m (the formula in this
    module's docstring)."""
    C = plan_grid_ctas(cfg, N)
    B = N * K * (1.5 if model.path == "compressed" else 2.0) / 1e3     # KB, so that KB / us = GB/s
    occ = plan_occupancy(fam, cfg, m)
    L = -(-C // hardware().sms)                                       # CTAs on the busiest SM
    bc = B / C

    def batch(k):                                                     # k CTAs resident together, each bc KB
        return k * bc / min(k * fam.r, fam.R)
    q, rem = divmod(L, occ) if L > occ else (0, L)
    busiest = q * batch(occ) + (batch(rem) if rem else 0.0)
    split = 0.0 if cfg.s == 1 else (model.cl0 + model.cl1 * (cfg.s - 1) if cfg.cl else
                                    model.tk0 + model.tk1 * (cfg.s - 1))
    return model.t0 + max(B / fam.bw, busiest) + split


def even_split(cfg, K):
    """Whether gemvz config cfg's S x NW warps share the K/64 / UG units equally (split_units in csrc/common.cuh takes
    any S). True for every other config: gemv_kernel's misfit rule asks for the even split, and
    gemvt_kernel's slices (any S) are not what the planner's uneven rule is about."""
    if not isinstance(cfg, GemvzConfig):
        return True
    return (K // 64 // cfg.ug) % (cfg.s * cfg.nw) == 0


def plan_splits(base, N, K, m, dual=False, max_s=PLAN_MAX_S):
    """{S: config} of base at every S up to max_s that fits [N, K] at m: cl = 2 (the cluster reduction) where it fits,
    else the ticket."""
    out = {}
    for v in range(1, max_s + 1):
        c = next((c for c in (base._replace(s=v, cl=cl) for cl in ((2, 0) if v > 1 else (0,)))
                  if not config_misfit(c, N, K, m, dual)), None)
        if c is not None:
            out[v] = c
    return out


def plan_candidates(N, K, m, path, max_s=PLAN_MAX_S, max_ctas=None, uneven=None):
    """[(model, family, config)] the cost model prices for an [N, K] layer at m on path: each family of the class for
    (path, m) at every S that fits, S > 1 only within the fit's domain (max_s, max_ctas: PLAN_MAX_S and
    PLAN_SPLIT_WAVES waves of one CTA an SM; tools/plan_grid.py can widen them to collect data). A gemvz family's
    uneven splits (S NW not dividing its K units) are priced only where it has no even split S > 1 (PLAN_UNEVEN =
    'needed'; uneven=True prices them always, for data): where even splits exist the model's uneven picks missed by
    up to 1.6x, and where K admits none they gained 8-18% (FINDINGS, "the planner"). tools/plan_grid.py times exactly
    these."""
    uneven = PLAN_UNEVEN == "always" if uneven is None else uneven
    max_ctas = PLAN_SPLIT_WAVES * hardware().sms if max_ctas is None else max_ctas
    out = []
    for model in PLAN_MODELS:
        if model.path != path or model.nb != nb_of(m):
            continue
        for fam in model.families:
            cap = max_ctas * (2 / 3 if isinstance(fam.config, RING_CONFIGS) else 1)
            fits = {v: c for v, c in plan_splits(fam.config, N, K, m, max_s=max_s).items()
                    if v == 1 or plan_grid_ctas(c, N) <= cap}
            if not uneven and any(v > 1 and even_split(c, K) for v, c in fits.items()):
                fits = {v: c for v, c in fits.items() if even_split(c, K)}
            out += [(model, fam, c) for c in fits.values()]
    return out


def plan_priced(N, K, m, path):
    """[(predicted us, config, family)] of plan_candidates, cheapest first (ties to the smaller S, then the family's
    order); [] where no class covers (path, m)."""
    priced = [(plan_cost(model, fam, c, N, K, m), c.s, i, c, fam)
              for i, (model, fam, c) in enumerate(plan_candidates(N, K, m, path))]
    priced.sort(key=lambda t: t[:3])
    return [(t, c, fam) for t, _, _, c, fam in priced]


def planner_serves(rule, m, card=None):
    """A rule serves the m of its m_max's token blocks (m <= 8, 9..16, 17..32): one instantiation (NB) per rule; and
    only on the cards it names (card: default the device's, current_card())."""
    card = current_card() if card is None else card
    return nb_of(m) == nb_of(rule.m_max) and (rule.cards is None or card in rule.cards)


def planner_plans(path, m, dual=False, card=None):
    """Whether the planner (a PLAN_MODELS class or a PLANNER rule) plans `path` at m at all (on card: default the
    device's)."""
    return (not dual and any(md.path == path and md.nb == nb_of(m) for md in PLAN_MODELS)) or \
        any(r.path == path and r.dual == dual and planner_serves(r, m, card) for r in PLANNER)


@functools.lru_cache(maxsize=None)   # a pure function of the shape and the constants: every prepared copy asks it
def planner_config(N, K, m, path, dual=False, card=None):
    """The planner's config for an N x K layer at m on `path` ('compressed' or 'plain'): the cost model's cheapest
    candidate where a PLAN_MODELS class covers (path, m) for bf16 weights; else the PLANNER rule's (planner_rule), or
    for plain bf16 at m <= 16 gemvt where that rule's gemv underfills or does not fit (plain_gemvt). cl = 2 (cluster reduction)
    where S > 1 and it fits, else the ticket. Returns (config, why) or (None, why-not)."""
    if not dual:
        priced = plan_priced(N, K, m, path)
        if priced:
            (t, c, fam), rest = priced[0], priced[1:]
            nxt = f"; next {config_short(rest[0][1])} at {rest[0][0]:.1f}" if rest else ""
            uneven = ""
            if not even_split(c, K):   # gemvz's split_units: CTAs of T // S or T // S + 1 units of UG groups
                lo = K // 64 // c.ug // c.s * c.ug
                uneven = f", K split unevenly ({lo} or {lo + c.ug} of {K // 64} 64-wide groups a CTA)"
            return c, (f"planner (cost model): {config_short(c)}, {plan_grid_ctas(c, N)} CTAs, "
                       f"{plan_occupancy(fam, c, m)} an SM{uneven}; model time {t:.1f} us{nxt}")
    c, why = planner_rule(N, K, m, path, dual, card)
    if path == "plain" and not dual:
        t = plain_gemvt(N, K, m, c)
        if t is not None:
            return t
    return c, why


def plain_gemvt(N, K, m, gemv_cfg):
    """(config, why) of gemvt for plain bf16 at m <= 16 where the PLANNER rule's gemv_cfg is None or has fewer than two
    CTAs an SM, above PLAIN_GEMVT_MIN_BYTES; else None. The gemvt config is the m = 17..32 cost model's cheapest
    candidate that fits at m. Why: gemv splits K only evenly, so a K with no even split leaves it a grid of one or two
    CTAs an SM, or no config at all; there the ring won, and elsewhere no rule of the shape held on both the public and
    the holdout shapes; under PLAIN_GEMVT_MIN_BYTES the ring does not pay (FINDINGS, "plain_gemvt")."""
    if nb_of(m) > 2 or 2 * N * K < PLAIN_GEMVT_MIN_BYTES:
        return None
    if gemv_cfg is not None and plan_grid_ctas(gemv_cfg, N) >= 2 * hardware().sms:
        return None
    for t, c, fam in plan_priced(N, K, 32, "plain"):
        if not config_misfit(c, N, K, m):
            why = ("no gemv rule fits" if gemv_cfg is None else
                   f"{config_short(gemv_cfg)} would run {plan_grid_ctas(gemv_cfg, N)} CTAs, under two an SM")
            return c, (f"planner: {config_short(c)}, {plan_grid_ctas(c, N)} CTAs (the m = 17..32 cost model's pick, "
                       f"model time {t:.1f} us at m = 32): {why} (plain_gemvt)")
    return None


def planner_rule(N, K, m, path, dual=False, card=None):
    """The first PLANNER rule of the path and dtype whose m range holds m and whose family fits, with the S (dividing
    the K blocks) whose grid comes closest to the rule's CTA count, ties to the smaller S: (config, why) or (None,
    why-not). planner_config's fallback where no cost model class covers (path, m)."""
    tried = []
    for rule in PLANNER:
        if rule.path != path or rule.dual != dual or not planner_serves(rule, m, card):
            continue
        fits = plan_splits(rule.config, N, K, m, dual, 64)
        if not fits:
            tried.append(f"{kernel_name(rule.config)} {rule.config}: {config_misfit(rule.config, N, K, m, dual)}")
            continue
        tiles = plan_grid_ctas(rule.config, N)
        if isinstance(rule.config, RING_CONFIGS):   # one CTA an SM: the largest S whose grid stays within the count
            v = max([v for v in fits if tiles * v <= rule.ctas] or [min(fits)])
        else:
            v = min(fits, key=lambda v: (abs(tiles * v - rule.ctas), v))
        c = fits[v]
        return c, (f"planner: {kernel_name(c)} family of {rule.source}; S={c.s} -> {tiles * c.s} CTAs "
                   f"(target {rule.ctas})")
    return None, "; ".join(tried) or f"no planner rule for {path}{' DUAL' if dual else ''} at m={m}"


def reference_m(name, m, tables):
    """The tabled m' a (name, m) takes its config from: m itself if some table has it, else the smallest tabled
    m' > m with the same NB (odd m reuse the config, and so the instantiation, of the scored m above them)."""
    ms = sorted({mm for t in tables for (nn, mm) in t if nn == name and mm >= m and nb_of(mm) == nb_of(m)})
    return ms[0] if ms else None


def table_name(name, N, K, dual, tables, shapes=None):
    """The name a layer's table rows are looked up under, and a note for describe(): the layer's own name where some
    table has rows for it; else the tabled layer of the same shape and dtype (TABLE_SHAPES: the tuned rows follow the
    shape, so a layer named otherwise than in tables/shapes.json still gets them); else its own name (no rows)."""
    tabled = {nn for t in tables for (nn, _) in t}
    if name in tabled:
        return name, ""
    dtype = "fp32" if dual else "bf16"
    for nn, shape in (TABLE_SHAPES if shapes is None else shapes).items():
        if tuple(shape) == (N, K, dtype) and nn in tabled:
            return nn, f" (by shape: '{name}' is {N} x {K} {dtype}, as '{nn}')"
    return name, ""


def plan_for(name, N, K, m, dual, compressible, force=None, ctable=None, ztable=None, card=None):
    """The path and config for one m.

    compressible: True, or a string saying why the 12-bit format is not available for this weight.
    force: None (tables, then the planner), 'plain' or 'compressed'.
    card: whose tables (default: the device's, current_card()); ctable / ztable replace them (judge.py --no-tables).
    A (name, m') row in the card's ZTABLES means the compressed path won the tuning there (a GemvzConfig or a
    GemvtzConfig); its CTABLES has the plain winner of every scored shape, a GemvConfig or a GemvtConfig (used when the
    weight cannot be compressed). A row that does not fit the layer (a shape-matched row never fails: build.py checks
    every row) is passed over with a note."""
    card = current_card() if card is None else card
    ct, zt = card_tables(card)
    ctable = ct if ctable is None else ctable
    ztable = zt if ztable is None else ztable
    if m > MAX_M:
        return PlanEntry("fallback", None, f"m={m} > {MAX_M}")
    if N % 16 or K % 64:
        return PlanEntry("fallback", None, f"N={N}, K={K}: the kernels need N % 16 == 0 and K % 64 == 0")
    layer = name
    name, via = table_name(name, N, K, dual, (ctable, ztable))   # the name the rows are under
    can_z = compressible is True and not dual
    if force == "compressed" and not can_z:
        raise ValueError(f"layer '{layer}' cannot take the compressed path: "
                         f"{'fp32 weights take the DUAL plain path' if dual else compressible}")
    ref = reference_m(name, m, (ztable, ctable))
    note = ""
    nocard = f"; no tables for a {hardware().name} (tables/cards.json)" if card is None else ""
    if ref is not None:
        key = (name, ref)
        if key in ztable and force != "plain":
            bad = compressible if not can_z else config_misfit(ztable[key], N, K, m)
            if not bad:
                return PlanEntry("compressed", ztable[key], f"ZTABLE[{card}]{key}{via}")
            note = f"; ZTABLE[{card}]{key} unused: {bad}"
        if key in ctable and force != "compressed":
            bad = config_misfit(ctable[key], N, K, m, dual)
            if not bad:
                return PlanEntry("plain", ctable[key], f"CTABLE[{card}]{key}{via}{note}")
            note += f"; CTABLE[{card}]{key} unused: {bad}"
    pnote = ""
    if can_z and force != "plain" and (force == "compressed" or ref is None):
        cfg, why = planner_config(N, K, m, "compressed", False, card)
        if cfg is not None:
            return PlanEntry("compressed", cfg, why + note + nocard)
        pnote = f"; planner (compressed): {why}"
        cfg = default_config(N, K, m, compressed=True)
        # the default's compressed config only where the planner plans the 12-bit path at all (not at m >= 17, where
        # every bf16 row runs plain gemvt), or when forced
        if cfg is not None and (force == "compressed" or planner_plans("compressed", m, False, card)):
            return PlanEntry("compressed", cfg, "default rule" + note + pnote + nocard)
        if force == "compressed":
            raise ValueError(f"no compressed config fits layer '{layer}' N={N}, K={K}, m={m}")
    if not note and not can_z and isinstance(compressible, str) and force != "plain":
        note = f"; compressed not used: {compressible}"
    cfg, why = planner_config(N, K, m, "plain", dual, card)
    if cfg is not None:
        return PlanEntry("plain", cfg, why + note + nocard)
    cfg = default_config(N, K, m, compressed=False)
    if cfg is not None:
        return PlanEntry("plain", cfg, f"default rule{note}{pnote}; planner (plain): {why}{nocard}")
    return PlanEntry("fallback", None, f"no plain config fits N={N}, K={K}, m={m}")
