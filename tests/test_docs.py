"""Docs that cannot drift (issue #49), CPU, a second or less:
(a) every `FINDINGS n` / `FINDINGS n.m` (also `FINDINGS.md section n`, lists `FINDINGS 8, 10` and ranges
    `FINDINGS 10.2-10.4`) cited in code, tests and docs names a heading of FINDINGS.md (`## n.` or `### n.m`);
(b) every repository path named in README.md, tools/README.md, docs/SPEC.md and FINDINGS.md's code map exists.
history/, results/ and experiments/ are archives, written as they were: outside both checks. A failure names the file,
the line and the missing target. When FINDINGS.md is renumbered, the citations move with it (its section 1 keeps the
old -> new table) and this test says which ones still point at the old numbers."""
import functools
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCHIVES = ("history", "results", "experiments")
CITING = (".py", ".cuh", ".cu", ".cpp", ".h", ".md", ".sh")   # and .ci/run
DOCS = ("README.md", "tools/README.md", "docs/SPEC.md")        # every path they name must exist (FINDINGS: its code map)
FUTURE_DIRS = ("examples",)                                     # top-level folders a doc may name before they exist


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def _files():
    """The repository's files (tracked and untracked-not-ignored, as git sees them; else a walk that skips hidden,
    cache and virtual-environment folders), relative to ROOT, archives left out."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode()
        files = [f for f in out.split("\0") if f and os.path.isfile(os.path.join(ROOT, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, subs, names in os.walk(ROOT):
            subs[:] = [s for s in subs if not s.startswith(".") or s == ".ci"]
            subs[:] = [s for s in subs if s not in ("__pycache__", "node_modules")
                       and not os.path.exists(os.path.join(d, s, "pyvenv.cfg"))]
            files += [os.path.relpath(os.path.join(d, n), ROOT) for n in names]
    return tuple(sorted(f for f in files if f.split("/")[0] not in ARCHIVES))


def _line(text, pos):
    return text.count("\n", 0, pos) + 1


# ---- (a) FINDINGS citations ---------------------------------------------------------------------------------------

_NUM = r"\d+(?:\.\d+)?"
_CITE = re.compile(r"\bFINDINGS(?:\.md)?[,:]?\s+\(?(?:sections?\s+)?(" + _NUM + r"(?:\s*(?:,|-|/|and)\s*" + _NUM + r")*)")


def findings_headings(text=None):
    """{'8', '8.5', ...}: the numbers of FINDINGS.md's `## n.` and `### n.m` headings."""
    text = _read("FINDINGS.md") if text is None else text
    heads = set(re.findall(r"^## (\d+)\.\s", text, re.M))
    heads |= set(re.findall(r"^### (\d+\.\d+)\s", text, re.M))
    return heads


def citations(text):
    """[(line, number)] of every FINDINGS section number cited in text."""
    out = []
    for m in _CITE.finditer(text):
        for n in re.findall(_NUM, m.group(1)):
            out.append((_line(text, m.start()), n))
    return out


def _findings_own_history_blanked(text):
    """FINDINGS.md with its own history left out of (a): the old -> new section table and any `##` section whose title
    says history (they name old numbers on purpose). Lines are kept, blanked, so line numbers stay true."""
    out, skip = [], False
    for line in text.split("\n"):
        if line.startswith("## "):
            skip = "history" in line.lower()
        out.append("" if skip or (line.startswith("|") and "->" in line) else line)
    return "\n".join(out)


def stale_citations():
    heads = findings_headings()
    bad = []
    for f in _files():
        if not (f.endswith(CITING) or f == ".ci/run"):
            continue
        try:
            text = _read(f)
        except (UnicodeDecodeError, OSError):
            continue
        if f == "FINDINGS.md":
            text = _findings_own_history_blanked(text)
        for line, n in citations(text):
            if n not in heads:
                want = f"'### {n}'" if "." in n else f"'## {n}.'"
                bad.append(f"{f}:{line}: cites FINDINGS {n}, but FINDINGS.md has no heading {want}")
    return bad


def test_every_findings_section_cited_exists():
    bad = stale_citations()
    assert not bad, "stale FINDINGS citations (point them at the section that now holds what they cite):\n" + \
        "\n".join(bad)


