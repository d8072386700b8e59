"""Where the time of back-to-back calls goes: each CTA's thread 0 timestamps its start, the release of
griddepcontrol.wait, partials in shared memory, the CTA barrier, the split-K combine and its end, in a build of
the kernels with MUSE_TRACE defined (the shipped build compiles the hooks to nothing: same PTX). One replay of
a graph of P back-to-back calls (P copies, as SPEC times them) is traced after three warm-up replays.

    python tools/trace_chain.py router:1 pooler:1 router:1:nw=8:u=4
    (cases: 'layer:m[:plain|compressed][:field=value...]', tools/cases.py; CUDA paths only)

Per case: the graph's time per call; then medians over the launches of: end of launch i-1 (its last CTA's last
timestamp) to the first CTA of launch i passing the wait; from there to launch i's last CTA end; how long
launch i's CTAs were resident before that release; and, per CTA after its release (clock64, converted with the
CTAs' own globaltimer / clock64 ratio): main loop, CTA barrier, split-K combine (CTAs that store / that do not),
store. Timestamps are thread 0's: the kernel's completion (every thread, memory flush) comes a little later.
"""
import hashlib
import os
import statistics
import sys

os.environ.setdefault("MUSE_BUILD", "0")   # this tool builds its own (traced) extension
import torch

import cases
import judge
import submission as S

SLOTS = 32768
EXTRA_BIND = r"""
int muse_trace_fetch(unsigned long long* host, int max_slots);
torch::Tensor trace_read() {
  auto t = torch::zeros({32768, 12}, torch::kInt64);
  const int n = muse_trace_fetch((unsigned long long*)t.data_ptr(), 32768);
  TORCH_CHECK(n >= 0, "MUSE_TRACE: reading the trace buffer failed");
  return t.narrow(0, 0, std::min(n, 32768));   // the counter runs past the slots: those CTAs were not recorded
}
"""
MOD = "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"


def traced_sources():
    src = "#define MUSE_TRACE\n" + S.KERNEL_SRC
    if S.BIND_SRC.count(MOD) != 1:
        raise RuntimeError("BIND_SRC has no single PYBIND11_MODULE block to extend")
    bind = S.BIND_SRC.replace(MOD, EXTRA_BIND + "\n" + MOD + '\n  m.def("trace_read", &trace_read, "MUSE_TRACE slots");')
    return src, bind


def build():
    src, bind = traced_sources()
    name = "muse_trace_" + hashlib.sha1((src + bind + " ".join(S.NVCC_FLAGS)).encode()).hexdigest()[:12]
    return S.build_extension(src, name, bind_src=bind)


def med(v):
    return statistics.median(v) if v else float("nan")


def analyse(rows, keys):
    """rows: [n, 12] int64 slots; keys: {a copy's weight pointer: launch index}."""
    by = {}
    for r in rows.tolist():
        i = keys.get(r[10])
        if i is not None:
            by.setdefault(i, []).append(r)
    if len(by) < 2:
        raise SystemExit(f"[trace] only {len(by)} launches recorded: nothing to compare")
    L = sorted(by)
    first_rel = {i: min(r[1] for r in by[i]) for i in L}
    start = {i: min(r[0] for r in by[i]) for i in L}
    end = {i: max(r[2] for r in by[i]) for i in L}
    gaps, crit, early, period = [], [], [], []
    for a, b in zip(L, L[1:]):
        if b != a + 1:
            continue
        gaps.append(first_rel[b] - end[a])
        crit.append(end[b] - first_rel[b])
        early.append(first_rel[b] - start[b])
        period.append(end[b] - end[a])
    ratio = med([(r[2] - r[0]) / (r[8] - r[3]) for i in L for r in by[i] if r[8] > r[3]])   # ns per cycle
    cta = [r for i in L for r in by[i]]
    ph = lambda j, k, sel=None: med([(r[3 + k] - r[3 + j]) * ratio for r in cta if sel is None or sel(r)])
    stored = lambda r: (r[9] >> 48) & 1
    gts = sorted({r[c] for r in cta for c in (0, 1, 2)})
    res = min((b - a for a, b in zip(gts, gts[1:]) if b > a), default=0)
    return {
        "launches": len(L), "ctas": len(cta) / len(L),
        "period": med(period), "gap": med(gaps), "crit": med(crit), "early": med(early),
        "wait": ph(0, 1), "loop": ph(1, 2), "barrier": ph(2, 3),
        "combine_store": ph(3, 4, lambda r: stored(r)), "combine_other": ph(3, 4, lambda r: not stored(r)),
        "store": ph(4, 5, lambda r: stored(r)), "ns_per_cycle": ratio, "gt_res": res,
    }


def run_case(ext, spec):
    Ls, m, x = cases.prepare(spec)
    P = len(Ls)
    p = Ls[0].plan(m)
    if p.path not in ("plain", "compressed"):
        print(f"[trace] {spec}: {p.path} path has no trace hooks; skipped", flush=True)
        return
    keys = {(Lc.w if p.path == "plain" else Lc.z.stream).data_ptr(): i for i, Lc in enumerate(Ls)}
    if len(keys) != P:
        raise SystemExit(f"[trace] {spec}: {P} copies but {len(keys)} distinct weight pointers")
    ms, _ = judge.time_graph([lambda Lc=Lc: S.kernel_fn(x, Lc) for Lc in Ls], 10)
    g, _ = judge.capture(lambda: [S.kernel_fn(x, Lc) for Lc in Ls])
    for _ in range(3):
        g.replay()
    ext.trace_read()                                # drop the warm-up's slots
    g.replay()
    rows = ext.trace_read()
    if rows.shape[0] >= SLOTS:
        raise SystemExit(f"[trace] {spec}: {rows.shape[0]} slots filled: the replay recorded more CTAs than fit")
    a = analyse(rows, keys)
    print(f"[trace] {spec}: {p.path} {p.config}; {a['launches']} launches x {a['ctas']:.0f} CTAs; "
          f"graph {ms * 1e3 / P:.2f} us per call (traced build)", flush=True)
    print(f"  per launch (globaltimer, medians): end to end {a['period'] / 1e3:.2f} us = previous launch's last "
          f"CTA end -> first release {a['gap'] / 1e3:.2f} us + release -> last CTA end {a['crit'] / 1e3:.2f} us; "
          f"CTAs resident {a['early'] / 1e3:.2f} us before the release", flush=True)
    print(f"  per CTA (clock64 at {1 / a['ns_per_cycle']:.2f} GHz, medians): start -> wait released "
          f"{a['wait'] / 1e3:.2f} us; main loop {a['loop'] / 1e3:.2f} us; CTA barrier {a['barrier'] / 1e3:.2f} us; "
          f"combine {a['combine_store'] / 1e3:.2f} us (storing CTAs) / {a['combine_other'] / 1e3:.2f} us (others); "
          f"store {a['store'] / 1e3:.2f} us; globaltimer step {a['gt_res']} ns", flush=True)


def main(argv):
    if not torch.cuda.is_available():
        print("[trace] needs a CUDA device")
        return 1
    ext = build()
    S._EXT = ext
    for spec in argv:
        run_case(ext, spec)
        torch.cuda.empty_cache()                    # the case's copies are gone with run_case's frame
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
