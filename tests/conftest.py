"""Shared test setup: the repo root on sys.path; without CUDA, submission.py imports without building."""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if not torch.cuda.is_available():
    os.environ.setdefault("MUSE_BUILD", "0")
