"""Lab 5: split-K inside one launch: the semaphore / last-CTA protocol of splitk_combine, simulated (numpy, CPU).

    python labs/lab5_splitk.py

Mirrors splitk_combine in submission.py (used by gemv_kernel and gemvz_kernel when S > 1): each of the S CTAs
of a row block parks its fp32 partial in ws[rb][s], takes a ticket with atomicAdd(&sem[rb], 1); the CTA that
draws S-1 sums ws[rb][0..S-1] in that fixed order, stores, and resets sem[rb] = 0 for the next call.
The lab lets CTAs finish in random orders over several CUDA-graph replays and shows the output is bit-identical
every time; with RESET = False, replay 1 loses its output. Then cluster_combine (cl = 1: the S CTAs form one
thread-block cluster and the leader sums the others' partials out of its own shared memory after one cluster
barrier): the same bits as the ticket, and no state that outlives a launch. Then cl = 2 (the partials sent with
st.async, counted in bytes on the leader's mbarrier; only the leader waits): the same bits when the leader waits for
every byte, and unfilled slots when it does not. Last the atomic-add alternative: it
needs a zeroed output before every call and its rounding depends on the order in which CTAs finish.
"""
import sys

import numpy as np

from labkit import check


# %% Motivation ------------------------------------------------------------------------------------
# The router has 256 rows: 16 row blocks, 16 CTAs for 132 SMs. Splitting K over S CTAs per row block
# fills the GPU, but the S partial sums must be added somewhere. One launch (no second "reduce" kernel,
# no memset) and a deterministic result: the last CTA to finish adds all S partials in the order 0..S-1.

RESET = True        # splitk_combine's `sem[rb] = 0`; set False to watch replay 1 lose its output


def hexf(v):
    return f"0x{int(np.float32(v).view(np.uint32)):08x}"


