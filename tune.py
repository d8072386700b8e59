"""Find the fastest config of every scored (layer, m) on the GPU and write the winners to this card's tables/<card>/.

    python tune.py                          # all 30 shapes (about 5 minutes on an H200, build included)
    python tune.py --layers router --m 1,2  # a subset; the other rows of the tables are kept
    python tune.py --no-write               # measure and print only
    python tune.py --paths compressed       # one path only (the other path's rows are kept)
    python tune.py --families gemvtz --paths compressed --m 32   # one kernel family's candidates only
    python tune.py --pf 0,1 --pf-final 0   # L2 prefetch values for the screen / the finalists
    python3 tune.py --shapes 6144x4096,4096x14336      # your own shapes: registered, then tuned (bf16)
    python3 tune.py --config path/to/config.json       # a model config's linear layers (qkv, o, gate_up, down, lm_head)
    python3 build.py                        # then regenerate submission.py from the tables

The rows go to the tables of the card the GPU is (tables/cards.json: its device name and SM count); on a device no card
matches, the first write adds one (tables/<new card>/, a key made from the device name). Rows of another card are never
touched: build.py takes a compressed row over the plain one by times of the same card only. Nothing under tables/ is
written before the first layer's timings exist (a run that fails before leaves the tree as it was).
How: one extension holds every candidate instantiation (plain NW in {4, 8, 16} x U in {1, 2, 4} x R in {1, 2, 4}
x the six (loop, mb) pairs LOOP_MBS; compressed NW x UG in {1, 2, 4} x R x LOOP_MBS; gemvt NW in {4, 8} x ST x KA;
gemvtz (m >= 9) NW in {4, 8} x GZ_STS x KA; for the NB and DUAL the selected shapes need), compiled from
submission.KERNEL_SRC split over several .cu files so ninja builds them on all cores. Candidates that spill (local
memory > 0, as the compiler reports) are dropped. Each candidate, with
every S that divides K and each screen pf (--pf), is screened with a light replay count of SPEC's timing (P
copies >= 2 GB, one graph of P back-to-back calls); the finalists are timed again with the full replay count,
each also at every --pf-final value and with PDL off, and the winner of each path goes to tables/ctable.json
(plain) and tables/ztable.json (compressed) with its runner-ups. Tables are written after each layer, so an
interrupted run keeps what it finished; rerun with --layers to resume. --no-write writes nothing anywhere (not the
tables, not a --shapes / --config registration in tables/shapes.json).
"""
import argparse
import datetime
import hashlib
import itertools
import json
import os
import sys
import time

os.environ.setdefault("MUSE_BUILD", "0")   # the tuner loads its own extension instead of submission's
import torch

import build
import judge
import submission as sub

NWS = (4, 8, 16)
US = (1, 2, 4)
UGS = (1, 2, 4)
RS = (1, 2, 4)
LOOP_MBS = ((0, 0), (0, 1), (1, 0), (1, 2), (2, 0), (2, 2))   # (loop, mb) pairs the register kernels are tuned over
# gemvt_kernel (GemvtConfig: TMA ring + wgmma, bf16 weights only): NW consumer warps, ST stages of the ring, KA 64-k
# atoms a stage; S only where the grid has 0.5 to 4 CTAs per SM (a CTA holds up to the opt-in shared memory of ring).
TMA_NWS = (4, 8)
TMA_STS = (4, 8, 12)
TMA_KAS = (1, 2)
# gemvtz_kernel (GemvtzConfig: the 12-bit stream in a TMA ring): compressed path, m >= 9 (NB >= 2); its stage holds
# x too and the permuted x buffers take 3 stages' x, so the deepest ring that fits is shallower than gemvt's
GZ_STS = (4, 6, 8)
GZ_MIN_NB = 2
# L2 prefetch of the warp's slice (pf = 1): not in the screen, tried on the finalists (it won only router shapes,
# whose slice is one batch). --pf / --pf-final override.
PFS = (0,)
FINAL_PFS = (0, 1)
ROOT = os.path.dirname(os.path.abspath(__file__))
FAMILY = {f.name: i for i, f in enumerate(sub.FAMILIES)}   # the glue's family index
RENAMED = ("muse_launch", "muse_attrs", "unpackz_launch", "unpackz_kernel")