def test_the_citation_pattern_reads_every_form_used():
    text = ("a (FINDINGS 8.5): b\nFINDINGS 10.5, 10.6 and FINDINGS.md section 19; (FINDINGS 8, 10) FINDINGS 10.2-10.4\n"
            "FINDINGS.md (sections 11, 12; ...) FINDINGS 6.3. FINDINGS 12.1, S10c3; FINDINGS, \"the house\"")
    assert citations(text) == [(1, "8.5"), (2, "10.5"), (2, "10.6"), (2, "19"), (2, "8"), (2, "10"), (2, "10.2"),
                               (2, "10.4"), (3, "11"), (3, "12"), (3, "6.3"), (3, "12.1")]
    heads = findings_headings("## 8. A\n### 8.5 B\n## 10. C\n#### 10.5.1 D\n")
    assert heads == {"8", "8.5", "10"}


# ---- (b) paths named in the docs ----------------------------------------------------------------------------------

def _top_dirs():
    return sorted({f.split("/")[0] for f in _files() if "/" in f} | set(ARCHIVES) | set(FUTURE_DIRS))


def _path_pattern(prefixes):
    """A path that starts with one of prefixes (a folder), not inside a longer path, a URL, a ~/ or $VARIABLE path."""
    alt = "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True))
    return re.compile(r"(?<![\w$~./<>{}-])((?:" + alt + r")/[\w.*<>{}/-]*)")


def _backticked_names(text):
    """(pos, name) of every backticked bare file name (`build.py`, `test_labs.py`): no folder, a known extension."""
    for m in re.finditer(r"`([^`\n]+)`", text):
        for w in re.finditer(r"(?<![\w$~./<>-])([\w-]+(?:\.[\w-]+)*\.(?:py|md|txt|json|cuh|cu|cpp|h|sh|toml|cfg))"
                             r"(?![\w/.])", m.group(1)):
            yield m.start(1) + w.start(1), w.group(1)


def findings_code_map():
    """(first line, text) of FINDINGS.md's `## n. Code map` section, found by its title (the number may change)."""
    text = _read("FINDINGS.md")
    m = re.search(r"^## \d+\. Code map\b.*?(?=^## |\Z)", text, re.M | re.S)
    assert m, "FINDINGS.md has no '## n. Code map' section"
    return _line(text, m.start()), m.group(0)


def missing_paths(doc, text, first_line=1):
    """['doc:line: `path` does not exist'] for the paths named in text (doc's content from first_line on): folder paths
    from the repository root (or doc's own folder, for its subfolders), backticked bare file names anywhere in the
    repository. Archives, placeholders (<...>, *, ...), ~/ and $VARIABLE paths are skipped."""
    files = _files()
    names = {os.path.basename(f) for f in files}
    here = os.path.dirname(doc)
    local = []   # doc's own subfolders (docs/SPEC.md names `anchors/...`), read from doc's folder
    if here:
        local = sorted(d for d in os.listdir(os.path.join(ROOT, here))
                       if os.path.isdir(os.path.join(ROOT, here, d)) and not d.startswith(".") and d not in _top_dirs())
    top = _top_dirs() + [".ci"]
    bad = []
    for m in _path_pattern(top + local).finditer(text):
        p = m.group(1).rstrip(".")
        if p.split("/")[0] in ARCHIVES or re.search(r"[<>{}*]|\.\.\.", p):
            continue
        roots = [here] if p.split("/")[0] in local else [""]
        if not any(os.path.exists(os.path.join(ROOT, r, p)) for r in roots):
            bad.append(f"{doc}:{first_line - 1 + _line(text, m.start())}: `{p}` does not exist")
    if doc != "docs/SPEC.md":   # SPEC, the shared contract, names the guide's own files (outside this repository)
        for pos, n in _backticked_names(text):
            if n not in names and not os.path.exists(os.path.join(ROOT, here, n)):
                bad.append(f"{doc}:{first_line - 1 + _line(text, pos)}: `{n}` names no file of the repository")
    return bad


def test_every_path_the_docs_name_exists():
    bad = []
    for doc in DOCS:
        bad += missing_paths(doc, _read(doc))
    line, text = findings_code_map()
    bad += missing_paths("FINDINGS.md", text, line)
    assert not bad, "paths named in the docs that are not in the repository:\n" + "\n".join(bad)


def test_the_path_pattern_finds_paths_and_skips_what_is_not_one():
    text = ("`csrc/gemvt.cuh` and tools/ab.py, (labs/lab3_compress.py). `tests/...`, results/x.json, "
            "$OUT/tools/x.py, ~/tools/y, `tools/<tool>.py`, https://h/tools/z.py, `test_labs.py`, `ab.py --x`\n"
            "`csrc/nothere.cuh`, `muse/` and `examples/none.py`; `not_a_file_anywhere.py`")
    bad = missing_paths("README.md", text)
    assert bad == ["README.md:2: `csrc/nothere.cuh` does not exist", "README.md:2: `examples/none.py` does not exist",
                   "README.md:2: `not_a_file_anywhere.py` names no file of the repository"], bad
