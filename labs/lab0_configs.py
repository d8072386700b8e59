"""Lab 0: what each tuned config launches, and whether it keeps enough bytes in flight (numpy-free arithmetic).

    python labs/lab0_configs.py

Reads tables/shapes.json, tables/ctable.json and tables/ztable.json. For every table row it prints the
grid of gemv_kernel / gemvz_kernel (N/(16R) x S), the warps per CTA, the K each warp streams, the bytes a lane
has in flight right after a load batch, and the bytes in flight per SM against Little's law. It checks that
every row divides evenly (the kernels use integer divisions: a row that does not divide silently skips
weights) and exits 1 naming the first bad row. check_row() is what tests/test_labs.py calls.
Independent oracle: this file shares no code with submission.py (gemv_misfit / gemvz_misfit restate the same rules).
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
SMS = 132                      # H200 SMs
HBM_BPS = 4.8e12               # bytes / s
LATENCY_S = 0.7e-6             # load latency under load (guide ch. 2.4)
LITTLE_PER_SM = HBM_BPS * LATENCY_S / SMS      # ~25.5 kB
MAX_CTAS_PER_SM = 2            # assumption: registers allow at most 2 resident CTAs of our kernels
SMEM_LIMIT = 48 * 1024         # static + dynamic shared memory per CTA


# %% Layout: the rules a config must satisfy -----------------------------------------------------------
def ring_fields(config):
    """A gemvt_kernel row (GemvtConfig: {nw, s, st, ka, pdl, cl, co}) in this lab's terms for the TMA ring: pipe 6,
    u = the ring's stages, r = 64-k tiles a stage. Other rows unchanged."""
    if "st" not in config:
        return config
    c = {k: v for k, v in config.items() if k not in ("st", "ka")}
    return dict(c, u=config["st"], r=config["ka"], pipe=6)


def check_row(kind, layer, m, config):
    """Problems of one table row (empty list if it is fine). kind: 'plain' (gemv_kernel) or 'compressed'
    (gemvz_kernel); layer: {"layer", "N", "K", "dtype"}; config: {"nw", "s", "u" | "ug", "pipe"} and optionally
    "r" (row blocks per warp, default 1), "pf" (L2 prefetch, 0/1), "pdl" (0/1), "cl" (split-K: 0 ticket, 1 cluster barrier, 2 cluster mbarrier)."""
    name, N, K = layer.get("layer", "?"), layer["N"], layer["K"]
    where = f"{kind} row ('{name}', m={m})"
    probs = []
    if kind not in ("plain", "compressed"):
        return [f"{where}: kind must be 'plain' or 'compressed'"]
    config = ring_fields(config)
    ukey = "u" if kind == "plain" else "ug"
    for key in ("nw", "s", ukey, "pipe", "r", "pf", "pdl", "cl"):
        v = config.get(key, {"r": 1, "pf": 0, "pdl": 1, "cl": 0}.get(key))
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if key in ("pipe", "pf", "pdl", "cl") else 1):
            want = "non-negative" if key in ("pipe", "pf", "pdl", "cl") else "positive"
            probs.append(f"{where}: config field '{key}' = {v!r} is not a {want} int")
    if probs:
        return probs
    nw, s, u, pipe = config["nw"], config["s"], config[ukey], config["pipe"]
    r, pf, pdl, cl = config.get("r", 1), config.get("pf", 0), config.get("pdl", 1), config.get("cl", 0)
    if not 1 <= m <= 32:
        probs.append(f"{where}: m={m} outside 1..32")
    nb = nb_of(m)
    if pipe == 6 and kind == "compressed":
        return probs + [f"{where}: the compressed TMA ring (gemvtz_kernel) was removed (FINDINGS.md)"]
    if pipe == 6:
        return probs + check_tma_row(where, layer, nb, nw, s, u, r, pf, pdl, cl)
    if pipe > 5:
        probs.append(f"{where}: PIPE={pipe} not in 0..6")
    if pf > 1 or pdl > 1 or cl > 2:
        probs.append(f"{where}: pf={pf}, pdl={pdl}, cl={cl}: pf and pdl are 0 or 1, cl is 0, 1 or 2")
    if cl and not 2 <= s <= 16:
        probs.append(f"{where}: cl={cl} makes the S={s} CTAs of a row group one cluster: S must be 2..16")
    if N % (16 * r):
        probs.append(f"{where}: N={N} not a multiple of 16*R={16 * r}")
    # red[NW][R*NB*32] float4 (+ the exception warp's ecorr) (+ with cl the leader's cbuf[S-1][R*NB*32])
    smem = (nw + (s - 1) * (cl >= 1)) * r * nb * 32 * 16 + (r * 16 * (nb * 8 + 1) * 4 if kind == "compressed" else 0) + 12
    if smem > SMEM_LIMIT:
        probs.append(f"{where}: shared memory (NW + cl*(S-1))*R*NB*512 B (+ ecorr) = {smem} B > {SMEM_LIMIT} B")
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


