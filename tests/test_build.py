"""build.py's table checks, on a copy of the tree (the build_tree fixture, tests/conftest.py): a bad row planted in a
card's tables/<card>/ctable.json or ztable.json stops `python3 build.py --check` and `python3 build.py` with exit code 1,
one line on stderr naming the file, the row and the reason, and nothing written (a row timed on another card's device
is a bad row). Also: the committed tree passes --check,
a hand-edited or a stale submission.py fails it, build.py never imports submission.py, the upload carries no
instrument (trace or timing-only) code, and tune.py --no-write on a machine without a GPU leaves tables/ alone."""
import json

import pytest

# everything build.py writes: none of it may change when a table row is bad
OUTPUTS = ("submission.py", "csrc/configs.cuh", "csrc/args.h", "README.md")
TRAILER = "build.py: the tables hold rows that cannot run (above); nothing written"


def _outputs(tree):
    return {name: (tree / name).read_bytes() for name in OUTPUTS}


def _row_index(rows, layer, m):
    return next(i for i, r in enumerate(rows) if (r["layer"], r["m"]) == (layer, m))


def _plant(tree, table, layer, m, change):
    """Apply change(rows, i) to the row (layer, m) of tables/<table> in the tree; returns the index of the bad row and
    its (layer, m) after the change."""
    path = tree / "tables" / table
    d = json.loads(path.read_text())
    i = _row_index(d["rows"], layer, m)
    i = change(d["rows"], i)
    path.write_text(json.dumps(d, indent=1) + "\n")
    return i, d["rows"][i]["layer"], d["rows"][i]["m"]


def _set(**fields):
    def change(rows, i):
        rows[i]["config"].update(fields)
        return i
    return change


def _rename(old, new):
    def change(rows, i):
        rows[i]["config"][new] = rows[i]["config"].pop(old)
        return i
    return change


def _row_field(key, value):
    def change(rows, i):
        rows[i][key] = value
        return i
    return change


def _duplicate(rows, i):
    rows.append(json.loads(json.dumps(rows[i])))
    return len(rows) - 1


def _gemvz_config(rows, i):
    rows[i]["config"] = {"nw": 8, "s": 1, "ug": 1, "r": 2, "loop": 2, "mb": 0, "walk": 0, "pf": 0, "pdl": 1, "cl": 0}
    return i


def _gemvtz_config(rows, i):
    rows[i]["config"] = {"nw": 4, "s": 1, "st": 40, "ka": 2, "pdl": 1, "cl": 0}
    return i


BAD_ROWS = [  # (id, table, layer, m, change, reason: a substring of the line, or a tuple of them)
    ("s7", "ctable.json", "router", 1, _set(s=7),
     "K/32=256 not divisible by S*NW*U=224 (gemv_kernel splits K evenly)"),
    ("nw32", "ctable.json", "o_proj", 1, _set(nw=32), "nw=32: gemv_kernel takes 1, 2, 4, 8, 16 streaming warps"),
    ("st40", "ctable.json", "qkv_gate", 8, _set(st=40), ("shared memory", f"B > {227 * 1024}")),   # H200's opt-in
    ("loop9", "ctable.json", "pooler", 1, _set(loop=9), "loop=9: gemv_kernel's loops are 0"),
    ("m64", "ctable.json", "router", 1, _row_field("m", 64), "m must be an int in 1..32"),
    ("nww", "ctable.json", "o_proj", 2, _rename("nw", "nww"), "unknown field nww for a GemvConfig"),
    ("nw-string", "ctable.json", "unpooler", 1, _set(nw="16"), "field nw: expected an int, got '16'"),
    ("unknown-layer", "ctable.json", "pooler", 2, _row_field("layer", "nobody"), "unknown layer 'nobody'"),
    ("gemvz-in-ctable", "ctable.json", "o_proj", 4, _gemvz_config,
     "a GemvzConfig row; tables/h200/ctable.json holds GemvConfig or GemvtConfig rows"),
    ("second-row", "ctable.json", "qkv_gate", 1, _duplicate, "a second row for the same layer and m"),
    ("z-walk2", "ztable.json", "o_proj", 1, _set(walk=2), "walk=2: expected 0 (one lane a row) or 1"),
    ("z-loop9", "ztable.json", "pooler", 1, _set(loop=9), "loop=9: gemvz_kernel's loops are 0"),
    ("z-ring-st40", "ztable.json", "pooler", 1, _gemvtz_config, ("shared memory", f"B > {227 * 1024}")),
    ("other-card", "ztable.json", "o_proj", 2, _row_field("device", "NVIDIA H100 80GB HBM3"),
     "timed on 'NVIDIA H100 80GB HBM3', but this table is the card 'NVIDIA H200''s"),
]


@pytest.mark.parametrize("args", [("--check",), ()], ids=["check", "build"])
@pytest.mark.parametrize("table,layer,m,change,reason", [b[1:] for b in BAD_ROWS], ids=[b[0] for b in BAD_ROWS])
def test_a_bad_row_stops_the_build_naming_file_row_and_reason_and_nothing_is_written(build_tree, args, table, layer,
                                                                                     m, change, reason):
    table = f"h200/{table}"
    i, layer, m = _plant(build_tree, table, layer, m, change)
    before = _outputs(build_tree)
    r = build_tree.run("build.py", *args)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    named = [line for line in lines if f"tables/{table}" in line]
    assert len(named) == 1, r.stderr
    assert named[0].startswith(f"tables/{table} row {i} ({layer}, m={m}): "), named[0]
    assert all(s in named[0] for s in ((reason,) if isinstance(reason, str) else reason)), named[0]
    assert [line for line in lines if line != TRAILER] == named, r.stderr   # no other complaint
    assert _outputs(build_tree) == before, "build.py wrote an output although a table row is bad"
    assert "regenerated" not in r.stdout


