"""The kernel families: config types, the hardware they are sized for, and one description per family.

A config is a named tuple whose fields are named after the kernel's template parameters (compile-time) and
launch arguments (runtime). Each family's description (FAMILIES) says, in one place:
  * its template parameters in order, each taken from a config field or derived (NB from m, DUAL from the dtype);
  * its runtime fields, which land in GemvArgs (csrc/args.h, whose runtime members build.py writes from RUNTIME);
  * why a config cannot run a shape (misfit), including its shared memory;
  * which packed weights it reads, and how describe() writes it.
build.py generates from these descriptions the instantiation table and dispatch (csrc/configs.cuh), the runtime
members of GemvArgs, and the table checks; instance_of / config_misfit / config_short read them at run time.

This module imports only the standard library: build.py imports it (torch-free) to check tables and generate code.
"""
import collections

# ---- hardware ----------------------------------------------------------------------------------------------------
# What the kernels are sized against. H200 is what build.py checks the tables with (they were tuned on one); on a GPU,
# set_hardware(device_hardware()) replaces it with the device's own numbers at import (muse/extension.py).
Hardware = collections.namedtuple("Hardware", "name sms smem_cta smem_sm")
H200 = Hardware("NVIDIA H200", sms=132, smem_cta=227 * 1024, smem_sm=228 * 1024)
HW = H200
STATIC_SMEM = 48 * 1024   # static shared memory of one CTA: the most a kernel may declare without the opt-in (sm_90)
MAX_CLUSTER = 16          # CTAs a cluster: 8 is portable, 16 needs the non-portable opt-in (sm_90)
MAX_M = 32                # tokens the kernels take: NB token blocks of 8, NB in {1, 2, 4}


def card_of(cards, name, sms):
    """The card of a device in cards ({card: (device name, SM count)}, as tables/cards.json lists them): the one whose
    name and SM count are the device's, as torch reports them; None where none is."""
    return next((c for c, (n, k) in cards.items() if n == name and k == sms), None)


def set_hardware(hw):
    """Size the misfit rules and the planner for hw (a Hardware)."""
    global HW
    HW = hw


def hardware():
    """The Hardware the rules are sized for now (H200 until set_hardware)."""
    return HW


def nb_of(m):
    """8-token blocks the mma runs per K step: 1 for m <= 8, 2 for m <= 16, 4 for m <= 32."""
    return 1 if m <= 8 else 2 if m <= 16 else 4


# ---- config types ------------------------------------------------------------------------------------------------
# gemv_kernel<NW, U, NB, R, DUAL, LOOP, MB> (csrc/gemv.cuh)
GemvConfig = collections.namedtuple("GemvConfig", "nw s u r loop mb pf pdl cl", defaults=(1, 0))
# gemvz_kernel<NW, UG, NB, R, LOOP, MB, WALK> (csrc/gemvz.cuh)
GemvzConfig = collections.namedtuple("GemvzConfig", "nw s ug r loop mb walk pf pdl cl", defaults=(1, 0))
# gemvt_kernel<NW, ST, NB, KA> (csrc/gemvt.cuh)
GemvtConfig = collections.namedtuple("GemvtConfig", "nw s st ka pdl cl", defaults=(1, 0))
# gemvtz_kernel<NW, ST, NB, KA> (csrc/gemvtz.cuh): gemvt's fields; the 12-bit stream (pack_z's) instead of bf16 tiles
GemvtzConfig = collections.namedtuple("GemvtzConfig", "nw s st ka pdl cl", defaults=(1, 0))

# What each field means (README's config-field table is generated from this).
FIELD_DOCS = {
    "nw": "warps that stream the weights (gemvz: one exception warp more); gemvt / gemvtz: consumer warps, whole "
          "warpgroups (gemvtz: one exception warp more)",
    "s": "CTAs a row group (split-K); their partials are summed in a fixed order",
    "u": "32-wide K blocks a warp loads per loop trip",
    "ug": "64-wide K groups a warp loads per loop trip",
    "r": "16-row blocks a warp owns: each x fragment is reused r times from registers",
    "loop": "0: load a batch, then compute it; 1: the next batch's weights in flight during the MMAs; "
            "2: the next batch's weights and x in flight",
    "mb": "occupancy the compiler must keep: at least mb CTAs an SM by registers (0: no bound)",
    "walk": "the exception warp's walk: 0 one lane a row; 1 cooperative, the CTA's entries dealt to 32 lanes",
    "st": "stages of the TMA ring",
    "ka": "64-k tiles a stage",
    "pf": "1: an L2 prefetch of the warp's slice before griddepcontrol.wait",
    "pdl": "1: launch with programmatic dependent launch when the layer has it on; 0: never",
    "cl": "split-K reduction: 0 a global workspace and a ticket; 2 the S CTAs form a cluster and send their partials "
          "to the leader's shared memory (st.async counted on its mbarrier)",
}

