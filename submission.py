"""MUSE BF16 GEMV for the NVIDIA H200: y = x @ W.T for a few tokens (1 <= m <= 32), exact BF16 weights.

    import submission                                # compiles the CUDA extension once (cached by torch)
    layer = submission.prepare("pooler", weight)     # weight: CUDA [N, K] bf16, or fp32 (router-style)
    y = submission.kernel_fn(x, layer)               # x: CUDA bf16 [m, K], contiguous
    print(layer.describe())                          # which path and config each m takes, and why

Three CUDA kernels, chosen per (layer, m) from the tuned tables below (the default rule elsewhere):
  * gemv_kernel  - plain BF16 tensor-core GEMV over fragment-ordered weights; DUAL=true is the router's
                   fp32 path (hi + lo bf16 halves into fp32 accumulators, fp32 output).      csrc/gemv.cuh
  * gemvz_kernel - the same GEMV over a lossless 12-bit format (25% fewer bytes) with one extra warp that
                   applies the exact corrections of the rare out-of-window weights.          csrc/gemvz.cuh
  * gemvt_kernel - a TMA ring of weight tiles and x, warpgroup MMA (bf16 weights).           csrc/gemvt.cuh
All split K over S CTAs inside one launch (semaphore + fixed-order sum, or a thread-block cluster) and use
programmatic dependent launch (PDL) so back-to-back calls overlap their fixed start-up cost. MUSE_PDL=0 turns PDL
off. An optional Triton path (tri_gemv) runs where prepare(path="triton") asks for it.

This file imports torch and the standard library only (triton if installed). It is assembled by build.py: the
CUDA source from csrc/, the table literals and the instantiation lines from tables/*.json. Edit those, then run
`python3 build.py`.
"""
import collections
import functools
import json
import math
import os
import sys
import time

import torch

# ---------------------------------------------------------------------------------------------------
# Configs. Field names and order follow the template parameters; NB (token blocks) and DUAL (router) are not part
# of a config: NB follows from m (nb_of) and DUAL from the weight's dtype. Runtime fields: s, the CTAs per row group
# (split-K); pf, an L2 prefetch of each warp's slice before griddepcontrol.wait (0/1); pdl (1: launch with PDL when
# the layer has it on; 0: this config measured faster without); cl, the split-K reduction (0: a global workspace and
# a ticket; 1: the S CTAs of a row group form a thread-block cluster and reduce in distributed shared memory behind a
# cluster barrier; 2: the same cluster, the partials sent with st.async and counted on the leader's mbarrier); co, the
# shared memory carveout the launch asks for (percent of the SM's unified L1 / shared memory; -1: the driver's
# choice, the best on every shape swept).
# ---------------------------------------------------------------------------------------------------
# gemv_kernel<NW, U, NB, R, DUAL, PIPE> (csrc/gemv.cuh): nw warps, u K-blocks a trip, r row blocks a warp, pipe 0..5
GemvConfig = collections.namedtuple("GemvConfig", "nw s u r pipe pf pdl cl co", defaults=(1, 0, -1))
# gemvz_kernel<NW, UG, NB, R, PIPE> (csrc/gemvz.cuh): the same over the 12-bit stream, ug 64-wide groups a trip
GemvzConfig = collections.namedtuple("GemvzConfig", "nw s ug r pipe pf pdl cl co", defaults=(1, 0, -1))
# gemvt_kernel<NW, ST, NB, KA> (csrc/gemvt.cuh): nw consumer warps (whole warpgroups, 16 nw rows a CTA), a ring of st
# stages of ka 64-k tiles; bf16 weights only; the ring is its prefetch (no pf)
GemvtConfig = collections.namedtuple("GemvtConfig", "nw s st ka pdl cl co", defaults=(1, 0, -1))

# The Triton path (tri_gemv): bn weight rows per program, K step bk of one tl.dot, s split-K programs per column
# block, Triton's num_warps / num_stages, mode "ticket" (fixed-order sum: deterministic) or "atomic" (fp32
# atomics into a zeroed buffer: the summation order varies), pdl as above.
TritonConfig = collections.namedtuple("TritonConfig", "bn bk s warps stages mode pdl", defaults=(1,))

# Default rule for a (layer, m) that no table row covers (see default_config): the first of these
# (nw, u|ug, r, pipe) whose divisibility constraints hold. build.py compiles all of them for every NB.
DEFAULT_GEMV = [(4, 1, 1, 2), (2, 1, 1, 2)]
DEFAULT_GEMVZ = [(4, 1, 1, 2)]
SMEM_LIMIT = 48 * 1024        # static + dynamic shared memory of one CTA (no opt-in attribute needed)
MAX_CLUSTER = 16              # CTAs per cluster: 8 is portable, 16 needs the non-portable opt-in (sm_90)
MAX_M = 32                    # token blocks of 8: NB in {1, 2, 4}
TARGET_CTAS = 264             # the default rule splits K until there are two CTAs per SM (132 SMs)

# The compressed path pays while the exception warp's walk hides under the stream. Where it stops paying was measured
# (tools/format_bench.py, results/format-2026-12-01-s17call2-6033229.json: Gaussian weights with 0.1% / 0.2% planted
# out-of-window weights against trained-looking ones, both paths timed; FINDINGS.md section 19): at m <= 8 between
# 0.08% (qkv_gate: 2304 rows, few CTAs) and 0.25-0.3% (unpooler) of weights out of window, at m = 16 between 0.06%
# (pooler) and 0.13% (unpooler). Neither the rate nor the exceptions per row alone predicts it across the four shapes
# (pooler and qkv_gate have the same K and rate and differ), so the tuned shapes carry their own measured limits,
# EXC_RATE_LIMITS_BY_SHAPE (break-even less about 10%), and any other shape the smallest measured ones. A layer above
# the limit of an m range runs plain there (the worst row: CAPR_LIMITS below); a layer over the limits of every m is not
# compressed at all (MAX_EXC_RATE, MAX_CAPR); describe() says which m took which path and why.
# Trained-looking weights: 0.03-0.05%.
EXC_RATE_LIMITS = ((8, 0.0008), (32, 0.0006))   # (largest m, largest share of exceptions): any shape
EXC_RATE_LIMITS_BY_SHAPE = {                     # (N, K): the measured break-evens of the tuned shapes, less ~10%
    (2304, 8192): ((8, 0.0008), (32, 0.0006)),   # qkv_gate: 0.084-0.090% at m <= 8
    (8192, 2048): ((8, 0.0014), (32, 0.0009)),   # o_proj: 0.16-0.20% at m <= 8, 0.10% at m = 16
    (4096, 8192): ((8, 0.0012), (32, 0.0006)),   # pooler: 0.13-0.16% at m <= 8, 0.064% at m = 16
    (8192, 4096): ((8, 0.0023), (32, 0.0012)),   # unpooler: 0.25-0.30% at m <= 8, 0.13% at m = 16
}
MAX_EXC_RATE = max(r for lim in (EXC_RATE_LIMITS, *EXC_RATE_LIMITS_BY_SHAPE.values()) for _, r in lim)
# The worst row counts too, whatever the rate. The exception warp's per-row walk gives a row to one lane, and past a few
# dozen exceptions in one row that lane's chain outlasts the CTA's stream. Measured (tools/capr_probe.py, H200, session
# 19; FINDINGS 22): trained-looking gemma-2b.down (2048 x 16384, 0.037% out of window) with exceptions planted in one
# row ran compressed / plain at m = 1: capr 15 12.8 / 17.5 us, 41 14.2 / 17.4, 73 18.5 / 17.6, 88 20.1 / 17.4; at
# m = 16: 15.5 / 20.6, 18.7 / 20.5, 25.8 / 20.6, 28.7 / 20.6. CAPR_LIMITS are those break-evens less ~15%. Above the
# limit of an m range the layer takes the cooperative walk (gemvz PIPE + 8, coop_walk in csrc/gemvz.cuh): the CTA's
# entries dealt to the 32 lanes in contiguous pieces, so its chain is the CTA's rows' entries / 32 instead of the worst
# row's (session 22, FINDINGS 25: capr 73-89 ran 12.8-13.0 us at gemma-2b.down m = 1 and 15.5-15.9 at m = 16, as with
# no planted row; it costs 0.4-1.6 us on qwen2-7b.down's PIPE 0 / 2 rows where no row is long, so it is not the
# default). Where even that chain (coop_chain) is over the limit, the m range runs plain; over MAX_CAPR at every R the
# layer is not compressed at all. Trained-looking weights (judge.py's seed): capr 4-21 on the scored, public and holdout
# shapes; heavy-tailed (Student-t, 3 dof) draws reach 126-176 on long-K layers (gemma-2b.down, llama3-8b.down,
# qwen2-7b.down: those went plain before the cooperative walk, 1.06x / 0.945x cuBLAS at qwen2-7b.down / llama3-8b.down).
CAPR_LIMITS = ((8, 56), (32, 40))               # (largest m, longest chain of exceptions one lane walks)
MAX_CAPR = max(c for _, c in CAPR_LIMITS)

# ---- BEGIN GENERATED by build.py from tables/ctable.json: edit the table, not this ----
CTABLE = {
    ("router", 1): GemvConfig(nw=16, s=8, u=2, r=2, pipe=3, pf=0, pdl=1, cl=2),  # 2.49 us, runner-up 2.82 us
    ("router", 2): GemvConfig(nw=16, s=8, u=2, r=2, pipe=3, pf=0, pdl=1, cl=2),  # 2.52 us, runner-up 2.84 us
    ("router", 4): GemvConfig(nw=16, s=8, u=2, r=2, pipe=3, pf=0, pdl=1, cl=2),  # 2.55 us, runner-up 2.88 us
    ("router", 8): GemvConfig(nw=16, s=8, u=2, r=2, pipe=3, pf=0, pdl=1, cl=2),  # 2.64 us, runner-up 3.07 us
    ("router", 16): GemvConfig(nw=16, s=8, u=2, r=2, pipe=0, pf=1, pdl=1, cl=2),  # 3.18 us, runner-up 3.19 us
    ("router", 32): GemvConfig(nw=8, s=8, u=1, r=1, pipe=4, pf=0, pdl=1, cl=2),  # 5.29 us, runner-up 5.29 us
    ("qkv_gate", 1): GemvConfig(nw=4, s=4, u=4, r=1, pipe=1, pf=0, pdl=1, cl=2),  # 9.72 us, runner-up 9.87 us
    ("qkv_gate", 2): GemvConfig(nw=4, s=4, u=4, r=1, pipe=1, pf=0, pdl=1, cl=2),  # 9.69 us, runner-up 9.78 us
    ("qkv_gate", 4): GemvConfig(nw=8, s=8, u=2, r=2, pipe=3, pf=0, pdl=1, cl=2),  # 9.86 us, runner-up 9.86 us
    ("qkv_gate", 8): GemvtConfig(nw=4, s=6, st=4, ka=2, pdl=1, cl=2),  # 9.94 us, runner-up 9.95 us
    ("qkv_gate", 16): GemvConfig(nw=4, s=4, u=4, r=1, pipe=3, pf=0, pdl=1, cl=2),  # 10.13 us, runner-up 10.14 us
    ("qkv_gate", 32): GemvtConfig(nw=4, s=3, st=4, ka=2, pdl=1, cl=2),  # 10.97 us, runner-up 11.06 us
    ("o_proj", 1): GemvConfig(nw=8, s=2, u=2, r=2, pipe=0, pf=0, pdl=1, cl=2),  # 7.89 us, runner-up 8.21 us
    ("o_proj", 2): GemvConfig(nw=8, s=2, u=2, r=2, pipe=0, pf=0, pdl=1, cl=2),  # 7.96 us, runner-up 8.36 us
    ("o_proj", 4): GemvConfig(nw=8, s=2, u=2, r=2, pipe=0, pf=0, pdl=1, cl=2),  # 7.84 us, runner-up 8.29 us
    ("o_proj", 8): GemvConfig(nw=8, s=2, u=2, r=2, pipe=0, pf=0, pdl=1, cl=2),  # 7.80 us, runner-up 8.36 us
    ("o_proj", 16): GemvConfig(nw=4, s=2, u=2, r=2, pipe=4, pf=0, pdl=1, cl=2),  # 8.72 us, runner-up 8.75 us
    ("o_proj", 32): GemvtConfig(nw=4, s=1, st=8, ka=2, pdl=1, cl=0),  # 9.72 us, runner-up 10.01 us
    ("pooler", 1): GemvConfig(nw=16, s=1, u=4, r=2, pipe=3, pf=0, pdl=1, cl=0),  # 15.52 us, runner-up 15.62 us
    ("pooler", 2): GemvConfig(nw=16, s=1, u=4, r=2, pipe=3, pf=0, pdl=1, cl=0),  # 15.55 us, runner-up 15.81 us
    ("pooler", 4): GemvConfig(nw=16, s=1, u=4, r=2, pipe=3, pf=0, pdl=1, cl=0),  # 15.72 us, runner-up 15.97 us
    ("pooler", 8): GemvtConfig(nw=4, s=2, st=12, ka=2, pdl=1, cl=2),  # 15.88 us, runner-up 15.97 us
    ("pooler", 16): GemvConfig(nw=8, s=2, u=4, r=2, pipe=3, pf=0, pdl=1, cl=2),  # 16.38 us, runner-up 16.58 us
    ("pooler", 32): GemvtConfig(nw=4, s=2, st=8, ka=2, pdl=1, cl=2),  # 16.75 us, runner-up 17.24 us
    ("unpooler", 1): GemvConfig(nw=8, s=2, u=2, r=2, pipe=0, pf=0, pdl=1, cl=2),  # 15.46 us, runner-up 15.52 us
    ("unpooler", 2): GemvConfig(nw=8, s=2, u=2, r=2, pipe=0, pf=0, pdl=1, cl=2),  # 15.53 us, runner-up 15.55 us
    ("unpooler", 4): GemvtConfig(nw=4, s=1, st=12, ka=2, pdl=1, cl=0),  # 15.45 us, runner-up 15.55 us
    ("unpooler", 8): GemvtConfig(nw=4, s=1, st=12, ka=2, pdl=1, cl=0),  # 15.36 us, runner-up 15.45 us
    ("unpooler", 16): GemvtConfig(nw=4, s=2, st=4, ka=2, pdl=1, cl=2),  # 16.11 us, runner-up 16.14 us
    ("unpooler", 32): GemvtConfig(nw=4, s=1, st=8, ka=2, pdl=1, cl=0),  # 16.68 us, runner-up 17.06 us
}
# ---- END GENERATED ----

# ---- BEGIN GENERATED by build.py from tables/ttable.json: edit the table, not this ----
TTABLE = {
    ("router", 1): TritonConfig(bn=32, bk=256, s=32, warps=4, stages=3, mode="ticket", pdl=0),  # 5.67 us, runner-up 5.90 us
    ("router", 2): TritonConfig(bn=32, bk=256, s=32, warps=4, stages=3, mode="ticket", pdl=0),  # 5.64 us, runner-up 5.93 us
    ("router", 4): TritonConfig(bn=32, bk=256, s=32, warps=4, stages=3, mode="ticket", pdl=0),  # 5.83 us, runner-up 5.90 us
    ("router", 8): TritonConfig(bn=32, bk=256, s=32, warps=4, stages=3, mode="ticket", pdl=1),  # 5.96 us, runner-up 5.99 us
    ("router", 16): TritonConfig(bn=32, bk=256, s=32, warps=4, stages=3, mode="ticket", pdl=1),  # 6.17 us, runner-up 6.27 us
    ("router", 32): TritonConfig(bn=32, bk=256, s=32, warps=4, stages=3, mode="ticket", pdl=1),  # 6.73 us, runner-up 8.08 us
    ("qkv_gate", 1): TritonConfig(bn=64, bk=128, s=8, warps=4, stages=3, mode="ticket", pdl=0),  # 8.90 us, runner-up 10.49 us
    ("qkv_gate", 2): TritonConfig(bn=64, bk=128, s=8, warps=4, stages=3, mode="ticket", pdl=0),  # 9.07 us, runner-up 10.53 us
    ("qkv_gate", 4): TritonConfig(bn=64, bk=128, s=8, warps=4, stages=3, mode="ticket", pdl=0),  # 9.16 us, runner-up 10.59 us
    ("qkv_gate", 8): TritonConfig(bn=64, bk=128, s=8, warps=4, stages=3, mode="ticket", pdl=0),  # 9.47 us, runner-up 10.82 us
    ("qkv_gate", 16): TritonConfig(bn=64, bk=256, s=4, warps=4, stages=3, mode="ticket", pdl=0),  # 14.40 us, runner-up 14.48 us
    ("qkv_gate", 32): TritonConfig(bn=32, bk=256, s=4, warps=4, stages=3, mode="ticket", pdl=0),  # 15.98 us, runner-up 16.10 us
    ("o_proj", 1): TritonConfig(bn=64, bk=256, s=2, warps=4, stages=3, mode="ticket", pdl=1),  # 7.10 us, runner-up 7.55 us
    ("o_proj", 2): TritonConfig(bn=64, bk=256, s=2, warps=4, stages=3, mode="ticket", pdl=1),  # 7.16 us, runner-up 7.53 us
    ("o_proj", 4): TritonConfig(bn=64, bk=256, s=2, warps=4, stages=3, mode="ticket", pdl=1),  # 7.21 us, runner-up 7.74 us
    ("o_proj", 8): TritonConfig(bn=64, bk=256, s=2, warps=4, stages=3, mode="ticket", pdl=1),  # 7.37 us, runner-up 7.82 us
    ("o_proj", 16): TritonConfig(bn=32, bk=256, s=1, warps=4, stages=3, mode="ticket", pdl=0),  # 10.79 us, runner-up 10.84 us
    ("o_proj", 32): TritonConfig(bn=64, bk=256, s=2, warps=4, stages=3, mode="ticket", pdl=1),  # 11.80 us, runner-up 11.91 us
    ("pooler", 1): TritonConfig(bn=64, bk=256, s=4, warps=4, stages=3, mode="ticket", pdl=1),  # 18.58 us, runner-up 19.37 us
    ("pooler", 2): TritonConfig(bn=64, bk=256, s=4, warps=4, stages=3, mode="ticket", pdl=1),  # 18.93 us, runner-up 19.35 us
    ("pooler", 4): TritonConfig(bn=64, bk=256, s=4, warps=4, stages=3, mode="ticket", pdl=1),  # 18.85 us, runner-up 19.49 us
    ("pooler", 8): TritonConfig(bn=64, bk=256, s=4, warps=4, stages=3, mode="ticket", pdl=1),  # 19.03 us, runner-up 19.75 us
    ("pooler", 16): TritonConfig(bn=64, bk=256, s=4, warps=4, stages=3, mode="ticket", pdl=1),  # 19.54 us, runner-up 20.24 us
    ("pooler", 32): TritonConfig(bn=32, bk=256, s=2, warps=4, stages=3, mode="ticket", pdl=0),  # 21.48 us, runner-up 22.24 us
    ("unpooler", 1): TritonConfig(bn=64, bk=256, s=2, warps=4, stages=3, mode="ticket", pdl=1),  # 18.27 us, runner-up 18.98 us
    ("unpooler", 2): TritonConfig(bn=64, bk=256, s=2, warps=4, stages=3, mode="ticket", pdl=1),  # 18.42 us, runner-up 19.28 us
    ("unpooler", 4): TritonConfig(bn=64, bk=256, s=2, warps=4, stages=3, mode="ticket", pdl=1),  # 18.59 us, runner-up 19.41 us
    ("unpooler", 8): TritonConfig(bn=64, bk=256, s=2, warps=4, stages=3, mode="ticket", pdl=1),  # 18.95 us, runner-up 19.60 us
    ("unpooler", 16): TritonConfig(bn=64, bk=256, s=2, warps=4, stages=3, mode="ticket", pdl=1),  # 19.24 us, runner-up 19.72 us
    ("unpooler", 32): TritonConfig(bn=32, bk=256, s=1, warps=4, stages=3, mode="ticket", pdl=0),  # 20.84 us, runner-up 21.32 us
}
TPICK = frozenset()
# ---- END GENERATED ----

# ---- BEGIN GENERATED by build.py from tables/shapes.json: edit the table, not this ----
# the tabled layers' shapes: a layer of the same shape and dtype takes their rows (table_name)
TABLE_SHAPES = {
    "router": (256, 8192, "fp32"),
    "qkv_gate": (2304, 8192, "bf16"),
    "o_proj": (8192, 2048, "bf16"),
    "pooler": (4096, 8192, "bf16"),
    "unpooler": (8192, 4096, "bf16"),
}
# ---- END GENERATED ----

# ---- BEGIN GENERATED by build.py from tables/ztable.json: edit the table, not this ----
ZTABLE = {
    ("qkv_gate", 1): GemvzConfig(nw=8, s=4, ug=1, r=2, pipe=0, pf=0, pdl=1, cl=2),  # 8.17 us, runner-up 8.32 us
    ("qkv_gate", 2): GemvzConfig(nw=8, s=4, ug=1, r=2, pipe=0, pf=0, pdl=1, cl=2),  # 8.14 us, runner-up 8.30 us
    ("qkv_gate", 4): GemvzConfig(nw=8, s=4, ug=1, r=2, pipe=0, pf=0, pdl=1, cl=2),  # 8.16 us, runner-up 8.30 us
    ("qkv_gate", 8): GemvzConfig(nw=8, s=4, ug=1, r=2, pipe=0, pf=0, pdl=1, cl=2),  # 8.36 us, runner-up 8.53 us
    ("qkv_gate", 16): GemvzConfig(nw=4, s=4, ug=1, r=2, pipe=4, pf=0, pdl=1, cl=2),  # 9.21 us, runner-up 9.22 us
    ("o_proj", 1): GemvzConfig(nw=8, s=1, ug=2, r=2, pipe=3, pf=0, pdl=1, cl=0),  # 6.41 us, runner-up 6.49 us
    ("o_proj", 2): GemvzConfig(nw=8, s=1, ug=1, r=2, pipe=4, pf=0, pdl=1, cl=0),  # 6.63 us, runner-up 6.66 us
    ("o_proj", 4): GemvzConfig(nw=8, s=1, ug=1, r=2, pipe=4, pf=0, pdl=1, cl=0),  # 6.56 us, runner-up 6.60 us
    ("o_proj", 8): GemvzConfig(nw=8, s=1, ug=1, r=2, pipe=4, pf=0, pdl=1, cl=0),  # 6.56 us, runner-up 6.58 us
    ("o_proj", 16): GemvzConfig(nw=4, s=1, ug=2, r=2, pipe=2, pf=0, pdl=1, cl=0),  # 7.39 us, runner-up 7.43 us
    ("pooler", 1): GemvzConfig(nw=16, s=1, ug=1, r=2, pipe=4, pf=0, pdl=1, cl=0),  # 12.58 us, runner-up 12.62 us
    ("pooler", 2): GemvzConfig(nw=16, s=1, ug=1, r=2, pipe=4, pf=0, pdl=1, cl=0),  # 12.52 us, runner-up 12.72 us
    ("pooler", 4): GemvzConfig(nw=16, s=1, ug=1, r=2, pipe=4, pf=0, pdl=1, cl=0),  # 12.52 us, runner-up 12.74 us
    ("pooler", 8): GemvzConfig(nw=16, s=1, ug=1, r=2, pipe=4, pf=0, pdl=1, cl=0),  # 12.72 us, runner-up 12.81 us
    ("pooler", 16): GemvzConfig(nw=4, s=2, ug=2, r=2, pipe=1, pf=0, pdl=1, cl=2),  # 13.93 us, runner-up 13.94 us
    ("unpooler", 1): GemvzConfig(nw=8, s=1, ug=1, r=2, pipe=5, pf=0, pdl=1, cl=0),  # 12.37 us, runner-up 12.39 us
    ("unpooler", 2): GemvzConfig(nw=8, s=1, ug=1, r=2, pipe=5, pf=0, pdl=1, cl=0),  # 12.41 us, runner-up 12.51 us
    ("unpooler", 4): GemvzConfig(nw=8, s=1, ug=1, r=2, pipe=4, pf=0, pdl=1, cl=0),  # 12.40 us, runner-up 12.45 us
    ("unpooler", 8): GemvzConfig(nw=8, s=1, ug=1, r=2, pipe=5, pf=0, pdl=1, cl=0),  # 12.55 us, runner-up 12.62 us
    ("unpooler", 16): GemvzConfig(nw=4, s=1, ug=2, r=2, pipe=2, pf=0, pdl=1, cl=0),  # 13.64 us, runner-up 13.77 us
}
# ---- END GENERATED ----