# ---- the candidate extension -----------------------------------------------------------------------
def instances(nbs, duals, paths=("plain", "compressed"), nws=NWS, tma=True):
    """(kind, template args) of every candidate of the paths, minus those whose shared memory does not fit and
    the obviously register-starved ones (the compiler's spill report prunes the rest at run time). The router
    (DUAL) is always plain."""
    out = []
    for nw in nws:
        for nb in nbs:
            for r in RS:
                for loop, mb in LOOP_MBS:
                    pipelined = loop >= 1
                    xbufs = 2 if loop == 2 else 1          # loop 2: the next trip's x in flight too
                    for u in US:
                        for dual in duals:
                            if not dual and "plain" not in paths:
                                continue
                            frags = 8 * u * r * (2 if dual else 1) * (2 if pipelined else 1)
                            regs = frags + (4 * u * nb * xbufs if pipelined else 4 * nb) + 4 * r * nb
                            if regs <= 200 and sub.smem_bytes(nw, nb, r, False) <= sub.STATIC_SMEM:
                                out.append(("gemv", (nw, u, nb, r, dual, loop, mb)))
                    if False not in duals or "compressed" not in paths:
                        continue
                    for ug in UGS:
                        frags = 12 * ug * r * (2 if pipelined else 1)
                        regs = frags + (8 * ug * nb * xbufs if pipelined else 8 * nb) + 4 * r * nb + 16
                        if regs <= 200 and sub.smem_bytes(nw, nb, r, True) <= sub.STATIC_SMEM:
                            out.append(("gemvz", (nw, ug, nb, r, loop, mb, 0)))
    # gemvt_kernel (the TMA ring, GemvtConfig): bf16 weights, plain path only
    if tma and "plain" in paths and False in duals:
        for nw, nb, st, ka in itertools.product(TMA_NWS, nbs, TMA_STS, TMA_KAS):
            if sub.gemvt_smem(nw, st, nb, ka) <= sub.hardware().smem_cta:
                out.append(("gemvt", (nw, st, nb, ka)))
    # gemvtz_kernel (the 12-bit ring, GemvtzConfig): compressed path, m >= 9
    if tma and "compressed" in paths and False in duals:
        for nw, nb, st, ka in itertools.product(TMA_NWS, nbs, GZ_STS, TMA_KAS):
            if nb >= GZ_MIN_NB and sub.cta_smem(sub.GemvtzConfig(nw, 1, st, ka), 8 * nb) <= sub.hardware().smem_cta:
                out.append(("gemvtz", (nw, st, nb, ka)))
    return out


def tune_sources(insts, nfiles):
    """nfiles .cu sources (each the kernel source with a share of the instantiations and its entry points renamed
    _i) and a .cpp (the glue, BIND_SRC, and the chain that tries each file's dispatcher in turn under the names the
    glue calls)."""
    files = []
    for i in range(nfiles):
        head = "".join(f"#define {n} {n}_{i}\n" for n in RENAMED)
        files.append(head + sub.variant_source((), insts[i::nfiles]))
    sig = {
        "muse_launch": ("int family, const int* t, int n, const GemvArgs& a, bool pdl, cudaStream_t st",
                        "family, t, n, a, pdl, st"),
        "muse_attrs": ("int family, const int* t, int n, int* res", "family, t, n, res"),
    }
    cpp = [sub.BIND_SRC]
    for name, (params, args) in sig.items():
        cpp += [f"int {name}_{i}({params});" for i in range(nfiles)]
        body = "".join(f"  if ((rc = {name}_{i}({args})) != -1) return rc;\n" for i in range(nfiles))
        cpp.append(f"int {name}({params}) {{\n  int rc;\n{body}  return -1;\n}}")
    cpp.append("int unpackz_launch_0(const void* w, const void* zbase, void* out, int N, int K, cudaStream_t st);")
    cpp.append("int unpackz_launch(const void* w, const void* zbase, void* out, int N, int K, cudaStream_t st) "
               "{ return unpackz_launch_0(w, zbase, out, N, K, st); }")
    return files, "\n".join(cpp) + "\n"