# Runtime fields: (config field, GemvArgs member, default where a family has no such field, what the kernel does with
# it). build.py writes the members into csrc/args.h, in this order, and the setter the glue fills them with.
RuntimeField = collections.namedtuple("RuntimeField", "field member default doc")
RUNTIME = (
    RuntimeField("s", "S", 1, "CTAs per row group (split-K)"),
    RuntimeField("pf", "pf", 0, "gemv / gemvz: 1 = L2 prefetch of each warp's slice before griddepcontrol.wait"),
    RuntimeField("cl", "cl", 0, "split-K reduction: 0 global ticket, 2 cluster mbarrier (st.async)"),
)


# ---- shared memory -----------------------------------------------------------------------------------------------
def smem_bytes(nw, nb, r, compressed, s=1, cl=0):
    """Static + dynamic shared memory of a register-kernel CTA: the warps' partials red[NW][R*NB*32] float4 (+ the
    exception warp's ecorr), and with cl the leader's cbuf[S - 1][R*NB*32] for the other CTAs of its cluster (+ the
    ticket flag and the cluster mbarrier, 12 B, in every build)."""
    part = r * nb * 32 * 16
    return nw * part + (r * 16 * (nb * 8 + 1) * 4 if compressed else 0) + 4 + 8 + (s - 1) * part * (cl >= 1)


def coop_smem(r, nb):
    """The cooperative walk's shared memory (coop_walk's roff, part, prow)."""
    return 4 * (r * 16 + 1) + 32 * 2 * nb * 8 * 4 + 32 * 2 * 4


def gemvt_smem(nw, st, nb, ka, s=1, cl=0):
    """gemvt_kernel's dynamic shared memory (gemvt_smem in csrc/gemvt.cuh): 1 KB alignment slack, the ring of st
    stages of ka 64-k tiles (16 nw weight rows + 8 nb tokens, 128 B each), and with cl the leader's cbuf."""
    return 1024 + st * ka * (16 * nw + 8 * nb) * 128 + ((s - 1) * nw * nb * 32 * 16 if cl else 0)


def gemvt_cta_smem(cfg, m):
    """All the shared memory of one gemvt CTA of GemvtConfig cfg at m: gemvt_smem plus its mbarriers."""
    return gemvt_smem(cfg.nw, cfg.st, nb_of(m), cfg.ka, cfg.s, cfg.cl) + 16 * cfg.st + 16