# ===================================================================================================
# CUDA source, inlined by build.py from csrc/ (edit csrc/, then run `python3 build.py`). KERNEL_SRC is plain CUDA
# C++: csrc/kernels.cu with the headers it includes, each once (nvcc alone compiles it: tests/test_compile.py does,
# for sm_90a, on a CPU machine). BIND_SRC is the pybind11 glue (csrc/bind.cpp with csrc/args.h), compiled by the
# host compiler; it includes no torch header.
# ===================================================================================================
# ---- BEGIN GENERATED by build.py from csrc/kernels.cu: edit csrc/, not this ----
KERNEL_SRC = r"""
// MUSE BF16 GEMV kernels for sm_90a (an H100 / H200: wgmma is arch-specific). This file and the headers it includes
// are the whole device source: tests compile it with nvcc directly; build.py inlines it (this order, each header
// once) into submission.py's KERNEL_SRC, the string the upload compiles with load_inline.
//   ptx.cuh     one wrapper per PTX instruction
//   common.cuh  x loads, the warps' reduction, split-K combine (ticket / cluster), store, MUSE_TRACE hooks
//   gemv.cuh    gemv_kernel: plain BF16 (and the router's fp32 as hi + lo), PIPE 0..5
//   gemvz.cuh   the 12-bit format (decz), gemvz_kernel with its exception warp, unpackz_kernel
//   gemvt.cuh   gemvt_kernel: TMA ring + warpgroup MMA (GemvtConfig)
//   launch.cuh  launch_pdl, opt-ins, TMA descriptors, launchers, dispatchers; configs.cuh (generated) inside
// launch.cuh: host side. Per-kernel opt-ins, the one launch function (PDL, clusters, carveout), TMA descriptors,
// one launcher per kernel family, and the dispatchers that map a runtime config onto a compiled instantiation
// (configs.cuh, generated by build.py from tables/).
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <mutex>
#include <utility>
#include <vector>

// gemv.cuh: the plain BF16 GEMV (PIPE 0..5) and its weight loader.
// common.cuh: the pieces gemv_kernel, gemvz_kernel and gemvt_kernel share: x loads, the warps' reduction, the
// split-K combine (global ticket or thread-block cluster), the store, and the MUSE_TRACE hooks.
// defines: land_before_wait, load_xbatch, sum_warps, splitk_combine, cluster_combine, cluster_start, store_tile,
//          MIN_BLOCKS, MuseTrace / TR_* (MUSE_TRACE builds), combine_store
// args.h: what one launch hands its kernel besides the template parameters: one struct for the three kernel families,
// shared by the device source and the Python glue (bind.cpp), so a new field is written here and filled in bind.cpp.
// Plain C++ (pointers as void*): the glue is compiled by the host compiler without CUDA's headers.
#include <stdint.h>

struct GemvArgs {
  const void* x;     // bf16 [M, K] row-major, 16-byte aligned (gemvt: the pointer of its TMA descriptor)
  const void* w;     // the layer's weight as the kernel reads it: pack_plain (gemv), pack_z's stream (gemvz), pack_tma's
                     // tiles (gemvt)
  const void* w2;    // gemv with DUAL: the router's lo half, packed like w; else unused
  void* out;         // [M, N]: bf16, fp32 for DUAL
  void* ws;          // float4 split-K partials (cl = 0 and S > 1)
  void* sem;         // int32 split-K tickets (cl = 0 and S > 1), zero between calls: every call leaves them so
  int M, N, K;       // tokens, rows, columns
  int S;             // CTAs per row group (split-K)
  int pf;            // gemv / gemvz: 1 = L2 prefetch of each warp's slice before griddepcontrol.wait
  int cl;            // split-K reduction: 0 global ticket, 1 cluster barrier, 2 cluster mbarrier (st.async)
  const void* eptr;  // gemvz: the side table's row offsets, int32 [N + 1]; else unused
  const void* esc;   // gemvz: the side table's entries, int2 {k, fp32 bits of the correction}; else unused
  const void* zbase; // gemvz: each row's window, uint8 [N]: row r's 8 classes are zbase[r] .. zbase[r] + 7
};
// The order is gemv_kernel's parameter list before the struct (x .. cl). The kernels take it as a __grid_constant__
// parameter: read in place from the parameter space. Taken by plain value, the router's m = 32 kernel (gemv 8, 1, 4,
// 1, DUAL, PIPE 4) went from 120 to 136 registers, one CTA an SM instead of two, and 5.3 -> 7.5 us with its clusters
// of 8 in two waves (device call 1 of session 16, FINDINGS.md "House"); with __grid_constant__ its code is
// byte-identical to the positional parameters' again, and no kernel changed its register allocation granule.
// ptx.cuh: one small device function per PTX instruction the kernels use, each with its reason.
// defines: ld_stream, ld_x, ld_x1_if, ld_esc_if, mma16816, prmt, pdl_trigger, pdl_wait,
//          named_bar_arrive1, named_bar_sync1, cluster_arrive_relaxed / _release, cluster_wait_acquire, cluster_rank,
//          map_shared, st_cluster, cluster_mbar, mbar_init_expect, st_async, mbar_wait0, prefetch_l2, smem_u32,
//          mbar_init, mbar_expect_tx, mbar_arrive, mbar_wait, bulk_load, policy_evict_first, tma_load_2d, wg_fence,
//          wg_commit, wg_wait0, wg_wait1, wg_pin, wg_desc, wgmma_ss
#include <cuda.h>  // CUtensorMap (gemvt_kernel's TMA descriptors; the driver entry point is fetched at run time)
#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;

// Weights are read exactly once: non-coherent path, no L1 allocation (L1 stays free for x).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// x is read by every CTA of the launch: the cached read-only path (L1 + L2), 16 bytes = 8 tokens' k.
#ifdef MUSE_ABL_NOX  // timing only (tools/ab.py, FINDINGS 25): no x load, constant fragments; wrong on purpose
__device__ __forceinline__ uint4 ld_x(const bf16* p) {
  return make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, (uint32_t)(size_t)p & 0x3f803f80u);
}
#else
__device__ __forceinline__ uint4 ld_x(const bf16* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
#endif

// gemvz's exception warp, R >= 2: one x value (0 when !on) and one side-table entry (dflt when !on), each a
// predicated load in the PTX, so no branch goes around it. Both volatile: they stay after pdl_wait (an entry load
// before the wait lengthened the warp's chain in session 12's call 4).
__device__ __forceinline__ float ld_x1_if(const bf16* p, bool on) {
  unsigned short v = 0;
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q ld.global.u16 %0, [%1];\n}" : "+h"(v) : "l"(p), "r"((int)on));
  return __bfloat162float(__ushort_as_bfloat16(v));
}
__device__ __forceinline__ int2 ld_esc_if(const int2* p, bool on, int2 dflt) {
  int a = dflt.x, b = dflt.y;
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %3, 0;\n@q ld.global.nc.v2.s32 {%0, %1}, [%2];\n}"
      : "+r"(a), "+r"(b) : "l"(p), "r"((int)on));
  return make_int2(a, b);
}

// D += A.B on the tensor cores: A = 16 weight rows x 16 k (8 bf16 per lane), B = 16 k x 8 tokens.
__device__ __forceinline__ void mma16816(float (&d)[4], uint4 a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// Byte permute: byte i of the result is byte (sel nibble i & 7) of {b, a}; nibble bit 3 = sign mode.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}


// PDL: let the next kernel of the stream be scheduled now (its CTAs take SMs as ours retire).
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// PDL: wait until the previous kernel has finished and its writes are visible. Everything a previous
// kernel may write or read (x, out, ws, sem) is touched only after this; weights may be read before.
#ifdef MUSE_ABL_NOWAIT  // timing only (tools/ab.py, FINDINGS 25): no dependency on the previous launch
__device__ __forceinline__ void pdl_wait() {}
#else
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
#endif

// Named barrier 1 (0 is __syncthreads): n threads in all, arrivals from some warps and a sync in others.
__device__ __forceinline__ void named_bar_arrive1(int n) { asm volatile("bar.arrive 1, %0;" ::"r"(n) : "memory"); }
__device__ __forceinline__ void named_bar_sync1(int n) { asm volatile("bar.sync 1, %0;" ::"r"(n) : "memory"); }

// Thread-block clusters (cl = 1: the S CTAs of a row group form one cluster and reduce through distributed
// shared memory instead of the global workspace). Each thread arrives once per barrier phase; a wait
// returns when every non-exited thread of the cluster has arrived.
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait_acquire() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// The shared::cluster address of our shared-memory object p in the cluster's CTA `rank`.
__device__ __forceinline__ uint32_t map_shared(const void* p, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"((uint32_t)__cvta_generic_to_shared(p)), "r"(rank));
  return r;
}

__device__ __forceinline__ void st_cluster(uint32_t addr, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

// cl = 2: the leader's mbarrier counts the bytes the other CTAs send with st.async (one per CTA: a __shared__
// variable of a device function is one object per CTA).
__device__ __forceinline__ unsigned long long* cluster_mbar() {
  __shared__ unsigned long long bar;
  return &bar;
}

// Leader, kernel start: one expected arrival (its own, made here with the byte count it will wait for), then the
// fence that makes the initialised barrier visible to the cluster before the start-up cluster arrive.
__device__ __forceinline__ void mbar_init_expect(unsigned long long* b, uint32_t bytes) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(b);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Store 16 bytes into another CTA's shared memory; their arrival is counted on that CTA's mbarrier (rbar).
__device__ __forceinline__ void st_async(uint32_t addr, float4 v, uint32_t rbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
               ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rbar) : "memory");
}

// Wait for phase 0 of our mbarrier (every expected byte has arrived); acquire at cluster scope.
__device__ __forceinline__ void mbar_wait0(unsigned long long* b) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(b);
  uint32_t done;
  do {
    asm volatile("{\n .reg .pred q;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 q, [%1], 0;\n"
                 " selp.u32 %0, 1, 0, q;\n}" : "=r"(done) : "r"(a) : "memory");
  } while (!done);
}

// Ask L2 to fetch [p, p + bytes) from HBM now: one instruction, no registers held until the data is
// used. Weights are constant after prepare, so this may run before pdl_wait (pf = 1: the warp's slice).
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned long long* b, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
// One arrival that also raises the phase's expected transaction count by `bytes` (the copies count them down).
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
// Wait until the phase with this parity has completed (acquire, CTA scope).
__device__ __forceinline__ void mbar_wait(unsigned long long* b, uint32_t parity) {
  const uint32_t a = smem_u32(b);
  uint32_t done;
  do {
    asm volatile("{\n .reg .pred q;\n mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2;\n selp.u32 %0, 1, 0, q;\n}"
                 : "=r"(done) : "r"(a), "r"(parity) : "memory");
  } while (!done);
}
// Bulk copy (TMA, no descriptor) of `bytes` contiguous bytes into shared memory at dst; they complete_tx on bar.
// The L2 policy evict_first: weights are read once, x and the workspace stay.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, unsigned long long* bar,
                                          uint64_t policy) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy) : "memory");
}
__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
// TMA: the box at (c0 = k, c1 = row) of map into shared memory at dst; its bytes complete_tx on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, unsigned long long* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
// Keep the compiler from moving accumulator reads or writes across the asynchronous mma.
template <int N>
__device__ __forceinline__ void wg_pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
// Shared memory matrix descriptor: K-major, 128-byte swizzle, 8-row atoms 1024 B apart (SBO), LBO unused (1).
// The k16 step j of an atom starts 32 j bytes in (the swizzle is applied to the address bits).
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
  return (uint64_t)((saddr >> 4) & 0x3FFFu) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
// D[64 rows x 8 NB tokens] += A[64 x 16] . B[16 x 8 NB], both from shared memory (da, db).
template <int NB>
__device__ __forceinline__ void wgmma_ss(float (&d)[NB * 4], uint64_t da, uint64_t db) {
  if constexpr (NB == 4) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "r"(1));
  } else if constexpr (NB == 2) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(da), "l"(db), "r"(1));
  } else {
    static_assert(NB == 1, "NB is 1, 2 or 4");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(da), "l"(db), "r"(1));
  }
}

// The warp does not reach griddepcontrol.wait before every load of its first batch has landed: chk folds one
// word of each load, and a branch on it cannot issue before they are all in registers (its body is harmless if it
// ever runs). gemvz_kernel does this (an A/B of compile-time variants, 2026-11-30: pooler m=1 12.55 -> 12.43 us, o_proj m=1
// 6.75 -> 6.67); gemv_kernel does not (the router went 2.95 -> 3.35 us with it). FINDINGS.md, "PDL".
__device__ __forceinline__ void land_before_wait(uint32_t chk) {
  if (chk == 0x7fc00123u) asm volatile("nanosleep.u32 1;");
}

// One batch of x fragments: for each of U trips' K blocks (KS k apart: 32 plain, 64 compressed) and token block
// nb, 16 B at xr[nb] + (i + u) * KS + off.
template <int U, int NB, int KS>
__device__ __forceinline__ void load_xbatch(uint4 (&xv)[U][NB], const bf16* const (&xr)[NB], int i, int off = 0) {
#pragma unroll
  for (int u = 0; u < U; u++)
#pragma unroll
    for (int nb = 0; nb < NB; nb++) xv[u][nb] = ld_x(xr[nb] + (i + u) * KS + off);
}

// gemvz's split-K over the S CTAs of a row group and their NW warps, in whole units of UNIT = UG 64-wide groups, for
// any S. The row's T = KB / UNIT units: CTA sidx takes d = T / S of them, one more for the first r = T % S CTAs,
// contiguous in sidx order; inside the CTA, warp w takes its share of those the same way (wd, one more for the first
// wr warps). Shares differ by at most one unit, CTA to CTA and warp to warp; where S NW divides T it is the even
// split of sessions 1-19, with the same values. S is then free to fill the SMs instead of dividing K (qwen2-7b.down's
// 296 groups: S = 3, 25.3 against 28.4 us at m = 1; FINDINGS 23). One runtime division (T / S; NW is a compile-time
// constant). Needs T >= S NW (every warp streams at least one unit: the first batch is loaded before the loop, and
// the streaming warps all arrive on the named barrier in their first trip). Returns {first block, blocks}, in K
// blocks. gemv_kernel keeps the even split: this code took 2-6 more registers there (a CTA an SM less for the plain
// o_proj twin C(8,2,1,2,0), 64 -> 66-68, and 22% slower; session 20, FINDINGS 23). Lab: labs/labkit.py split_units.
template <int UNIT, int NW>
__device__ __forceinline__ int2 split_units(int KB, int S, int sidx, int w) {
  const int T = KB / UNIT, d = T / S, r = T - d * S;
  const int cn = d + (sidx < r), c0 = sidx * d + min(sidx, r);
  const int wd = cn / NW, wr = cn - wd * NW;
  return make_int2((c0 + w * wd + min(w, wr)) * UNIT, (wd + (w < wr)) * UNIT);
}
// CTA sidx's slice {first block, end block}, in K blocks: the union of its warps' split_units shares. Its first
// lines repeat split_units': written through one shared helper, the two changed the machine code of Z(4,2,2,2,1)
// (pooler m=16's row; same size and registers, other bytes, tools/same_code.py), which was timed as it stands.
template <int UNIT>
__device__ __forceinline__ int2 cta_slice(int KB, int S, int sidx) {
  const int T = KB / UNIT, d = T / S, r = T - d * S;
  const int c0 = sidx * d + min(sidx, r);
  return make_int2(c0 * UNIT, (c0 + d + (sidx < r)) * UNIT);
}

// Sum the NW streaming warps' partials parked in red[NW][P] (after the barrier): thread tid < NT takes
// positions p = tid + j * NT, in the fixed warp order 0..NW-1.
template <int NW, int P, int NT, int J>
__device__ __forceinline__ void sum_warps(float4 (&res)[J], const float4 (&red)[NW][P]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < J; j++) {
    const int p = tid + j * NT;
    res[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (tid < NT && p < P) {
#pragma unroll
      for (int wi = 0; wi < NW; wi++) {
        const float4 v = red[wi][p];
        res[j].x += v.x; res[j].y += v.y; res[j].z += v.z; res[j].w += v.w;
      }
    }
  }
}

// The CTA's C fragments after the warp reduction: P = R * NB * 32 positions p = (r * NB + nb) * 32 + lane
// (row block r of the group, token block nb, fragment lane); thread tid < NT holds p = tid + j * NT.
// Split-K across the S CTAs of a row group, inside one launch: every CTA parks its partials in ws and
// takes a ticket; the last one sums the S partials in the fixed order s = 0..S-1 (so the result does
// not depend on which CTA finished last) and resets the ticket for the next call / graph replay.
// Returns true in the CTA that must store. All threads of the CTA call it. Lab: labs/lab5_splitk.py.
template <int J, int P, int NT>
__device__ __forceinline__ bool splitk_combine(float4 (&res)[J], float4* __restrict__ ws, int* __restrict__ sem,
                                               int rg, int sidx, int S) {
  __shared__ int s_last;
  if (S == 1) return true;
  const int tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < J; j++) {
    const int p = tid + j * NT;
    if (tid < NT && p < P) ws[((size_t)rg * S + sidx) * P + p] = res[j];
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = (atomicAdd(&sem[rg], 1) == S - 1);
  __syncthreads();
  if (!s_last) return false;
  __threadfence();
#pragma unroll
  for (int j = 0; j < J; j++) {
    const int p = tid + j * NT;
    if (tid < NT && p < P) {
      float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int s = 0; s < S; s++) {
        const float4 v = __ldcg(ws + ((size_t)rg * S + s) * P + p);
        r.x += v.x; r.y += v.y; r.z += v.z; r.w += v.w;
      }
      res[j] = r;
    }
  }
  if (tid == 0) sem[rg] = 0;
  return true;
}

// The same reduction inside a cluster of the S CTAs (cl = 1; grid y = S = cluster size, rank = sidx): CTA
// rank s > 0 stores its partials into slot s - 1 of the leader's (rank 0) cbuf[S - 1][P] in distributed shared
// memory; one release/acquire barrier; the leader sums its own partial and slots 0..S-2 in the order
// s = 0..S-1 (the ticket path's order: both give the same bits). No global traffic, no fence, no ticket.
// Every thread arrived on the cluster barrier once at kernel start (so all CTAs have started before a
// remote store). Returns true in the leader. All threads of the CTA call it.
// cl = 2 (mbarrier): the other CTAs send with st.async, counted in bytes on the leader's mbarrier (cluster_mbar,
// armed at kernel start for (S - 1) P 16 bytes); they leave at once, and only the leader waits, for the bytes
// alone: no second cluster barrier. Same order of the sum, same bits.
template <int J, int P, int NT>
__device__ __forceinline__ bool cluster_combine(float4 (&res)[J], float4* cbuf, int S, int cl) {
  const int tid = threadIdx.x;
  const uint32_t rank = cluster_rank();
  if (cl == 2) {
    if (rank != 0) {
      cluster_wait_acquire();                  // the leader runs and its mbarrier is armed
      const uint32_t base = map_shared(cbuf + (rank - 1) * P, 0), rbar = map_shared(cluster_mbar(), 0);
#pragma unroll
      for (int j = 0; j < J; j++) {
        const int p = tid + j * NT;
        if (tid < NT && p < P) st_async(base + 16u * p, res[j], rbar);
      }
      return false;
    }
    mbar_wait0(cluster_mbar());
  } else {
    cluster_wait_acquire();                    // phase 1: every CTA of the cluster is running
    if (rank != 0) {
      const uint32_t base = map_shared(cbuf + (rank - 1) * P, 0);
#pragma unroll
      for (int j = 0; j < J; j++) {
        const int p = tid + j * NT;
        if (tid < NT && p < P) st_cluster(base + 16u * p, res[j]);
      }
    }
    cluster_arrive_release();                  // phase 2: the stores above reach the leader before its wait
    if (rank != 0) return false;
    cluster_wait_acquire();
  }
#pragma unroll
  for (int j = 0; j < J; j++) {
    const int p = tid + j * NT;
    if (tid < NT && p < P) {
      float4 r = res[j];
      for (int s = 1; s < S; s++) {
        const float4 v = cbuf[(s - 1) * P + p];
        r.x += v.x; r.y += v.y; r.z += v.z; r.w += v.w;
      }
      res[j] = r;
    }
  }
  return true;
}

// Kernel start with cl: (cl = 2) the leader arms its mbarrier for the other CTAs' (S - 1) P float4, then every
// thread arrives once on the cluster barrier (cluster_combine waits on it before any remote store).
template <int P>
__device__ __forceinline__ void cluster_start(int cl, int S) {
#ifdef MUSE_ABL_NOCOMB  // timing only: no cluster handshake either (combine_store skips the combine)
  return;
#endif
  if (!cl) return;
  if (cl == 2 && threadIdx.x == 0 && cluster_rank() == 0) mbar_init_expect(cluster_mbar(), (uint32_t)(S - 1) * P * 16u);
  cluster_arrive_relaxed();
}

// Position p = (r * NB + nb) * 32 + lane of row group rg: value q of the C fragment is
// (row 16 (rg R + r) + g + 8 (q >> 1), token 8 nb + 2t + (q & 1)). Tokens past M were clamped: never stored.
template <bool F32OUT, int NB, int R>
__device__ __forceinline__ void store_tile(void* __restrict__ out, float4 v, int p, int rg, int M, int N) {
  const int lane = p & 31, nb = (p >> 5) % NB, r = (p >> 5) / NB, g = lane >> 2, t = lane & 3;
  const float rr[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; q++) {
    const int tok = nb * 8 + 2 * t + (q & 1);
    const int row = (rg * R + r) * 16 + g + ((q >> 1) << 3);
    if (tok < M) {
      if (F32OUT) ((float*)out)[(size_t)tok * N + row] = rr[q];
      else ((bf16*)out)[(size_t)tok * N + row] = __float2bfloat16_rn(rr[q]);
    }
  }
}

#define MIN_BLOCKS(PIPE) ((PIPE) == 2 || (PIPE) == 5 ? 2 : (PIPE) == 3 ? 1 : 0)

// ---- MUSE_TRACE (tools/trace_chain.py only; the shipped build never defines it) ------------------
// Thread 0 of every CTA records when it starts, passes pdl_wait, has its first batch of weights and then its first x
// in registers, has its partials in shared memory, passes the CTA barrier, is through the split-K combine, and is
// done (%globaltimer at 3 points, clock64 at all 8), with the CTA's coordinates, its SM and whether it stored, and
// (gemvz) when its exception warp reached the CTA barrier (clock64; 0 elsewhere). The slot (14 u64) is the CTA's
// own, in the layer's workspace after the split-K area any config of the layer may use (N/16 x S x 128 float4):
// plain stores at the CTA's end, no atomics. trace_chain.py grows every copy's workspace to hold the slots of all
// its CTAs.
#ifdef MUSE_TRACE
struct MuseTrace { unsigned long long g[3], c[8], e = 0; };  // e: gemvz's exception warp at the CTA barrier
__device__ __forceinline__ unsigned long long muse_gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// clock64 once v is in its register: the read is predicated on a compare of v, so it cannot issue before v lands.
__device__ __forceinline__ unsigned long long muse_after(uint32_t v) {
  unsigned long long t = 0;
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %1, 0x7fc00123;\n @q mov.u64 %0, %%clock64;\n"
               " @!q mov.u64 %0, %%clock64;\n}" : "+l"(t) : "r"(v) : "memory");
  return t;
}
__device__ __forceinline__ void muse_trace_flush(const MuseTrace& tr, float4* ws, int N, int S, bool stored) {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  unsigned long long* o = reinterpret_cast<unsigned long long*>(ws + (size_t)(N / 16) * S * 128) +
                          ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * 14;
  for (int i = 0; i < 3; i++) o[i] = tr.g[i];
  for (int i = 0; i < 8; i++) o[3 + i] = tr.c[i];
  o[11] = blockIdx.x | ((unsigned long long)blockIdx.y << 16) | ((unsigned long long)sm << 32) |
          ((unsigned long long)stored << 48);
  o[12] = tr.e;
  o[13] = 0;
}
#define TR_G(i) if (threadIdx.x == 0) tr_.g[i] = muse_gtimer();
#define TR_C(i) if (threadIdx.x == 0) tr_.c[i] = clock64();
#define TR_ARRIVED(first, wv, xv) \
  if ((first) && threadIdx.x == 0) { tr_.c[6] = muse_after(wv); tr_.c[7] = muse_after(xv); }
#define TR_FLUSH(stored) if (threadIdx.x == 0) muse_trace_flush(tr_, ws, N, S, stored);
// gemvz: the exception warp's lane 0 notes when it reaches the CTA barrier; thread 0 reads it after the barrier
#define TR_EXC_DECL __shared__ unsigned long long tr_exc_;
#define TR_EXC_END if (lane == 0) tr_exc_ = clock64();
#define TR_EXC_READ if (threadIdx.x == 0) tr_.e = tr_exc_;
#else
struct MuseTrace {};  // nothing recorded: an empty argument the compiler drops
#define TR_G(i)
#define TR_C(i)
#define TR_ARRIVED(first, wv, xv)
#define TR_FLUSH(stored)
#define TR_EXC_DECL
#define TR_EXC_END
#define TR_EXC_READ
#endif

// The end of both GEMVs: the split-K combine (cluster or ticket), then the CTA that holds the sums stores them.
// EXC: the CTA has an exception warp, whose threads (tid >= NT) hold no position. All threads call it.
template <bool F32OUT, bool EXC, int NB, int R, int J, int P, int NT>
__device__ __forceinline__ void combine_store(float4 (&res)[J], MuseTrace& tr_, void* __restrict__ out, float4* cbuf,
                                              float4* __restrict__ ws, int* __restrict__ sem, int rg, int sidx,
                                              int S, int cl, int M, int N) {
  const int tid = threadIdx.x;
#ifdef MUSE_ABL_NOCOMB  // timing only (tools/ab.py, FINDINGS 25): no split-K combine, CTA 0 of a group stores its part
  const bool store = sidx == 0;
#else
  const bool store = cl ? cluster_combine<J, P, NT>(res, cbuf, S, cl) : splitk_combine<J, P, NT>(res, ws, sem, rg, sidx, S);
#endif
  TR_C(4)
  if (store) {
#pragma unroll
    for (int j = 0; j < J; j++)
      if ((!EXC || tid < NT) && tid + j * NT < P) store_tile<F32OUT, NB, R>(out, res[j], tid + j * NT, rg, M, N);
  }
  TR_G(2) TR_C(5) TR_FLUSH(store)
}

// One batch of U K-blocks of fragment-ordered weights (2 units of 16 B per lane per block) for each of
// the warp's R row blocks (rstride units apart), for the hi matrix and, with NH = 2, the router's lo.
// Lab: labs/lab2_fragments.py, part 2.
template <int U, int NH, int R>
__device__ __forceinline__ void load_wbatch(uint4 (&a)[NH][U][R][2], const uint4* wp, const uint4* wp2,
                                            size_t rstride, int i) {
#pragma unroll
  for (int u = 0; u < U; u++)
#pragma unroll
    for (int r = 0; r < R; r++) {
      const size_t o = r * rstride + (size_t)(i + u) * 64;
      a[0][u][r][0] = ld_stream(wp + o);
      a[0][u][r][1] = ld_stream(wp + o + 32);
      if constexpr (NH == 2) {
        a[1][u][r][0] = ld_stream(wp2 + o);
        a[1][u][r][1] = ld_stream(wp2 + o + 32);
      }
    }
}

// ---- gemv_kernel: the plain BF16 tensor-core GEMV -------------------------------------------------
// Contract: x bf16 [M, K] row-major, 16-byte aligned; w (and w2, the router's lo half) bf16 [N, K]
// repacked by pack_plain into fragment order: [N/16][K/32][2 steps][32 lanes][8 bf16]; out [M, N],
// bf16, or fp32 when DUAL; ws >= N/(16R) * S * R*NB*32 float4; sem >= N/(16R) ints, zero between calls.
// Requires N % (16R) == 0, K/32 % (S*NW*U) == 0, M <= NB*8.
//
//   grid (N/(16R), S): CTA (rg, sidx) = row blocks rg*R .. rg*R+R-1 x K blocks [sidx*KB/S, (sidx+1)*KB/S);
//   cl = 1: clusters (1, S), split-K reduced in the leader's shared memory (cluster_combine), ws/sem unused
//   CTA: NW warps; warp w streams K blocks kb0 + [0, KBW) of the slice for all R row blocks, U per trip
//   lane (g = lane>>2, t = lane&3): A fragment = rows g, g+8 of a block; B = x[token 8nb+g][8t..8t+7]
//   end: warps -> smem red[NW][R*NB*32] -> sum over warps -> split-K combine -> store
//
// Why R: every CTA reads its K slice of x once from L2, so x costs (N/16R) * m * K * 2 bytes of L2->SM
// traffic: at R = 1 and m = 32 that is twice the weight bytes, and the L2 path, not HBM, sets the time
// (measured 2026-11-30: pooler 16.6 us at m=1, 27.5 us at m=32). R row blocks per warp reuse each x
// fragment R times from registers.
// PIPE: 0/3 load a batch of U blocks, then compute it (3: minBlocks 1); 1/2 software-pipelined, the
// next batch's weights issued before this batch's mma (2: two CTAs per SM); 4/5 = 1/2 with the next batch's
// x issued with its weights, one trip ahead (registers for a second x batch: at m >= 16 a warp waits on its x
// loads, ncu 2026-12-01: 4.3 of 9.0 cycles between issues on an L1TEX scoreboard). The first batch (and, pf = 1,
// an L2 prefetch of the warp's whole slice) is issued before pdl_wait: weights are constant after
// prepare, so under PDL it overlaps the previous kernel's tail. Lab: labs/lab2_fragments.py, lab5.
template <int NW, int U, int NB, int R, bool DUAL, int PIPE>
__global__ void __launch_bounds__(NW * 32, MIN_BLOCKS(PIPE))
gemv_kernel(const __grid_constant__ GemvArgs args) {
  static_assert(PIPE >= 0 && PIPE <= 5, "PIPE is 0..5");
  const bf16* __restrict__ x = static_cast<const bf16*>(args.x);
  const uint4* __restrict__ w = static_cast<const uint4*>(args.w);
  const uint4* __restrict__ w2 = static_cast<const uint4*>(args.w2);
  void* __restrict__ out = args.out;
  float4* __restrict__ ws = static_cast<float4*>(args.ws);
  int* __restrict__ sem = static_cast<int*>(args.sem);
  const int M = args.M, N = args.N, K = args.K, S = args.S, pf = args.pf, cl = args.cl;
  constexpr int NH = DUAL ? 2 : 1;
  constexpr int P = R * NB * 32, NT = NW * 32, J = (P + NT - 1) / NT;
  extern __shared__ float4 cbuf[];  // cl: [S - 1][P], the other CTAs' partials (in the leader)
  MuseTrace tr_;  // MUSE_TRACE: thread 0's timestamps
  TR_G(0) TR_C(0)
  pdl_trigger();
  cluster_start<P>(cl, S);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rg = blockIdx.x, sidx = blockIdx.y;
  const int KB = K / 32, KBS = KB / S, KBW = KBS / NW;
  const int kb0 = sidx * KBS + warp * KBW;
  const size_t rstride = (size_t)KB * 64;
  const size_t woff = ((size_t)rg * R * KB + kb0) * 64 + lane;
  const uint4* wp = w + woff;
  const uint4* wp2 = DUAL ? (w2 + woff) : nullptr;

  if (pf && lane == 0) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      prefetch_l2(wp + r * rstride, (uint32_t)KBW * 1024u);
      if (DUAL) prefetch_l2(wp2 + r * rstride, (uint32_t)KBW * 1024u);
    }
  }
  uint4 a[NH][U][R][2];
  load_wbatch<U, NH, R>(a, wp, wp2, rstride, 0);
  pdl_wait();
  TR_G(1) TR_C(1)

  const bf16* xr[NB];
#pragma unroll
  for (int nb = 0; nb < NB; nb++) xr[nb] = x + (size_t)min(nb * 8 + g, M - 1) * K + kb0 * 32 + t * 8;
  // DUAL with NB = 1: hi and lo accumulate into separate fp32 accumulators (half the dependent mma chain),
  // summed once at the end (a one-hot probe still returns fl32(hi + lo)). Measured (judge.py, 2026-11-30):
  // router m=8 3.46 -> 3.21 us; at NB = 2 the m=16 config went 3.40 -> 4.07 (116 -> 128 registers), and at
  // NB = 4 the second set spills the m=32 config: one set there
  constexpr int NA = DUAL && NB == 1 ? 2 : 1;
  float acc[NA][R][NB][4];
#pragma unroll
  for (int h = 0; h < NA; h++)
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int nb = 0; nb < NB; nb++) acc[h][r][nb][0] = acc[h][r][nb][1] = acc[h][r][nb][2] = acc[h][r][nb][3] = 0.f;

  if constexpr (PIPE == 0 || PIPE == 3) {
    for (int i = 0; i < KBW; i += U) {
      if (i > 0) load_wbatch<U, NH, R>(a, wp, wp2, rstride, i);
#pragma unroll
      for (int u = 0; u < U; u++) {
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
          const uint4 xv = ld_x(xr[nb] + (i + u) * 32);
          TR_ARRIVED(i == 0 && u == 0 && nb == 0, a[0][0][0][0].x, xv.x)
#pragma unroll
          for (int r = 0; r < R; r++)
#pragma unroll
            for (int h = 0; h < NH; h++) {
              mma16816(acc[h % NA][r][nb], a[h][u][r][0], xv.x, xv.y);
              mma16816(acc[h % NA][r][nb], a[h][u][r][1], xv.z, xv.w);
            }
        }
      }
    }
  } else {
    constexpr bool XAHEAD = PIPE >= 4;
    uint4 xv[U][NB];
    if constexpr (XAHEAD) load_xbatch<U, NB, 32>(xv, xr, 0);
    for (int i = 0; i < KBW; i += U) {
      if constexpr (!XAHEAD) load_xbatch<U, NB, 32>(xv, xr, i);
      uint4 na[NH][U][R][2], nxv[U][NB];
      if (i + U < KBW) {
        load_wbatch<U, NH, R>(na, wp, wp2, rstride, i + U);
        if constexpr (XAHEAD) load_xbatch<U, NB, 32>(nxv, xr, i + U);
      }
      TR_ARRIVED(i == 0, a[0][0][0][0].x, xv[0][0].x)
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
          for (int r = 0; r < R; r++)
#pragma unroll
            for (int h = 0; h < NH; h++) {
              mma16816(acc[h % NA][r][nb], a[h][u][r][0], xv[u][nb].x, xv[u][nb].y);
              mma16816(acc[h % NA][r][nb], a[h][u][r][1], xv[u][nb].z, xv[u][nb].w);
            }
#pragma unroll
      for (int h = 0; h < NH; h++)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
          for (int r = 0; r < R; r++) { a[h][u][r][0] = na[h][u][r][0]; a[h][u][r][1] = na[h][u][r][1]; }
      if constexpr (XAHEAD) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
          for (int nb = 0; nb < NB; nb++) xv[u][nb] = nxv[u][nb];
      }
    }
  }

  __shared__ float4 red[NW][P];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
      float4 v = make_float4(acc[0][r][nb][0], acc[0][r][nb][1], acc[0][r][nb][2], acc[0][r][nb][3]);
      if constexpr (NA == 2) {
        v.x += acc[1][r][nb][0]; v.y += acc[1][r][nb][1]; v.z += acc[1][r][nb][2]; v.w += acc[1][r][nb][3];
      }
      red[warp][(r * NB + nb) * 32 + lane] = v;
    }
  TR_C(2)
  __syncthreads();
  TR_C(3)
  float4 res[J];
  sum_warps<NW, P, NT, J>(res, red);
  combine_store<DUAL, false, NB, R, J, P, NT>(res, tr_, out, cbuf, ws, sem, rg, sidx, S, cl, M, N);
}
// gemvz.cuh: the lossless 12-bit format on the GPU: decz (one fragment), the stream's loader, gemvz_kernel with its
// exception warp, and unpackz_kernel (prepare's decode check).

#ifdef MUSE_SKIP_CORRECTIONS
constexpr bool kSkipCorrections = true;   // a timing-only build: gemvz's exception warp adds nothing (wrong results)
#else
constexpr bool kSkipCorrections = false;
#endif

// ---- the 12-bit format ----------------------------------------------------------------------------
// Each row r has its own window: the 8 consecutive classes zbase[r] .. zbase[r] + 7 (class = bf16 bits 14..8).
// A weight is stored as its low byte verbatim, a 3-bit window index i (class = zbase[r] + i) and its sign.
// decz: one m16n8k16 A fragment (8 bf16, element j = 0..7 in mma16816's register order: j0, j1 and j4, j5 on the
// lane's row g, j2, j3 and j6, j7 on row g + 8) from
//   lo0, lo1: verbatim low bytes of j0..j3 and j4..j7 (exponent bit 0 + 7 mantissa bits), byte i = j_i
//   c:        the code word; byte b = idx(j_b) in bits 0..2, idx(j_b+4) in bits 4..6, sign(j_b) in bit 7 and
//             sign(j_4+(b+3)%4) in bit 3, placed so that c and c rotated right by 4 each hold 4 indices in bits
//             0..2 and their signs in bit 7 of every byte
//   B:        the lane's two windows as bytes {zbase[g], zbase[g], zbase[g + 8], zbase[g + 8]} (zrow_word)
// A high byte is (index | sign) + base: base <= 120 and index <= 7 never carry into the sign bit. 9 integer
// instructions per 8 weights (1 SHF, 2 LOP3, 2 adds: IMAD.IADD in the SASS, 4 PRMT), no branches, no table.
// Lab: labs/lab3_compress.py.
__device__ __forceinline__ uint4 decz(uint32_t lo0, uint32_t lo1, uint32_t c, uint32_t B) {
  const uint32_t h0 = (c & 0x87878787u) + B;
  const uint32_t h1 = (__funnelshift_r(c, c, 4) & 0x87878787u) + B;
  uint4 f;
  f.x = prmt(lo0, h0, 0x5140u);  // {lo j0, hi j0, lo j1, hi j1}
  f.y = prmt(lo0, h0, 0x7362u);  // {lo j2, hi j2, lo j3, hi j3}
  f.z = prmt(lo1, h1, 0x5140u);
  f.w = prmt(lo1, h1, 0x7362u);
  return f;
}

// decz's B for the lane of row g (0..7) of the 16-row block whose first row is row0
__device__ __forceinline__ uint32_t zrow_word(const uint8_t* __restrict__ zbase, int row0, int g) {
  return (uint32_t)__ldg(zbase + row0 + g) * 0x0101u | (uint32_t)__ldg(zbase + row0 + g + 8) * 0x01010000u;
}

// One batch of UG 64-wide groups of the 12-bit format for each of R row blocks: units A0, A1, C (codes) at
// +0, +32, +64 (512 B per warp load each).
template <int UG, int R>
__device__ __forceinline__ void load_zbatch(uint4 (&z)[UG][R][3], const uint4* wp, size_t rstride, int i) {
#pragma unroll
  for (int u = 0; u < UG; u++)
#pragma unroll
    for (int r = 0; r < R; r++) {
      const uint4* p = wp + r * rstride + (size_t)(i + u) * 96;
      z[u][r][0] = ld_stream(p);
      z[u][r][1] = ld_stream(p + 32);
      z[u][r][2] = ld_stream(p + 64);
    }
}

// One 64-wide group of one row block: decode its 4 fragments from the A0, A1, C units with the rows' window
// word B, and run them against the token blocks' x (xa: k 0..31 of the group, xb: k 32..63), 4 NB mma.
template <int NB>
__device__ __forceinline__ void mma_zgroup(float (&acc)[NB][4], const uint4 (&z)[3], const uint4 (&xa)[NB],
                                           const uint4 (&xb)[NB], uint32_t B) {
  const uint4 f0 = decz(z[0].x, z[0].y, z[2].x, B);
  const uint4 f1 = decz(z[0].z, z[0].w, z[2].y, B);
  const uint4 f2 = decz(z[1].x, z[1].y, z[2].z, B);
  const uint4 f3 = decz(z[1].z, z[1].w, z[2].w, B);
#pragma unroll
  for (int nb = 0; nb < NB; nb++) {
    mma16816(acc[nb], f0, xa[nb].x, xa[nb].y);
    mma16816(acc[nb], f1, xa[nb].z, xa[nb].w);
    mma16816(acc[nb], f2, xb[nb].x, xb[nb].y);
    mma16816(acc[nb], f3, xb[nb].z, xb[nb].w);
  }
}

// ---- the cooperative walk (gemvz PIPE 8..13 = PIPE 0..5 with it) ----------------------------------------------
// The CTA's rows' entries are one contiguous run of the side table, esc[roff[0] .. roff[16 R]). Lane l takes the l-th
// of 32 equal contiguous pieces of that run, with all 8 NB tokens, so a row with many out-of-window weights is walked by
// several lanes at once. The per-row walk gives a row to one lane, and that lane's chain of chunks sets the CTA's time
// once a row holds more than about 50 (FINDINGS 22). A row inside one lane's piece is summed there in k order; a row
// split between lanes is summed per lane, then over the lanes in lane order, so every call gives the same bits. roff,
// part and prow are the exception warp's shared memory; ecorr as gemvz_kernel's. prepare takes it where the worst row is
// over CAPR_LIMITS (submission._walk_for): flat in the worst row, but 0.4-1.6 us slower than the per-row walk on some
// rows where no row is long (it walks the rows' entries of all K, FINDINGS 25). Lab: labs/lab3_compress.py coop_pieces.
template <int NB, int R, int EC>
__device__ __forceinline__ void coop_walk(float (&ecorr)[R * 16][NB * 8 + 1], const int* roff, float (&part)[32][2][NB * 8],
                                          int (&prow)[32][2], const int2* __restrict__ esc, const bf16* __restrict__ x,
                                          int M, int K, int klo, int khi, int lane) {
  constexpr int RB = R * 16, TK = NB * 8;
  const int E0 = roff[0], n = roff[RB] - E0, c = (n + 31) >> 5;
  const int a = E0 + min(lane * c, n), b = E0 + min(lane * c + c, n);
  for (int r = lane; r < RB; r += 32)
#pragma unroll
    for (int q = 0; q < TK; q++) ecorr[r][q] = 0.f;
  prow[lane][0] = prow[lane][1] = -1;
  __syncwarp();
  if (!kSkipCorrections && a < b) {
    int lo = 0, hi = RB;  // the row that holds entry a: the last r with roff[r] <= a (roff[RB] > a)
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (roff[mid] <= a) lo = mid;
      else hi = mid;
    }
    const int first = lo;
    int cur = lo;
    float ea[TK];
#pragma unroll
    for (int q = 0; q < TK; q++) ea[q] = 0.f;
    auto flush = [&](int row) {  // a row inside the piece goes to ecorr, a split one to the lane's part slot
      if (roff[row] >= a && roff[row + 1] <= b) {
#pragma unroll
        for (int q = 0; q < TK; q++) ecorr[row][q] = ea[q];
      } else {
        const int sl = row == first ? 0 : 1;
        prow[lane][sl] = row;
#pragma unroll
        for (int q = 0; q < TK; q++) part[lane][sl][q] = ea[q];
      }
#pragma unroll
      for (int q = 0; q < TK; q++) ea[q] = 0.f;
    };
    for (int j = a; j < b; j += EC) {
      int2 e[EC];
#pragma unroll
      for (int cc = 0; cc < EC; cc++) e[cc] = ld_esc_if(esc + j + cc, j + cc < b, make_int2(khi, 0));
      float xv[EC][TK];
#pragma unroll
      for (int cc = 0; cc < EC; cc++)
#pragma unroll
        for (int q = 0; q < TK; q++)
          xv[cc][q] = ld_x1_if(x + (size_t)q * K + e[cc].x, e[cc].x >= klo && e[cc].x < khi && q < M);
#pragma unroll
      for (int cc = 0; cc < EC; cc++) {
        if (j + cc < b) {
          while (j + cc >= roff[cur + 1]) {
            flush(cur);
            cur++;
          }
          if (e[cc].x >= klo && e[cc].x < khi) {
            const float d = __int_as_float(e[cc].y);
#pragma unroll
            for (int q = 0; q < TK; q++) ea[q] += d * xv[cc][q];  // tok >= M: x read as 0, never stored
          }
        }
      }
    }
    flush(cur);
  }
  __syncwarp();
  for (int r = lane; r < RB; r += 32) {  // the split rows: their lanes' sums added in lane order
    bool any = false;
    float sum[TK];
#pragma unroll
    for (int q = 0; q < TK; q++) sum[q] = 0.f;
    for (int l = 0; l < 32; l++)
#pragma unroll
      for (int sl = 0; sl < 2; sl++)
        if (prow[l][sl] == r) {
          any = true;
#pragma unroll
          for (int q = 0; q < TK; q++) sum[q] += part[l][sl][q];
        }
    if (any)
#pragma unroll
      for (int q = 0; q < TK; q++) ecorr[r][q] = sum[q];
  }
}

// ---- gemvz_kernel: the compressed GEMV with its exception warp ------------------------------------
// Contract: x as gemv_kernel; w = pack_z's stream: [N/16][K/64][A0 32 units | A1 32 units | C 32 units]
// of 16 B; zbase uint8 [N], each row's window; the side table in CSR: row r's exceptions are
// esc[eptr[r] .. eptr[r+1]) = int2 {k, fp32 bits of the correction}, k ascending; out bf16 [M, N].
// Requires N % (16R) == 0, K/64 % UG == 0, K/64 / UG >= S*NW (any S: split_units).
//
//   warps 0..NW-1 stream: per 64-wide group and row block, a lane loads A0, A1, C (48 B) and decodes 4
//     fragments with its rows' window word B (zrow_word, read before the wait): f0 = decz(A0.x, A0.y, C.x),
//     f1 = (A0.z, A0.w, C.y) -> K block 2G, steps 0/1; f2, f3 from A1 -> block 2G+1. Grid, R, PIPE and pf as
//     gemv_kernel.
//   warp NW (the exception warp): lane -> row r = lane & 15 of each of the R blocks, tokens p, p+2, ...
//     (p = lane >> 4); adds correction x x[token][k] for its rows' exceptions in [klo, khi), in k order,
//     into smem ecorr; one barrier; the corrections are added after the warps' reduction, before split-K.
//     The side table is constant after prepare: its row offsets are read, and its first lines prefetched to
//     L1, before pdl_wait. A row's list is walked in chunks of EC entries: the chunk's entries, then all their
//     x values, are loaded before its first FMA (one chain of two loads per chunk, not per entry). R >= 2: the
//     first chunks of all R blocks are loaded at once, every load predicated in the PTX (no branch around it;
//     o_proj m=8 7.1 -> 6.7 us, FINDINGS.md, session 13); R = 1: a block at a time (the predicated form ties or loses).
//     NB >= 2: the walk starts once every streaming warp is through its first trip (named barrier 1: they arrive,
//     it syncs), away from their first x misses: o_proj m=16 -0.1 us (FINDINGS.md, session 14); at NB = 1 it starts at
//     the wait (the late start lost up to 0.35 us there). The walk is never the CTA's last warp at the barrier; what it
//     costs (0.2-0.5 us at m=16) is its L2 requests slowing the stream (session 14's trace and timing-only variants).
// An out-of-window weight decodes to v, its own sign and low byte with the nearest window class; prepare verified
// fl32(v + correction) == W for every one of them. A build with MUSE_SKIP_CORRECTIONS defined skips
// the corrections (wrong results: tools/ab.py times what they cost; a GPU test checks that they matter).
// Lab: labs/lab3_compress.py (format, decz, the kernel in miniature).
template <int NW, int UG, int NB, int R, int PIPE>
__global__ void __launch_bounds__((NW + 1) * 32, MIN_BLOCKS(PIPE & 7))
gemvz_kernel(const __grid_constant__ GemvArgs args) {
  static_assert((PIPE & 7) <= 5 && PIPE <= 13, "PIPE is 0..5, or 8..13 for the same loops with the cooperative walk");
  constexpr int LOOP = PIPE & 7;    // the streaming warps' loop (PIPE 0..5)
  constexpr bool COOP = PIPE >= 8;  // the exception warp's walk: cooperative (coop_walk) or one lane a row
  const bf16* __restrict__ x = static_cast<const bf16*>(args.x);
  const uint4* __restrict__ w = static_cast<const uint4*>(args.w);
  const int* __restrict__ eptr = static_cast<const int*>(args.eptr);
  const int2* __restrict__ esc = static_cast<const int2*>(args.esc);
  bf16* __restrict__ out = static_cast<bf16*>(args.out);
  float4* __restrict__ ws = static_cast<float4*>(args.ws);
  int* __restrict__ sem = static_cast<int*>(args.sem);
  const int M = args.M, N = args.N, K = args.K, S = args.S, pf = args.pf, cl = args.cl;
  const uint8_t* __restrict__ zbase = static_cast<const uint8_t*>(args.zbase);
  constexpr int P = R * NB * 32, NT = NW * 32, J = (P + NT - 1) / NT;
  constexpr int EC = NB == 4 ? 2 : 4;  // exception chunk: EC entries x NB*4 tokens of x in flight per lane
  constexpr bool LATE = NB >= 2;  // the walk starts once every streaming warp is through its first trip
  constexpr bool PWALK = R >= 2;  // the exception warp's walk: predicated first chunks of all row blocks at once
  extern __shared__ float4 cbuf[];  // cl: [S - 1][P], the other CTAs' partials (in the leader)
  MuseTrace tr_;  // MUSE_TRACE: thread 0's timestamps
  TR_G(0) TR_C(0)
  pdl_trigger();
  cluster_start<P>(cl, S);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rg = blockIdx.x, sidx = blockIdx.y;
  const int KG = K / 64;  // units of UG groups, split over S x NW warps (split_units)
  __shared__ float4 red[NW][P];
  __shared__ float ecorr[R * 16][NB * 8 + 1];  // +1: the 16 rows of a block land in 16 different banks
  TR_EXC_DECL

  if (warp == NW && COOP) {
    if constexpr (COOP) {
      __shared__ int roff[R * 16 + 1];
      __shared__ float part[32][2][NB * 8];
      __shared__ int prow[32][2];
      const int2 slice = cta_slice<UG>(KG, S, sidx);
      for (int i = lane; i <= R * 16; i += 32) roff[i] = __ldg(eptr + rg * R * 16 + i);  // constant: before the wait
      __syncwarp();
      pdl_wait();
      if constexpr (LATE) named_bar_sync1((NW + 1) * 32);
      coop_walk<NB, R, EC>(ecorr, roff, part, prow, esc, x, M, K, slice.x * 64, slice.y * 64, lane);
    }
    TR_EXC_END
  } else if (warp == NW) {
    const int rl = lane & 15, p = lane >> 4;
    const int2 slice = cta_slice<UG>(KG, S, sidx);
    const int klo = slice.x * 64, khi = slice.y * 64;
    int beg[R], end[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int row = (rg * R + r) * 16 + rl;
      beg[r] = __ldg(eptr + row);
      end[r] = __ldg(eptr + row + 1);
      if (!kSkipCorrections && beg[r] < end[r])
        asm volatile("prefetch.global.L1 [%0];" ::"l"(esc + beg[r]));
    }
    pdl_wait();
    if constexpr (LATE) named_bar_sync1((NW + 1) * 32);
    // a chunk's corrections into ea, entries in k order (entries outside [klo, khi) add nothing)
    auto fma_chunk = [&](float (&ea)[NB * 4], const int2 (&e)[EC], const float (&xv)[EC][NB * 4]) {
#pragma unroll
      for (int c = 0; c < EC; c++)
        if (e[c].x >= klo && e[c].x < khi) {
          const float d = __int_as_float(e[c].y);
#pragma unroll
          for (int q = 0; q < NB * 4; q++) ea[q] += d * xv[c][q];  // tok >= M: never stored
        }
    };
    if constexpr (PWALK) {
      // R >= 2 (session 13, FINDINGS.md): the first chunk of every row block at once after the wait, with every load
      // predicated in the PTX itself (rewrites that came out with branches around their x loads lost in session 12).
      // Same entries, same order, same FMAs as the walk below.
      auto load_chunk = [&](int2 (&e)[EC], float (&xv)[EC][NB * 4], int j, int end) {
#pragma unroll
        for (int c = 0; c < EC; c++) e[c] = ld_esc_if(esc + j + c, j + c < end, make_int2(khi, 0));
#pragma unroll
        for (int c = 0; c < EC; c++)
#pragma unroll
          for (int q = 0; q < NB * 4; q++) {
            const int tok = p + 2 * q;
            xv[c][q] = ld_x1_if(x + (size_t)tok * K + e[c].x, e[c].x >= klo && e[c].x < khi && tok < M);
          }
      };
      int2 e0[R][EC];
      float xv0[R][EC][NB * 4];
#pragma unroll
      for (int r = 0; r < R; r++) load_chunk(e0[r], xv0[r], beg[r], kSkipCorrections ? beg[r] : end[r]);
#pragma unroll
      for (int r = 0; r < R; r++) {
        float ea[NB * 4];
#pragma unroll
        for (int q = 0; q < NB * 4; q++) ea[q] = 0.f;
        fma_chunk(ea, e0[r], xv0[r]);
        if (e0[r][EC - 1].x < khi) {  // the row may go on in this CTA's slice: the rest, a chunk at a time
          for (int j = beg[r] + EC; j < end[r]; j += EC) {
            int2 e[EC];
            float xv[EC][NB * 4];
            load_chunk(e, xv, j, end[r]);
            fma_chunk(ea, e, xv);
            if (e[EC - 1].x >= khi) break;  // k ascending: the rest of the row is past this CTA's slice
          }
        }
#pragma unroll
        for (int q = 0; q < NB * 4; q++) ecorr[r * 16 + rl][p + 2 * q] = ea[q];
      }
    } else {  // R = 1: a row block at a time, a chunk at a time
#pragma unroll
      for (int r = 0; r < R; r++) {
        float ea[NB * 4];
#pragma unroll
        for (int q = 0; q < NB * 4; q++) ea[q] = 0.f;
        if (!kSkipCorrections) {
          for (int j = beg[r]; j < end[r]; j += EC) {
            int2 e[EC];
            bool use[EC];
#pragma unroll
            for (int c = 0; c < EC; c++) {
              e[c] = j + c < end[r] ? __ldg(esc + j + c) : make_int2(khi, 0);
              use[c] = e[c].x >= klo && e[c].x < khi;
            }
            float xv[EC][NB * 4];
#pragma unroll
            for (int c = 0; c < EC; c++)
#pragma unroll
              for (int q = 0; q < NB * 4; q++) {
                const int tok = p + 2 * q;
                xv[c][q] = use[c] && tok < M ? __bfloat162float(x[(size_t)tok * K + e[c].x]) : 0.f;
              }
            fma_chunk(ea, e, xv);
            if (e[EC - 1].x >= khi) break;  // k ascending: the rest of the row is past this CTA's slice
          }
        }
#pragma unroll
        for (int q = 0; q < NB * 4; q++) ecorr[r * 16 + rl][p + 2 * q] = ea[q];
      }
    }
    TR_EXC_END
  } else {
    const int2 share = split_units<UG, NW>(KG, S, sidx, warp);
    const int g0 = share.x, KGW = share.y;
    const size_t rstride = (size_t)KG * 96;
    const uint4* wp = w + ((size_t)rg * R * KG + g0) * 96 + lane;
    if (pf && lane == 0) {
#pragma unroll
      for (int r = 0; r < R; r++) prefetch_l2(wp + r * rstride, (uint32_t)KGW * 1536u);
    }
    uint4 z[UG][R][3];
    load_zbatch<UG, R>(z, wp, rstride, 0);
    // the rows' windows: constant after prepare, so read before the wait and landed with the first batch (loading them
    // first ties, leaving them out of chk loses 0.04 us at o_proj m=1; FINDINGS.md section 19)
    uint32_t B[R];
#pragma unroll
    for (int r = 0; r < R; r++) B[r] = zrow_word(zbase, (rg * R + r) * 16, g);
    {
      uint32_t chk = 0;
#pragma unroll
      for (int r = 0; r < R; r++) chk ^= B[r];
#pragma unroll
      for (int u = 0; u < UG; u++)
#pragma unroll
        for (int r = 0; r < R; r++) chk ^= z[u][r][0].x ^ z[u][r][1].x ^ z[u][r][2].x;
      land_before_wait(chk);
    }
    pdl_wait();
    TR_G(1) TR_C(1)

    const bf16* xr[NB];
#pragma unroll
    for (int nb = 0; nb < NB; nb++) xr[nb] = x + (size_t)min(nb * 8 + g, M - 1) * K + g0 * 64 + t * 8;
    float acc[R][NB][4];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int nb = 0; nb < NB; nb++) acc[r][nb][0] = acc[r][nb][1] = acc[r][nb][2] = acc[r][nb][3] = 0.f;
    // LATE: every streaming thread arrives on named barrier 1 once, after its first trip's MMAs (its x is in). The
    // arrival waits for the warp's loads in flight (bar.arrive orders them), and the walk's burst needs that pause:
    // a relaxed shared counter as the signal lost 0.7 us, other placements 0.08 (FINDINGS.md, session 15).
    auto let_exception_warp_go = [&](int i) {
      if constexpr (LATE)
        if (i == 0) named_bar_arrive1((NW + 1) * 32);
    };

    if constexpr (LOOP == 0 || LOOP == 3) {
      for (int i = 0; i < KGW; i += UG) {
        if (i > 0) load_zbatch<UG, R>(z, wp, rstride, i);
#pragma unroll
        for (int u = 0; u < UG; u++) {
          uint4 xa[NB], xb[NB];
#pragma unroll
          for (int nb = 0; nb < NB; nb++) {
            xa[nb] = ld_x(xr[nb] + (i + u) * 64);
            xb[nb] = ld_x(xr[nb] + (i + u) * 64 + 32);
          }
          TR_ARRIVED(i == 0 && u == 0, z[0][0][0].x, xa[0].x)
#pragma unroll
          for (int r = 0; r < R; r++) mma_zgroup<NB>(acc[r], z[u][r], xa, xb, B[r]);
        }
        let_exception_warp_go(i);
      }
    } else {
      constexpr bool XAHEAD = LOOP >= 4;
      // x of trip i's groups: xa = k 0..31, xb = k 32..63 of each
      auto load_x = [&](uint4 (&xa_)[UG][NB], uint4 (&xb_)[UG][NB], int i) {
        load_xbatch<UG, NB, 64>(xa_, xr, i);
        load_xbatch<UG, NB, 64>(xb_, xr, i, 32);
      };
      uint4 xa[UG][NB], xb[UG][NB];
      if constexpr (XAHEAD) load_x(xa, xb, 0);
      for (int i = 0; i < KGW; i += UG) {
        if constexpr (!XAHEAD) load_x(xa, xb, i);
        uint4 nz[UG][R][3], nxa[UG][NB], nxb[UG][NB];
        if (i + UG < KGW) {
          load_zbatch<UG, R>(nz, wp, rstride, i + UG);
          if constexpr (XAHEAD) load_x(nxa, nxb, i + UG);
        }
        TR_ARRIVED(i == 0, z[0][0][0].x, xa[0][0].x)
#pragma unroll
        for (int u = 0; u < UG; u++)
#pragma unroll
          for (int r = 0; r < R; r++) mma_zgroup<NB>(acc[r], z[u][r], xa[u], xb[u], B[r]);
        let_exception_warp_go(i);
#pragma unroll
        for (int u = 0; u < UG; u++)
#pragma unroll
          for (int r = 0; r < R; r++) { z[u][r][0] = nz[u][r][0]; z[u][r][1] = nz[u][r][1]; z[u][r][2] = nz[u][r][2]; }
        if constexpr (XAHEAD) {
#pragma unroll
          for (int u = 0; u < UG; u++)
#pragma unroll
            for (int nb = 0; nb < NB; nb++) { xa[u][nb] = nxa[u][nb]; xb[u][nb] = nxb[u][nb]; }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int nb = 0; nb < NB; nb++)
        red[warp][(r * NB + nb) * 32 + lane] = make_float4(acc[r][nb][0], acc[r][nb][1], acc[r][nb][2], acc[r][nb][3]);
    TR_C(2)
  }
  __syncthreads();  // red and ecorr are both complete after this one barrier
  TR_C(3)
  TR_EXC_READ

  float4 res[J];  // threads of the exception warp (tid >= NT) hold no position
  sum_warps<NW, P, NT, J>(res, red);
#pragma unroll
  for (int j = 0; j < J; j++) {
    const int p = tid + j * NT;
    if (tid < NT && p < P) {
      const int pl = p & 31, nbo = (p >> 5) % NB, r = (p >> 5) / NB, pg = pl >> 2, pt = pl & 3;
      res[j].x += ecorr[r * 16 + pg][nbo * 8 + 2 * pt];
      res[j].y += ecorr[r * 16 + pg][nbo * 8 + 2 * pt + 1];
      res[j].z += ecorr[r * 16 + pg + 8][nbo * 8 + 2 * pt];
      res[j].w += ecorr[r * 16 + pg + 8][nbo * 8 + 2 * pt + 1];
    }
  }
  combine_store<false, true, NB, R, J, P, NT>(res, tr_, out, cbuf, ws, sem, rg, sidx, S, cl, M, N);
}

// ---- unpackz_kernel: decode the whole 12-bit stream back to bf16 [N, K] ---------------------------
// prepare() runs it on every layer it compresses and compares with the weight, bit for bit, so the
// decoder that runs in gemvz_kernel (decz) is checked on the GPU itself. One thread per (rb, G, lane).
__global__ void unpackz_kernel(const uint4* __restrict__ w, const uint8_t* __restrict__ zbase,
                               uint16_t* __restrict__ out, int N, int K) {
  const int KG = K / 64;
  const size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (id >= (size_t)(N / 16) * KG * 32) return;
  const int lane = (int)(id & 31), g = lane >> 2, t = lane & 3;
  const size_t blk = id >> 5;
  const int rb = (int)(blk / KG), G = (int)(blk % KG);
  const uint4* p = w + blk * 96 + lane;
  const uint4 A0 = p[0], A1 = p[32], C = p[64];
  const uint32_t B = zrow_word(zbase, rb * 16, g);
  const uint4 f[4] = {decz(A0.x, A0.y, C.x, B), decz(A0.z, A0.w, C.y, B),
                      decz(A1.x, A1.y, C.z, B), decz(A1.z, A1.w, C.w, B)};
#pragma unroll
  for (int fi = 0; fi < 4; fi++) {
    const uint32_t regs[4] = {f[fi].x, f[fi].y, f[fi].z, f[fi].w};
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const int row = rb * 16 + g + 8 * ((j >> 1) & 1);
      const int k = G * 64 + 32 * (fi >> 1) + 8 * t + 4 * (fi & 1) + 2 * (j >> 2) + (j & 1);
      out[(size_t)row * K + k] = (uint16_t)(regs[j >> 1] >> (16 * (j & 1)));
    }
  }
}
// gemvt.cuh: PIPE 6 of the plain path (its own config type, GemvtConfig): a TMA ring of weight tiles and x, and
// warpgroup MMA from shared memory.

// ---- gemvt_kernel: PIPE 6 of the plain path, a TMA ring of weight tiles and x, warpgroup MMA ---------------
// Contract: x bf16 [M, K] row-major, reached through a 2-D TMA descriptor (box 64 k x 8 NB tokens, 128-byte
// swizzle; rows past M read as zeros); wt = pack_tma's tiles: [N/64][K/64][64 rows][64 k], each 8 KB tile already
// in the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r & 7)), so one bulk copy of contiguous bytes
// lands it as wgmma reads it; out bf16 [M, N]; ws / sem as gemv_kernel. Requires N % (16 NW) == 0,
// K % (64 KA) == 0, S <= K / (64 KA), NW % 4 == 0 (S need not divide: the slices differ by at most one step).
//
//   grid (N / (16 NW), S): CTA (rg, sidx) = rows 16 NW rg .. +16 NW x K slice sidx (about K / S wide)
//   warps 0..NW-1 (NW / 4 warpgroups) consume; warp NW produces (its lane 0 issues every copy)
//   ring of ST stages in dynamic shared memory; stage = W [NW / 4 warpgroups][KA atoms][64 rows x 128 B] (one bulk
//     copy of KA tiles per warpgroup: contiguous in wt) then x [KA atoms][8 NB tokens x 128 B] (one TMA box per
//     atom), both in the 128-byte swizzle (8-row groups 1024 B apart)
//   full[s]: the producer's expect_tx of the stage's bytes, completed by the copies; empty[s]: one arrival per
//     consumer warp once its wgmma on the stage are done
//   per stage and warpgroup: 4 KA wgmma.m64n(8NB)k16, A = its 64 weight rows, B = the tokens, both from shared
//     memory; warp w's D fragment = rows 16w..16w+15 as mma16816's C fragments side by side (r = w below)
//   end: D -> red (the ring's memory) -> split-K combine (gemv_kernel's) -> store
// PDL: only weights before griddepcontrol.wait: the producer fills the W part of the first min(ST, steps) stages,
// waits, then copies their x; the consumers wait before the epilogue (out, ws, sem).
// Why: at m = 16 / 32 the register kernels are held by x's trips through L1 (ncu 2026-12-01: L1TEX 80% of peak,
// DRAM 43%); here x reaches the tensor cores from shared memory, one TMA copy per stage, and the bytes in flight
// (ST stages) cost no registers. Why tiles: boxes of the natural [N, K] layout read 128 B from each of 64 rows
// 16 KB apart, and streamed at 3.7-3.8 TB/s (device call 3, 2026-12-01; FINDINGS.md, session 9).
// Lab: labs/lab6_tma.py (the tiles, the swizzle the descriptors undo, x's box, the kernel in miniature).

// Dynamic shared memory of one gemvt CTA: 1 KB of alignment slack, the ring, and with cl the leader's cbuf.
__host__ __device__ constexpr size_t gemvt_smem(int NW, int ST, int NB, int KA, int S, int cl) {
  return 1024 + (size_t)ST * KA * (16 * NW + 8 * NB) * 128 + (cl ? (size_t)(S - 1) * NW * NB * 32 * 16 : 0);
}

// ---- the ring: split, barriers, producer, end ----------------------------------------------------------------
// Split-K in whole steps of KA 64-k groups, any S <= K / (64 KA): CTA sidx takes steps [sidx T / S, (sidx + 1) T / S).
template <int KA>
__device__ __forceinline__ void ring_slice(int K, int S, int sidx, int& steps, int& g0) {
  const int T = K / (64 * KA), s0 = (int)((long)sidx * T / S);
  steps = (int)((long)(sidx + 1) * T / S) - s0;
  g0 = s0 * KA;
}

// full[s]: one arrival (the producer's expect_tx), completed by the copies' bytes; empty[s]: one arrival per consumer
// warp. Made visible to the async proxy (TMA) before the CTA barrier. All threads call it.
template <int ST>
__device__ __forceinline__ void ring_init(unsigned long long* full, unsigned long long* empty, int consumers) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < ST; s++) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], consumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// The producer (one thread): the weights of the first min(ST, steps) stages before griddepcontrol.wait (they are
// constant after prepare), then those stages' x, then one stage per slot the consumers free. load_w(sb, i, bar,
// pol) issues step i's weight copies into the stage at sb with the L2 policy pol (evict_first); x's KA boxes
// (64 k x 8 NB tokens) go to sb + xoff + a XB.
template <int ST, int KA, typename LoadW>
__device__ __forceinline__ void ring_produce(const CUtensorMap* tx, unsigned long long* full, unsigned long long* empty,
                                             uint32_t base, uint32_t stage, uint32_t xoff, uint32_t XB, int steps,
                                             int g0, LoadW load_w) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tx)) : "memory");
  const uint64_t pol = policy_evict_first();   // weights are read once: x and the workspace stay in L2
  const int pre = steps < ST ? steps : ST;
  for (int i = 0; i < pre; i++) {
    mbar_expect_tx(&full[i], stage);
    load_w(base + i * stage, i, &full[i], pol);
  }
  pdl_wait();
  for (int i = 0; i < pre; i++)
#pragma unroll
    for (int a = 0; a < KA; a++) tma_load_2d(base + i * stage + xoff + a * XB, tx, (g0 + i * KA + a) * 64, 0, &full[i]);
  for (int i = ST; i < steps; i++) {
    const int s = i % ST;
    mbar_wait(&empty[s], ((i / ST) - 1) & 1);  // every consumer warp is done with the stage's last use
    const uint32_t sb = base + s * stage;
    mbar_expect_tx(&full[s], stage);
    load_w(sb, i, &full[s], pol);
#pragma unroll
    for (int a = 0; a < KA; a++) tma_load_2d(sb + xoff + a * XB, tx, (g0 + i * KA + a) * 64, 0, &full[s]);
  }
}

// The end of both ring kernels: after the wait (out, ws and sem may belong to the previous kernel until then) and
// once every stage is consumed (the ring's memory is free), the consumer warps' D fragments go through the ring's
// memory to one position per consumer thread (warp w's D = row block w of the CTA: R = NW), then gemv_kernel's
// split-K combine and store.
template <int NW, int NB>
__device__ __forceinline__ void ring_end(const float (&acc)[NB * 4], uint8_t* ring, float4* cbuf, MuseTrace& tr_,
                                         bf16* __restrict__ out, float4* __restrict__ ws, int* __restrict__ sem,
                                         int tid, int lane, int warp, int rg, int sidx, int S, int cl, int M,
                                         int N) {
  constexpr int NT = NW * 32, J = NB, P = NW * NB * 32;
  pdl_wait();
  __syncthreads();
  float4* red = reinterpret_cast<float4*>(ring);
  if (warp < NW) {
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
      red[(warp * NB + nb) * 32 + lane] = make_float4(acc[4 * nb], acc[4 * nb + 1], acc[4 * nb + 2], acc[4 * nb + 3]);
  }
  __syncthreads();
  float4 res[J];
#pragma unroll
  for (int j = 0; j < J; j++) res[j] = tid < NT ? red[tid + j * NT] : make_float4(0.f, 0.f, 0.f, 0.f);
  combine_store<false, true, NB, NW, J, P, NT>(res, tr_, out, cbuf, ws, sem, rg, sidx, S, cl, M, N);
}

template <int NW, int ST, int NB, int KA>
__global__ void __launch_bounds__(NW * 32 + 32, 1)
gemvt_kernel(const __grid_constant__ GemvArgs args, const __grid_constant__ CUtensorMap tx) {
  static_assert(NW % 4 == 0 && NW >= 4 && NW <= 16, "NW: whole warpgroups");
  constexpr uint32_t TILE = 64 * 128, WB = 16 * NW * 128, XB = 8 * NB * 128, STAGE = KA * (WB + XB);
  constexpr int NWG = NW / 4, P = NW * NB * 32;
  const uint8_t* __restrict__ wt = static_cast<const uint8_t*>(args.w);
  bf16* __restrict__ out = static_cast<bf16*>(args.out);
  float4* __restrict__ ws = static_cast<float4*>(args.ws);
  int* __restrict__ sem = static_cast<int*>(args.sem);
  const int M = args.M, N = args.N, K = args.K, S = args.S, cl = args.cl;
  extern __shared__ uint8_t dsm[];
  __shared__ __align__(8) unsigned long long full[ST], empty[ST];
  const uint32_t dbase = smem_u32(dsm), base = (dbase + 1023u) & ~1023u;
  uint8_t* ring = dsm + (base - dbase);
  float4* cbuf = reinterpret_cast<float4*>(ring + (size_t)ST * STAGE);  // cl: [S - 1][P], after the ring
  MuseTrace tr_{};
  pdl_trigger();
  cluster_start<P>(cl, S);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rg = blockIdx.x, sidx = blockIdx.y;
  int steps, atom0;
  ring_slice<KA>(K, S, sidx, steps, atom0);
  ring_init<ST>(full, empty, NW);

  float acc[NB * 4];
#pragma unroll
  for (int i = 0; i < NB * 4; i++) acc[i] = 0.f;
  if (warp == NW) {
    if (lane == 0) {
      const size_t KT = K / 64;
      // warpgroup g's KA tiles of step i: contiguous in wt, to its part of the stage
      auto load_w = [&](uint32_t sb, int i, unsigned long long* bar, uint64_t pol) {
#pragma unroll
        for (int g = 0; g < NWG; g++)
          bulk_load(sb + g * KA * TILE, wt + (((size_t)rg * NWG + g) * KT + atom0 + i * KA) * TILE, KA * TILE, bar, pol);
      };
      ring_produce<ST, KA>(&tx, full, empty, base, STAGE, KA * WB, XB, steps, atom0, load_w);
    }
  } else {
    const uint32_t wgoff = (uint32_t)(warp >> 2) * KA * TILE;  // this warpgroup's KA tiles of the stage
    for (int i = 0; i < steps; i++) {
      const int s = i % ST;
      mbar_wait(&full[s], (i / ST) & 1);
      const uint32_t sb = base + s * STAGE;
      wg_pin(acc);
      wg_fence();
#pragma unroll
      for (int a = 0; a < KA; a++)
#pragma unroll
        for (int j = 0; j < 4; j++)
          wgmma_ss<NB>(acc, wg_desc(sb + wgoff + a * TILE + 32 * j), wg_desc(sb + KA * WB + a * XB + 32 * j));
      wg_commit();
      wg_wait0();
      wg_pin(acc);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }
  ring_end<NW, NB>(acc, ring, cbuf, tr_, out, ws, sem, tid, lane, warp, rg, sidx, S, cl, M, N);
}

// ---- launch --------------------------------------------------------------------------------------
// Per-kernel opt-ins, made once per kernel and remembered (host-side calls: nothing for a graph to capture;
// kernel_fn's first eager call makes them):
//   OPT_CLUSTERS:  clusters above 8 CTAs are non-portable on sm_90, the kernel must allow them before such a launch
//   OPT_LARGE_SMEM: a TMA ring above 48 KB needs the dynamic shared memory opt-in: set to the most the SM allows
//                   beside the kernel's static shared memory (227 KB per CTA in all)
enum OptIn { OPT_CLUSTERS, OPT_LARGE_SMEM };
static int opt_in_once(const void* f, OptIn what) {
  static std::mutex mu;
  static std::vector<std::pair<const void*, OptIn>> done;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& d : done)
    if (d.first == f && d.second == what) return 0;
  cudaError_t e;
  if (what == OPT_CLUSTERS) {
    e = cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  } else {
    cudaFuncAttributes a;
    e = cudaFuncGetAttributes(&a, f);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 - (int)a.sharedSizeBytes);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return (int)e;
  }
  done.emplace_back(f, what);
  return 0;
}

// Every kernel goes through here: with pdl, the launch may start while the previous kernel of the
// stream is still running (programmatic stream serialization); torch's graph capture keeps the edge.
template <typename... KArgs, typename... Args>
static int launch_pdl(void (*kern)(KArgs...), dim3 grid, dim3 block, cudaStream_t st, bool pdl, int cluster_y,
                      size_t dsmem, int carveout, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = dsmem;
  cfg.stream = st;
  cudaLaunchAttribute attr[3];
  int n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_y > 1) {  // clusters of cluster_y CTAs along y (more than 8 is a non-portable size on sm_90)
    if (cluster_y > 8) {
      const int e = opt_in_once((const void*)kern, OPT_CLUSTERS);
      if (e) return e;
    }
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1;
    attr[n].val.clusterDim.y = cluster_y;
    attr[n++].val.clusterDim.z = 1;
  }
  if (carveout >= 0) {  // percent of the unified L1 / shared memory the SM should give to shared memory
    attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attr[n++].val.sharedMemCarveout = (unsigned)carveout;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  const cudaError_t rc = cudaLaunchKernelEx(&cfg, kern, args...);
  if (rc != cudaSuccess) (void)cudaGetLastError();  // a refused launch (not sticky): reported once, here, not again by torch
  return (int)rc;
}

static int func_attrs(const void* f, int* res) {
  cudaFuncAttributes a;
  const cudaError_t e = cudaFuncGetAttributes(&a, f);
  if (e != cudaSuccess) return (int)e;
  res[0] = a.numRegs; res[1] = (int)a.localSizeBytes; res[2] = (int)a.sharedSizeBytes; res[3] = a.maxThreadsPerBlock;
  return 0;
}

// ---- gemvt (PIPE 6): TMA descriptors and launch ------------------------------------------------------
// cuTensorMapEncodeTiled is a driver function: fetched once through the runtime (no -lcuda needed).
static PFN_cuTensorMapEncodeTiled_v12000 tmap_encoder() {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    else
      (void)cudaGetLastError();
  });
  return fn;
}

// bf16 [rows, K] row-major at p: boxes of 64 k x box_rows rows, 128-byte swizzle; rows past the end read as zeros.
// A host-side encode (no GPU work): each launch passes its descriptors by value, so a captured graph keeps them.
static int make_tmap(CUtensorMap* m, const void* p, int rows, int K, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 enc = tmap_encoder();
  if (!enc) return (int)cudaErrorNotSupported;
  const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)K * 2};
  const cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p), dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : (int)cudaErrorInvalidValue;
}

// ---- one launcher per kernel family ------------------------------------------------------------------
// The launch options of a config (co: the carveout, -1 = the driver's choice; pdl) and the stream.
struct LaunchOpts {
  int co;
  bool pdl;
  cudaStream_t st;
};

// gemv_kernel<NW, U, NB, R, DUAL, PIPE>: grid (N / 16R, S), clusters (1, S) when cl; the leader's cbuf in dynamic smem.
template <int NW, int U, int NB, int R, bool D, int P>
static int launch_gemv(const GemvArgs& a, const LaunchOpts& o) {
  return launch_pdl(gemv_kernel<NW, U, NB, R, D, P>, dim3(a.N / (16 * R), a.S), dim3(NW * 32), o.st, o.pdl,
                    a.cl ? a.S : 1, a.cl ? (size_t)(a.S - 1) * R * NB * 32 * 16 : 0, o.co, a);
}

// gemvz_kernel<NW, UG, NB, R, PIPE>: the same grid, one more warp (the exception warp).
template <int NW, int UG, int NB, int R, int P>
static int launch_gemvz(const GemvArgs& a, const LaunchOpts& o) {
  return launch_pdl(gemvz_kernel<NW, UG, NB, R, P>, dim3(a.N / (16 * R), a.S), dim3((NW + 1) * 32), o.st, o.pdl,
                    a.cl ? a.S : 1, a.cl ? (size_t)(a.S - 1) * R * NB * 32 * 16 : 0, o.co, a);
}

// gemvt_kernel<NW, ST, NB, KA>: grid (N / 16NW, S), NW consumer warps + the producer, the ring in dynamic smem (opt-in
// above 48 KB), x through a TMA descriptor made here (host-side; a captured graph keeps it by value).
template <int NW, int ST, int NB, int KA>
static int launch_gemvt(const GemvArgs& a, const LaunchOpts& o) {
  int e = opt_in_once((const void*)gemvt_kernel<NW, ST, NB, KA>, OPT_LARGE_SMEM);
  if (e) return e;
  CUtensorMap tx;
  if ((e = make_tmap(&tx, a.x, a.M, a.K, 8 * NB))) return e;
  return launch_pdl(gemvt_kernel<NW, ST, NB, KA>, dim3(a.N / (16 * NW), a.S), dim3(NW * 32 + 32), o.st, o.pdl,
                    a.cl ? a.S : 1, gemvt_smem(NW, ST, NB, KA, a.S, a.cl), o.co, a, tx);
}

// configs.cuh: the compiled instantiations, one X-macro line per config a table row or the default rule can ask
// for. Generated by build.py (edit tables/*.json or submission.DEFAULT_GEMV / DEFAULT_GEMVZ, then run it).

// ---- BEGIN GENERATED by build.py from tables/*.json + DEFAULT_GEMV / DEFAULT_GEMVZ: edit the tables, not this ----
// C3(NW, U, NB, R, DUAL, PIPE): one compiled gemv_kernel
#define GEMV_CONFIGS(C3) \
  C3(2, 1, 1, 1, false, 2) \
  C3(2, 1, 1, 1, true, 2) \
  C3(2, 1, 2, 1, false, 2) \
  C3(2, 1, 2, 1, true, 2) \
  C3(2, 1, 4, 1, false, 2) \
  C3(2, 1, 4, 1, true, 2) \
  C3(4, 1, 1, 1, false, 2) \
  C3(4, 1, 1, 1, true, 2) \
  C3(4, 1, 2, 1, false, 2) \
  C3(4, 1, 2, 1, true, 2) \
  C3(4, 1, 4, 1, false, 2) \
  C3(4, 1, 4, 1, true, 2) \
  C3(4, 2, 2, 2, false, 4) \
  C3(4, 4, 1, 1, false, 1) \
  C3(4, 4, 2, 1, false, 3) \
  C3(8, 1, 4, 1, true, 4) \
  C3(8, 2, 1, 2, false, 0) \
  C3(8, 2, 1, 2, false, 3) \
  C3(8, 4, 2, 2, false, 3) \
  C3(16, 2, 1, 2, true, 3) \
  C3(16, 2, 2, 2, true, 0) \
  C3(16, 4, 1, 2, false, 3)
// Z3(NW, UG, NB, R, PIPE): one compiled gemvz_kernel
#define GEMVZ_CONFIGS(Z3) \
  Z3(4, 1, 1, 1, 2) \
  Z3(4, 1, 1, 1, 10) \
  Z3(4, 1, 1, 2, 0) \
  Z3(4, 1, 1, 2, 8) \
  Z3(4, 1, 2, 1, 2) \
  Z3(4, 1, 2, 1, 10) \
  Z3(4, 1, 2, 2, 4) \
  Z3(4, 1, 2, 2, 12) \
  Z3(4, 1, 4, 1, 2) \
  Z3(4, 1, 4, 1, 10) \
  Z3(4, 2, 2, 2, 1) \
  Z3(4, 2, 2, 2, 2) \
  Z3(4, 2, 2, 2, 9) \
  Z3(4, 2, 2, 2, 10) \
  Z3(8, 1, 1, 2, 0) \
  Z3(8, 1, 1, 2, 4) \
  Z3(8, 1, 1, 2, 5) \
  Z3(8, 1, 1, 2, 8) \
  Z3(8, 1, 1, 2, 12) \
  Z3(8, 1, 1, 2, 13) \
  Z3(8, 1, 2, 2, 4) \
  Z3(8, 1, 2, 2, 12) \
  Z3(8, 2, 1, 2, 3) \
  Z3(8, 2, 1, 2, 11) \
  Z3(16, 1, 1, 2, 4) \
  Z3(16, 1, 1, 2, 12)
// T3(NW, ST, NB, KA): one compiled gemvt_kernel
#define GEMVT_CONFIGS(T3) \
  T3(4, 4, 1, 2) \
  T3(4, 4, 2, 2) \
  T3(4, 4, 4, 2) \
  T3(4, 8, 1, 2) \
  T3(4, 8, 2, 2) \
  T3(4, 8, 4, 2) \
  T3(4, 12, 1, 2) \
  T3(8, 4, 1, 2) \
  T3(8, 4, 2, 2) \
  T3(8, 4, 4, 2)
// ---- END GENERATED ----

// ---- dispatch: a runtime config -> its compiled instantiation (the lines of configs.cuh) -----------------
// kind: 0 gemv (t = NW, U, NB, R, DUAL, PIPE), 1 gemvz (t = NW, UG, NB, R, PIPE), 2 gemvt (t = NW, ST, NB, KA).
#define MUSE_IS_C3(NW_, U_, NB_, R_, D_, P_) \
  (kind == 0 && t[0] == NW_ && t[1] == U_ && t[2] == NB_ && t[3] == R_ && t[4] == (int)D_ && t[5] == P_)
#define MUSE_IS_Z3(NW_, U_, NB_, R_, P_) (kind == 1 && t[0] == NW_ && t[1] == U_ && t[2] == NB_ && t[3] == R_ && t[4] == P_)
#define MUSE_IS_T3(NW_, ST_, NB_, KA_) (kind == 2 && t[0] == NW_ && t[1] == ST_ && t[2] == NB_ && t[3] == KA_)

// Return codes: 0 launched, -1 config not compiled in, > 0 the cudaError_t of the launch.
int muse_launch(int kind, const int* t, const GemvArgs& a, int co, bool pdl, cudaStream_t st) {
  const LaunchOpts o{co, pdl, st};
#define LAUNCH_C3(NW_, U_, NB_, R_, D_, P_) \
  if (MUSE_IS_C3(NW_, U_, NB_, R_, D_, P_)) return launch_gemv<NW_, U_, NB_, R_, D_, P_>(a, o);
#define LAUNCH_Z3(NW_, U_, NB_, R_, P_) if (MUSE_IS_Z3(NW_, U_, NB_, R_, P_)) return launch_gemvz<NW_, U_, NB_, R_, P_>(a, o);
#define LAUNCH_T3(NW_, ST_, NB_, KA_) if (MUSE_IS_T3(NW_, ST_, NB_, KA_)) return launch_gemvt<NW_, ST_, NB_, KA_>(a, o);
  GEMV_CONFIGS(LAUNCH_C3)
  GEMVZ_CONFIGS(LAUNCH_Z3)
  GEMVT_CONFIGS(LAUNCH_T3)
#undef LAUNCH_C3
#undef LAUNCH_Z3
#undef LAUNCH_T3
  return -1;
}

// res = {registers, local (spill) bytes, static shared bytes, max threads} of a compiled config; same return codes.
int muse_attrs(int kind, const int* t, int* res) {
#define ATTRS_C3(NW_, U_, NB_, R_, D_, P_) \
  if (MUSE_IS_C3(NW_, U_, NB_, R_, D_, P_)) return func_attrs((const void*)gemv_kernel<NW_, U_, NB_, R_, D_, P_>, res);
#define ATTRS_Z3(NW_, U_, NB_, R_, P_) \
  if (MUSE_IS_Z3(NW_, U_, NB_, R_, P_)) return func_attrs((const void*)gemvz_kernel<NW_, U_, NB_, R_, P_>, res);
#define ATTRS_T3(NW_, ST_, NB_, KA_) \
  if (MUSE_IS_T3(NW_, ST_, NB_, KA_)) return func_attrs((const void*)gemvt_kernel<NW_, ST_, NB_, KA_>, res);
  GEMV_CONFIGS(ATTRS_C3)
  GEMVZ_CONFIGS(ATTRS_Z3)
  GEMVT_CONFIGS(ATTRS_T3)
#undef ATTRS_C3
#undef ATTRS_Z3
#undef ATTRS_T3
  return -1;
}

int unpackz_launch(const void* w, const void* zbase, void* out, int N, int K, cudaStream_t st) {
  const size_t threads = (size_t)(N / 16) * (K / 64) * 32;
  return launch_pdl(unpackz_kernel, dim3((unsigned)((threads + 255) / 256)), dim3(256), st, false, 1, 0, -1,
                    (const uint4*)w, (const uint8_t*)zbase, (uint16_t*)out, N, K);
}
"""
# ---- END GENERATED ----