@pytest.mark.parametrize("args", [("--check",), ()], ids=["check", "build"])
def test_malformed_json_stops_the_build_naming_the_file(build_tree, args):
    text = (build_tree / "tables" / "h100" / "ctable.json").read_text()
    (build_tree / "tables" / "h100" / "ctable.json").write_text(text.rstrip().rstrip("}"))     # the closing brace lost
    before = _outputs(build_tree)
    r = build_tree.run("build.py", *args)
    assert r.returncode == 1, r.stdout + r.stderr
    named = [line for line in r.stderr.splitlines() if "tables/h100/ctable.json" in line]
    assert len(named) == 1 and named[0].startswith("tables/h100/ctable.json: not valid JSON"), r.stderr
    assert _outputs(build_tree) == before


def test_a_tables_folder_of_a_card_cards_json_does_not_list_stops_the_build(build_tree):
    import shutil
    shutil.copytree(build_tree / "tables" / "h100", build_tree / "tables" / "h800")
    before = _outputs(build_tree)
    r = build_tree.run("build.py")
    assert r.returncode == 1 and "tables/h800/: a folder of tables for a card tables/cards.json does not list" in \
        r.stderr, r.stdout + r.stderr
    assert _outputs(build_tree) == before


def test_each_card_takes_a_compressed_row_by_its_own_plain_time(build_tree):
    # the H200's compressed pooler m=1 row beats its plain row; made slower than the H100's plain time (a faster card's
    # number) but faster than its own plain row, it must stay: the winner rule compares one card's times only
    zt = json.loads((build_tree / "tables" / "h200" / "ztable.json").read_text())
    ct = json.loads((build_tree / "tables" / "h200" / "ctable.json").read_text())
    c100 = json.loads((build_tree / "tables" / "h100" / "ctable.json").read_text())
    own = next(r["us"] for r in ct["rows"] if (r["layer"], r["m"]) == ("pooler", 1))
    other = next(r["us"] for r in c100["rows"] if (r["layer"], r["m"]) == ("pooler", 1))
    row = next(r for r in zt["rows"] if (r["layer"], r["m"]) == ("pooler", 1))
    row["us"] = round(min(own * 0.9, max(other * 1.01, row["us"])), 3)
    (build_tree / "tables" / "h200" / "ztable.json").write_text(json.dumps(zt, indent=1) + "\n")
    r = build_tree.run("build.py")
    assert r.returncode == 0, r.stdout + r.stderr
    text = build_tree.read("submission.py")
    z = text[text.index("ZTABLES = {"):]
    h200 = z[z.index('"h200": {'):z.index("},", z.index('"h200": {'))]
    assert '("pooler", 1): GemvzConfig' in h200, h200


def test_the_committed_tree_passes_the_check(build_tree):
    r = build_tree.run("build.py", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "up to date" in r.stdout and not r.stderr
    r = build_tree.run("build.py")                                   # and building it changes nothing
    assert r.returncode == 0 and "already up to date" in r.stdout, r.stdout + r.stderr


def test_a_hand_edited_submission_fails_the_check_and_a_build_restores_it(build_tree):
    good = build_tree.read("submission.py")
    line = next(l for l in good.splitlines() if l.startswith('        ("pooler", 1): ') and "nw=16" in l)
    build_tree.write("submission.py", good.replace(line, line.replace("nw=16", "nw=8", 1), 1))
    assert build_tree.read("submission.py") != good
    r = build_tree.run("build.py", "--check")
    assert r.returncode == 1 and "submission.py" in r.stderr and "stale" in r.stderr, r.stdout + r.stderr
    assert '("pooler", 1)' in r.stdout                               # the diff shows the edited row
    r = build_tree.run("build.py")
    assert r.returncode == 0 and "regenerated submission.py" in r.stdout
    assert build_tree.read("submission.py") == good


def test_build_does_not_import_submission(build_tree):
    # a submission.py that exits 3 on import: build.py still reaches its own verdict (stale: rc 1), never 3
    build_tree.write("submission.py", "raise SystemExit(3)\n")
    r = build_tree.run("build.py", "--check")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "submission.py" in r.stderr and "stale" in r.stderr
    r = build_tree.run("build.py")
    assert r.returncode == 0 and "raise SystemExit(3)" not in build_tree.read("submission.py")


def test_the_upload_carries_no_instrument_code():
    # trace and timing-only code (csrc/instruments.cuh) reaches variant builds only, never submission.py
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "submission.py")).read()
    for s in ("MUSE_TRACE", "MUSE_ABL_", "MUSE_SKIP_CORRECTIONS", "MUSE_TZ_"):
        assert s not in text, s
    assert "MUSE_TRACE" in open(os.path.join(root, "csrc", "instruments.cuh")).read()


def _tables_bytes(tree):
    import os
    root = tree / "tables"
    return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
            for d, _, fs in os.walk(root) for f in fs}


@pytest.mark.parametrize("args", [("--no-write",), ()], ids=["no-write", "write"])
def test_tune_without_a_gpu_leaves_the_tables_as_they_were(build_tree, args):
    before = _tables_bytes(build_tree)
    r = build_tree.run("tune.py", "--shapes", "6144x4096", *args)
    assert r.returncode == 1, r.stdout + r.stderr                    # no GPU: nothing to time
    assert "needs a CUDA device" in r.stdout and "nothing written" in r.stdout, r.stdout
    assert _tables_bytes(build_tree) == before                       # shapes.json, cards.json, every card's tables