def gemvtz_smem(nw, st, nb, ka, s=1, cl=0):
    """gemvtz_kernel's dynamic shared memory (gemvtz_smem in csrc/gemvtz.cuh): 1 KB alignment slack, the ring of st
    stages (ka x boxes of 8 nb tokens x 128 B, then nw row blocks x ka 64-groups of the 12-bit stream, 1536 B each),
    three permuted x buffers a warpgroup, and with cl the leader's cbuf."""
    return (1024 + st * ka * (8 * nb * 128 + nw * 1536) + 3 * (nw // 4) * ka * 8 * nb * 128 +
            ((s - 1) * nw * nb * 32 * 16 if cl else 0))


def gemvtz_cta_smem(cfg, m):
    """All the shared memory of one gemvtz CTA of GemvtzConfig cfg at m: gemvtz_smem plus its static arrays (the
    exception warp's ecorr and cooperative walk, coop_smem; the ring's mbarriers; the cluster mbarrier and ticket
    flag)."""
    nb = nb_of(m)
    return (gemvtz_smem(cfg.nw, cfg.st, nb, cfg.ka, cfg.s, cfg.cl) + cfg.nw * 16 * (nb * 8 + 1) * 4 +
            coop_smem(cfg.nw, nb) + 16 * cfg.st + 32)


def cta_smem(cfg, m):
    """The shared memory one CTA of cfg takes at m (what an SM must hold per resident CTA)."""
    if isinstance(cfg, GemvtConfig):
        return gemvt_cta_smem(cfg, m)
    if isinstance(cfg, GemvtzConfig):
        return gemvtz_cta_smem(cfg, m)
    z = isinstance(cfg, GemvzConfig)
    return smem_bytes(cfg.nw, nb_of(m), cfg.r, z, cfg.s, cfg.cl) + (coop_smem(cfg.r, nb_of(m)) if z and cfg.walk else 0)


# ---- misfit: why a config cannot run an [N, K] layer at m (a string), or None if it can ---------------------------
REGISTER_NWS = (1, 2, 4, 8, 16)   # streaming warps the register kernels are built for (gemvz adds one: <= 544 threads)


def _shared_misfit(cfg, smem, smem_limit):
    """The rules every CUDA config shares: pdl, cl, the cluster size, pf where the config has it, and the CTA's
    shared memory within smem_limit."""
    if cfg.pdl not in (0, 1):
        return f"pdl={cfg.pdl!r}: expected 0 (never) or 1 (with the layer's PDL)"
    if getattr(cfg, "pf", 0) not in (0, 1):
        return f"pf={cfg.pf!r}: expected 0 (no L2 prefetch) or 1 (the warp's slice, before griddepcontrol.wait)"
    if cfg.cl not in (0, 2):
        return f"cl={cfg.cl!r}: expected 0 (global ticket) or 2 (cluster, st.async to the leader's mbarrier)"
    if cfg.s < 1:
        return f"s={cfg.s}: expected at least 1 CTA a row group"
    if cfg.cl and not 2 <= cfg.s <= MAX_CLUSTER:
        return f"cl={cfg.cl} needs 2 <= S <= {MAX_CLUSTER} (one cluster per row group), got S={cfg.s}"
    if smem > smem_limit:
        return f"shared memory {smem} B > {smem_limit}"
    return None


def _register_misfit(cfg, kernel):
    """nw, r, loop and mb of gemv_kernel / gemvz_kernel."""
    if cfg.nw not in REGISTER_NWS:
        return f"nw={cfg.nw}: {kernel} takes {', '.join(map(str, REGISTER_NWS))} streaming warps"
    if cfg.r < 1:
        return f"r={cfg.r}: expected at least one row block a warp"
    if cfg.loop not in (0, 1, 2):
        return f"loop={cfg.loop!r}: {kernel}'s loops are 0 (batch), 1 (weights ahead), 2 (weights and x ahead)"
    if cfg.mb not in (0, 1, 2):
        return f"mb={cfg.mb!r}: expected 0 (no occupancy bound), 1 or 2 CTAs an SM"
    return None


def gemv_misfit(cfg, N, K, m, dual=False):
    """Why a GemvConfig cannot run this shape, or None if it can: K split evenly over S x NW warps of U blocks."""
    bad = _register_misfit(cfg, "gemv_kernel")
    if bad:
        return bad
    if cfg.u < 1:
        return f"u={cfg.u}: expected at least one K block a trip"
    KB = K // 32
    if N % (16 * cfg.r) or K % 32:
        return f"N={N} not a multiple of 16*R={16 * cfg.r}, or K={K} not a multiple of 32"
    if cfg.s < 1 or KB % (cfg.s * cfg.nw * cfg.u):
        return f"K/32={KB} not divisible by S*NW*U={cfg.s * cfg.nw * cfg.u} (gemv_kernel splits K evenly)"
    return _shared_misfit(cfg, cta_smem(cfg, m), STATIC_SMEM)


def gemvz_misfit(cfg, N, K, m, dual=False):
    """Why a GemvzConfig cannot run this shape, or None if it can: any S, as long as every warp streams a unit."""
    if dual:
        return "the compressed path takes bf16 weights only"
    bad = _register_misfit(cfg, "gemvz_kernel")
    if bad:
        return bad
    if cfg.walk not in (0, 1):
        return f"walk={cfg.walk!r}: expected 0 (one lane a row) or 1 (the cooperative walk)"
    if cfg.ug < 1:
        return f"ug={cfg.ug}: expected at least one 64-wide group a trip"
    KG = K // 64
    if N % (16 * cfg.r) or K % 64:
        return f"N={N} not a multiple of 16*R={16 * cfg.r}, or K={K} not a multiple of 64"
    if cfg.s < 1 or KG % cfg.ug or KG // cfg.ug < cfg.s * cfg.nw:
        return (f"K/64={KG} not a multiple of UG={cfg.ug}, or fewer than S*NW={cfg.s * cfg.nw} units of UG groups "
                f"(every warp streams at least one; S need not divide K: split_units)")
    return _shared_misfit(cfg, cta_smem(cfg, m), STATIC_SMEM)


def gemvt_misfit(cfg, N, K, m, dual=False):
    """Why a GemvtConfig cannot run this shape, or None if it can: bf16 weights, nw consumer warps in whole
    warpgroups (16 nw rows a CTA), at least one stage of at least one 64-k tile, any S up to K / (64 ka) (the slices
    need not be equal), and the ring within the opt-in shared memory."""
    if dual:
        return "gemvt_kernel (TMA + wgmma) takes bf16 weights only, not the DUAL router"
    if cfg.nw not in (4, 8, 12, 16) or cfg.st < 1 or cfg.ka < 1:
        return f"gemvt_kernel needs NW 4, 8, 12 or 16 (whole warpgroups) and st, ka >= 1: {cfg}"
    return _ring_misfit(cfg, N, K, m, "gemvt_kernel")


def gemvtz_misfit(cfg, N, K, m, dual=False):
    """Why a GemvtzConfig cannot run this shape, or None if it can: bf16 weights, one or two consumer warpgroups (16 nw
    rows a CTA: nw 4 or 8), 1, 2 or 4 64-groups a stage, any S up to K / (64 ka), and the ring, the permuted x buffers
    and the exception warp's arrays within the opt-in shared memory."""
    if dual:
        return "the compressed path takes bf16 weights only"
    if cfg.nw not in (4, 8) or cfg.st < 1 or cfg.ka not in (1, 2, 4):
        return f"gemvtz_kernel needs NW 4 or 8 (one or two warpgroups), st >= 1 and ka 1, 2 or 4: {cfg}"
    return _ring_misfit(cfg, N, K, m, "gemvtz_kernel")


def _ring_misfit(cfg, N, K, m, kernel):
    """The rules both TMA rings share: whole 64-row tiles of 16 nw rows, whole stages of ka 64-k groups, S up to the
    steps (the slices need not be equal), the CTA within the opt-in shared memory."""
    if N % (16 * cfg.nw) or K % (64 * cfg.ka) or not 1 <= cfg.s <= K // (64 * cfg.ka):
        return (f"{kernel}: N={N} not a multiple of 16*NW={16 * cfg.nw}, or K={K} not a multiple of "
                f"64*KA={64 * cfg.ka}, or S={cfg.s} not in 1..K/(64*KA) (S need not divide K)")
    return _shared_misfit(cfg, cta_smem(cfg, m), hardware().smem_cta)


# ---- the families ------------------------------------------------------------------------------------------------
# template: the kernel's template parameters in order, each (NAME, source): a config field, or "nb" (nb_of(m)) or
# "dual" (fp32 weights, a bool). weights: what the kernel reads ("plain": pack_plain's w and w2; "z": pack_z's stream,
# windows and side table, which gemvz and gemvtz share; "tiles": pack_tma's tiles). letter: describe()'s short form,
# e.g. C(8,2,2).
Family = collections.namedtuple("Family", "name kernel config template misfit weights letter short_fields")
FAMILIES = (
    Family("gemv", "gemv_kernel", GemvConfig,
           (("NW", "nw"), ("U", "u"), ("NB", "nb"), ("R", "r"), ("DUAL", "dual"), ("LOOP", "loop"), ("MB", "mb")),
           gemv_misfit, "plain", "C", ("nw", "u", "r")),
    Family("gemvz", "gemvz_kernel", GemvzConfig,
           (("NW", "nw"), ("UG", "ug"), ("NB", "nb"), ("R", "r"), ("LOOP", "loop"), ("MB", "mb"), ("WALK", "walk")),
           gemvz_misfit, "z", "Z", ("nw", "ug", "r")),
    Family("gemvt", "gemvt_kernel", GemvtConfig,
           (("NW", "nw"), ("ST", "st"), ("NB", "nb"), ("KA", "ka")),
           gemvt_misfit, "tiles", "T", ("nw", "st", "ka")),
    Family("gemvtz", "gemvtz_kernel", GemvtzConfig,
           (("NW", "nw"), ("ST", "st"), ("NB", "nb"), ("KA", "ka")),
           gemvtz_misfit, "z", "Y", ("nw", "st", "ka")),
)
FAMILY_OF = {f.config: f for f in FAMILIES}


def family_of(cfg):
    """The Family of a config (TypeError for anything else)."""
    f = FAMILY_OF.get(type(cfg))
    if f is None:
        raise TypeError(f"{cfg!r} is not a {', '.join(t.config.__name__ for t in FAMILIES)}")
    return f


def family_named(name):
    return next(f for f in FAMILIES if f.name == name)


def family_path(f):
    """The path a family runs: 'compressed' for the families that read pack_z's stream, else 'plain'."""
    return "compressed" if f.weights == "z" else "plain"


def family_of_fields(fields, path=None):
    """The family a table row's or a cache entry's field dict is written for: the first family whose config type has
    every one of the fields, one of `path`'s ('plain' or 'compressed') first when given; gemv if none has. gemvt and
    gemvtz have the same fields: a row of the compressed table is a gemvtz row, of the plain table a gemvt row."""
    fits = [f for f in FAMILIES if set(fields) <= set(f.config._fields)]
    return next((f for f in fits if path is None or family_path(f) == path), fits[0] if fits else FAMILIES[0])


def template_args(cfg, m, dual=False):
    """The template arguments of the kernel cfg runs at m, in the family's order (DUAL as a bool)."""
    f = family_of(cfg)
    return tuple(nb_of(m) if src == "nb" else bool(dual) if src == "dual" else getattr(cfg, src)
                 for _, src in f.template)


def instance_of(cfg, m, dual=False):
    """(family name, template args) of the compiled kernel a config runs at m: what csrc/configs.cuh must list."""
    return family_of(cfg).name, template_args(cfg, m, dual)


def instance_label(name, args):
    """An instantiation as the errors and tools write it: gemvz_kernel<NW=8, UG=1, NB=1, R=2, LOOP=2, MB=2, WALK=0>."""
    f = family_named(name)
    return f"{f.kernel}<" + ", ".join(f"{p}={int(v) if isinstance(v, bool) else v}"
                                      for (p, _), v in zip(f.template, args)) + ">"


def runtime_values(cfg):
    """The config's runtime fields in RUNTIME's order (a family's missing field: its default)."""
    return [int(getattr(cfg, r.field, r.default)) for r in RUNTIME]


def config_misfit(cfg, N, K, m, dual=False):
    """Why cfg cannot run an [N, K] layer at m (its family's misfit rule), or None if it can."""
    try:
        f = family_of(cfg)
    except TypeError as e:
        return str(e)
    if not 1 <= m <= MAX_M:
        return f"m={m} outside 1..{MAX_M} (larger m run the fallback)"
    return f.misfit(cfg, N, K, m, dual)


def coop_twin(cfg):
    """A per-row-walk gemvz config's twin with the cooperative walk (walk = 1, coop_walk); any other config (plain, a
    ring, or already cooperative) as it is. The cooperative walk needs more registers: a twin of 16 streaming warps
    keeps at most one CTA an SM by registers (mb <= 1; at mb = 2, 544 threads, ptxas spills it)."""
    if not isinstance(cfg, GemvzConfig) or cfg.walk:
        return cfg
    return cfg._replace(walk=1, mb=min(cfg.mb, 1) if cfg.nw >= 16 else cfg.mb)


RING_CONFIGS = (GemvtConfig, GemvtzConfig)   # the TMA-ring families: a CTA is 16 nw rows, one CTA an SM


def rows_per_cta(cfg):
    """Weight rows one CTA of cfg covers: 16 nw for the ring families, 16 r for the register kernels."""
    return 16 * (cfg.nw if isinstance(cfg, RING_CONFIGS) else cfg.r)


def kernel_name(cfg):
    """The kernel a config runs, for describe()."""
    return family_of(cfg).kernel + (" (TMA ring)" if isinstance(cfg, RING_CONFIGS) else "")


def config_short(c):
    """A config in a few characters, for describe() and the planner's notes: gemv C(8,2,2) loop 0 S=2 cl=2."""
    f = FAMILY_OF.get(type(c))
    if f is None:
        return repr(c)
    head = f"{f.name} {f.letter}(" + ",".join(str(getattr(c, k)) for k in f.short_fields) + ")"
    if hasattr(c, "loop"):
        head += f" loop {c.loop}" + (f" mb {c.mb}" if c.mb else "") + (" coop walk" if getattr(c, "walk", 0) else "")
    return f"{head} S={c.s}{f' cl={c.cl}' if c.s > 1 else ''}"


def config_from_fields(fields, family=None, path=None):
    """(config, None) from a table row's or a cache entry's field dict, or (None, why). The family is the one given,
    else family_of_fields' (of `path`'s families, when given). Every field must be the family's and an int (not a bool,
    not a string); fields left out take the type's defaults."""
    if not isinstance(fields, dict):
        return None, f"config must be an object of fields, got {type(fields).__name__}"
    if family is None:
        family = family_of_fields(fields, path)
    cls = family.config
    unknown = sorted(set(fields) - set(cls._fields))
    if unknown:
        return None, (f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for a {cls.__name__} "
                      f"(fields: {', '.join(cls._fields)})")
    for k, v in fields.items():
        if not isinstance(v, int) or isinstance(v, bool):
            return None, f"field {k}: expected an int, got {v!r}"
    missing = [k for k in cls._fields[:len(cls._fields) - len(cls._field_defaults)] if k not in fields]
    if missing:
        return None, f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)} of a {cls.__name__}"
    return cls(**fields), None