TMA_SMEM_LIMIT = 227 * 1024    # PIPE 6 opts in to the most shared memory a CTA may have


def ring_w_bytes(nw, compressed):
    """One 64-k group of a PIPE 6 stage's weights: gemvt_kernel 16 nw bf16 rows at 128 B, gemvtz_kernel a 6 KB
    12-bit tile per warpgroup."""
    return nw // 4 * 6144 if compressed else 16 * nw * 128


def tma_smem(nw, st, nb, ka, s, cl, compressed=False):
    """PIPE 6: 1 KB of alignment slack + a ring of st stages, each ka 64-k groups of 8 nb tokens at 128 B a row and of
    weights (gemvt_kernel: 16 nw bf16 rows at 128 B; gemvtz_kernel: 6 KB of 12-bit tile per warpgroup), + with cl the
    leader's cbuf[S-1][nw*nb*32] float4, + the mbarriers (static)."""
    return 1024 + st * ka * (ring_w_bytes(nw, compressed) + 8 * nb * 128) + (s - 1) * nw * nb * 32 * 16 * (cl >= 1) + 16 * st + 16


def check_tma_row(where, layer, nb, nw, s, u, r, pf, pdl, cl, compressed=False):
    """PIPE 6 rows (plain: gemvt_kernel; compressed: gemvtz_kernel): u = stages, r = 64-k groups a stage, nw consumer
    warps (whole warpgroups of 64 rows; compressed: one or two); S need not divide K (the CTAs' slices differ by at
    most one step), but every CTA needs a step."""
    N, K = layer["N"], layer["K"]
    probs = []
    if layer.get("dtype") == "fp32":
        probs.append(f"{where}: PIPE 6 takes bf16 weights, not the DUAL router")
    if nw not in ((4, 8) if compressed else (4, 8, 12, 16)):
        probs.append(f"{where}: PIPE 6 needs NW = {'4 or 8' if compressed else '4, 8, 12 or 16'} (warpgroups), got {nw}")
    if N % (16 * nw) or K % (64 * r):
        probs.append(f"{where}: PIPE 6 needs N % (16*NW) == 0 and K % (64*R) == 0 (N={N}, K={K}, NW={nw}, R={r})")
    elif not 1 <= s <= K // (64 * r):
        probs.append(f"{where}: PIPE 6: S={s} CTAs would leave one without a step (K/(64*R) = {K // (64 * r)})")
    if pf or pdl > 1 or cl > 2:
        probs.append(f"{where}: PIPE 6 has pf = 0 (its ring prefetches), pdl 0/1, cl 0..2; got pf={pf} pdl={pdl} cl={cl}")
    if cl and not 2 <= s <= 16:
        probs.append(f"{where}: cl={cl} makes the S={s} CTAs of a row group one cluster: S must be 2..16")
    smem = tma_smem(nw, u, nb, r, s, cl, compressed)
    if smem > TMA_SMEM_LIMIT:
        probs.append(f"{where}: PIPE 6 shared memory {smem} B > {TMA_SMEM_LIMIT} B")
    return probs


