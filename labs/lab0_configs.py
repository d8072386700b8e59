"""Lab 0: what each tuned config launches, and whether it keeps enough bytes in flight (numpy-free arithmetic).

    python labs/lab0_configs.py

Reads tables/shapes.json, tables/ctable.json and tables/ztable.json. For every table row it prints the
grid of gemv_kernel / gemvz_kernel (N/(16R) x S; gemvt_kernel: N/(16NW) x S), the warps per CTA, the K each warp
streams, the bytes a lane has in flight right after a load batch, and the bytes in flight per SM against Little's law.
It checks that every row divides evenly (the kernels use integer divisions: a row that does not divide silently skips
weights) and exits 1 naming the first bad row. check_row() is what tests/test_labs.py calls.
Independent oracle: this file shares no code with submission.py or muse/ (muse/families.py's gemv_misfit /
gemvz_misfit / gemvt_misfit state the same rules; this lab restates them from the kernels).
"""
import json
import math
import pathlib
import sys

from labkit import nb_of


# %% Motivation ------------------------------------------------------------------------------------
# A GEMV at m <= 32 is a streaming read of W. HBM keeps 4.8 TB/s busy only if enough bytes are requested
# and not yet returned at every moment (Little's law: bytes in flight = bandwidth x latency). The knobs
# are how many CTAs (N/(16R) x S), warps per CTA (NW) and loads per warp before the first use (U, UG, times
# the R row blocks each warp streams). R also divides the L2 -> SM traffic of x: every CTA reads its K slice
# of x once, so x costs N/(16R) x m x K x 2 bytes, twice the weight bytes at R = 1, m = 32.

REPO = pathlib.Path(__file__).resolve().parent.parent
TABLES = REPO / "tables"
# This lab is about the H200 (what the tables were tuned on), so its numbers are the H200's, written out here rather
# than read from the device: 132 SMs, and (below) 48 KB of static shared memory a CTA and 227 KB with the opt-in.
SMS = 132                      # H200 SMs
HBM_BPS = 4.8e12               # bytes / s
LATENCY_S = 0.7e-6             # load latency under load (guide ch. 2.4)
LITTLE_PER_SM = HBM_BPS * LATENCY_S / SMS      # ~25.5 kB
MAX_CTAS_PER_SM = 2            # assumption: registers allow at most 2 resident CTAs of our kernels
SMEM_LIMIT = 48 * 1024         # static + dynamic shared memory per CTA (no opt-in: gemv_kernel, gemvz_kernel)
LOOPS = (0, 1, 2)              # 0 load a batch then compute it; 1 next batch's weights in flight; 2 weights and x
MBS = (0, 1, 2)                # occupancy bound: at least mb CTAs an SM by registers (0: none)


# %% Layout: the rules a config must satisfy -----------------------------------------------------------
def is_ring(config):
    """A TMA-ring row (GemvtConfig / GemvtzConfig: {nw, s, st, ka, pdl, cl}), recognised by its st / ka fields:
    gemvt_kernel in a plain table, gemvtz_kernel (the 12-bit stream in the ring) in a compressed one."""
    return "st" in config or "ka" in config