# ---- BEGIN GENERATED by build.py from csrc/bind.cpp: edit csrc/, not this ----
BIND_SRC = r"""
// bind.cpp: the Python glue, compiled by the host compiler. Plain pybind11 over raw pointers and the raw stream:
// submission.py checks dtypes, shapes, devices and alignment before it calls, so no torch header is needed here (the
// torch headers cost the first import most of its compile time). Errors name the config.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

// args.h: what one launch hands its kernel besides the template parameters: one struct for the three kernel families,
// shared by the device source and the Python glue (bind.cpp), so a new field is written here and filled in bind.cpp.
// Plain C++ (pointers as void*): the glue is compiled by the host compiler without CUDA's headers.
#include <stdint.h>

struct GemvArgs {
  const void* x;     // bf16 [M, K] row-major, 16-byte aligned (gemvt: the pointer of its TMA descriptor)
  const void* w;     // the layer's weight as the kernel reads it: pack_plain (gemv), pack_z's stream (gemvz), pack_tma's
                     // tiles (gemvt)
  const void* w2;    // gemv with DUAL: the router's lo half, packed like w; else unused
  void* out;         // [M, N]: bf16, fp32 for DUAL
  void* ws;          // float4 split-K partials (cl = 0 and S > 1)
  void* sem;         // int32 split-K tickets (cl = 0 and S > 1), zero between calls: every call leaves them so
  int M, N, K;       // tokens, rows, columns
  int S;             // CTAs per row group (split-K)
  int pf;            // gemv / gemvz: 1 = L2 prefetch of each warp's slice before griddepcontrol.wait
  int cl;            // split-K reduction: 0 global ticket, 1 cluster barrier, 2 cluster mbarrier (st.async)
  const void* eptr;  // gemvz: the side table's row offsets, int32 [N + 1]; else unused
  const void* esc;   // gemvz: the side table's entries, int2 {k, fp32 bits of the correction}; else unused
  const void* zbase; // gemvz: each row's window, uint8 [N]: row r's 8 classes are zbase[r] .. zbase[r] + 7
};
// The order is gemv_kernel's parameter list before the struct (x .. cl). The kernels take it as a __grid_constant__
// parameter: read in place from the parameter space. Taken by plain value, the router's m = 32 kernel (gemv 8, 1, 4,
// 1, DUAL, PIPE 4) went from 120 to 136 registers, one CTA an SM instead of two, and 5.3 -> 7.5 us with its clusters
// of 8 in two waves (device call 1 of session 16, FINDINGS.md "House"); with __grid_constant__ its code is
// byte-identical to the positional parameters' again, and no kernel changed its register allocation granule.

int muse_launch(int kind, const int* t, const GemvArgs& a, int co, bool pdl, cudaStream_t st);
int muse_attrs(int kind, const int* t, int* res);
int unpackz_launch(const void* w, const void* zbase, void* out, int N, int K, cudaStream_t st);

namespace py = pybind11;

// The config line a (kind, template parameters) stands for, as configs.cuh writes it.
static std::string config_name(int kind, const std::vector<int>& t) {
  static const char* const head[] = {"gemv C3(NW, U, NB, R, DUAL, PIPE) = (", "gemvz Z3(NW, UG, NB, R, PIPE) = (",
                                     "gemvt T3(NW, ST, NB, KA) = ("};
  std::string s = kind >= 0 && kind <= 2 ? head[kind] : "kind " + std::to_string(kind) + " (";
  for (size_t i = 0; i < t.size(); i++) s += (i ? ", " : "") + std::to_string(t[i]);
  return s + ")";
}

static void check_rc(int rc, const std::string& what) {
  if (rc == -1) throw std::runtime_error("unsupported " + what + ": not compiled in (add its table row and run build.py)");
  if (rc) throw std::runtime_error(what + ": CUDA error " + cudaGetErrorString((cudaError_t)rc));
}

static std::vector<int> checked_template(int kind, std::vector<int> t) {
  const size_t want = kind == 0 ? 6 : kind == 1 ? 5 : kind == 2 ? 4 : 0;
  if (!want || t.size() != want)
    throw std::invalid_argument("Launch: kind " + std::to_string(kind) + " takes " + std::to_string(want) +
                                " template parameters, got " + std::to_string(t.size()));
  return t;
}

// One planned launch of a layer at one m: the kernel (kind + template parameters), the layer's weight, side table and
// split-K buffers, the config's runtime fields. prepare builds it once; a call supplies x, out, the tokens and the
// stream.
struct Launch {
  int kind;
  std::vector<int> t;
  GemvArgs a;
  int co;

  void call(uintptr_t x, uintptr_t out, int M, uintptr_t stream, bool pdl) const {
    GemvArgs b = a;
    b.x = reinterpret_cast<const void*>(x);
    b.out = reinterpret_cast<void*>(out);
    b.M = M;
    const int rc = muse_launch(kind, t.data(), b, co, pdl, reinterpret_cast<cudaStream_t>(stream));
    if (rc) check_rc(rc, config_name(kind, t));
  }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // module_local: every variant build (tools, tests) defines its own Launch; pybind11 would refuse a second global one
  py::class_<Launch>(m, "Launch", py::module_local(), "one planned launch: Launch(...)(x_ptr, out_ptr, M, stream, pdl)")
      .def(py::init([](int kind, std::vector<int> t, uintptr_t w, uintptr_t w2, uintptr_t eptr, uintptr_t esc,
                       uintptr_t ws, uintptr_t sem, int N, int K, int S, int pf, int cl, uintptr_t zbase,
                       int co) {
             GemvArgs a{};
             a.w = reinterpret_cast<const void*>(w);
             a.w2 = reinterpret_cast<const void*>(w2);
             a.eptr = reinterpret_cast<const void*>(eptr);
             a.esc = reinterpret_cast<const void*>(esc);
             a.ws = reinterpret_cast<void*>(ws);
             a.sem = reinterpret_cast<void*>(sem);
             a.N = N, a.K = K, a.S = S, a.pf = pf, a.cl = cl;
             a.zbase = reinterpret_cast<const void*>(zbase);
             return Launch{kind, checked_template(kind, std::move(t)), a, co};
           }),
           py::arg("kind"), py::arg("t"), py::arg("w"), py::arg("w2"), py::arg("eptr"), py::arg("esc"), py::arg("ws"),
           py::arg("sem"), py::arg("N"), py::arg("K"), py::arg("S"), py::arg("pf"), py::arg("cl"), py::arg("zbase"),
           py::arg("co"))
      .def("__call__", &Launch::call, py::arg("x"), py::arg("out"), py::arg("M"), py::arg("stream"), py::arg("pdl"))
      .def_readonly("kind", &Launch::kind)
      .def_readonly("t", &Launch::t);
  m.def("attrs", [](int kind, std::vector<int> t) -> std::vector<int> {
    int res[4] = {0, 0, 0, 0};
    const int rc = muse_attrs(kind, checked_template(kind, t).data(), res);
    if (rc == -1) return {};
    check_rc(rc, config_name(kind, t));
    return {res[0], res[1], res[2], res[3]};
  }, "registers / spill bytes / static smem / max threads of a compiled config; [] if it is not compiled in");
  m.def("unpackz", [](uintptr_t w, uintptr_t zbase, uintptr_t out, int N, int K, uintptr_t stream) {
    const int rc = unpackz_launch(reinterpret_cast<const void*>(w), reinterpret_cast<const void*>(zbase),
                                  reinterpret_cast<void*>(out), N, K, reinterpret_cast<cudaStream_t>(stream));
    if (rc) check_rc(rc, "unpackz");
  }, "decode a 12-bit stream to bf16 [N, K] (prepare's check)");
}
"""
# ---- END GENERATED ----

