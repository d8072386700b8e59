"""Shared test setup: the repo root and tools/ on sys.path (the tools import each other by name); without CUDA,
submission.py imports without building."""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (os.path.join(ROOT, "tools"), ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)
if not torch.cuda.is_available():
    os.environ.setdefault("MUSE_BUILD", "0")
