"""The Python source of submission.py, one module per concern. build.py concatenates them, in MODULES' order below,
with the generated tables and the CUDA source between rules.py and extension.py, into the one uploadable file.

  families.py   config types, the hardware, one description per kernel family (misfit, template, runtime fields)
  rules.py      the planner's fixed rules and the defaults, as data; which instantiations are reachable
  extension.py  the kernel source string, variant builds, the build at import
  packing.py    fragment order, TMA tiles, the router's hi + lo
  zformat.py    the lossless 12-bit format, its GPU check, and when prepare compresses
  planner.py    a path and config for every (layer, m): tables, cost model, rules, default
  layer.py      Layer: packed weights, workspace, launches, describe()
  call.py       kernel_fn and the cuBLAS fallback
  tuning.py     prepare(tune=True)
  api.py        prepare
  nn.py         Linear (an nn.Linear drop-in), patch(model), the muse::gemv custom op (torch.compile, CUDA graphs)

Each module imports what it uses from the others with `from .x import ...` (build.py drops those lines and checks
that every such name is defined by an earlier module). `from ._generated import ...` names what build.py writes into
the upload from tables/ and csrc/: CARDS, CTABLES, ZTABLES, TABLE_SHAPES, PLAN_MODELS, KERNEL_SRC, BIND_SRC; there is no
_generated.py. families.py and rules.py import nothing generated, and no torch: build.py imports them.
"""
MODULES = ("families", "rules", "extension", "packing", "zformat", "planner", "layer", "call", "tuning", "api", "nn")
GENERATED_AFTER = "rules"     # the generated tables and CUDA source come right after this module