# ---- generated C++ -------------------------------------------------------------------------------------------------
def replace_region(text, begin, end, body):
    """text with the lines between the line holding `begin` and the next line holding `end` replaced by body (build.py's
    generated regions, a variant build's kernel table)."""
    i = text.find(begin)
    if i < 0:
        raise ValueError(f"marker not found: {begin}")
    first = text.index("\n", i) + 1
    j = text.find(end, first)
    if j < 0:
        raise ValueError(f"no '{end}' after {begin}")
    last = text.rfind("\n", 0, j) + 1
    return text[:first] + body + "\n" + text[last:]


# The fences of csrc/configs.cuh's generated region (a variant build swaps the region for its own instantiations).
KERNEL_TABLE_BEGIN = "// ---- BEGIN GENERATED by build.py from tables/ and muse/rules.py: edit those, not this ----"
KERNEL_TABLE_END = "// ---- END GENERATED ----"


def kernel_table_source(insts):
    """csrc/configs.cuh's generated body for insts, a list of (family name, template args): the table every launch and
    attribute query looks its kernel up in (launch.cuh), one entry per compiled instantiation, and a sentinel."""
    names = {f.name for f in FAMILIES}
    bad = [i for i in insts if i[0] not in names]
    if bad:
        raise ValueError(f"instantiations {bad}: the family must be one of {sorted(names)}")
    out = [f"// {len(set((k, tuple(a)) for k, a in insts))} instantiations; entry = {{family, template args, "
           f"launcher, kernel}}", "static const KernelEntry kKernels[] = {"]
    for i, f in enumerate(FAMILIES):
        args = sorted({tuple(a) for k, a in insts if k == f.name})
        if not args:
            continue
        out.append(f"  // {f.kernel}<{', '.join(p for p, _ in f.template)}>")
        for a in args:
            if len(a) != len(f.template):
                raise ValueError(f"{f.name} takes {len(f.template)} template args, got {a}")
            tmpl = ", ".join(("true" if v else "false") if isinstance(v, bool) else str(v) for v in a)
            ints = ", ".join(str(int(v)) for v in a)
            out.append(f"  {{{i}, {len(a)}, {{{ints}}}, launch_{f.name}<{tmpl}>, (const void*){f.kernel}<{tmpl}>}},")
    out += ["  {-1, 0, {0}, nullptr, nullptr},  // the end", "};"]
    return "\n".join(out)


def runtime_members_source():
    """csrc/args.h's generated members of GemvArgs: one int per RUNTIME field."""
    return "\n".join(f"  int {r.member};{' ' * max(1, 6 - len(r.member))}// {r.doc}" for r in RUNTIME)


def runtime_setter_source():
    """csrc/args.h's generated setter: the glue fills GemvArgs's runtime members from runtime_values' list."""
    body = " ".join(f"a.{r.member} = v[{i}];" for i, r in enumerate(RUNTIME))
    return (f"constexpr int kRuntimeFields = {len(RUNTIME)};  // {', '.join(r.field for r in RUNTIME)}\n"
            f"inline void set_runtime(GemvArgs& a, const int* v) {{ {body} }}")
