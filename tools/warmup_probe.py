"""Is the first timing after a prepare slow, and why? The same case timed as SPEC times it (judge.per_call_us: P copies
>= 2 GB, one graph, 3 warm-up replays, median of the replays) several times in a row right after its preparation,
again after the GPU has idled, and once after a long warm-up, with the SM clock sampled by nvidia-smi all along.

    python3 tools/warmup_probe.py llama3-8b.gate_up:1:wseed=99:xseed=100 gemma-2b.gate_up:8:wseed=99:xseed=107

Why (session 23): tools/ab.py's first choice of round 1 read 49.3 us on llama3-8b.gate_up m=1 and the same config
44.0 us in round 2 (gemma-2b.gate_up m=8: 27.7 against 24.9); every later choice repeated its time. judge.py times a
row once, first after the layer's prepare, so such a shape's score moves with it (llama3-8b.gate_up m=1 read 43.9 and
48.7 us in two runs of the same config, S23c1).
Per case, one line per timing: its label, us, and the SM clock (MHz) nvidia-smi reported while it ran (min / median).
"""
import os
import statistics
import subprocess
import sys
import time

import torch

import cases

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import judge  # noqa: E402
import submission as S  # noqa: E402

REPLAYS = 15


class Clocks:
    """nvidia-smi sampling the SM clock every 20 ms in the background: samples() -> [(wall time, MHz)]."""

    def __init__(self):
        self.p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-lms",
                                   "20"], stdout=subprocess.PIPE, text=True, bufsize=1)
        self.got = []
        import threading
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            try:
                self.got.append((time.time(), int(line.strip())))
            except ValueError:
                pass

    def between(self, t0, t1):
        return [c for t, c in self.got if t0 <= t <= t1]

    def stop(self):
        self.p.terminate()


def timed(label, Ls, x, clocks, log):
    t0 = time.time()
    us = judge.per_call_us(S.kernel_fn, Ls, x, REPLAYS)
    cs = clocks.between(t0, time.time())
    clk = f"{min(cs)} / {statistics.median(cs):.0f} MHz" if cs else "no clock sample"
    log(f"{label:28s} {us:8.2f} us   SM clock {clk}")
    return us


def main(argv):
    if not argv or not torch.cuda.is_available():
        print(__doc__ if not argv else "[warmup] needs a CUDA device")
        return 1
    clocks = Clocks()
    log = lambda s: print(f"[warmup] {s}", flush=True)   # noqa: E731
    try:
        for spec in argv:
            t0 = time.time()
            Ls, m, x = cases.prepare(spec)
            torch.cuda.synchronize()
            log(f"{spec}: {len(Ls)} copies prepared in {time.time() - t0:.1f} s; {Ls[0].plan(m).why[:90]}")
            for i in range(5):
                timed(f"{spec.split(':')[0]} after prepare #{i + 1}", Ls, x, clocks, log)
            time.sleep(2.0)
            for i in range(2):
                timed(f"after 2 s idle #{i + 1}", Ls, x, clocks, log)
            time.sleep(2.0)
            g, _ = judge.capture(lambda Ls=Ls: [S.kernel_fn(x, L) for L in Ls])
            t1 = time.time()
            while time.time() - t1 < 0.3:                  # 300 ms of the same work before the timing
                g.replay()
                torch.cuda.synchronize()
            timed("after 2 s idle + 300 ms busy", Ls, x, clocks, log)
            del Ls, g
            torch.cuda.empty_cache()
    finally:
        clocks.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