def build_tune_ext(insts, nfiles=None):
    from torch.utils.cpp_extension import load, get_default_build_root
    nfiles = nfiles or max(1, min(32, os.cpu_count() or 1))
    files, cpp = tune_sources(insts, nfiles)
    h = hashlib.sha1(("".join(files) + cpp).encode()).hexdigest()[:12]
    name = f"muse_tune_{h}"
    d = os.path.join(get_default_build_root(), name)
    os.makedirs(d, exist_ok=True)
    paths = []
    for i, text in enumerate(files + [cpp]):
        p = os.path.join(d, f"k{i}.cu" if i < len(files) else "bind.cpp")
        if not os.path.exists(p) or open(p).read() != text:
            with open(p, "w") as f:
                f.write(text)
        paths.append(p)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    t0 = time.time()
    print(f"[tune] compiling {len(insts)} candidate kernels in {nfiles} sources ({os.environ['MAX_JOBS']} jobs)...",
          flush=True)
    mod = load(name=name, sources=paths, extra_cuda_cflags=sub.NVCC_FLAGS, extra_cflags=["-O2"],
               build_directory=d, verbose=False)
    print(f"[tune] compiled in {time.time() - t0:.1f} s", flush=True)
    return mod


# ---- candidates ------------------------------------------------------------------------------------
def s_options(kblocks, per_cta, row_groups, uneven=False):
    """S values that keep the grid below 16 CTAs per SM: the powers of two that divide the K blocks, and with uneven
    (gemvz since session 20: split_units) also every S up to 16 whose grid stays within 6 CTAs an SM and that leaves
    each of the per_cta warp-units of a CTA at least one (qwen2-7b.down's best, S = 3 on 112 row groups, fills no whole
    wave: S20c1's grid)."""
    out, s = [], 1
    sms = sub.hardware().sms
    while kblocks % (s * per_cta) == 0 and row_groups * s <= sms * 16:
        out.append(s)
        s *= 2
    if uneven:
        out += [v for v in range(2, 17) if v not in out and kblocks >= v * per_cta and row_groups * v <= sms * 6]
    return sorted(out)


