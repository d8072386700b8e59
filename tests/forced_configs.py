"""Configs the GPU tests force with set_config, whatever the tables pick. Every one must be compiled in:
they use the default rule's (nw, u|ug, r, pipe), which build.py compiles for every NB and DUAL;
tests/test_cpu.py checks that each is in the C3 / Z3 lists."""
import submission as S

_NW, _U, _R, _PIPE = S.DEFAULT_GEMV[0]
_ZNW, _ZUG, _ZR, _ZPIPE = S.DEFAULT_GEMVZ[0]

# (layer, m, config) run with cl=0 (ticket), cl=1 (cluster barrier) and cl=2 (cluster mbarrier): S=16 is a
# non-portable cluster size
CLUSTER_CASES = [
    ("router", 1, S.GemvConfig(nw=_NW, s=8, u=_U, r=_R, pipe=_PIPE, pf=1)),
    ("router", 1, S.GemvConfig(nw=_NW, s=16, u=_U, r=_R, pipe=_PIPE, pf=0)),
    ("qkv_gate", 8, S.GemvzConfig(nw=_ZNW, s=4, ug=_ZUG, r=_ZR, pipe=_ZPIPE, pf=0)),
    ("pooler", 2, S.GemvzConfig(nw=_ZNW, s=2, ug=_ZUG, r=_ZR, pipe=_ZPIPE, pf=0)),
]

# (layer, m, config) of gemvz_kernel with S that does not divide the K units (split_units, session 20): the warps'
# shares differ by one unit, the CTAs' slices too; run with the ticket and the cluster (S = 11: a non-portable cluster)
UNEVEN_CASES = [
    ("qkv_gate", 1, S.GemvzConfig(nw=_ZNW, s=11, ug=_ZUG, r=_ZR, pipe=_ZPIPE, pf=0)),
    ("qkv_gate", 16, S.GemvzConfig(nw=_ZNW, s=5, ug=_ZUG, r=_ZR, pipe=_ZPIPE, pf=0)),
    ("o_proj", 32, S.GemvzConfig(nw=_ZNW, s=3, ug=_ZUG, r=_ZR, pipe=_ZPIPE, pf=0)),
]
