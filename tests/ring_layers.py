"""The layers the ring kernels' GPU tests run on (tests/test_tma.py, tests/test_tmaz.py): every scored bf16 layer on
trained-like weights, prepared on one path with a test extension."""
import torch

import judge
import submission as S

NAMES = ["qkv_gate", "o_proj", "pooler", "unpooler"]


def prepared_layers(ext, path, seed0):
    """{name: (layer, weight)} for NAMES: weights trained_like(seed0 + i), prepare(path=path, ext=ext)."""
    out = {}
    for i, name in enumerate(NAMES):
        d = judge.LAYERS[name]
        w = judge.trained_like(d["N"], d["K"], seed0 + i, "cuda", torch.bfloat16)
        out[name] = (S.prepare(name, w, path=path, ext=ext), w)
    return out
