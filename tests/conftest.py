"""Shared test setup: the repo root and tools/ on sys.path (the tools import each other by name); without CUDA,
submission.py imports without building. The build_tree fixture: a copy of what build.py reads and writes, for tests
that make build.py (or tune.py) act on a modified tree."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (os.path.join(ROOT, "tools"), ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)
if not torch.cuda.is_available():
    os.environ.setdefault("MUSE_BUILD", "0")

# build.py reads muse/, csrc/, tables/ and README.md and writes submission.py, csrc/ and README.md, all relative to its
# own directory; tune.py and judge.py come along for the tests that run tune.py in the copy
TREE = ("build.py", "muse", "csrc", "tables", "README.md", "submission.py", "tune.py", "judge.py")


class BuildTree:
    """A copy of the repository's build inputs and outputs in a tmp dir (path); run() runs a script of it there."""

    def __init__(self, path):
        self.path = path
        path.mkdir()
        for name in TREE:
            src = os.path.join(ROOT, name)
            if os.path.isdir(src):
                shutil.copytree(src, path / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(src, path / name)

    def __truediv__(self, name):
        return self.path / name

    def read(self, name):
        return (self.path / name).read_text()

    def write(self, name, text):
        (self.path / name).write_text(text)

    def run(self, script="build.py", *args):
        """python3 <tree>/<script> args, with the tree as the working directory and no GPU visible (a CPU run on any
        machine): the CompletedProcess (text)."""
        env = dict(os.environ, MUSE_BUILD="0", CUDA_VISIBLE_DEVICES="")
        return subprocess.run([sys.executable, str(self.path / script), *args], cwd=self.path, capture_output=True,
                              text=True, env=env, timeout=600)


@pytest.fixture
def build_tree(tmp_path):
    return BuildTree(tmp_path / "tree")