# %% Layout: ws [RB][S][threads x 4] fp32 partials, sem [RB] int tickets, out [RB][threads x 4] -------------
def interleaving(rng, R, S):
    """A random completion order: every CTA (rb, sidx) runs step 0 (write ws, __threadfence) before step 1
    (atomicAdd ticket, maybe combine); CTAs interleave freely."""
    steps = np.repeat(np.arange(R * S), 2)
    rng.shuffle(steps)
    done = np.zeros(R * S, int)
    order = []
    for c in steps:
        order.append((int(c) // S, int(c) % S, int(done[c])))
        done[c] += 1
    return order


# %% Emulation ---------------------------------------------------------------------------------------------
def splitk_combine(partials, ws, sem, out, order, reset=True):
    """One launch of the protocol. partials [R, S, T] fp32; ws [R, S, T], sem [R] int and out [R, T] persist
    across launches (graph replays). Returns {rb: sidx of the CTA that stored}."""
    R, S, T = partials.shape
    stored = {}
    for rb, sidx, step in order:
        if step == 0:
            ws[rb, sidx] = partials[rb, sidx]                    # park the partial, then __threadfence()
            continue
        ticket = sem[rb]                                          # atomicAdd(&sem[rb], 1) returns the old value
        sem[rb] += 1
        if ticket != S - 1:
            continue                                              # not last: this CTA exits
        r = np.zeros(T, np.float32)
        for s in range(S):                                        # fixed order, whoever is last
            r = (r + ws[rb, s]).astype(np.float32)
        out[rb] = r
        stored[rb] = sidx
        if reset:
            sem[rb] = 0
    return stored


def cluster_combine(partials, order):
    """cl = 1, one launch: CTA s > 0 stores its partial into slot s - 1 of the leader's cbuf (distributed shared
    memory, garbage at launch); after the cluster barrier (every store of step 0 happens before it) the leader
    adds its own partial and slots 0..S-2 in the order s = 0..S-1. Returns out [R, T]."""
    R, S, T = partials.shape
    cbuf = np.full((R, S - 1, T), np.nan, np.float32)            # the leader's dynamic shared memory
    for rb, sidx, step in order:
        if step == 0 and sidx > 0:
            cbuf[rb, sidx - 1] = partials[rb, sidx]                # st.shared::cluster into CTA rank 0
    # barrier.cluster.arrive.release / wait.acquire: the leader reads only after every store above
    out = partials[:, 0].copy()                                   # the leader's own partial, in registers
    for s in range(1, S):
        out = (out + cbuf[:, s - 1]).astype(np.float32)
    return out


def mbarrier_combine(partials, order, wait=True):
    """cl = 2, one launch: the leader arms its mbarrier for (S - 1) x T x 4 bytes; CTA s > 0 sends its partial into
    slot s - 1 of the leader's cbuf with st.async, which completes its bytes on that mbarrier, and leaves. The
    leader sums once the count reaches 0 (wait = True); wait = False reads when its own partial is ready, a missing
    wait. Returns out [R, T]."""
    R, S, T = partials.shape
    cbuf = np.full((R, S - 1, T), np.nan, np.float32)
    pending = np.full(R, (S - 1) * T * 4)                           # mbarrier tx-count per row block
    leader_in, summed = np.zeros(R, bool), np.zeros(R, bool)
    out = np.full((R, T), np.nan, np.float32)
    for rb, sidx, step in order:
        if step != 0:
            continue
        if sidx > 0:
            cbuf[rb, sidx - 1] = partials[rb, sidx]                # st.async ... complete_tx::bytes
            pending[rb] -= T * 4
        else:
            leader_in[rb] = True                                   # the leader's own partial is summed
        if leader_in[rb] and not summed[rb] and (pending[rb] == 0 or not wait):
            o = partials[rb, 0].copy()
            for s in range(1, S):
                o = (o + cbuf[rb, s - 1]).astype(np.float32)
            out[rb], summed[rb] = o, True
    return out


def atomic_add_launch(partials, out, order):
    """The alternative: every CTA does atomicAdd(out, partial) into an fp32 buffer that must start at 0."""
    for rb, sidx, step in order:
        if step == 1:
            out[rb] = (out[rb] + partials[rb, sidx]).astype(np.float32)


# %% Check ---------------------------------------------------------------------------------------------
def main():
    rng = np.random.default_rng(5)
    R, S, T = 4, 8, 128                              # 4 row blocks, S = 8, NB*32 threads x 4 values -> 128
    # partials with a wide range of magnitudes, so that fp32 addition order matters
    partials = (rng.standard_normal((R, S, T)) * 10.0 ** rng.uniform(-3, 3, (R, S, T))).astype(np.float32)
    ref = np.zeros((R, T), np.float32)
    for s in range(S):
        ref = (ref + partials[:, s]).astype(np.float32)

    print(f"# Semaphore + fixed-order sum, RESET = {RESET}: {R} row blocks x S = {S} CTAs, {T} values each")
    ws = np.zeros((R, S, T), np.float32)
    sem = np.zeros(R, np.int64)
    out = np.zeros((R, T), np.float32)
    replays = 200                                           # one random completion order per replay
    last = set()
    n_same = 0
    for rep in range(replays):
        out[:] = np.nan                                     # poison: every element must be written
        stored = splitk_combine(partials, ws, sem, out, interleaving(rng, R, S), reset=RESET)
        last.update(stored.values())
        same = bool(np.array_equal(out.view(np.uint32), ref.view(np.uint32)))
        n_same += same
        if rep < 3:
            print(f"  replay {rep}: last CTA per row block sidx {[stored.get(rb) for rb in range(R)]}, "
                  f"sem after = {sem.tolist()}, out == fixed-order sum bit for bit: {same}")
    check(n_same == replays, f"{replays} graph replays, each with a random completion order: out bit-identical to "
                             f"ws[0] + ... + ws[{S - 1}] in {n_same} of {replays} (the storing CTA varied over "
                             f"sidx {sorted(last)})")

    print("\n# RESET = False: the ticket counter is never given back")
    ws[:] = 0
    sem = np.zeros(R, np.int64)
    lost = []
    for rep in range(3):
        out[:] = np.nan
        stored = splitk_combine(partials, ws, sem, out, interleaving(rng, R, S), reset=False)
        ok = bool(np.array_equal(out.view(np.uint32), ref.view(np.uint32)))
        lost.append(not ok)
        state = "correct" if ok else f"still poisoned (NaN): {int(np.isnan(out).sum())} values"
        print(f"  replay {rep}: tickets drawn {rep * S}..{rep * S + S - 1} per row block, CTAs that stored: "
              f"{len(stored)} of {R} row blocks, out {state}")
    check(lost == [False, True, True], f"without the reset replay 0 is right and replay 1 loses its output: "
                                       f"no CTA draws ticket S-1 = {S - 1} (they draw {S}..{2 * S - 1}), "
                                       f"out stays poisoned")

    print("\n# cl = 1: the S CTAs are one cluster; the leader sums from its shared memory")
    crng = np.random.default_rng(7)                          # its own orders: the sections below keep theirs
    outs = [cluster_combine(partials, interleaving(crng, R, S)) for _ in range(replays)]
    same = sum(bool(np.array_equal(o.view(np.uint32), ref.view(np.uint32))) for o in outs)
    print("  the leader starts from its own partial instead of 0: 0 + p == p bit for bit for every p except "
          "-0 (0 + -0 = +0), and a partial is never -0 (the MMA accumulators start at +0)")
    check(same == replays, f"cluster reduction over {replays} random store orders: bit-identical to the ticket "
                           f"path's fixed-order sum in {same} of {replays}; no workspace, no ticket, nothing to reset")

    print("\n# cl = 2: st.async into the leader's shared memory, bytes counted on its mbarrier; only the leader waits")
    outs = [mbarrier_combine(partials, interleaving(crng, R, S)) for _ in range(replays)]
    same = sum(bool(np.array_equal(o.view(np.uint32), ref.view(np.uint32))) for o in outs)
    check(same == replays, f"mbarrier reduction over {replays} random store orders: bit-identical to the ticket "
                           f"path's fixed-order sum in {same} of {replays}")
    early = [mbarrier_combine(partials, interleaving(crng, R, S), wait=False) for _ in range(replays)]
    n_bad = sum(int(np.isnan(o).any()) for o in early)
    check(n_bad > 0, f"without the mbarrier wait the leader sums slots not yet written (NaN) in {n_bad} of "
                     f"{replays} launches")

    print("\n# Alternative: atomicAdd of each partial into a zeroed fp32 output")
    results = []
    for _ in range(50):
        out_a = np.zeros((R, T), np.float32)
        atomic_add_launch(partials, out_a, interleaving(rng, R, S))
        results.append(out_a.copy())
    bits = np.stack([r.view(np.uint32) for r in results])
    n_diff = int((bits != bits[0]).any(axis=0).sum())
    distinct = max(len(set(bits[:, i, j].tolist())) for i in range(R) for j in range(T))
    a, b = results[0], next((r for r in results[1:] if not np.array_equal(r, results[0])), results[1])
    cols = [int(i) for i in np.flatnonzero((a != b).reshape(-1))[:6]]
    print(f"  {'element':>8} {'order A':>26} {'order B':>26} {'semaphore (fixed order)':>28}")
    for i in cols:
        rb, j = divmod(i, T)
        print(f"  {i:>8} {a[rb, j]:>15.8g} {hexf(a[rb, j])} {b[rb, j]:>15.8g} {hexf(b[rb, j])} "
              f"{ref[rb, j]:>17.8g} {hexf(ref[rb, j])}")
    check(n_diff > 0, f"atomic add: {n_diff} of {R * T} outputs differ bitwise across 50 completion orders "
                      f"(up to {distinct} distinct values for one output); the semaphore's never do")
    out_a = np.zeros((R, T), np.float32)
    order = interleaving(rng, R, S)
    atomic_add_launch(partials, out_a, order)
    first = out_a.copy()
    atomic_add_launch(partials, out_a, order)                # replay without a memset in between
    check(np.allclose(out_a, 2 * first, rtol=1e-5, atol=1e-6) and not np.allclose(out_a, first),
          "atomic add without zeroing before the replay returns about twice the answer: it needs a memset per call")
    print("lab5: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