def check_row(kind, layer, m, config):
    """Problems of one table row (empty list if it is fine). kind: 'plain' (gemv_kernel, or gemvt_kernel for a row
    with st / ka) or 'compressed' (gemvz_kernel); layer: {"layer", "N", "K", "dtype"}; config: {"nw", "s", "u" | "ug",
    "loop", "mb"} (compressed: and "walk", 0 one lane a row or 1 the cooperative walk, default 0) and optionally "r"
    (row blocks per warp, default 1), "pf" (L2 prefetch, 0/1), "pdl" (0/1), "cl" (split-K: 0 ticket, 2 cluster
    mbarrier); a gemvt row {"nw", "s", "st", "ka"} and optionally "pdl", "cl"."""
    name, N, K = layer.get("layer", "?"), layer["N"], layer["K"]
    where = f"{kind} row ('{name}', m={m})"
    probs = []
    if kind not in ("plain", "compressed"):
        return [f"{where}: kind must be 'plain' or 'compressed'"]
    if not 1 <= m <= 32:
        probs.append(f"{where}: m={m} outside 1..32")
    nb = nb_of(m)
    if is_ring(config):
        return probs + check_tma_row(where, layer, nb, config, kind == "compressed")
    ukey = "u" if kind == "plain" else "ug"
    if kind == "plain" and "walk" in config:
        probs.append(f"{where}: 'walk' is a compressed row's field (the exception warp's walk)")
    for key in ("nw", "s", ukey, "loop", "mb", "r", "pf", "pdl", "cl", "walk"):
        v = config.get(key, {"r": 1, "pf": 0, "pdl": 1, "cl": 0, "walk": 0}.get(key))
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if key in ("loop", "mb", "pf", "pdl", "cl", "walk")
                                                                else 1):
            want = "non-negative" if key in ("loop", "mb", "pf", "pdl", "cl", "walk") else "positive"
            probs.append(f"{where}: config field '{key}' = {v!r} is not a {want} int")
    if probs:
        return probs
    nw, s, u, loop, mb = config["nw"], config["s"], config[ukey], config["loop"], config["mb"]
    r, pf, pdl, cl = config.get("r", 1), config.get("pf", 0), config.get("pdl", 1), config.get("cl", 0)
    walk = config.get("walk", 0)
    if nw not in (1, 2, 4, 8, 16):
        probs.append(f"{where}: NW={nw}: the register kernels are built for 1, 2, 4, 8 or 16 streaming warps")
    if loop not in LOOPS:
        probs.append(f"{where}: loop={loop} not in 0..2")
    if mb not in MBS:
        probs.append(f"{where}: mb={mb} not in 0..2")
    if walk > 1:
        probs.append(f"{where}: walk={walk}: 0 (one lane a row) or 1 (cooperative)")
    if pf > 1 or pdl > 1 or cl not in (0, 2):
        probs.append(f"{where}: pf={pf}, pdl={pdl}, cl={cl}: pf and pdl are 0 or 1, cl is 0 or 2")
    if cl and not 2 <= s <= 16:
        probs.append(f"{where}: cl={cl} makes the S={s} CTAs of a row group one cluster: S must be 2..16")
    if N % (16 * r):
        probs.append(f"{where}: N={N} not a multiple of 16*R={16 * r}")
    # red[NW][R*NB*32] float4 (+ the exception warp's ecorr) (+ with cl the leader's cbuf[S-1][R*NB*32]) + the ticket
    # flag and the cluster mbarrier (12 B) (+ walk 1: the cooperative walk's roff[R*16+1], part[32][2][NB*8], prow[32][2])
    smem = (nw + (s - 1) * (cl > 0)) * r * nb * 32 * 16 + (r * 16 * (nb * 8 + 1) * 4 if kind == "compressed" else 0) + 12
    if walk:
        smem += 4 * (r * 16 + 1) + 4 * 32 * 2 * nb * 8 + 4 * 32 * 2
    if smem > SMEM_LIMIT:
        probs.append(f"{where}: shared memory (NW + cl*(S-1))*R*NB*512 B (+ ecorr, + walk) = {smem} B > {SMEM_LIMIT} B")
    if kind == "plain":
        if K % 32:
            probs.append(f"{where}: K={K} not a multiple of 32")
        elif (K // 32) % (s * nw * u):
            probs.append(f"{where}: K/32={K // 32} not divisible by S*NW*U={s}*{nw}*{u}={s * nw * u}")
    else:
        if layer.get("dtype") == "fp32":
            probs.append(f"{where}: fp32 weights take the DUAL plain path, never the compressed one")
        if K % 64:
            probs.append(f"{where}: K={K} not a multiple of 64")
        elif (K // 64) % u or (K // 64) // u < s * nw:
            probs.append(f"{where}: K/64={K // 64} not a multiple of UG={u}, or fewer units of UG groups than "
                         f"S*NW={s}*{nw} (any S: split_units)")
    return probs


TMA_SMEM_LIMIT = 227 * 1024    # gemvt_kernel opts in to the most shared memory an H200 CTA may have


def tma_smem(nw, st, nb, ka, s, cl):
    """gemvt_kernel: 1 KB of alignment slack + a ring of st stages, each ka 64-k tiles of 16 nw bf16 weight rows and
    8 nb tokens at 128 B a row, + with cl the leader's cbuf[S-1][nw*nb*32] float4, + the mbarriers (16 B a stage + 16)."""
    return 1024 + st * ka * (16 * nw + 8 * nb) * 128 + (s - 1) * nw * nb * 32 * 16 * (cl > 0) + 16 * st + 16


def tmaz_smem(nw, st, nb, ka, s, cl):
    """gemvtz_kernel: 1 KB of alignment slack + a ring of st stages, each ka x boxes of 8 nb tokens x 128 B and nw row
    blocks x ka 64-groups of the 12-bit stream (1536 B each), + 3 permuted x buffers a warpgroup (ka x 8 nb x 128 B),
    + with cl the leader's cbuf, + its static arrays: the exception warp's corrections (16 nw rows x (8 nb + 1) fp32),
    the cooperative walk's row offsets, parts and rows, the mbarriers (16 B a stage) and 32 B."""
    return (1024 + st * ka * (8 * nb * 128 + nw * 1536) + 3 * (nw // 4) * ka * 8 * nb * 128 +
            (s - 1) * nw * nb * 32 * 16 * (cl > 0) + nw * 16 * (nb * 8 + 1) * 4 +
            4 * (nw * 16 + 1) + 32 * 2 * nb * 8 * 4 + 32 * 2 * 4 + 16 * st + 32)


def check_tma_row(where, layer, nb, config, compressed=False):
    """Ring rows: st stages of ka 64-k groups, nw consumer warps (whole warpgroups of 64 rows); S need not divide K
    (the CTAs' slices differ by at most one step), but every CTA needs a step. compressed: gemvtz_kernel (nw 4 or 8,
    ka 1, 2 or 4, its own shared memory), else gemvt_kernel."""
    N, K = layer["N"], layer["K"]
    probs = []
    for key in ("nw", "s", "st", "ka", "pdl", "cl"):
        v = config.get(key, {"pdl": 1, "cl": 0}.get(key))
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if key in ("pdl", "cl") else 1):
            probs.append(f"{where}: gemvt config field '{key}' = {v!r} is not a {'non-negative' if key in ('pdl', 'cl') else 'positive'} int")
    extra = sorted(set(config) - {"nw", "s", "st", "ka", "pdl", "cl"})
    if extra:
        probs.append(f"{where}: a gemvt row has no field(s) {extra}")
    if probs:
        return probs
    nw, s, st, ka, pdl, cl = (config.get(k, d) for k, d in (("nw", 0), ("s", 0), ("st", 0), ("ka", 0), ("pdl", 1),
                                                            ("cl", 0)))
    if layer.get("dtype") == "fp32":
        probs.append(f"{where}: gemvt takes bf16 weights, not the DUAL router")
    if nw not in ((4, 8) if compressed else (4, 8, 12, 16)):
        probs.append(f"{where}: {'gemvtz needs NW = 4 or 8' if compressed else 'gemvt needs NW = 4, 8, 12 or 16'} "
                     f"(warpgroups), got {nw}")
    if compressed and ka not in (1, 2, 4):
        probs.append(f"{where}: gemvtz needs KA = 1, 2 or 4, got {ka}")
    if N % (16 * nw) or K % (64 * ka):
        probs.append(f"{where}: gemvt needs N % (16*NW) == 0 and K % (64*KA) == 0 (N={N}, K={K}, NW={nw}, KA={ka})")
    elif not 1 <= s <= K // (64 * ka):
        probs.append(f"{where}: gemvt: S={s} CTAs would leave one without a step (K/(64*KA) = {K // (64 * ka)})")
    if pdl > 1 or cl not in (0, 2):
        probs.append(f"{where}: gemvt has pdl 0/1, cl 0 or 2; got pdl={pdl} cl={cl}")
    if cl and not 2 <= s <= 16:
        probs.append(f"{where}: cl={cl} makes the S={s} CTAs of a row group one cluster: S must be 2..16")
    smem = (tmaz_smem if compressed else tma_smem)(nw, st, nb, ka, s, cl)
    if smem > TMA_SMEM_LIMIT:
        probs.append(f"{where}: {'gemvtz' if compressed else 'gemvt'} shared memory {smem} B > {TMA_SMEM_LIMIT} B")
    return probs


# %% Emulation: what a config launches -----------------------------------------------------------------
def launch_numbers(kind, layer, config):
    """Grid, warps, K per warp, bytes in flight per lane and per SM for one row."""
    N, K = layer["N"], layer["K"]
    nw, s, r = config["nw"], config["s"], config.get("r", 1)
    if is_ring(config):         # the ring's weight bytes are what a CTA keeps in flight
        st, ka, z = config["st"], config["ka"], kind == "compressed"
        ctas = N // (16 * nw) * s
        fit = TMA_SMEM_LIMIT // (tmaz_smem if z else tma_smem)(nw, st, 4, ka, s, config.get("cl", 0))
        per_sm_ctas = min(math.ceil(ctas / SMS), max(fit, 1))
        sm_bytes = st * ka * nw * (1536 if z else 16 * 128) * per_sm_ctas
        return dict(grid=(N // (16 * nw), s), ctas=ctas, warps=nw + (2 if z else 1), k_per_warp=K // s, lane_bytes=0,
                    ctas_per_sm=per_sm_ctas, sm_bytes=sm_bytes, little=sm_bytes / LITTLE_PER_SM)
    ctas = N // (16 * r) * s
    if kind == "plain":
        dual = layer.get("dtype") == "fp32"             # the router streams hi and lo
        lane_bytes = config["u"] * r * 2 * 16 * (2 if dual else 1)
        warps = nw
    else:
        lane_bytes = config["ug"] * r * 3 * 16
        warps = nw + 1                                   # + the exception warp (it streams no weights)
    per_sm_ctas = min(math.ceil(ctas / SMS), MAX_CTAS_PER_SM)
    sm_bytes = 32 * nw * lane_bytes * per_sm_ctas        # streaming warps only
    return dict(grid=(N // (16 * r), s), ctas=ctas, warps=warps, k_per_warp=K // (s * nw), lane_bytes=lane_bytes,
                ctas_per_sm=per_sm_ctas, sm_bytes=sm_bytes, little=sm_bytes / LITTLE_PER_SM)


def fmt_cfg(kind, c):
    """A row's config in one line (a field the row lacks: '?', so that a bad row prints too)."""
    g = lambda k, d="?": c.get(k, d)   # noqa: E731
    if is_ring(c):
        return (f"{'gemvtz' if kind == 'compressed' else 'gemvt'} nw={g('nw')} s={g('s')} st={g('st')} ka={g('ka')} "
                f"pdl={g('pdl', 1)} cl={g('cl', 0)}")
    u = f"u={g('u')}" if kind == "plain" else f"ug={g('ug')}"
    walk = "" if kind == "plain" else f" walk={g('walk', 0)}"
    return (f"nw={g('nw')} s={g('s')} {u} r={g('r', 1)} loop={g('loop')} mb={g('mb')}{walk} pf={g('pf', 0)} "
            f"pdl={g('pdl', 1)} cl={g('cl', 0)}")


def print_row(kind, layer, m, config, note=""):
    n = launch_numbers(kind, layer, config)
    grid = f"{n['grid'][0]}x{n['grid'][1]}"
    print(f"  {kind:<10} {layer['layer']:<9} m={m:<3} {fmt_cfg(kind, config):<40} grid {grid:<7} {n['ctas']:>4} CTAs "
          f"{n['warps']:>2} warps  K/warp {n['k_per_warp']:>5}  {n['lane_bytes']:>4} B/lane  "
          f"{n['ctas_per_sm']} CTA/SM  {n['sm_bytes'] / 1000:6.1f} kB/SM = {n['little']:4.2f} x Little{note}")
    return n


# %% Check ---------------------------------------------------------------------------------------------
def load(name):
    with open(TABLES / name) as f:
        return json.load(f)


def card_tables():
    """[(kind, 'card/file')] of every card's tables: tables/cards.json's cards, each with tables/<card>/ctable.json
    (plain) and ztable.json (compressed) where they exist."""
    cards = load("cards.json")["cards"]
    return [(kind, f"{c}/{f}") for c in cards for kind, f in (("plain", "ctable.json"), ("compressed", "ztable.json"))
            if (TABLES / c / f).exists()]


def main():
    shapes = load("shapes.json")
    layers = {l["layer"]: l for l in shapes["layers"]}
    tables = card_tables()
    print(f"Little's law: {HBM_BPS / 1e12:.1f} TB/s x {LATENCY_S * 1e6:.1f} us / {SMS} SMs = "
          f"{LITTLE_PER_SM / 1000:.1f} kB in flight per SM (kB = 1000 B)")
    print(f"assumption: resident CTAs per SM = min(ceil(CTAs / {SMS}), {MAX_CTAS_PER_SM}) (launch spread evenly, "
          f"registers allow at most {MAX_CTAS_PER_SM}); per-SM bytes count streaming warps only\n")
    bad = []
    n_rows = 0
    tabled = {}
    for kind, fname in tables:
        rows = load(fname)["rows"]
        print(f"{fname}: {len(rows)} rows ({kind})")
        for row in rows:
            n_rows += 1
            name, m, cfg = row["layer"], row["m"], row["config"]
            if name not in layers:
                bad.append(f"{kind} row ('{name}', m={m}): layer not in shapes.json")
                continue
            probs = check_row(kind, layers[name], m, cfg)
            if probs:
                bad.extend(probs)
                print(f"  {kind:<10} {name:<9} m={m:<3} {fmt_cfg(kind, cfg) if 'nw' in cfg else cfg}  BAD: {probs[0]}")
                continue
            tabled[(fname.split("/")[0], kind, name, m)] = cfg
            print_row(kind, layers[name], m, cfg)
    if bad:
        for b in bad:
            print(f"MISMATCH: {b}")
        raise SystemExit(1)
    print(f"verified: all {n_rows} table rows fit (N % 16R, K/32 % S*NW*U (plain), at least S*NW units of UG groups "
          f"(compressed), shared memory)")

    # odd m reuse the config of the smallest tabled m above them with the same NB (same instantiation)
    for card in sorted({c for c, _, _, _ in tabled}):
      for name, layer in layers.items():
        for m in shapes["odd_m"]:
            for kind in ("compressed", "plain"):
                refs = sorted(mm for (c, k, n, mm) in tabled
                              if c == card and k == kind and n == name and mm >= m and nb_of(mm) == nb_of(m))
                if refs:
                    probs = check_row(kind, layer, m, tabled[(card, kind, name, refs[0])])
                    if probs:
                        print(f"MISMATCH: odd m={m} of '{name}' via ({kind}, m={refs[0]}): {probs[0]}")
                        raise SystemExit(1)
    print(f"verified: odd m {shapes['odd_m']} fit the configs of the tabled m they reuse (same NB)")

    print("\nworked examples (not table rows):")
    guide = dict(nw=16, s=4, u=4, loop=0, mb=1)
    n = print_row("plain", layers["router"], 1, guide, "   <- guide ch. 6 exercise")
    ok = n["ctas"] == 64 and n["lane_bytes"] == 256 and not check_row("plain", layers["router"], 1, guide)
    if not ok:
        print("MISMATCH: router m=1 S=4 should be 16 x 4 = 64 CTAs, 4 blocks x 4 loads x 16 B = 256 B per lane")
        raise SystemExit(1)
    print("verified: router (N=256) at m=1 with S=4: grid 16 x 4 = 64 CTAs; DUAL: 4 blocks x (2 hi + 2 lo) loads "
          "x 16 B = 256 B per lane")
    zex = dict(nw=16, s=1, ug=1, loop=1, mb=2, walk=0)
    n = print_row("compressed", layers["pooler"], 1, zex, "   <- STYLE.md's example row")
    if check_row("compressed", layers["pooler"], 1, zex) or n["warps"] != 17 or n["lane_bytes"] != 48:
        print("MISMATCH: pooler m=1 GemvzConfig(nw=16, s=1, ug=1, loop=1, mb=2) should fit, 17 warps, 48 B per lane")
        raise SystemExit(1)
    print("verified: compressed pooler m=1 nw=16 ug=1: 16 + 1 warps per CTA, UG x 3 x 16 B = 48 B per lane")
    probe = check_row("plain", layers["router"], 1, dict(nw=8, s=3, u=2, loop=1, mb=0))
    if not probe:
        print("MISMATCH: S=3 on the router should not divide K/32 = 256 (gemv_kernel splits K evenly)")
        raise SystemExit(1)
    print(f"verified: a bad row is caught: {probe[0]}")
    print("lab0: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
