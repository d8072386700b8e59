"""Configs the GPU tests force with set_config, whatever the tables pick. Every one must be compiled in: they are
the default rule's configs (muse/rules.py DEFAULT_GEMV / DEFAULT_GEMVZ), which build.py compiles for every NB and
DUAL, with other S, pf and cl; tests/test_cpu.py checks that each is in the kernel table."""
import submission as S

_C = S.DEFAULT_GEMV[0]
_Z = S.DEFAULT_GEMVZ[0]

# (layer, m, config) run with cl=0 (ticket) and cl=2 (cluster mbarrier): S=16 is a non-portable cluster size
CLUSTER_CASES = [
    ("router", 1, _C._replace(s=8, pf=1)),
    ("router", 1, _C._replace(s=16, pf=0)),
    ("qkv_gate", 8, _Z._replace(s=4)),
    ("pooler", 2, _Z._replace(s=2)),
]

# (layer, m, config) of gemvz_kernel with S that does not divide the K units (split_units): the warps' shares differ
# by one unit, the CTAs' slices too; run with the ticket and the cluster (S = 11: a non-portable cluster)
UNEVEN_CASES = [
    ("qkv_gate", 1, _Z._replace(s=11)),
    ("qkv_gate", 16, _Z._replace(s=5)),
    ("o_proj", 32, _Z._replace(s=3)),
]