# sm_90a: the wgmma instructions of gemvt_kernel exist only on the arch-specific target (an H100 / H200 build: a plain
# sm_90 binary would refuse them).
NVCC_FLAGS = ["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a"]

# The instantiation lists in KERNEL_SRC (csrc/configs.cuh): one X-macro line per compiled config, written by build.py
# from the tables and the defaults (instantiations_cuh), or for a variant build from the list it asks for.
CONFIGS_BEGIN = "// ---- BEGIN GENERATED by build.py from tables/*.json + DEFAULT_GEMV / DEFAULT_GEMVZ: edit the tables, not this ----"
CONFIGS_END = "// ---- END GENERATED ----"
KINDS = ("gemv", "gemvz", "gemvt")     # the kernel families, in the order of the glue's `kind` argument


def instantiations_cuh(insts):
    """The body of csrc/configs.cuh's generated region for insts, a list of (kind, template args): "gemv" (NW, U, NB,
    R, DUAL, PIPE), "gemvz" (NW, UG, NB, R, PIPE), "gemvt" (NW, ST, NB, KA). One X-macro list per family."""
    heads = {"gemv": ("GEMV_CONFIGS", "C3", "C3(NW, U, NB, R, DUAL, PIPE): one compiled gemv_kernel"),
             "gemvz": ("GEMVZ_CONFIGS", "Z3", "Z3(NW, UG, NB, R, PIPE): one compiled gemvz_kernel"),
             "gemvt": ("GEMVT_CONFIGS", "T3", "T3(NW, ST, NB, KA): one compiled gemvt_kernel")}
    bad = [i for i in insts if i[0] not in heads]
    if bad:
        raise ValueError(f"instantiations {bad}: kind must be one of {KINDS}")
    out = []
    for kind in KINDS:
        macro, line, what = heads[kind]
        args = sorted({tuple(a) for k, a in insts if k == kind})
        body = [f"  {line}(" + ", ".join(("true" if v else "false") if isinstance(v, bool) else str(v) for v in a) + ")"
                for a in args]
        out += [f"// {what}", f"#define {macro}({line})" + (" \\" if body else "")]
        out += [b + " \\" for b in body[:-1]] + body[-1:]
    return "\n".join(out)


