"""README.md's two commands keep their form: they are what a new user runs verbatim (issue #26: a bare `pip` on the
H200 machine belongs to another Python and failed at `torch>=2.4`; issue #49: the CPU line must resolve with the public
package index alone)."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def _commands():
    """The indented command lines of README's '## Two commands' section, in order."""
    text = _read("README.md")
    section = text[text.index("## Two commands"):]
    section = section[:section.index("\n## ", 3)]
    return [line.strip() for line in section.splitlines() if line.startswith("    ") and line.strip()]


def test_readme_has_the_gpu_command_then_the_cpu_command():
    gpu, cpu = _commands()
    assert gpu == "python3 -m pip install -r requirements.txt && python3 judge.py"
    assert cpu.startswith("python3 -m pip install torch==2.13.0 ") and cpu.endswith("python3 -m pytest -q tests/")


def test_every_pip_in_the_commands_is_python3_dash_m_pip():
    for cmd in _commands():
        for part in cmd.split("&&"):
            words = part.split()
            assert words[0] == "python3", part                          # never a bare pip / python
            if "pip" in words:
                assert words[1:3] == ["-m", "pip"], part


def test_ci_runs_the_readme_test_command_verbatim():
    ci = [line for line in _read(".ci/run").splitlines() if line.strip() and not line.startswith("#")]
    assert ci[-1].strip() == _commands()[1]


def test_requirements_ask_for_no_torch():
    reqs = [re.split(r"[<>=!~\s#\[;]", line.strip())[0].lower() for line in _read("requirements.txt").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    assert reqs and "torch" not in reqs and not any(r.startswith("torch") or r.startswith("nvidia") for r in reqs)


def test_the_cpu_command_installs_the_cpu_torch_by_exact_version():
    cpu = _commands()[1]
    assert re.search(r"\btorch==2\.13\.0\b", cpu) and "-r requirements.txt" in cpu


def test_the_cpu_command_resolves_with_the_public_index_alone():
    # issue #49: on the public index torch 2.13.0 is the CUDA build, which pins triton==3.7.1; the old line's
    # triton==3.6.0 made `pip install --dry-run --isolated --ignore-installed` end in ResolutionImpossible. The line
    # names no index or wheel folder of its own (here pip's configuration adds the local CPU build), and every package
    # it names besides the requirements file is pinned.
    cpu = _commands()[1]
    install = cpu.split("&&")[0].split()
    assert install[:4] == ["python3", "-m", "pip", "install"]
    assert not any(w.startswith(("--index-url", "-i", "--extra-index-url", "--find-links", "-f", "--no-index"))
                   for w in install[4:]), install
    pins = dict(w.split("==") for w in install[4:] if "==" in w)
    assert pins == {"torch": "2.13.0", "triton": "3.7.1"}, pins