def candidates(ext, N, K, m, dual, compressed, pfs=PFS, nws=NWS, tma=True):
    """Every compiled config that fits the shape and does not spill, with every S and pf in pfs; for S > 1 the
    cluster reduction (cl = 2), or the ticket (cl = 0) where the cluster's shared memory does not fit. Plus (bf16
    weights) the compiled ring configs at the S listed below: gemvt_kernel on the plain path, gemvtz_kernel on the
    compressed one."""
    nb = sub.nb_of(m)
    out, spilled = [], 0
    if tma and not dual:
        ring, cls, sts = ("gemvtz", sub.GemvtzConfig, GZ_STS) if compressed else ("gemvt", sub.GemvtConfig, TMA_STS)
        for nw in TMA_NWS:
            for st in sts:
                for ka in TMA_KAS:
                    a = ext.attrs(FAMILY[ring], [nw, st, nb, ka])
                    if not a:
                        continue
                    if a[1] > 0:
                        spilled += 1
                        continue
                    tiles = N // (16 * nw)
                    # powers of two, and the S (need not divide K) that fill 75-100% of one wave at one or two CTAs
                    # an SM: the ring holds most of the SM's shared memory, so a second wave costs a whole CTA's time
                    sms = sub.hardware().sms
                    ss = sorted({s for s in s_options(K // 64, ka, tiles) if sms // 2 <= tiles * s <= 4 * sms} |
                                {s for s in range(2, 33) for w in (sms, 2 * sms) if 0.75 * w <= tiles * s <= w})
                    for s in ss:                  # config_misfit refuses an S past K / (64 ka)
                        for cl in ((2, 0) if s > 1 else (0,)):
                            c = cls(nw, s, st, ka, 1, cl)
                            if not sub.config_misfit(c, N, K, m, dual):
                                out.append(c)
                                break
    for nw in nws:
        for u in (UGS if compressed else US):
            for r in RS:
                if N % (16 * r):
                    continue
                for loop, mb in LOOP_MBS:
                    a = (ext.attrs(FAMILY["gemvz"], [nw, u, nb, r, loop, mb, 0]) if compressed else
                         ext.attrs(FAMILY["gemv"], [nw, u, nb, r, int(dual), loop, mb]))
                    if not a:
                        continue
                    if a[1] > 0:
                        spilled += 1
                        continue
                    if (nw + (1 if compressed else 0)) * 32 > a[3]:
                        continue                  # too many registers for this many threads: cannot launch
                    kblocks = K // 64 if compressed else K // 32
                    for s in s_options(kblocks, nw * u, N // (16 * r), uneven=compressed):
                        for pf in pfs:
                            # S > 1: the cluster reduction, and the ticket only where the cluster does not fit (every
                            # S > 1 winner took the cluster where it fit: FINDINGS, "split-K")
                            for cl in ((2, 0) if s > 1 else (0,)):
                                c = (sub.GemvzConfig(nw, s, u, r, loop, mb, 0, pf, 1, cl) if compressed else
                                     sub.GemvConfig(nw, s, u, r, loop, mb, pf, 1, cl))
                                if not sub.config_misfit(c, N, K, m, dual):
                                    out.append(c)
                                    break
    return out, spilled


def time_config(Ls, m, cfg, x, replays):
    for L in Ls:
        L.set_config(m, cfg)
    return judge.per_call_us(sub.kernel_fn, Ls, x, replays, warmup=1)


def tune_shape(Ls, m, x, cands, screen, full, keep, log, final_pfs=(), misfit=lambda c: None):
    """Screen every candidate, re-time the best `keep`, each also at every pf of final_pfs and without PDL, leaving out
    the variants misfit(cfg) refuses (a field value the config's path does not take); returns [(us, cfg)] sorted,
    finalists first."""
    res = []
    for c in cands:
        try:
            res.append((time_config(Ls, m, c, x, screen), c))
        except RuntimeError as e:
            log(f"    {c}: {e}")
    res.sort(key=lambda r: r[0])
    # finalists: the best `keep`, each also without PDL (a config whose CTAs crowd the SMs can lose to the next
    # kernel's early CTAs: FINDINGS, "PDL")
    variants = []
    for _, c in res[:keep]:
        bases = [c] + [c._replace(pf=p) for p in final_pfs if "pf" in c._fields and p != c.pf]   # gemvt: no pf
        for b in bases:
            for c2 in (b, b._replace(pdl=0)):
                if c2 not in variants and not misfit(c2):
                    variants.append(c2)
    fin = [(time_config(Ls, m, c2, x, full), c2) for c2 in variants]
    fin.sort(key=lambda r: r[0])
    return fin + res[keep:]


def verified(Ls, m, x, ranked, log):
    """ranked without the leading configs whose output misses SPEC's tolerance against the float64 reference
    (each one dropped is logged as WRONG): the winner that goes to the tables is a checked one."""
    ref = judge.reference(x, Ls[0].weight)
    while ranked:
        cfg = ranked[0][1]
        Ls[0].set_config(m, cfg)
        try:
            judge.check_close(sub.kernel_fn(x, Ls[0]), ref, Ls[0].dual, f"{Ls[0].name} m={m} {cfg}")
            return ranked
        except judge.CheckFailed as e:
            log(f"    WRONG (dropped): {e}")
            ranked = ranked[1:]
    raise SystemExit(f"[tune] {Ls[0].name} m={m}: no candidate passed the accuracy check")


def best_by(ranked, field):
    """'pf 0: 9.10, 1: 9.32, ...': the best time at each value of a config field (finalists re-timed, the rest
    screened)."""
    best = {}
    for us, c in ranked:
        v = getattr(c, field, type(c).__name__)     # a field the config type lacks (gemvt: pf, loop): its type
        best[v] = min(us, best.get(v, us))
    return f"{field} " + ", ".join(f"{v}: {us:.2f}" for v, us in sorted(best.items(), key=lambda kv: str(kv[0])))


def row_of(layer, m, ranked, device, date):
    us, c = ranked[0]
    return {"layer": layer, "m": m, "config": dict(c._asdict()), "us": round(us, 3), "date": date, "device": device,
            "runner_up": [{"config": dict(rc._asdict()), "us": round(ru, 3)} for ru, rc in ranked[1:4]]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default=None, help="comma list of tables/shapes.json's layers (default: the scored "
                    "ones, or those --shapes / --config name)")
    ap.add_argument("--shapes", default=None, help="NxK[,NxK...]: bf16 layers of your own, registered in "
                    "tables/shapes.json's user_layers as 'NxK' and tuned; any layer of that shape then takes the rows")
    ap.add_argument("--config", action="append", default=[], help="a model config.json: its linear layers "
                    "(<name>.qkv, .o, .gate_up, .down, .lm_head; <name> from the file's _name_or_path or its folder), "
                    "registered and tuned; may repeat")
    ap.add_argument("--m", default=",".join(map(str, judge.SCORED_M)))
    ap.add_argument("--screen", type=int, default=3, help="replays per candidate in the screen")
    ap.add_argument("--full", type=int, default=25, help="replays per finalist")
    ap.add_argument("--keep", type=int, default=4, help="finalists per path")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--build-only", action="store_true",
                    help="compile the candidate extension for these layers / m / paths / nw, then stop "
                         "(tools/device.sh prebuild: overlaps it with the shipped build)")
    ap.add_argument("--nw", default=",".join(map(str, NWS)), help="warps per CTA to try")
    ap.add_argument("--budget-s", type=float, default=540, help="stop (tables saved) before this many seconds")
    ap.add_argument("--no-tma", action="store_true", help="leave gemvt_kernel (TMA ring + wgmma) out")
    ap.add_argument("--paths", default="plain,compressed", help="CUDA paths to tune: plain, compressed or both")
    ap.add_argument("--families", default=None, help="comma list of kernel families whose candidates are timed "
                    f"({', '.join(f.name for f in sub.FAMILIES)}; default: all)")
    ap.add_argument("--pf", default=",".join(map(str, PFS)), help="L2 prefetch values to screen (0, 1)")
    ap.add_argument("--pf-final", default=",".join(map(str, FINAL_PFS)), help="L2 prefetch values for the finalists")
    args = ap.parse_args(argv)
    fams = None if args.families is None else {f for f in args.families.split(",") if f}
    known = {f.name for f in sub.FAMILIES}
    if fams is not None and (not fams or not fams <= known):
        ap.error(f"--families {args.families!r}: expected names in {', '.join(sorted(known))}")
    new_layers = user_layers(args, ap.error)     # checked here, registered in tables/shapes.json with the first rows
    user = [n for n, _, _ in new_layers]
    if not torch.cuda.is_available():
        print("[tune] needs a CUDA device (an H100 or H200) to time anything; nothing written")
        return 1
    if user:
        print(f"[tune] layers of your own: {', '.join(user)}" + (" (--no-write: not registered in tables/shapes.json)"
              if args.no_write else "; registered in tables/shapes.json with their rows; `python3 build.py` after the "
              "tuning compiles them into submission.py"), flush=True)
    cards = build.load_cards()
    dev = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    card = build.card_of_device(cards, dev, sms)
    if card is None:
        card = build.new_card_key(cards, dev)
        cards = dict(cards, **{card: {"name": dev, "sms": sms}})
        print(f"[tune] {dev} ({sms} SMs) has no tables yet: its rows go to tables/{card}/, a new card in "
              f"tables/cards.json", flush=True)
    else:
        print(f"[tune] {dev}: rows go to tables/{card}/ (this card's; other cards' tables are left alone)", flush=True)
    layer_info = dict(build.load_tables(card)[1], **{n: {"layer": n, "N": N, "K": K, "dtype": "bf16"}
                                                     for n, N, K in new_layers})
    layers = [l for l in args.layers.split(",") if l] if args.layers else (user or list(judge.LAYERS))
    for l in layers:
        if l not in layer_info:
            ap.error(f"--layers: {l!r} is not in tables/shapes.json ({', '.join(layer_info)})")
    paths = {p for p in args.paths.split(",") if p}
    if not paths or not paths <= {"plain", "compressed"}:
        ap.error(f"--paths {args.paths!r}: expected plain, compressed or both")
    ms = [int(v) for v in args.m.split(",") if v]
    pfs = tuple(int(v) for v in args.pf.split(",") if v)
    fpfs = tuple(int(v) for v in args.pf_final.split(",") if v)
    if not pfs or not set(pfs + fpfs) <= {0, 1}:
        ap.error(f"--pf {args.pf!r} / --pf-final {args.pf_final!r}: expected values in 0,1")
    nws = tuple(int(v) for v in args.nw.split(",") if v)
    if not nws or not set(nws) <= set(NWS):
        ap.error(f"--nw {args.nw!r}: expected values in {NWS}")
    t_start = time.time()
    duals = sorted({layer_info[l]["dtype"] == "fp32" for l in layers})
    nbs = sorted({sub.nb_of(m) for m in ms})
    ext = build_tune_ext([i for i in instances(nbs, duals, paths, nws, not args.no_tma) if fams is None or i[0] in fams])
    if args.build_only:
        return 0
    date = datetime.date.today().isoformat()
    shapes, _, ct, zt = build.load_tables(card)
    crow = {(r["layer"], r["m"]): r for r in ct["rows"]}
    zrow = {(r["layer"], r["m"]): r for r in zt["rows"]}
    log = lambda s: print(s, flush=True)
    total, done = len(layers) * len(ms), 0
    out_of_time = False
    for name in layers:
        d = layer_info[name]
        N, K, dual = d["N"], d["K"], d["dtype"] == "fp32"
        w = judge.trained_like(N, K, 5, "cuda", torch.float32 if dual else torch.bfloat16)
        P = judge.copies_for(N * K * 2 * (2 if dual else 1))
        Ls = [sub.prepare(name, w, path=None if dual else "compressed", ext=ext) for _ in range(P)]
        if not dual:
            log(f"[tune] {name}: {Ls[0].describe().splitlines()[1].strip()}")
        for m in ms:
            if time.time() - t_start > args.budget_s:
                log(f"[tune] budget of {args.budget_s:.0f} s reached: stopping; rerun with --layers/--m for the rest")
                out_of_time = True
                break
            x = judge.fresh_x(m, K, 3 + m, "cuda")
            misfit = lambda c: sub.config_misfit(c, N, K, m, dual)   # noqa: E731 (finalist variants the path takes)
            t0 = time.time()
            line = ""
            if "plain" in paths or dual:
                cp, sp = candidates(ext, N, K, m, dual, False, pfs, nws, not args.no_tma)
                cp = [c for c in cp if fams is None or sub.family_of(c).name in fams]
                rp = verified(Ls, m, x, tune_shape(Ls, m, x, cp, args.screen, args.full, args.keep, log, fpfs, misfit),
                              log)
                crow[(name, m)] = row_of(name, m, rp, dev, date)
                line = (f"plain {rp[0][1]} {rp[0][0]:.2f} us (next {rp[1][0]:.2f}; {len(cp)} cands, {sp} spilled; "
                        f"{best_by(rp, 'pf')}; {best_by(rp, 'loop')}; {best_by(rp, 'mb')})")
            if not dual and "compressed" in paths:
                cz, sz = candidates(ext, N, K, m, dual, True, pfs, nws, not args.no_tma)
                cz = [c for c in cz if fams is None or sub.family_of(c).name in fams]
                rz = verified(Ls, m, x, tune_shape(Ls, m, x, cz, args.screen, args.full, args.keep, log, fpfs, misfit),
                              log)
                zrow[(name, m)] = row_of(name, m, rz, dev, date)
                line += (f" | compressed {rz[0][1]} {rz[0][0]:.2f} us (next {rz[1][0]:.2f}; {len(cz)} cands, "
                         f"{sz} spilled; {best_by(rz, 'pf')}; {best_by(rz, 'loop')}; {best_by(rz, 'mb')})")
            done += 1
            el = time.time() - t_start
            log(f"[tune {done}/{total}] {name} m={m}: {line}  [{time.time() - t0:.0f} s; {el:.0f} s in all]")
        del Ls
        torch.cuda.empty_cache()
        if not args.no_write:
            if new_layers:                          # the user's layers, with their first rows
                build.add_user_layers(new_layers)
                shapes = build.load_tables(card)[0]
                new_layers = []
            if card not in build.load_cards():
                build.write_cards(cards)
            _save(card, ct, zt, crow, zrow, shapes)   # after every layer: an interrupted run keeps what it finished
        if out_of_time:
            break
    print(f"[tune] done in {time.time() - t_start:.0f} s" + ("" if args.no_write else
          f"; tables/{card}/ updated: run `python3 build.py` to regenerate submission.py"))
    return 0


def user_layers(args, error):
    """The --shapes / --config layers [(name, N, K)], checked against tables/shapes.json (build.add_user_layers with
    write=False); main registers them with the first rows it writes."""
    new = []
    for spec in (args.shapes or "").split(","):
        if not spec:
            continue
        try:
            N, K = (int(v) for v in spec.lower().split("x"))
        except ValueError:
            error(f"--shapes {spec!r}: expected NxK, e.g. 6144x4096")
        new.append((f"{N}x{K}", N, K))
    for path in args.config:
        try:
            with open(path) as f:
                cfg = json.load(f)
        except (OSError, ValueError) as e:
            error(f"--config {path}: {e}")
        prefix = os.path.basename(str(cfg.get("_name_or_path") or os.path.dirname(os.path.abspath(path)))) or "model"
        try:
            new += build.shapes_from_config(cfg, prefix)
        except ValueError as e:
            error(f"--config {path}: {e}")
    bad = [f"{n} ({N} x {K})" for n, N, K in new if N % 16 or K % 64]
    if bad:
        print(f"[tune] left out, the kernels need N % 16 == 0 and K % 64 == 0 (torch runs them): {', '.join(bad)}")
    new = [(n, N, K) for n, N, K in new if not (N % 16 or K % 64)]
    try:
        build.add_user_layers(new, write=False)
    except ValueError as e:
        error(str(e))
    return new


def _in_shape_order(rows, shapes):
    """The rows of {(layer, m): row} in tables/shapes.json's order (unknown shapes last)."""
    order = {(d["layer"], m): i for i, (d, m) in enumerate((d, m) for d in build.all_layers(shapes)
                                                               for m in shapes["m"])}
    return sorted(rows.values(), key=lambda r: order.get((r["layer"], r["m"]), 10 ** 6))


def _save(card, ct, zt, crow, zrow, shapes):
    ct["rows"] = _in_shape_order(crow, shapes)
    zt["rows"] = _in_shape_order(zrow, shapes)
    ct["note"] = "winners measured by tune.py (SPEC timing) on this card; runner_up = the next finalists"
    zt["note"] = ct["note"] + "; build.py puts a row in ZTABLES only where it beats the plain row by more than its Z_MARGIN"
    build.write_table(f"{card}/ctable.json", ct)
    build.write_table(f"{card}/ztable.json", zt)


if __name__ == "__main__":
    sys.exit(main())