def replace_region(text, begin, end, body):
    """text with the lines between the marker line `begin` and the next `end` replaced by body."""
    i = text.find(begin)
    if i < 0:
        raise ValueError(f"marker not found: {begin}")
    j = text.find(end, i + len(begin))
    if j < 0:
        raise ValueError(f"no '{end}' after {begin}")
    return text[:i + len(begin)] + "\n" + body + "\n" + text[j:]


def variant_source(defines=(), insts=None, kernel_src=None):
    """KERNEL_SRC (or kernel_src) with `#define NAME` lines first (compile-time variants: MUSE_TRACE,
    MUSE_SKIP_CORRECTIONS) and, when insts is given, only those instantiations."""
    src = KERNEL_SRC if kernel_src is None else kernel_src
    for d in defines:
        if not d.replace("_", "").isalnum():
            raise ValueError(f"define {d!r} is not a macro name")
    if insts is not None:
        src = replace_region(src, CONFIGS_BEGIN, CONFIGS_END, instantiations_cuh(insts))
    return "".join(f"#define {d}\n" for d in defines) + src


# ===================================================================================================
# Build: once per source text, cached by torch under $TORCH_EXTENSIONS_DIR (default
# ~/.cache/torch_extensions/<python>_<cuda>/muse_gemv_<hash>). Set MUSE_BUILD=0 to skip (CPU tools).
# ===================================================================================================
def build_extension(defines=(), insts=None, verbose=False):
    """Compile the kernels (variant_source(defines, insts)) and the glue with load_inline, as muse_gemv_<hash of the
    sources and flags>; returns the module. The shipped build is build_extension(). A variant (tools, tests) gets its
    own cached build; with insts it compiles only those configs (seconds instead of the shipped build's tens of
    seconds). Prints a line before and after a cold build."""
    import hashlib
    import inspect
    from torch.utils import cpp_extension
    src = variant_source(defines, insts)
    name = "muse_gemv_" + hashlib.sha1((src + BIND_SRC + " ".join(NVCC_FLAGS)).encode()).hexdigest()[:12]
    try:
        bdir = cpp_extension._get_build_directory(name, verbose=False)
    except Exception:  # private helper: only used for the progress message
        bdir = os.path.join(cpp_extension.get_default_build_root(), name)
    cached = os.path.exists(os.path.join(bdir, name + ".so"))
    # no_implicit_headers (torch >= 2.7): no torch/extension.h in the glue nor torch/types.h in the kernels, which
    # need neither; older torch prepends them, and the build only takes longer.
    lean = {"no_implicit_headers": True} if "no_implicit_headers" in inspect.signature(
        cpp_extension.load_inline).parameters else {}
    t0 = time.time()
    if not cached:
        print(f"[muse] compiling CUDA extension {name}{' (' + '+'.join(defines) + ')' if defines else ''}: "
              f"{'the shipped configs' if insts is None else f'{len(insts)} configs'}, cached afterwards in {bdir}"
              f"{'' if lean else ' (this torch prepends its own headers: slower)'}", file=sys.stderr, flush=True)
    mod = cpp_extension.load_inline(name=name, cpp_sources=[BIND_SRC], cuda_sources=[src],
                                    extra_cuda_cflags=NVCC_FLAGS, extra_cflags=["-O2"], verbose=verbose, **lean)
    if not cached:
        print(f"[muse] compiled in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    return mod


_SHIPPED = None
if torch.cuda.is_available() and os.environ.get("MUSE_BUILD", "1") != "0":
    _SHIPPED = build_extension()


def shipped_extension():
    """The extension built at import from the shipped source (prepare's default)."""
    if _SHIPPED is None:
        raise RuntimeError("the CUDA extension is not built: this needs a CUDA device (and MUSE_BUILD != 0)")
    return _SHIPPED


# torch's own accessor of the current stream's handle (no Stream object per call); None where a torch lacks it
_CURRENT_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_stream(device):
    """The current CUDA stream of device as an integer handle (what the glue launches on; a graph capture's stream
    while capturing)."""
    if _CURRENT_RAW_STREAM is not None:
        return _CURRENT_RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


# ===================================================================================================
# Packing (our chapter 5): fragment order for the plain path.
# ===================================================================================================
def pack_plain(w):
    """Reorder W [N, K] (any 2-byte dtype) into fragment order; returns a tensor of shape [N/16, K/32, 64, 8].

    One m16n8k16 A fragment = 16 rows x 16 k; lane = 4g + t holds 8 values j = 0..7:
    j = 4p + 2h + e  ->  row g + 8h,  mma k 2t + 8p + e.
    The K relabelling: mma step s (0, 1) of 32-wide K block kb uses physical k = 32kb + 8t + 4s + 2p + e,
    so a lane's x for both steps is ONE 16-byte load of x[tok, 32kb + 8t .. 32kb + 8t + 7] (words 0, 1
    feed step 0; words 2, 3 step 1). The same permutation of k is applied to W and x: the dot product
    is unchanged.

        packed[rb][kb][s*32 + lane][j] = W[16rb + g + 8h][32kb + 8t + 4s + 2p + e]

        per (rb, kb): 1024 bytes = 64 units of 16 B
        unit:   0 .. 31  step 0, lanes 0..31  -> one 512 B warp load (ld_stream(wp + kb*64))
               32 .. 63  step 1, lanes 0..31  -> one 512 B warp load (ld_stream(wp + kb*64 + 32))
        unit bytes (lane g,t; step s):  j0 j1 | j2 j3 | j4 j5 | j6 j7
                                     row g  | g+8   | g     | g+8
                                    k 8t+4s+{0,1}   | 8t+4s+{2,3}
    Lab: labs/lab2_fragments.py emulates these loads lane by lane.
    """
    N, K = w.shape
    if N % 16 or K % 32:
        raise ValueError(f"pack_plain needs N % 16 == 0 and K % 32 == 0, got N={N}, K={K}")
    v = w.reshape(N // 16, 2, 8, K // 32, 4, 2, 2, 2)            # rb, h, g, kb, t, s, p, e
    return v.permute(0, 3, 5, 2, 4, 6, 1, 7).reshape(N // 16, K // 32, 64, 8).contiguous()


def pack_tma(w):
    """W [N, K] (bf16) as gemvt_kernel reads it: tiles of 64 rows x 64 k, tile (rt, kt) at index
    rt * K/64 + kt, each 8 KB in the 128-byte swizzle of its shared-memory image: row r is 128 B, and its 16-byte
    chunk c (k 8c .. 8c + 7 of the tile) sits at chunk position c ^ (r & 7). Returns [N/64, K/64, 64, 64].

        packed[rt][kt][r][8 (c ^ (r & 7)) + i] = W[64 rt + r][64 kt + 8 c + i]

    A warpgroup's KA tiles of one stage are contiguous (one bulk copy); wgmma reads the tile through a descriptor
    with the 128-byte swizzle, which undoes the XOR. Lab: labs/lab6_tma.py checks this layout against the
    hardware's swizzle rule (the address bits 4-6 XOR bits 7-9 of a 1024-byte aligned tile)."""
    N, K = w.shape
    if N % 64 or K % 64:
        raise ValueError(f"pack_tma needs N % 64 == 0 and K % 64 == 0, got N={N}, K={K}")
    v = w.reshape(N // 64, 64, K // 64, 8, 8).permute(0, 2, 1, 3, 4)   # rt, kt, r, c, i
    r = torch.arange(64, device=w.device)
    pos = torch.arange(8, device=w.device)
    src = pos[None, :] ^ (r[:, None] & 7)                               # chunk that lands at position pos of row r
    return v[:, :, r[:, None], src, :].reshape(N // 64, K // 64, 64, 64).contiguous()


def split_hi_lo(w32):
    """The router's fp32 weight as two bf16 halves: hi = bf16(W), lo = bf16(W - hi) (W - hi is exact in fp32).

    hi + lo carries 16 significant bits; the fused DUAL kernel sums x.hi + x.lo into one set of fp32
    accumulators. Non-finite weights keep lo = 0 (Inf - Inf would be NaN); finite weights above the bf16
    range take hi = the largest bf16 of their sign (truncation) so that lo stays finite.
    """
    w32 = w32.float()
    hi = w32.to(torch.bfloat16)
    over = torch.isinf(hi) & torch.isfinite(w32)
    if bool(over.any()):
        trunc = (w32.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
        hi = torch.where(over, trunc, hi)
    lo = (w32 - hi.float()).to(torch.bfloat16)
    lo = torch.where(torch.isfinite(w32), lo, torch.zeros_like(lo))
    return hi, lo


# ===================================================================================================
# The lossless 12-bit format (our chapter 7).
#
# A bf16 is s | e7..e0 | m6..m0. Its low byte (e0 + 7 mantissa bits) is stored verbatim (8 bits). Its high
# byte minus the sign, the "class" e7..e1 (7 bits, a factor-4 range of magnitudes), is stored as a 3-bit
# index into its row's window, and the sign as a 4th bit: 12 bits per weight, fixed rate. A row's window is 8
# consecutive classes zbase[r] .. zbase[r] + 7 (16 binades), the run that holds most of the row's weights, so
# rows of different scale each get the binades they use (FINDINGS.md section 19; one window per matrix put
# 0.3-0.8% of row-scaled weights out of window).
#
# Every weight is stored as index clamp(class - zbase, 0, 7), its own sign and low byte: in-window weights decode
# to themselves, out-of-window weights (exceptions) to v, the nearest window class with W's sign and low byte.
# An fp32 correction c = fl(W - v) in a side table restores them: pack_z takes a row's best window only if
# fl(v + c) == W bit for bit for every exception of the row (true when W is within 16 binades of the window;
# otherwise it tries the row's other windows, most weights first; if none works, e.g. a subnormal next to
# normal weights, it refuses the matrix and the layer runs plain). Zeros are exceptions whose v + c is +0: the
# sign of a zero weight is not kept, which no GEMV output can observe (every sum starts from +0, and a
# product with -0 adds nothing to it). So the stream never branches, and a one-hot probe on an exception
# column returns v + c = W exactly.
#
# Layout per (16-row block rb, 64-wide group G): 96 units of 16 B = 1536 B (vs 2048 B of bf16)
#   units  0..31  A0[lane]: low bytes of fragment f0 (j0..j7) then f1 (j0..j7)
#   units 32..63  A1[lane]: low bytes of f2, f3
#   units 64..95  C[lane]:  code words of f0, f1, f2, f3 (one 32-bit word per fragment)
# where f = 2*kb2 + s is mma step s of K block kb = 2G + kb2, i.e. fragment f of a lane holds exactly
# what pack_plain puts in unit (kb, s, lane). Code word (decz): byte b holds the index of j_b in bits 0..2,
# of j_b+4 in bits 4..6, the sign of j_b in bit 7 and of j_4+(b+3)%4 in bit 3 (ZIDX_BIT, ZSIGN_BIT).
# zbase: uint8 [N], 8 bits per row. Side table, CSR: eptr int32 [N + 1] (row r's exceptions are entries
# eptr[r] .. eptr[r+1]-1) and esc int32 [n_exc, 2] = {k, fp32 bits of c}, row-major, each row's k ascending:
# 64 bits per exception + 32 per row (trained-looking weights: 0.03-0.05 bit per weight).
# ===================================================================================================
ZIDX_BIT = (0, 8, 16, 24, 4, 12, 20, 28)      # code-word bit where fragment element j's 3-bit index starts
ZSIGN_BIT = (7, 15, 23, 31, 11, 19, 27, 3)    # code-word bit that holds the sign of fragment element j
ZBASES = 121                                  # window starts 0 .. 120 (class + 7 <= 127)

ZPack = collections.namedtuple("ZPack", "stream zbase eptr esc capr n_exc exc_cols moved")
# moved: rows whose window is not their fullest run of 8 classes (the fullest left an exception inexact)


def side_table_bits(z, N, K):
    """Bits per weight beyond the 12 of the stream: the windows (8 per row) and the exception side table (CSR:
    eptr [N + 1] int32 + esc [n_exc] int2)."""
    return (64 * z.n_exc + 32 * (N + 1) + 8 * N) / (N * K)


def _zrow_counts(cls, chunk=1024):
    """[N, ZBASES] int64: how many of each row's weights a window starting at class b holds."""
    N = cls.shape[0]
    hist = torch.zeros((N, 128), dtype=torch.int64, device=cls.device)
    for r0 in range(0, N, chunk):                       # row chunks: the bincount keys stay small
        c = cls[r0:r0 + chunk]
        key = (torch.arange(c.shape[0], device=cls.device)[:, None] * 128 + c).flatten()
        hist[r0:r0 + c.shape[0]] = torch.bincount(key, minlength=c.shape[0] * 128).view(-1, 128)
    csum = torch.nn.functional.pad(torch.cumsum(hist, 1), (1, 0))
    return csum[:, 8:] - csum[:, :ZBASES]


def _bf16_values(bits):
    """bf16 bit patterns held as int32 0..65535 -> their fp32 values."""
    return (bits - ((bits >> 15) << 16)).to(torch.int16).view(torch.bfloat16).float()


def _restores(back, w):
    """Whether v + c (fp32 back) gives the weight w back as the format accepts it: bit for bit, NaN for NaN, or +0 for
    a zero weight of either sign (no GEMV output can observe the sign of a zero weight: every sum starts from +0)."""
    return (back.view(torch.int32) == w.view(torch.int32)) | (torch.isnan(back) & torch.isnan(w)) | \
        ((w == 0) & (back == 0))


def _zdecode_exact(bits, base):
    """For weights bits (int32 [..., K]) stored with windows base (int [..., 1] or broadcastable): the index each is
    stored with, whether it is an exception, whether v + c gives W back (True for in-window weights), and c."""
    d = ((bits >> 8) & 0x7F) - base
    exc = (d < 0) | (d > 7)
    idx = d.clamp(0, 7)
    v = _bf16_values((((bits >> 15) & 1) << 15) | ((base + idx) << 8) | (bits & 0xFF))
    w = _bf16_values(bits)
    corr = w - v
    return idx, exc, _restores(v + corr, w) | ~exc, corr


def pack_z(w):
    """Compress bf16 W [N, K] (N % 16 == 0, K % 64 == 0) to the 12-bit format; torch ops, CPU or GPU.

    Returns ZPack(stream uint8 [N/16, K/64, 1536], zbase uint8 [N], eptr int32 [N + 1], esc int32
    [max(n_exc, 1), 2], capr, n_exc, exc_cols (sorted unique k of exceptions), moved).
    Row r's window is classes zbase[r] .. zbase[r] + 7: the run of 8 holding most of its weights (ties: the
    smaller start) among those that leave every exception of the row exact as v + c. The side table is CSR:
    row r's exceptions are esc[eptr[r]:eptr[r + 1]] = {k, fp32 bits of the correction}, k ascending; capr is
    the largest count of one row.
    NaN weights come back as NaN at the same positions (a signalling NaN's payload comes back quiet: the
    correction W - v is computed in fp32), zeros as +0; no GEMV output can observe either. Raises ValueError
    when a row has no exact window (e.g. subnormals next to normal weights).
    """
    N, K = w.shape
    if w.dtype != torch.bfloat16:
        raise TypeError(f"pack_z needs a bf16 weight, got {w.dtype}")
    if N % 16 or K % 64:
        raise ValueError(f"pack_z needs N % 16 == 0 and K % 64 == 0, got N={N}, K={K}")
    dev = w.device
    bits = w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    counts = _zrow_counts((bits >> 8) & 0x7F)
    base = torch.argmax(counts, 1)                      # the first maximum: ties to the smaller start
    idx, exc, ok, corr = _zdecode_exact(bits, base[:, None])
    bad = torch.nonzero(~ok.all(1)).flatten().tolist()
    for r in bad:                                       # rare: try the row's other windows, fullest first
        cand = torch.arange(ZBASES, device=dev)[:, None]
        good = _zdecode_exact(bits[r][None, :].expand(ZBASES, K), cand)[2].all(1)
        if not bool(good.any()):
            raise ValueError(f"row {r}: no window of 8 classes leaves its out-of-window weights exact as v + c "
                             f"(classes {sorted(set(((bits[r] >> 8) & 0x7F).tolist()))})")
        base[r] = int(torch.argmax(torch.where(good, counts[r], torch.full_like(counts[r], -1))))
    if bad:
        idx, exc, ok, corr = _zdecode_exact(bits, base[:, None])
        assert bool(ok.all())

    # exception table, CSR: the exceptions in row-major order (each row's k ascending) and the row offsets
    ex_r, ex_k = torch.nonzero(exc, as_tuple=True)
    n_exc = int(ex_r.numel())
    per_row = torch.bincount(ex_r, minlength=N) if n_exc else torch.zeros(N, dtype=torch.int64, device=dev)
    capr = int(per_row.max()) if n_exc else 0
    eptr = torch.zeros(N + 1, dtype=torch.int32, device=dev)
    eptr[1:] = torch.cumsum(per_row, 0).to(torch.int32)
    esc = torch.zeros((max(n_exc, 1), 2), dtype=torch.int32, device=dev)
    if n_exc:
        esc[:n_exc, 0] = ex_k.to(torch.int32)
        esc[:n_exc, 1] = corr[ex_r, ex_k].view(torch.int32)
    exc_cols = torch.unique(ex_k).tolist() if n_exc else []

    # fragment order, as pack_plain: [RB, KB, 2 (s), 32 (lane), 8 (j)] -> [RB, KG, 4 (f = 2 kb2 + s), 32, 8]
    RB, KG = N // 16, K // 64
    lo_f = pack_plain((bits & 0xFF).to(torch.uint8)).view(RB, KG, 4, 32, 8)
    idx_f = pack_plain(idx.to(torch.int64)).view(RB, KG, 4, 32, 8)
    sgn_f = pack_plain(((bits >> 15) & 1).to(torch.int64)).view(RB, KG, 4, 32, 8)
    shift_idx = torch.tensor(ZIDX_BIT, device=dev, dtype=torch.int64)
    shift_sgn = torch.tensor(ZSIGN_BIT, device=dev, dtype=torch.int64)
    word = ((idx_f << shift_idx) | (sgn_f << shift_sgn)).sum(-1)                    # [RB, KG, 4, 32]
    word = torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)
    codes = word.permute(0, 1, 3, 2).contiguous().view(torch.uint8)                   # [RB, KG, 32, 16]
    a = lo_f.view(RB, KG, 2, 2, 32, 8).permute(0, 1, 2, 4, 3, 5).reshape(RB, KG, 2, 32, 16)
    stream = torch.cat([a[:, :, 0], a[:, :, 1], codes], dim=2).reshape(RB, KG, 1536).contiguous()
    return ZPack(stream, base.to(torch.uint8), eptr, esc, capr, n_exc, exc_cols, len(bad))


# ===================================================================================================
# The Triton path (our chapter 9): the same GEMV written in Triton, as a tuned alternative the tables can pick
# (TTABLE / TPICK) and that prepare(path="triton") forces. Weights stay in their natural [N, K] layout (the
# router: its hi / lo bf16 halves). One launch per call, grid (N // bn, s); split-K is reduced inside the
# launch (ticket: deterministic; atomic: not). Triton is optional: without it the CUDA paths work and
# prepare(path="triton") says it is missing.
#
#     ws_elems, sem_count = tri_workspace(N, m_max, cfg)      # the caller allocates, zero-filled, once
#     tri_gemv(x, w, None, out, ws, sem, cfg, dual=False)     # bf16 layer: out bf16 [m, N]
#     tri_gemv(x, hi, lo, out, ws, sem, cfg, dual=True)       # router: out fp32 [m, N]
# ===================================================================================================
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

TRI_MODES = ("ticket", "atomic")
TRI_SMEM_LIMIT = 227 * 1024   # opt-in shared memory of one H100 / H200 CTA


if triton is not None:
    @triton.jit
    def _tri_mma(acc, x, w, F32_DOT: tl.constexpr):
        """acc + x @ w.T in fp32 (bf16 products are exact in fp32)."""
        if F32_DOT:
            # The interpreter multiplies the raw bit patterns of bf16 dot operands (triton-lang/triton#11584);
            # fp32 operands give it the same exact products. Never used on a GPU.
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
        return acc


    @triton.jit
    def _tri_prefetch_l2(ptrs):
        """Fire-and-forget L2 prefetch of the 128-byte lines holding ptrs: no register waits for it."""
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // dummy $0", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)


    @triton.jit(do_not_specialize=["M"])   # one compile per (BM, config), not per m
    def _tri_gemv_kernel(x_ptr, w_ptr, w2_ptr, out_ptr, ws_ptr, sem_ptr, M, N, K,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, S: tl.constexpr, ITERS: tl.constexpr,
                         DUAL: tl.constexpr, ATOMIC: tl.constexpr, REVERSE: tl.constexpr,
                         USE_GDC: tl.constexpr, F32_DOT: tl.constexpr):
        """out[:M, block pid_n] = x @ W[block].T over the K slice pid_s, split-K reduced in this launch.

        ws: ticket mode fp32 partials [N // BN, S, M, BN]; atomic mode a zeroed fp32 buffer [M, N] (left zeroed).
        sem: int32 [N // BN] tickets, zero on entry and on exit. S == 1 touches neither.
        """
        if USE_GDC:
            # let the next kernel of the stream start its prologue now; it waits for us in its gdc_wait
            tl.extra.cuda.gdc_launch_dependents()
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        if REVERSE:
            pid_n = tl.num_programs(0) - 1 - pid_n
            pid_s = S - 1 - pid_s

        rm = tl.arange(0, BM)
        rn = tl.arange(0, BN)
        rk = tl.arange(0, BK)
        k0 = pid_s * (ITERS * BK)   # K // S, written so that the compiler sees it is a multiple of BK
        row_ok = (rm < M)[:, None]
        x_ptrs = x_ptr + rm[:, None] * K + (k0 + rk)[None, :]
        w_offs = (pid_n * BN + rn)[:, None] * K + (k0 + rk)[None, :]

        if USE_GDC:
            # A hint only (nothing is read into registers), so safe before the wait: the first weight tile
            # heads for L2 while the previous kernel finishes.
            lines = (pid_n * BN + rn)[:, None] * K + (k0 + 64 * tl.arange(0, (BK + 63) // 64))[None, :]
            _tri_prefetch_l2(w_ptr + lines)
            if DUAL:
                _tri_prefetch_l2(w2_ptr + lines)
            tl.extra.cuda.gdc_wait()   # x, ws, sem and out may belong to the previous kernel until here
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for i in range(ITERS):
            x = tl.load(x_ptrs + i * BK, mask=row_ok, other=0.0)
            acc = _tri_mma(acc, x, tl.load(w_ptr + w_offs + i * BK, eviction_policy="evict_first"), F32_DOT)
            if DUAL:   # hi and lo into the same fp32 accumulators
                acc = _tri_mma(acc, x, tl.load(w2_ptr + w_offs + i * BK, eviction_policy="evict_first"), F32_DOT)

        out_offs = rm[:, None] * N + (pid_n * BN + rn)[None, :]
        if S == 1:
            tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=row_ok)
        else:
            part_offs = rm[:, None] * BN + rn[None, :]
            if ATOMIC:
                tl.atomic_add(ws_ptr + out_offs, acc, mask=row_ok, sem="relaxed")
            else:
                tl.store(ws_ptr + ((pid_n * S + pid_s) * M) * BN + part_offs, acc, mask=row_ok)
            # Every thread's partial must be issued before the ticket, whose release one thread performs.
            tl.debug_barrier()
            ticket = tl.atomic_add(sem_ptr + pid_n, 1, sem="acq_rel")
            if ticket == S - 1:
                # .cg reads L2, where the other programs' partials are; L1 is not coherent.
                if ATOMIC:
                    tot = tl.load(ws_ptr + out_offs, mask=row_ok, other=0.0, cache_modifier=".cg")
                    # The load and the zeroing store may give an element to different threads (their layouts
                    # differ): without this barrier a thread could zero an element before another has read
                    # it (seen on the H200 at BM = 32 with 8 warps: outputs of exactly 0).
                    tl.debug_barrier()
                    tl.store(ws_ptr + out_offs, tl.zeros((BM, BN), dtype=tl.float32), mask=row_ok)
                else:
                    blk = ws_ptr + (pid_n * S * M) * BN + part_offs
                    tot = tl.load(blk, mask=row_ok, other=0.0, cache_modifier=".cg")
                    for s in tl.static_range(1, S):   # fixed order: the result is independent of who is last
                        tot += tl.load(blk + s * M * BN, mask=row_ok, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + out_offs, tot.to(out_ptr.dtype.element_ty), mask=row_ok)
                tl.store(sem_ptr + pid_n, 0)


# Under TRITON_INTERPRET=1 triton.jit returns an InterpretedFunction: no PDL there, and fp32 dot operands.
_TRI_INTERPRET = triton is not None and not isinstance(_tri_gemv_kernel, triton.runtime.JITFunction)


def _tri_pow2(v):
    return isinstance(v, int) and v > 0 and v & (v - 1) == 0


def tri_bm(m):
    """Rows of the x tile (tl.dot needs at least 16): 16 for m <= 16, else 32."""
    return 16 if m <= 16 else 32


def tri_smem(cfg, m, dual):
    """Shared memory of one program in bytes: Triton 3.6 keeps stages - 1 tiles of x and W (and lo) in flight."""
    return max(cfg.stages - 1, 1) * (tri_bm(m) + cfg.bn * (2 if dual else 1)) * cfg.bk * 2


def tri_misfit(cfg, N, K, m, dual=False):
    """None if cfg can run the shape [m, K] x [N, K]^T (dual: with a lo half too), else a string saying why."""
    if cfg.mode not in TRI_MODES:
        return f"mode {cfg.mode!r} is not one of {TRI_MODES}"
    for name in ("bn", "bk"):
        v = getattr(cfg, name)
        if not _tri_pow2(v) or v < 16:
            return f"{name}={v} must be a power of two >= 16 (tl.dot tile)"
    if not _tri_pow2(cfg.warps) or cfg.warps > 32:
        return f"warps={cfg.warps} must be a power of two <= 32"
    for name in ("s", "stages"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or v < 1:
            return f"{name}={v} must be an int >= 1"
    if cfg.pdl not in (0, 1):
        return f"pdl={cfg.pdl} must be 0 or 1"
    if not 1 <= m <= MAX_M:
        return f"m={m} is outside 1..{MAX_M}"
    if N < 1 or K < 1 or N * K >= 2 ** 31:
        return f"N={N} K={K}: both must be positive and N*K < 2**31 (int32 offsets)"
    if N % cfg.bn:
        return f"N={N} is not a multiple of bn={cfg.bn}"
    if K % (cfg.s * cfg.bk):
        return f"K={K} is not a multiple of s*bk={cfg.s}*{cfg.bk}={cfg.s * cfg.bk}"
    smem = tri_smem(cfg, m, dual)
    if smem > TRI_SMEM_LIMIT:
        return f"the pipeline needs {smem} B of shared memory > {TRI_SMEM_LIMIT} B"
    return None


def tri_workspace(N, m_max, cfg):
    """(ws fp32 elements, sem int32 count) that calls of cfg need for N columns and up to m_max tokens.

    Allocate both zero-filled (torch.zeros) once; every call leaves them so. ticket mode: ws holds the fp32
    partials (scratch, may be shared by layers run one after another on one stream); atomic mode: ws is the
    accumulation buffer, which must stay all zeros between calls: never share it with a ticket-mode ws.
    Configs of one layer can share buffers of the largest size. s == 1 needs neither (sizes 0).
    """
    if cfg.s == 1:
        return 0, 0
    ws = (cfg.s if cfg.mode == "ticket" else 1) * m_max * N
    return ws, N // cfg.bn


def _tri_tensor(name, t, dtype, shape, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, received {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, received {t.dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, received {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (strides {t.stride()})")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, received {t.device}")


def _tri_check(x, w, w2, out, ws, sem, cfg, dual):
    """Validates a tri_gemv call (raises TypeError / ValueError naming the expected and received values)."""
    if not isinstance(cfg, TritonConfig):
        raise TypeError(f"cfg: expected a TritonConfig, received {type(cfg).__name__}")
    if not isinstance(dual, bool):
        raise TypeError(f"dual: expected a bool, received {type(dual).__name__}")
    _tri_tensor("x", x, torch.bfloat16, None, None)
    if x.dim() != 2:
        raise ValueError(f"x: expected 2 dims [m, K], received shape {tuple(x.shape)}")
    m, K = x.shape
    _tri_tensor("w", w, torch.bfloat16, None, x.device)
    if w.dim() != 2 or w.shape[1] != K:
        raise ValueError(f"w: expected shape [N, {K}], received {tuple(w.shape)}")
    N = w.shape[0]
    if dual:
        _tri_tensor("w2", w2, torch.bfloat16, (N, K), x.device)
    elif w2 is not None:
        raise ValueError("w2: expected None when dual is False (it is the router's lo half)")
    _tri_tensor("out", out, torch.float32 if dual else torch.bfloat16, (m, N), x.device)
    _tri_tensor("ws", ws, torch.float32, None, x.device)
    _tri_tensor("sem", sem, torch.int32, None, x.device)
    why = tri_misfit(cfg, N, K, m, dual)
    if why:
        raise ValueError(f"{cfg} cannot run m={m} N={N} K={K}: {why}")
    ws_need, sem_need = tri_workspace(N, m, cfg)
    if ws.numel() < ws_need or sem.numel() < sem_need:
        raise ValueError(f"ws / sem: expected at least {ws_need} / {sem_need} elements, "
                         f"received {ws.numel()} / {sem.numel()}")


def tri_gemv(x, w, w2, out, ws, sem, cfg, dual, pdl=True, reverse=False):
    """out = x @ w.T (bf16 out), or x @ w.T + x @ w2.T in one set of fp32 accumulators (dual, fp32 out).

    x bf16 [m, K], 1 <= m <= 32; w (and w2) bf16 [N, K]; ws / sem as tri_workspace says, zero-filled.
    Launches one kernel on the current stream: no allocation, no sync (CUDA-graph capturable). pdl: launch
    with programmatic dependent launch when cfg.pdl is 1 too: the kernel overlaps the previous one's tail
    and waits for it (griddepcontrol.wait) before reading x or touching out / ws / sem. reverse: maps
    program ids backwards (tests: the ticket result must not depend on program order). Returns out.
    """
    if triton is None:
        raise RuntimeError("the Triton path needs the triton package (pip install triton)")
    _tri_check(x, w, w2, out, ws, sem, cfg, dual)
    return _tri_launch(x, w, w2, out, ws, sem, cfg, dual, pdl, reverse)


def _tri_launch(x, w, w2, out, ws, sem, cfg, dual, pdl, reverse=False):
    """tri_gemv without its checks: kernel_fn's per-call path (the inputs are checked there, the config and the
    buffers at prepare)."""
    (m, K), N = x.shape, w.shape[0]
    use_pdl = bool(pdl and cfg.pdl) and not _TRI_INTERPRET
    # launch_pdl is a compile option as well as a launch attribute: pass it only when on
    extra = {"launch_pdl": True} if use_pdl else {}
    _tri_gemv_kernel[(N // cfg.bn, cfg.s)](
        x, w, w2 if dual else w, out, ws, sem, m, N, K,
        BM=tri_bm(m), BN=cfg.bn, BK=cfg.bk, S=cfg.s, ITERS=K // (cfg.s * cfg.bk), DUAL=dual,
        ATOMIC=cfg.mode == "atomic", REVERSE=bool(reverse), USE_GDC=use_pdl, F32_DOT=_TRI_INTERPRET,
        num_warps=cfg.warps, num_stages=cfg.stages, **extra)
    return out


# ===================================================================================================
# Dispatch: tables, default rule, plans.
# ===================================================================================================
def nb_of(m):
    """8-token blocks the mma runs per K step: 1 for m <= 8, 2 for m <= 16, 4 for m <= 32."""
    return 1 if m <= 8 else 2 if m <= 16 else 4


def smem_bytes(nw, nb, r, compressed, s=1, cl=0):
    """Shared memory of one CTA: the warps' partials red[NW][R*NB*32] (+ the exception warp's ecorr), and with
    cl the leader's cbuf[S - 1][R*NB*32] for the other CTAs of its cluster (+ the ticket flag and the cl = 2
    mbarrier, 12 B, in every build)."""
    part = r * nb * 32 * 16
    return nw * part + (r * 16 * (nb * 8 + 1) * 4 if compressed else 0) + 4 + 8 + (s - 1) * part * (cl >= 1)


def _split_misfit(cfg, smem):
    """The rules every CUDA config shares (pf where the config has it, cl, co, the cluster size), and the static shared
    memory smem within SMEM_LIMIT."""
    if getattr(cfg, "pf", 0) not in (0, 1):
        return f"pf={cfg.pf!r}: expected 0 (no L2 prefetch) or 1 (the warp's slice, before griddepcontrol.wait)"
    if cfg.cl not in (0, 1, 2):
        return f"cl={cfg.cl}: expected 0 (ticket), 1 (cluster barrier) or 2 (cluster mbarrier)"
    if not (isinstance(cfg.co, int) and -1 <= cfg.co <= 100):
        return f"co={cfg.co!r}: expected -1 (no carveout preference) or a percentage 0..100"
    if cfg.cl and not 2 <= cfg.s <= MAX_CLUSTER:
        return f"cl={cfg.cl} needs 2 <= S <= {MAX_CLUSTER} (one cluster per row group), got S={cfg.s}"
    if smem > SMEM_LIMIT:
        return f"shared memory {smem} B > {SMEM_LIMIT}"
    return None


TMA_SMEM_LIMIT = 227 * 1024   # gemvt_kernel: static + dynamic shared memory of one CTA (the opt-in maximum on sm_90)


def gemvt_smem(nw, st, nb, ka, s=1, cl=0):
    """gemvt_kernel's dynamic shared memory (gemvt_smem in csrc/gemvt.cuh): 1 KB alignment slack, the ring of st
    stages of ka 64-k tiles (16 nw weight rows + 8 nb tokens, 128 B each), and with cl the leader's cbuf."""
    return 1024 + st * ka * (16 * nw + 8 * nb) * 128 + ((s - 1) * nw * nb * 32 * 16 if cl else 0)


def gemvt_cta_smem(cfg, m):
    """All the shared memory of one gemvt CTA of GemvtConfig cfg at m: gemvt_smem plus its mbarriers."""
    return gemvt_smem(cfg.nw, cfg.st, nb_of(m), cfg.ka, cfg.s, cfg.cl) + 16 * cfg.st + 16


# ---- *_misfit(cfg, N, K, m[, dual]): why a config cannot run an [N, K] layer at m (a string), or None if it can ----
def gemv_misfit(cfg, N, K, m, dual=False):
    """Why a GemvConfig cannot run this shape, or None if it can."""
    nb, KB = nb_of(m), K // 32
    if cfg.pipe not in range(6):
        return f"pipe={cfg.pipe}: gemv_kernel's loops are PIPE 0..5 (the TMA ring is a GemvtConfig)"
    if N % (16 * cfg.r) or K % 32:
        return f"N={N} not a multiple of 16*R={16 * cfg.r}, or K={K} not a multiple of 32"
    if KB % (cfg.s * cfg.nw * cfg.u):
        return f"K/32={KB} not divisible by S*NW*U={cfg.s * cfg.nw * cfg.u} (gemv_kernel splits K evenly)"
    return _split_misfit(cfg, smem_bytes(cfg.nw, nb, cfg.r, False, cfg.s, cfg.cl))


def gemvt_misfit(cfg, N, K, m, dual=False):
    """Why a GemvtConfig cannot run this shape, or None if it can: bf16 weights, nw consumer warps in whole
    warpgroups (16 nw rows a CTA), at least one stage of at least one 64-k tile, any S up to K / (64 ka) (the slices
    need not be equal), and the ring within the opt-in shared memory; then the split-K rules every config shares."""
    if dual:
        return "gemvt_kernel (TMA + wgmma) takes bf16 weights only, not the DUAL router"
    if cfg.nw not in (4, 8, 12, 16) or cfg.st < 1 or cfg.ka < 1:
        return f"gemvt_kernel needs NW 4, 8, 12 or 16 (whole warpgroups) and st, ka >= 1: {cfg}"
    if N % (16 * cfg.nw) or K % (64 * cfg.ka) or not 1 <= cfg.s <= K // (64 * cfg.ka):
        return (f"gemvt_kernel: N={N} not a multiple of 16*NW={16 * cfg.nw}, or K={K} not a multiple of "
                f"64*KA={64 * cfg.ka}, or S={cfg.s} not in 1..K/(64*KA) (S need not divide K)")
    smem = gemvt_cta_smem(cfg, m)
    if smem > TMA_SMEM_LIMIT:
        return f"gemvt_kernel: shared memory {smem} B > {TMA_SMEM_LIMIT}"
    return _split_misfit(cfg, 0)


def gemvz_misfit(cfg, N, K, m):
    """Why a GemvzConfig cannot run this shape, or None if it can."""
    nb, KG = nb_of(m), K // 64
    if cfg.pipe not in range(6) and cfg.pipe not in range(8, 14):
        return f"pipe={cfg.pipe}: gemvz_kernel's loops are PIPE 0..5, and 8..13 with the cooperative walk"
    if N % (16 * cfg.r) or K % 64:
        return f"N={N} not a multiple of 16*R={16 * cfg.r}, or K={K} not a multiple of 64"
    if KG % cfg.ug or KG // cfg.ug < cfg.s * cfg.nw or cfg.s < 1:
        return (f"K/64={KG} not a multiple of UG={cfg.ug}, or fewer than S*NW={cfg.s * cfg.nw} units of UG groups "
                f"(every warp streams at least one; S need not divide K: split_units)")
    coop = 4 * (cfg.r * 16 + 1) + 32 * 2 * nb * 8 * 4 + 32 * 2 * 4 if cfg.pipe >= 8 else 0   # coop_walk's roff, part, prow
    return _split_misfit(cfg, smem_bytes(cfg.nw, nb, cfg.r, True, cfg.s, cfg.cl) + coop)


def config_misfit(cfg, N, K, m, dual=False):
    """Why cfg (GemvConfig, GemvzConfig, GemvtConfig or TritonConfig) cannot run an [N, K] layer at m, or None if it
    can: its kernel's misfit check (Layer.set_config and tune.py ask this one)."""
    if isinstance(cfg, TritonConfig):
        return "triton is not installed" if triton is None else tri_misfit(cfg, N, K, m, dual)
    if isinstance(cfg, GemvzConfig):
        return "the compressed path takes bf16 weights only" if dual else gemvz_misfit(cfg, N, K, m)
    if isinstance(cfg, GemvtConfig):
        return gemvt_misfit(cfg, N, K, m, dual)
    if isinstance(cfg, GemvConfig):
        return gemv_misfit(cfg, N, K, m, dual)
    return f"{cfg!r} is not a GemvConfig, GemvzConfig, GemvtConfig or TritonConfig"


def instance_of(cfg, m, dual=False):
    """(kind, template args) of the compiled kernel a CUDA config runs at m: what csrc/configs.cuh must list."""
    nb = nb_of(m)
    if isinstance(cfg, GemvtConfig):
        return "gemvt", (cfg.nw, cfg.st, nb, cfg.ka)
    if isinstance(cfg, GemvzConfig):
        return "gemvz", (cfg.nw, cfg.ug, nb, cfg.r, cfg.pipe)
    return "gemv", (cfg.nw, cfg.u, nb, cfg.r, bool(dual), cfg.pipe)


def config_short(c):
    """A config in a few characters, for describe() and the planner's notes: Z(NW,UG,R,PIPE) / C(NW,U,R,PIPE) /
    T(NW,ST,KA), then S and cl."""
    if isinstance(c, GemvtConfig):
        head = f"gemvt T({c.nw},{c.st},{c.ka})"
    elif isinstance(c, GemvzConfig):
        head = f"gemvz Z({c.nw},{c.ug},{c.r},PIPE {c.pipe})"
    elif isinstance(c, GemvConfig):
        head = f"gemv C({c.nw},{c.u},{c.r},PIPE {c.pipe})"
    else:
        return repr(c)
    return f"{head} S={c.s}{f' cl={c.cl}' if c.s > 1 else ''}"


def kernel_name(cfg):
    """The kernel a config runs, for describe()."""
    return {GemvConfig: "gemv_kernel", GemvzConfig: "gemvz_kernel", GemvtConfig: "gemvt_kernel (TMA ring)",
            TritonConfig: "tri_gemv (Triton)"}[type(cfg)]


def default_config(N, K, m, compressed):
    """The documented default for a (layer, m) no table row covers: the first (nw, u, r, pipe) of DEFAULT_GEMV
    (DEFAULT_GEMVZ) that fits, with S the smallest power of two giving TARGET_CTAS CTAs (two per SM) that
    still divides K, and no L2 prefetch. Every default is compiled in (build.py). None if nothing fits."""
    cls, misfit, cands = (GemvzConfig, gemvz_misfit, DEFAULT_GEMVZ) if compressed else (GemvConfig, gemv_misfit, DEFAULT_GEMV)
    for nw, u, r, pipe in cands:
        if misfit(cls(nw, 1, u, r, pipe, 0), N, K, m):
            continue
        s = 1
        while N // (16 * r) * s < TARGET_CTAS and not misfit(cls(nw, 2 * s, u, r, pipe, 0), N, K, m):
            s *= 2
        return cls(nw, s, u, r, pipe, 0)
    return None


# ---- the planner: a config for any (N, K, m, dtype) that no table row covers -----------------------------------
# Two parts. Where the 12-bit path runs (m <= 16) and where gemvt runs (bf16, m = 17..32), a cost model (PLAN_MODELS)
# prices every candidate family at every split-K S that fits and takes the cheapest. Elsewhere (plain bf16 m <= 16,
# the DUAL router) one kernel family per m range (PLANNER) with S chosen for its tuned rows' CTA count.
#
# The cost model (FINDINGS 22; fit by tools/plan_fit.py on tools/plan_grid.py's timings, H200, session 19): a CTA
# streams B / C bytes (B: the layer's bytes, 1.5 per weight compressed, 2 plain; C CTAs); an SM holds `occ` CTAs at
# once (registers: the family's constant, checked against ptxas by tests/test_compile.py; shared memory: computed), so
# the busiest SM runs L = ceil(C / 132) of them, in batches of occ; k CTAs resident on one SM stream min(k r, R)
# GB/s together (r: one CTA's latency-bound rate, R: the SM's cap); HBM caps the whole at bw (the family's: how its
# loads are issued decides how close to the HBM limit all SMs together come). Then
#   time = t0 + max(B / bw, the busiest SM's time) + split, split = 0 at S = 1, cl0 + cl1 (S - 1) through a cluster,
#   tk0 + tk1 (S - 1) through the global ticket.
# Its constants were fit to pick the fastest candidate (the expected loss of its pick, plus a small weight on the
# time's error), not to predict times: its times are rough (rms error in FINDINGS 22), its ranking is what it is for.
PlanFamily = collections.namedtuple("PlanFamily", "config occ r R bw")
PlanModel = collections.namedtuple("PlanModel", "path nb t0 cl0 cl1 tk0 tk1 families")
SMS = 132
PLAN_MAX_S = 8           # splits priced: the fit saw S <= 8
PLAN_UNEVEN = "needed"   # gemvz's uneven splits: priced only for a family with no even S > 1 ('always': every one)
PLAN_SPLIT_CTAS = 396    # a split (S > 1) is priced while its grid has at most this many CTAs (gemvt: two thirds):
                         # the fit's domain (three waves of one CTA an SM)
PLAN_MODELS = (
    PlanModel('compressed', nb=1, t0=0.000, cl0=0.000, cl1=1.441, tk0=37.907, tk1=0.000, families=(
        PlanFamily(GemvzConfig(nw=16, s=1, ug=1, r=2, pipe=4, pf=0), occ=1, r=36.96, R=92.19, bw=7803),
        PlanFamily(GemvzConfig(nw=4, s=1, ug=1, r=1, pipe=2, pf=0), occ=5, r=10.77, R=24.49, bw=8338),
        PlanFamily(GemvzConfig(nw=4, s=1, ug=1, r=2, pipe=0, pf=0), occ=5, r=15.66, R=596.85, bw=3403),
        PlanFamily(GemvzConfig(nw=8, s=1, ug=1, r=2, pipe=0, pf=0), occ=3, r=18.24, R=158.55, bw=5961),
        PlanFamily(GemvzConfig(nw=8, s=1, ug=1, r=2, pipe=4, pf=0), occ=2, r=24.68, R=42.30, bw=7175),
    )),
    PlanModel('compressed', nb=2, t0=0.000, cl0=0.000, cl1=1.821, tk0=0.532, tk1=0.094, families=(
        PlanFamily(GemvzConfig(nw=4, s=1, ug=1, r=1, pipe=2, pf=0), occ=3, r=8.76, R=49.28, bw=3577),
        PlanFamily(GemvzConfig(nw=4, s=1, ug=1, r=2, pipe=4, pf=0), occ=3, r=14.41, R=101.56, bw=4712),
        PlanFamily(GemvzConfig(nw=4, s=1, ug=2, r=2, pipe=2, pf=0), occ=2, r=17.41, R=58.40, bw=4425),
        PlanFamily(GemvzConfig(nw=8, s=1, ug=1, r=2, pipe=4, pf=0), occ=1, r=27.82, R=120.65, bw=7482),
    )),
    PlanModel('plain', nb=4, t0=0.000, cl0=0.000, cl1=1.790, tk0=8.427, tk1=0.556, families=(
        PlanFamily(GemvtConfig(nw=4, s=1, st=4, ka=2), occ=2, r=33.83, R=53.25, bw=6656),
        PlanFamily(GemvtConfig(nw=4, s=1, st=8, ka=2), occ=1, r=56.77, R=56.77, bw=5673),
        PlanFamily(GemvtConfig(nw=8, s=1, st=4, ka=2), occ=1, r=2097.80, R=53.84, bw=5814),
    )),
)


def plan_occupancy(fam, cfg, m):
    """CTAs of cfg one SM holds at once: the family's count at S = 1 (registers, threads, its own shared memory),
    lowered where the split's cluster buffer (cl) or gemvt's ring leaves fewer in the SM's 228 KB (1 KB a CTA)."""
    if isinstance(cfg, GemvtConfig):
        smem = gemvt_cta_smem(cfg, m)
    else:
        smem = smem_bytes(cfg.nw, nb_of(m), cfg.r, isinstance(cfg, GemvzConfig), cfg.s, cfg.cl)
    return max(1, min(fam.occ, (228 * 1024) // (smem + 1024)))


def plan_grid_ctas(cfg, N):
    """The grid's CTA count: row groups (16 R rows a register-kernel CTA, 16 NW a gemvt CTA) x S."""
    return N // (16 * (cfg.nw if isinstance(cfg, GemvtConfig) else cfg.r)) * cfg.s


def plan_cost(model, fam, cfg, N, K, m):
    """The cost model's time (us) of cfg, a config of family fam of model, on an [N, K] layer at m (the formula above
    PLAN_MODELS)."""
    C = plan_grid_ctas(cfg, N)
    B = N * K * (1.5 if model.path == "compressed" else 2.0) / 1e3     # KB, so that KB / us = GB/s
    occ = plan_occupancy(fam, cfg, m)
    L = -(-C // SMS)                                                  # CTAs on the busiest SM
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
    any S since session 20). True for every other config: gemv_kernel's misfit rule asks for the even split, and
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


def plan_candidates(N, K, m, path, max_s=PLAN_MAX_S, max_ctas=PLAN_SPLIT_CTAS, uneven=None):
    """[(model, family, config)] the cost model prices for an [N, K] layer at m on path: each family of the class for
    (path, m) at every S that fits, S > 1 only within the fit's domain (max_s, max_ctas: PLAN_MAX_S, PLAN_SPLIT_CTAS;
    tools/plan_grid.py can widen them to collect data). A gemvz family's uneven splits (S NW not dividing its K units)
    are priced only where it has no even split S > 1 (PLAN_UNEVEN = 'needed'; uneven=True prices them always, for
    data): on the holdout shapes the model's uneven picks missed by up to 1.6x where even ones were there (phi-2.fc2,
    FINDINGS 23), while the shapes whose K admits no even split gained 8-18% (qwen2-7b). tools/plan_grid.py times
    exactly these."""
    uneven = PLAN_UNEVEN == "always" if uneven is None else uneven
    out = []
    for model in PLAN_MODELS:
        if model.path != path or model.nb != nb_of(m):
            continue
        for fam in model.families:
            cap = max_ctas * (2 / 3 if isinstance(fam.config, GemvtConfig) else 1)
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


# The rules where no cost model class runs: one kernel family per (path, m range), the instantiation the tuned rows of
# tables/ share in that range, and the CTA count their S fills (the constant fit on those rows); for a new shape the
# rule keeps the family and picks S so that the grid comes as close as it can to that count (FINDINGS 21):
#   plain bf16 m <= 8   C(8,2,1,2,0): o_proj / unpooler S=2 -> 512
#   plain bf16 9..16    C(4,2,2,2,4): o_proj S=2 -> 512
#   fp32 (DUAL) router  C(16,2,1,2,3) S=8 -> 64 (m <= 8), C(16,2,2,2,0) pf=1 S=8 -> 64 (16), C(8,1,4,1,4) S=8 -> 128
# Every family of PLAN_MODELS and PLANNER is compiled for the m range it serves (build.py); a family that does not fit
# a shape falls through to the next rule of its path, and last to default_config.
PlannerRule = collections.namedtuple("PlannerRule", "path dual m_max config ctas source")
PLANNER = (
    PlannerRule("plain", False, 8, GemvConfig(nw=8, s=1, u=2, r=2, pipe=0, pf=0), 512,
                "the tuned m <= 8 plain rows (o_proj, unpooler: 512 CTAs)"),
    PlannerRule("plain", False, 16, GemvConfig(nw=4, s=1, u=2, r=2, pipe=4, pf=0), 512,
                "the tuned m = 16 plain row of o_proj (512 CTAs)"),
    PlannerRule("plain", True, 8, GemvConfig(nw=16, s=1, u=2, r=2, pipe=3, pf=0), 64,
                "the router's tuned m <= 8 rows (64 CTAs)"),
    PlannerRule("plain", True, 16, GemvConfig(nw=16, s=1, u=2, r=2, pipe=0, pf=1), 64,
                "the router's tuned m = 16 row (64 CTAs)"),
    PlannerRule("plain", True, 32, GemvConfig(nw=8, s=1, u=1, r=1, pipe=4, pf=0), 128,
                "the router's tuned m = 32 row (128 CTAs)"),
)


def planner_serves(rule, m):
    """A rule serves the m of its m_max's token blocks (m <= 8, 9..16, 17..32): one instantiation (NB) per rule."""
    return nb_of(m) == nb_of(rule.m_max)


def planner_plans(path, m, dual=False):
    """Whether the planner (a PLAN_MODELS class or a PLANNER rule) plans `path` at m at all."""
    return (not dual and any(md.path == path and md.nb == nb_of(m) for md in PLAN_MODELS)) or \
        any(r.path == path and r.dual == dual and planner_serves(r, m) for r in PLANNER)


@functools.lru_cache(maxsize=None)   # a pure function of the shape and the constants: every prepared copy asks it
def planner_config(N, K, m, path, dual=False):
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
    c, why = planner_rule(N, K, m, path, dual)
    if path == "plain" and not dual:
        t = plain_gemvt(N, K, m, c)
        if t is not None:
            return t
    return c, why


# Plain bf16 at m <= 16: gemvt_kernel (the TMA ring) where the PLANNER rule's gemv underfills the GPU or does not fit.
# gemv splits K only evenly, so a K with no even split leaves it a grid of one or two CTAs an SM, or no config at all
# (then default_config). Timed with columns of different scale (judge.py --weights colscaled: compression refused;
# tools/plan_grid.py --plain --plain-gemvt 3, H200, session 22, FINDINGS 25): where gemv's grid was under two CTAs an SM
# the m = 17..32 model's gemvt pick ran 1.08-1.12x faster (qwen2-7b.qkv / .down, 112-224 CTAs), and where the rule did
# not fit 2.1x faster than the default rule (qwen2-1.5b.down m = 1: 8.6 against 18.3 us). Elsewhere gemvt was 0.68-1.26x
# of gemv with no rule of the shape that held on both the public and the holdout shapes (a rule fit on the public set,
# gemvt wherever gemv splits K at m = 9..16, gained 1.10x there and lost 0.97x on the holdout), so gemv stays. Under
# 16 MB gemvt's ring does not pay (qwen2-1.5b.qkv 6.3 MB: 0.50x; llama3.2-1b.qkv 12.6 MB: 0.73x).
PLAIN_GEMVT_MIN_BYTES = 16e6


def plain_gemvt(N, K, m, gemv_cfg):
    """(config, why) of gemvt for plain bf16 at m <= 16 where the PLANNER rule's gemv_cfg is None or has fewer than two
    CTAs an SM, above PLAIN_GEMVT_MIN_BYTES; else None. The gemvt config is the m = 17..32 cost model's cheapest
    candidate that fits at m."""
    if nb_of(m) > 2 or 2 * N * K < PLAIN_GEMVT_MIN_BYTES:
        return None
    if gemv_cfg is not None and plan_grid_ctas(gemv_cfg, N) >= 2 * SMS:
        return None
    for t, c, fam in plan_priced(N, K, 32, "plain"):
        if not config_misfit(c, N, K, m):
            why = ("no gemv rule fits" if gemv_cfg is None else
                   f"{config_short(gemv_cfg)} would run {plan_grid_ctas(gemv_cfg, N)} CTAs, under two an SM")
            return c, (f"planner: {config_short(c)}, {plan_grid_ctas(c, N)} CTAs (the m = 17..32 cost model's pick, "
                       f"model time {t:.1f} us at m = 32): {why} (plain_gemvt)")
    return None


def planner_rule(N, K, m, path, dual=False):
    """The first PLANNER rule of the path and dtype whose m range holds m and whose family fits, with the S (dividing
    the K blocks) whose grid comes closest to the rule's CTA count, ties to the smaller S: (config, why) or (None,
    why-not). planner_config's fallback where no cost model class covers (path, m)."""
    tried = []
    for rule in PLANNER:
        if rule.path != path or rule.dual != dual or not planner_serves(rule, m):
            continue
        fits = plan_splits(rule.config, N, K, m, dual, 64)
        if not fits:
            tried.append(f"{kernel_name(rule.config)} {rule.config}: {config_misfit(rule.config, N, K, m, dual)}")
            continue
        tiles = plan_grid_ctas(rule.config, N)
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


PlanEntry = collections.namedtuple("PlanEntry", "path config why")   # plain | compressed | triton | fallback


def tri_default(N, K, m, dual):
    """The Triton default for a (layer, m) TTABLE does not cover: bn = 32 (16 if N needs it), bk = 128 (64 if K
    needs it), 4 warps, 3 stages, ticket mode, s the smallest power of two giving TARGET_CTAS programs that
    divides K. None if nothing fits."""
    for bn, bk in ((32, 128), (16, 128), (32, 64), (16, 64)):
        cfg = TritonConfig(bn, bk, 1, 4, 3, "ticket")
        if tri_misfit(cfg, N, K, m, dual):
            continue
        while N // bn * cfg.s < TARGET_CTAS and not tri_misfit(cfg._replace(s=2 * cfg.s), N, K, m, dual):
            cfg = cfg._replace(s=2 * cfg.s)
        return cfg
    return None


def _triton_plan(layer, name, N, K, m, dual, ttable, why=""):
    """The Triton plan of layer at m from ttable's rows under name (table_name), or the Triton default rule."""
    if triton is None:
        raise ValueError(f"layer '{layer}': the Triton path needs the triton package, which is not installed")
    ref = reference_m(name, m, (ttable,))
    cfg, src = (ttable[(name, ref)], f"TTABLE{(name, ref)}") if ref is not None else (tri_default(N, K, m, dual),
                                                                                        "Triton default rule")
    bad = "no config fits" if cfg is None else tri_misfit(cfg, N, K, m, dual)
    if bad:
        return PlanEntry("fallback", None, f"Triton {cfg}: {bad}")
    return PlanEntry("triton", cfg, src + why)


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


def plan_for(name, N, K, m, dual, compressible, force=None, ctable=None, ztable=None, ttable=None, tpick=None):
    """The path and config for one m.

    compressible: True, or a string saying why the 12-bit format is not available for this weight.
    force: None (tables, then the default rule), 'plain', 'compressed' or 'triton'.
    A (name, m') row in ZTABLE means the compressed path won the tuning there; CTABLE has the plain winner
    of every scored shape, a GemvConfig or a GemvtConfig (used when the weight cannot be compressed); TTABLE has the Triton winner of every
    tuned shape, and TPICK the shapes where it beat both CUDA paths (there the Triton path is the default)."""
    ctable = CTABLE if ctable is None else ctable
    ztable = ZTABLE if ztable is None else ztable
    ttable = TTABLE if ttable is None else ttable
    tpick = TPICK if tpick is None else tpick
    if m > MAX_M:
        return PlanEntry("fallback", None, f"m={m} > {MAX_M}")
    if N % 16 or K % 64:
        return PlanEntry("fallback", None, f"N={N}, K={K}: the kernels need N % 16 == 0 and K % 64 == 0")
    layer = name
    name, via = table_name(name, N, K, dual, (ctable, ztable, ttable))   # the name the rows are under
    if force == "triton":
        return _triton_plan(layer, name, N, K, m, dual, ttable, via)
    tref = reference_m(name, m, (ttable,))
    if force is None and tref is not None and (name, tref) in tpick and triton is not None:
        p = _triton_plan(layer, name, N, K, m, dual, ttable, via + " (TPICK: faster than the CUDA paths there)")
        if p.path == "triton":
            return p
    can_z = compressible is True and not dual
    if force == "compressed" and not can_z:
        raise ValueError(f"layer '{layer}' cannot take the compressed path: "
                         f"{'fp32 weights take the DUAL plain path' if dual else compressible}")
    ref = reference_m(name, m, (ztable, ctable))
    note = ""
    if ref is not None:
        key = (name, ref)
        if key in ztable and force != "plain":
            if can_z and not gemvz_misfit(ztable[key], N, K, m):
                return PlanEntry("compressed", ztable[key], f"ZTABLE{key}{via}")
            note = f"; ZTABLE{key} unused: {compressible if not can_z else gemvz_misfit(ztable[key], N, K, m)}"
        if key in ctable and force != "compressed" and not config_misfit(ctable[key], N, K, m, dual):
            return PlanEntry("plain", ctable[key], f"CTABLE{key}{via}{note}")
    pnote = ""
    if can_z and force != "plain" and (force == "compressed" or ref is None):
        cfg, why = planner_config(N, K, m, "compressed")
        if cfg is not None:
            return PlanEntry("compressed", cfg, why)
        pnote = f"; planner (compressed): {why}"
        cfg = default_config(N, K, m, compressed=True)
        # the old default's compressed config only where the planner plans the 12-bit path at all (not at m >= 17,
        # where every bf16 row runs plain gemvt: FINDINGS 20 / 21), or when forced
        if cfg is not None and (force == "compressed" or planner_plans("compressed", m)):
            return PlanEntry("compressed", cfg, "default rule" + pnote)
        if force == "compressed":
            raise ValueError(f"no compressed config fits layer '{layer}' N={N}, K={K}, m={m}")
    if not note and not can_z and isinstance(compressible, str) and force != "plain":
        note = f"; compressed not used: {compressible}"
    cfg, why = planner_config(N, K, m, "plain", dual)
    if cfg is not None:
        return PlanEntry("plain", cfg, why + note)
    cfg = default_config(N, K, m, compressed=False)
    if cfg is not None:
        return PlanEntry("plain", cfg, f"default rule{note}{pnote}; planner (plain): {why}")
    return PlanEntry("fallback", None, f"no plain config fits N={N}, K={K}, m={m}")


# ===================================================================================================
# prepare / kernel_fn
# ===================================================================================================
def _pdl_default():
    return os.environ.get("MUSE_PDL", "1") != "0"


class Layer:
    """A prepared layer: packed weights, workspace, and the plan for every m (see describe())."""

    def __init__(self, name, weight):
        self.name = name
        self.weight = weight                       # the caller's tensor: fallback path and reference
        self.N, self.K = weight.shape
        self.dual = weight.dtype == torch.float32
        self.out_dtype = torch.float32 if self.dual else torch.bfloat16
        self.device = weight.device
        self.pdl = _pdl_default()
        self._launches = {}                        # m -> the glue's Launch, built on first use (see launch())
        self._ext = None                           # the built extension the launches use (prepare's ext=)
        self.plans = []                            # plans[m] for m = 1..MAX_M (index 0 unused)
        self.w = self.w2 = None                    # plain: packed hi (and lo)
        self.z = None                              # compressed: ZPack
        self.z_note = "not tried"
        self.ws = self.sem = None
        self.wn = None                             # Triton (bf16): the layer's own copy, [N, K] order
        self.wt = None                             # gemvt_kernel: pack_tma's tiles
        self.tw = self.tw2 = None                  # Triton: weight (router: hi) and lo in [N, K] order
        self.tws = self.twa = self.tsem = None     # Triton: ticket partials, atomic buffer, tickets

    # -- sizes --------------------------------------------------------------------------------------
    def bytes_read(self, m):
        """Weight bytes one call at this m streams from memory (what the kernel really reads)."""
        p = self.plan(m)
        if p.path == "compressed":
            return self.z.stream.numel() + 8 * self.z.n_exc + 4 * (self.N + 1)
        if p.path in ("plain", "triton"):
            return 2 * self.N * self.K * (2 if self.dual else 1)
        return self.weight.numel() * self.weight.element_size()

    def exception_columns(self):
        """Columns k that hold at least one out-of-window weight (probe these: a lossy format fails)."""
        return list(self.z.exc_cols) if self.z is not None else []

    def plan(self, m):
        return self.plans[m] if 1 <= m <= MAX_M else PlanEntry("fallback", None, f"m={m} > {MAX_M}")

    @property
    def ext(self):
        """The built extension this layer launches with: the shipped build unless prepare(ext=) or an assignment
        chose a variant (tools, tests: a MUSE_SKIP_CORRECTIONS or MUSE_TRACE build)."""
        return self._ext

    @ext.setter
    def ext(self, mod):
        self._ext = mod
        self._launches = {}

    @property
    def ws(self):
        """The split-K workspace (float4 partials, cl = 0); a new one (tools: trace_chain's larger one) rebuilds the
        launches that point at it."""
        return self._ws

    @ws.setter
    def ws(self, t):
        self._ws = t
        self._launches = {}

    def launch(self, m):
        """The glue's Launch of a CUDA plan at m: its kernel and template parameters, the layer's weight, side table
        and split-K buffers, the config's runtime fields; a call then passes only x, out, m and the stream. prepare
        builds every plan's; set_config, a new workspace or another extension drop them, and the next call rebuilds."""
        lr = self._launches.get(m)
        if lr is None:
            c, ptr = self.plans[m].config, lambda t: 0 if t is None else t.data_ptr()   # noqa: E731
            kind, t = instance_of(c, m, self.dual)
            z = self.z if kind == "gemvz" else None
            w = {"gemv": self.w, "gemvz": z and z.stream, "gemvt": self.wt}[kind]
            lr = self._ext.Launch(kind=KINDS.index(kind), t=[int(v) for v in t], w=ptr(w),
                                  w2=ptr(self.w2 if kind == "gemv" else None), eptr=ptr(z and z.eptr),
                                  esc=ptr(z and z.esc), ws=ptr(self.ws), sem=ptr(self.sem), N=self.N, K=self.K, S=c.s,
                                  pf=getattr(c, "pf", 0), cl=c.cl, zbase=ptr(z and z.zbase), co=c.co)
            self._launches[m] = lr
        return lr

    def set_config(self, m, cfg):
        """Use cfg (GemvConfig, GemvzConfig, GemvtConfig or TritonConfig) for m from now on (tune.py, tools); grows
        the workspace if needed (and compiles a Triton config: eager, so do it before any graph capture)."""
        why = config_misfit(cfg, self.N, self.K, m, self.dual)
        if why:
            raise ValueError(f"config {cfg} does not fit layer '{self.name}' at m={m}: {why}")
        if isinstance(cfg, TritonConfig):
            self.plans[m] = PlanEntry("triton", cfg, "set_config")
            self._pack_triton()
            self._alloc_workspace()
            self._warm_triton()
            return
        path = "compressed" if isinstance(cfg, GemvzConfig) else "plain"
        if path == "compressed" and self.z is None:
            raise ValueError(f"layer '{self.name}' has no compressed weights ({self.z_note})")
        if isinstance(cfg, GemvConfig) and self.w is None:
            self._pack_plain()
        if isinstance(cfg, GemvtConfig) and self.wt is None:
            self.wt = pack_tma(self.weight)
        self.plans[m] = PlanEntry(path, cfg, "set_config")
        self._alloc_workspace()
        self._launches = {}

    # -- internals ----------------------------------------------------------------------------------
    def _pack_plain(self):
        if self.dual:
            hi, lo = split_hi_lo(self.weight)
            self.w, self.w2 = pack_plain(hi), pack_plain(lo)
        else:
            self.w = pack_plain(self.weight)
            self.w2 = self.w

    def _natural(self):
        """The weight in its natural [N, K] order, in memory of the layer's own: a kernel must not read the caller's
        tensor, or P layers prepared from one weight would share its bytes in L2 (SPEC's timing assumes each copy
        streams its own; measured 2026-12-01: a kernel on a shared o_proj weight ran 6.15 us, under the 7.0 us
        floor, and the Triton path's o_proj m=16 / 32 went 7.6 / 9.2 -> 10.8 / 11.8 us with a copy of its own)."""
        if self.wn is None:
            self.wn = self.weight.clone()
        return self.wn

    def _pack_triton(self):
        if self.tw is None:
            self.tw, self.tw2 = split_hi_lo(self.weight) if self.dual else (self._natural(), None)

    def _alloc_workspace(self):
        need = 1
        tneed = {"ticket": 1, "atomic": 1}
        tsem = 1
        for p in self.plans[1:]:
            if p.path in ("plain", "compressed") and p.config.s > 1 and not p.config.cl:
                need = max(need, self.N // 16 * p.config.s * 4 * 32)
            if p.path == "triton":
                ws, sem = tri_workspace(self.N, MAX_M, p.config)
                tneed[p.config.mode] = max(tneed[p.config.mode], ws)
                tsem = max(tsem, sem)
        if self.ws is None or self.ws.shape[0] < need:
            self.ws = torch.empty((need, 4), dtype=torch.float32, device=self.device)
        if self.sem is None:
            self.sem = torch.zeros(max(self.N // 16, 1), dtype=torch.int32, device=self.device)
        if self.tw is not None:
            # zero-filled: the atomic buffer and the tickets must be zero between calls (every call leaves them so)
            if self.tws is None or self.tws.numel() < tneed["ticket"]:
                self.tws = torch.zeros(tneed["ticket"], dtype=torch.float32, device=self.device)
            if self.twa is None or self.twa.numel() < tneed["atomic"]:
                self.twa = torch.zeros(tneed["atomic"], dtype=torch.float32, device=self.device)
            if self.tsem is None or self.tsem.numel() < tsem:
                self.tsem = torch.zeros(tsem, dtype=torch.int32, device=self.device)

    def _warm_triton(self):
        """Compile (once per process) every Triton config this layer's plans use, eagerly: a first call inside
        a graph capture would compile there. One call per (config, BM) on a throwaway x."""
        seen = set()
        for m in range(1, MAX_M + 1):
            p = self.plans[m]
            if p.path == "triton" and (p.config, tri_bm(m)) not in seen:
                seen.add((p.config, tri_bm(m)))
                kernel_fn(torch.ones((m, self.K), dtype=torch.bfloat16, device=self.device), self)
        torch.cuda.synchronize(self.device)

    # -- prepare(tune=True) ----------------------------------------------------------------------------
    def _timing_copy(self):
        """A Layer with its own copies of this one's packed weights (GPU copies: other addresses, so back-to-back calls
        over several copies read HBM, not L2) and its own split-K buffers; the same plans."""
        c = Layer(self.name, self.weight)
        c.ext, c.pdl, c.plans = self._ext, self.pdl, list(self.plans)
        clone = lambda t: None if t is None else t.clone()   # noqa: E731
        c.w, c.w2, c.wt = clone(self.w), clone(self.w2), clone(self.wt)
        if self.z is not None:
            c.z = self.z._replace(stream=clone(self.z.stream), zbase=clone(self.z.zbase), eptr=clone(self.z.eptr),
                                  esc=clone(self.z.esc))
        c._alloc_workspace()
        return c

    def _time_configs(self, cfgs, m, x, ref):
        """[(us, cfg)] of the configs that run and pass SPEC's tolerance at m, each timed as judge.per_call_us times a
        call: one graph of TUNE_CALLS back-to-back calls cycling over enough copies that their weights exceed L2, its
        median replay divided by the calls, the candidates' graphs replayed in TUNE_ROUNDS interleaved rounds (a clock or
        placement drift then hits every candidate alike). Session 21's first form (2-10 calls a graph, one round,
        candidates one after another) read 4-28% above the judge, unevenly, and mispicked (FINDINGS 24.3)."""
        n = max(1, min(TUNE_MAX_COPIES, math.ceil(TUNE_BYTES / max(self.bytes_read(m), 1))))
        copies = [self] + [self._timing_copy() for _ in range(n - 1)]
        calls = max(TUNE_CALLS, n)
        ok = []
        for cfg in cfgs:                               # every workspace grown first: no graph below loses its buffers
            try:
                for c in copies:
                    c.set_config(m, cfg)
                y = kernel_fn(x, self).double()
            except (ValueError, RuntimeError):      # a config that does not fit or is not compiled in: not timed
                continue
            err = (y - ref).abs()
            if bool((err <= 2 ** -7 * ref.abs() + 2 ** -10 * ref.abs().amax(1, keepdim=True)).all()):
                ok.append(cfg)                         # outside SPEC's tolerance: never picked
        graphs = []
        out = torch.empty((m, self.N), dtype=self.out_dtype, device=self.device)   # one output: no pool per graph
        for cfg in ok:
            for c in copies:
                c.set_config(m, cfg)
            run = lambda: [kernel_fn(x, copies[i % n], out=out) for i in range(calls)]   # noqa: E731
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                run()
            torch.cuda.current_stream(self.device).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                run()
            for _ in range(TUNE_WARMUP):
                g.replay()
            graphs.append((g, cfg, []))
        for _ in range(TUNE_ROUNDS):
            for g, cfg, ts in graphs:
                for _ in range(TUNE_REPLAYS):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    g.replay()
                    b.record()
                    b.synchronize()
                    ts.append(a.elapsed_time(b) * 1e3 / calls)
        return [(sorted(ts)[len(ts) // 2], cfg) for _, cfg, ts in graphs]

    def _tune(self, cache_path):
        """prepare(tune=True): for each token class (m <= 8, 9..16, 17..32) whose m the cost model planned (table rows
        and the rule-planned paths are left alone), the TUNE_TOP cheapest candidates of the planned path timed at the
        class's largest m on this layer's weights; the fastest serves the class's planned m. Winners are cached in
        cache_path under (device, extension, shape, class, path): a later prepare of the shape takes it untimed."""
        cache = _read_tune_cache(cache_path)
        dirty = False
        for nb in (1, 2, 4):
            ms = [m for m in range(1, MAX_M + 1) if nb_of(m) == nb and self.plans[m].why.startswith(PLANNER_MODEL_WHY)]
            if not ms:
                continue
            path, old = self.plans[ms[0]].path, self.plans[ms[0]].config
            ms = [m for m in ms if self.plans[m].path == path]
            m_top = ms[-1]
            key = _tune_key(self, nb, path)
            hit = _config_from_json(cache.get(key))
            if hit is not None and not config_misfit(hit, self.N, self.K, m_top, self.dual):
                cfg, why = hit, (f"tuned (cached in {cache_path}): {config_short(hit)} {cache[key]['us']:.2f} us at "
                                 f"m={cache[key]['m']}, fastest of {len(cache[key]['timed'])}")
            else:
                cands = [c for _, c, _ in plan_priced(self.N, self.K, m_top, path)][:TUNE_TOP]
                if path == "compressed":   # each with the walk its worst row needs (_walk_for; a long row: cooperative)
                    cands = [w[0] for w in (_walk_for(self.z, c, m_top) for c in cands) if not isinstance(w, str)]
                t0 = time.time()
                g = torch.Generator().manual_seed(20261202)
                x = torch.randn(m_top, self.K, generator=g).to(torch.bfloat16).to(self.device)
                ref = x.double() @ self.weight.double().t()
                timed = self._time_configs(cands, m_top, x, ref)
                if not timed:
                    raise RuntimeError(f"prepare(tune=True), layer '{self.name}' m={m_top}: none of the planner's "
                                       f"candidates {[config_short(c) for c in cands]} ran within SPEC's tolerance")
                us, cfg = min(timed, key=lambda t: t[0])
                listing = ", ".join(f"{config_short(c)} {t:.2f}" for t, c in timed)
                print(f"[muse] tuned layer '{self.name}' [{self.N} x {self.K}] m<={m_top} {path}: {listing} us "
                      f"({time.time() - t0:.1f} s)", file=sys.stderr, flush=True)
                cache[key] = {"config": _config_to_json(cfg), "us": round(us, 3), "m": m_top,
                              "timed": [[config_short(c), round(t, 3)] for t, c in timed],
                              "date": time.strftime("%Y-%m-%d")}
                dirty = True
                why = f"tuned on this device: {config_short(cfg)} {us:.2f} us at m={m_top}, fastest of {listing} us"
            for m in ms:
                self.set_config(m, cfg)
                self.plans[m] = PlanEntry(path, cfg, f"{why} (planner's pick: {config_short(old)})")
        if dirty:
            _write_tune_cache(cache_path, cache)

    def describe(self):
        mb = self.weight.numel() * self.weight.element_size() / 1e6
        head = (f"layer '{self.name}' [{self.N} x {self.K}] {str(self.weight.dtype).replace('torch.', '')}"
                f" ({mb:.1f} MB){' DUAL hi+lo -> fp32 out' if self.dual else ''}; PDL {'on' if self.pdl else 'off'}")
        lines = [head]
        if self.z is not None:
            z = self.z
            rate = z.n_exc / (self.N * self.K)
            lo, hi = int(z.zbase.min()), int(z.zbase.max())
            lines.append(f"  12-bit format: row windows start at class {lo}..{hi}"
                         f"{f' ({z.moved} rows off their fullest run, for exactness)' if z.moved else ''}, "
                         f"{z.n_exc} exceptions ({100 * rate:.4f}%), at most {z.capr} in a row, windows + side table "
                         f"{side_table_bits(z, self.N, self.K):.4f} bit/weight; decode check on the GPU passed")
        else:
            lines.append(f"  12-bit format: {self.z_note}")
        ms = list(range(1, MAX_M + 1))
        i = 0
        while i < len(ms):
            j = i
            while j + 1 < len(ms) and self.plans[ms[j + 1]] == self.plans[ms[i]]:
                j += 1
            p = self.plans[ms[i]]
            rng = f"m={ms[i]}" if i == j else f"m={ms[i]}..{ms[j]}"
            cfg = "" if p.config is None else f" {p.config}"
            kern = f" {kernel_name(p.config)}" if p.path in ("plain", "compressed") else ""
            lines.append(f"  {rng:<9} {p.path}{kern}{cfg}  [{p.why}]")
            i = j + 1
        lines.append(f"  m>{MAX_M}      fallback cuBLAS ({'fp32 GEMM' if self.dual else 'bf16 GEMM, fp32 split-K sums'}: "
                     f"fallback_matmul)  [m > {MAX_M}]")
        return "\n".join(lines)

    __repr__ = describe


def _check_weight(name, weight):
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"weight of layer '{name}' must be torch.bfloat16 or torch.float32, got {weight.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"weight of layer '{name}' must be 2-D [N, K], got shape {tuple(weight.shape)}")
    if weight.numel() == 0:
        raise ValueError(f"weight of layer '{name}' is empty: shape {tuple(weight.shape)}")
    if not weight.is_cuda:
        raise ValueError(f"weight of layer '{name}' must be a CUDA tensor, got device {weight.device}")


# ---- prepare(tune=True): the planner's cheapest candidates timed on the layer's own weights, cached on disk ---------
TUNE_TOP = 3                     # candidates timed per token class: the cost model's cheapest (its pick is within 2-8%
                                 # of the fastest on shapes it was not fit on, FINDINGS 22-23)
TUNE_BYTES = 160 * 1024 ** 2     # weight bytes the timing copies hold together: past the 60 MB L2, as SPEC's >= 2 GB
TUNE_MAX_COPIES = 64             #   are (a layer's own weights alone would time from L2: FINDINGS 2.2); tiny layers cap
TUNE_CALLS = 64                  # calls a graph, cycling over the copies (SPEC's P >= 2 GB copies give 30-100)
TUNE_WARMUP = 3                  # replays of each graph before any is timed
TUNE_ROUNDS = 3                  # interleaved rounds over the candidates' graphs
TUNE_REPLAYS = 3                 # replays a round: the median of ROUNDS x REPLAYS
PLANNER_MODEL_WHY = "planner (cost model)"   # the plans tune=True may replace: where the cost model priced candidates
TUNE_CONFIGS = {"GemvConfig": GemvConfig, "GemvzConfig": GemvzConfig, "GemvtConfig": GemvtConfig}


def tune_cache_path():
    """Where prepare(tune=True) keeps its winners: $MUSE_TUNE_CACHE, else ~/.cache/muse_gemv/tuned.json."""
    return os.environ.get("MUSE_TUNE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "muse_gemv",
                                                                "tuned.json")


def _tune_key(layer, nb, path):
    """The cache key of a tuned class: device, the extension (its name hashes the kernel source and flags), shape and
    dtype, token class, path."""
    dev = torch.cuda.get_device_name(layer.device) if layer.device.type == "cuda" else str(layer.device)
    ext = getattr(layer.ext, "__name__", "?")
    return f"{dev}|{ext}|{layer.N}x{layer.K}|{'fp32' if layer.dual else 'bf16'}|m<={8 * nb}|{path}"


def _config_to_json(cfg):
    return {"type": type(cfg).__name__, **cfg._asdict()}


def _config_from_json(d):
    """The config of a cache entry, or None for anything unreadable (an old or hand-edited file is not an error)."""
    try:
        fields = dict(d["config"])
        return TUNE_CONFIGS[fields.pop("type")](**fields)
    except (KeyError, TypeError, ValueError):
        return None


def _read_tune_cache(path):
    try:
        with open(path) as f:
            d = json.load(f)
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_tune_cache(path, cache):
    """Write the cache whole, through a temporary file (a concurrent reader sees the old or the new file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(cache, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def prepare(name, weight, *, path=None, pdl=None, ext=None, ctable=None, ztable=None, ttable=None, tpick=None,
            tune=False, tune_cache=None):
    """Pack one layer and plan every m. weight: CUDA [N, K], bf16 or fp32 (router: hi + lo, fp32 out).

    path: None (tables decide per m), 'plain', 'compressed' or 'triton' (force one path for every m <= 32;
          'compressed' takes the 12-bit format whenever it is exact, whatever its exception rate).
    pdl:  None (env MUSE_PDL, default on), True or False.
    ext:  None (the shipped build) or a module from build_extension(...) (a variant build: tools, tests).
    tune: False, or True: where the cost model planned a token class (m <= 8, 9..16, 17..32; not table rows), time its
          TUNE_TOP cheapest candidates on this layer's weights and keep the fastest; the winner is cached on disk
          (tune_cache, default tune_cache_path(): device, kernel build, shape), so a shape is timed once (a few
          seconds; a line on stderr says what was timed). describe() says "tuned on this device" / "tuned (cached ...)".
    Runs eagerly (may allocate, synchronize, verify). Returns a Layer; layer.describe() says what each m does.
    """
    _check_weight(name, weight)
    if path not in (None, "plain", "compressed", "triton"):
        raise ValueError(f"path must be None, 'plain', 'compressed' or 'triton', got {path!r}")
    if not isinstance(tune, bool):
        raise TypeError(f"tune must be True or False, got {tune!r}")
    ext = shipped_extension() if ext is None else ext
    weight = weight.contiguous()
    L = Layer(name, weight)
    L.ext = ext
    if pdl is not None:
        L.pdl = bool(pdl)
    N, K = L.N, L.K
    shape_ok = N % 16 == 0 and K % 64 == 0

    # Which paths could be used: compress only if some m would take it.
    compressible = "fp32 weights take the DUAL plain path" if L.dual else (
        f"shape N={N}, K={K} not a multiple of 16 / 64" if not shape_ok else True)
    pre = [plan_for(name, N, K, m, L.dual, compressible, path, ctable, ztable, ttable, tpick)
           for m in range(1, MAX_M + 1)]
    if any(p.path == "compressed" for p in pre):
        try:
            L.z = _compress_verified(weight, ext, limits=path != "compressed")
            L.z_note = "ok"
        except _NoCompression as e:
            if path == "compressed":
                raise ValueError(f"layer '{name}' cannot be compressed: {e}") from None
            compressible, L.z_note = str(e), f"not used: {e}"   # plan_for says "compressed not used: <why>"
    elif compressible is not True:
        L.z_note = f"not used: {compressible}"
    else:
        L.z_note = "not used: the tables send every m to the plain or Triton path"
    whys = []     # why an m range of a compressible layer runs plain anyway (the 12-bit note when none takes it)

    def plan_m(m):
        if L.z is None or path is not None:
            return plan_for(name, N, K, m, L.dual, compressible, path, ctable, ztable, ttable, tpick)
        pays = _z_pays(L.z, m)
        p = plan_for(name, N, K, m, L.dual, pays, path, ctable, ztable, ttable, tpick)
        if p.path != "compressed":
            whys.append(pays)
            return p
        walk = _walk_for(L.z, p.config, m)
        if isinstance(walk, str):
            whys.append(walk)
            return plan_for(name, N, K, m, L.dual, walk, path, ctable, ztable, ttable, tpick)
        return p._replace(config=walk[0], why=p.why + walk[1])

    L.plans = [None] + [plan_m(m) for m in range(1, MAX_M + 1)]
    if L.z is not None and not any(p.path == "compressed" for p in L.plans[1:]):   # no m takes it: drop the copy
        why = next((r for r in whys if r is not True), "the tables send every m to the plain or Triton path")
        L.z_note, L.z = f"not used: {why}", None
    if any(isinstance(p.config, GemvConfig) for p in L.plans[1:]):
        L._pack_plain()
    if any(isinstance(p.config, GemvtConfig) for p in L.plans[1:]):
        L.wt = pack_tma(weight)
    if any(p.path == "triton" for p in L.plans[1:]):
        L._pack_triton()
    L._alloc_workspace()
    if tune:
        L._tune(tune_cache or tune_cache_path())
    for m in range(1, MAX_M + 1):       # the launches, here rather than in a first kernel_fn (maybe under capture)
        if L.plans[m].path in ("plain", "compressed"):
            L.launch(m)
    L._warm_triton()
    torch.cuda.synchronize(L.device)
    return L


class _NoCompression(Exception):
    pass


def exc_rate_limit(N, K, m):
    """The largest share of out-of-window weights at which the compressed path is taken for an N x K layer at m: its
    shape's measured limit (EXC_RATE_LIMITS_BY_SHAPE), else the smallest measured one (EXC_RATE_LIMITS)."""
    return next(r for mm, r in EXC_RATE_LIMITS_BY_SHAPE.get((N, K), EXC_RATE_LIMITS) if m <= mm)


def _z_pays(z, m):
    """True, or why the compressed path does not pay at m for this packed weight (plan_for's compressible): the share of
    out-of-window weights. The worst row is _walk_for's question, asked of the config the plan takes."""
    N, K = z.zbase.numel(), z.stream.shape[1] * 64
    rate, lim = z.n_exc / (N * K), exc_rate_limit(N, K, m)
    if rate > lim:
        src = "EXC_RATE_LIMITS_BY_SHAPE" if (N, K) in EXC_RATE_LIMITS_BY_SHAPE else "EXC_RATE_LIMITS"
        return f"{100 * rate:.3f}% of weights out of window > {100 * lim:.2f}%, where compressed stops paying at m={m} ({src})"
    return True


def coop_chain(z, r):
    """The longest chain one lane of the cooperative walk follows for CTAs of 16 r rows: the most side-table entries
    of any 16 r-row group, dealt to 32 lanes (coop_walk's contiguous pieces, rounded up). Needs N % (16 r) == 0."""
    g = 16 * r
    e = z.eptr.to(torch.int64)
    return -(-int((e[g::g] - e[:-g:g]).max()) // 32) if z.n_exc else 0


def coop_twin(cfg):
    """A per-row-walk compressed config's twin with the cooperative walk (gemvz PIPE + 8, coop_walk); any other config
    (plain, or already cooperative) as it is."""
    return cfg._replace(pipe=cfg.pipe + 8) if isinstance(cfg, GemvzConfig) and cfg.pipe < 8 else cfg


def _walk_for(z, cfg, m):
    """The exception walk of a compressed plan: (cfg, '') with the per-row walk while the worst row (capr) is within
    CAPR_LIMITS at m; (cfg with PIPE + 8, the note) with the cooperative walk where capr is over it and coop_chain is
    within it; else a string saying why neither walk hides under the stream (the m range then runs plain)."""
    climit = next(c for mm, c in CAPR_LIMITS if m <= mm)
    if z.capr <= climit or cfg.pipe >= 8:
        return cfg, ""
    chain = coop_chain(z, cfg.r)
    coop = coop_twin(cfg)
    if chain > climit:
        return (f"{z.capr} exceptions in one row and {chain} a lane in the cooperative walk > {climit}, where the walk "
                f"outlasts the stream at m={m} (CAPR_LIMITS)")
    N, K = z.zbase.numel(), z.stream.shape[1] * 64
    bad = gemvz_misfit(coop, N, K, m)
    if bad:
        return f"{z.capr} exceptions in one row > {climit} (CAPR_LIMITS), and the cooperative walk does not fit: {bad}"
    return coop, (f"; cooperative exception walk (PIPE {coop.pipe}): {z.capr} exceptions in one row > {climit} "
                  f"(CAPR_LIMITS), {chain} a lane")


def _compress_verified(w, ext=None, limits=True):
    """pack_z + the GPU decode check (with ext's unpackz; default the shipped build); raises _NoCompression with the
    reason when the format is not exact, or (limits) when it does not pay: MAX_EXC_RATE, MAX_CAPR (the worst row and the
    cooperative walk's chain at R = 1, its shortest, both over it). prepare(path=
    'compressed') lifts the limits: an exact format is then used however many exceptions it has."""
    N, K = w.shape
    try:
        z = pack_z(w)
    except ValueError as e:
        raise _NoCompression(str(e))
    rate = z.n_exc / (N * K)
    chain = coop_chain(z, 1) if limits and z.capr > MAX_CAPR else 0
    if chain > MAX_CAPR:
        raise _NoCompression(f"{z.capr} exceptions in one row and {chain} a lane in the cooperative walk > "
                             f"MAX_CAPR {MAX_CAPR} ({100 * rate:.3f}% of weights out of window)")
    if limits and rate > MAX_EXC_RATE:
        raise _NoCompression(f"{100 * rate:.3f}% of weights out of window > {100 * MAX_EXC_RATE:.2f}%, the largest "
                             f"measured break-even of any shape and m (EXC_RATE_LIMITS_BY_SHAPE; capr {z.capr})")
    bad = verify_z(w, z, ext)
    if bad:
        raise _NoCompression(f"decode check failed on the GPU: {bad}")
    return z


def verify_z(w, z, ext=None):
    """Decode z on the GPU with the kernel's own decz (ext's unpackz_kernel; default the shipped build) and compare
    with w bit for bit (exceptions: v + c; a zero weight may come back +0). Returns '' when exact, else a
    description of the first mismatch."""
    N, K = w.shape
    dec = torch.empty((N, K), dtype=torch.bfloat16, device=w.device)
    (shipped_extension() if ext is None else ext).unpackz(z.stream.data_ptr(), z.zbase.data_ptr(), dec.data_ptr(),
                                                          N, K, _raw_stream(w.device))
    db = dec.view(torch.int16)
    wb = w.view(torch.int16)
    same = db == wb
    if z.n_exc:
        r = torch.arange(N, device=w.device).repeat_interleave((z.eptr[1:] - z.eptr[:-1]).long())
        e = z.esc[:z.n_exc]
        k, c = e[:, 0].long(), e[:, 1].view(torch.float32)
        back = dec[r, k].float() + c
        tgt = w[r, k].float()
        ok = _restores(back, tgt)
        if not bool(ok.all()):
            i = int((~ok).nonzero()[0])
            return f"exception at row {int(r[i])}, k {int(k[i])}: v + c = {float(back[i])} != {float(tgt[i])}"
        same[r, k] = True
    if not bool(same.all()):
        r, k = [int(v) for v in (~same).nonzero()[0]]
        return (f"weight [{r}, {k}] decodes to 0x{int(db[r, k]) & 0xFFFF:04x}, expected 0x{int(wb[r, k]) & 0xFFFF:04x}")
    return ""


def fallback_matmul(x, w, out):
    """out = x @ w.T through cuBLAS for what our kernels do not run (m > MAX_M, shapes they do not take): bf16 weights
    by cuBLAS's bf16 GEMM with its split-K partial sums kept in fp32 (torch lets cuBLAS reduce them in bf16 by default,
    which missed SPEC's tolerance on N = 100, K = 1000, m >= 17 in session 1), fp32 weights by the fp32 GEMM (TF32 is
    off by torch's default). Measured (tools/fallback_bench.py, H200, session 19): the bf16 GEMM this way runs as fast
    as torch's default F.linear (pooler m = 512: 47.3 against 49.1 us) and passes SPEC's check on trained-like and
    heavy-tailed weights at m = 33..512, where the fp32 matmul this replaced took 9-17x as long (FINDINGS 22)."""
    if w.dtype == torch.float32:
        torch.mm(x.float(), w.t(), out=out)
        return
    flags = torch.backends.cuda.matmul
    old = flags.allow_bf16_reduced_precision_reduction
    flags.allow_bf16_reduced_precision_reduction = False
    try:
        torch.mm(x, w.t(), out=out)
    finally:
        flags.allow_bf16_reduced_precision_reduction = old


def kernel_fn(x, layer, out=None):
    """y = x @ W.T for a prepared layer. x: CUDA bf16 [m, K], contiguous, 16-byte aligned, m >= 1.
    Returns [m, N] (bf16; fp32 for fp32 weights). out: optional preallocated result (tests poison it).
    Host-side checks only; launches on torch.cuda.current_stream(); safe to capture in a CUDA graph."""
    if not isinstance(layer, Layer):
        raise TypeError(f"layer must come from submission.prepare, got {type(layer).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x must be torch.bfloat16, got {x.dtype} (layer '{layer.name}')")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [m, K], got shape {tuple(x.shape)} (layer '{layer.name}')")
    m, k = x.shape
    if k != layer.K:
        raise ValueError(f"x has K={k} but layer '{layer.name}' has K={layer.K}")
    if m == 0:
        raise ValueError(f"x has m=0 rows; expected m >= 1 (layer '{layer.name}')")
    if x.device != layer.device:
        raise ValueError(f"x is on {x.device} but layer '{layer.name}' is on {layer.device}")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous, got strides {x.stride()} (layer '{layer.name}')")
    if x.data_ptr() % 16:
        raise ValueError(f"x must be 16-byte aligned, got address {x.data_ptr():#x} (layer '{layer.name}')")
    N = layer.N
    if out is None:
        out = torch.empty((m, N), dtype=layer.out_dtype, device=x.device)
    elif out.shape != (m, N) or out.dtype != layer.out_dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {layer.out_dtype} [{m}, {N}] on {x.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    p = layer.plans[m] if m <= MAX_M else None
    if p is None or p.path == "fallback":
        fallback_matmul(x, layer.weight, out)
        return out
    c = p.config
    if p.path == "triton":
        return _tri_launch(x, layer.tw, layer.tw2, out, layer.tws if c.mode == "ticket" else layer.twa, layer.tsem,
                           c, layer.dual, layer.pdl)
    layer.launch(m)(x.data_ptr(), out.data_ptr(), m, _raw_stream(x.device), layer.pdl and c.pdl == 1)
    return out