# %% Emulation: what a config launches -----------------------------------------------------------------
def launch_numbers(kind, layer, config):
    """Grid, warps, K per warp, bytes in flight per lane and per SM for one row."""
    config = ring_fields(config)
    N, K = layer["N"], layer["K"]
    nw, s, r = config["nw"], config["s"], config.get("r", 1)
    if config["pipe"] == 6:     # the ring's weight bytes are what a CTA keeps in flight
        comp = kind == "compressed"
        st = config["ug" if comp else "u"]
        ctas = N // (16 * nw) * s
        fit = TMA_SMEM_LIMIT // tma_smem(nw, st, 4, r, s, config.get("cl", 0), comp)
        per_sm_ctas = min(math.ceil(ctas / SMS), max(fit, 1))
        sm_bytes = st * r * ring_w_bytes(nw, comp) * per_sm_ctas
        return dict(grid=(N // (16 * nw), s), ctas=ctas, warps=nw + 1, k_per_warp=K // s, lane_bytes=0,
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
    if "st" in c:
        return f"gemvt nw={c['nw']} s={c['s']} st={c['st']} ka={c['ka']} pdl={c.get('pdl', 1)} cl={c.get('cl', 0)}"
    u = f"u={c['u']}" if kind == "plain" else f"ug={c['ug']}"
    return (f"nw={c['nw']} s={c['s']} {u} r={c.get('r', 1)} pipe={c['pipe']} pf={c.get('pf', 0)} "
            f"pdl={c.get('pdl', 1)} cl={c.get('cl', 0)}")


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


def main():
    shapes = load("shapes.json")
    layers = {l["layer"]: l for l in shapes["layers"]}
    tables = [("plain", "ctable.json"), ("compressed", "ztable.json")]
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
            tabled[(kind, name, m)] = cfg
            print_row(kind, layers[name], m, cfg)
    if bad:
        for b in bad:
            print(f"MISMATCH: {b}")
        raise SystemExit(1)
    print(f"verified: all {n_rows} table rows fit (N % 16R, K/32 % S*NW*U (plain), at least S*NW units of UG groups "
          f"(compressed), shared memory)")

    # odd m reuse the config of the smallest tabled m above them with the same NB (same instantiation)
    for name, layer in layers.items():
        for m in shapes["odd_m"]:
            for kind in ("compressed", "plain"):
                refs = sorted(mm for (k, n, mm) in tabled
                              if k == kind and n == name and mm >= m and nb_of(mm) == nb_of(m))
                if refs:
                    probs = check_row(kind, layer, m, tabled[(kind, name, refs[0])])
                    if probs:
                        print(f"MISMATCH: odd m={m} of '{name}' via ({kind}, m={refs[0]}): {probs[0]}")
                        raise SystemExit(1)
    print(f"verified: odd m {shapes['odd_m']} fit the configs of the tabled m they reuse (same NB)")

    print("\nworked examples (not table rows):")
    guide = dict(nw=16, s=4, u=4, pipe=3)
    n = print_row("plain", layers["router"], 1, guide, "   <- guide ch. 6 exercise")
    ok = n["ctas"] == 64 and n["lane_bytes"] == 256 and not check_row("plain", layers["router"], 1, guide)
    if not ok:
        print("MISMATCH: router m=1 S=4 should be 16 x 4 = 64 CTAs, 4 blocks x 4 loads x 16 B = 256 B per lane")
        raise SystemExit(1)
    print("verified: router (N=256) at m=1 with S=4: grid 16 x 4 = 64 CTAs; DUAL: 4 blocks x (2 hi + 2 lo) loads "
          "x 16 B = 256 B per lane")
    zex = dict(nw=16, s=1, ug=1, pipe=2)
    n = print_row("compressed", layers["pooler"], 1, zex, "   <- STYLE.md's example row")
    if check_row("compressed", layers["pooler"], 1, zex) or n["warps"] != 17 or n["lane_bytes"] != 48:
        print("MISMATCH: pooler m=1 GemvzConfig(16, 1, 1, 2) should fit, 17 warps, 48 B per lane")
        raise SystemExit(1)
    print("verified: compressed pooler m=1 nw=16 ug=1: 16 + 1 warps per CTA, UG x 3 x 16 B = 48 B per lane")
    probe = check_row("plain", layers["router"], 1, dict(nw=8, s=3, u=2, pipe=1))
    if not probe:
        print("MISMATCH: S=3 on the router should not divide K/32 = 256 (gemv_kernel splits K evenly)")
        raise SystemExit(1)
    print(f"verified: a bad row is caught: {probe[0]}")
    print("lab0: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
