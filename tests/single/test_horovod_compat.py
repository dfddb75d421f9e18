# test_horovod_compat.py — keeps three things in step: Horovod 0.28.1's public
# API (tests/data/horovod_0.28.1_api.json, written by scripts/horovod_api.py
# from Horovod's source), the table in docs/horovod_compat.md, and gradflow's
# objects. Any of the three drifting from the others fails here.
"""Drift test of docs/horovod_compat.md.

Table rows look like
    | `horovod.torch` | `allreduce(tensor, average=None, ...)` | same (note) |
    | `horovod.keras`, `horovod.tensorflow.keras` | `load_model(...)` | missing: why |
The first column lists the Horovod modules the row covers (modules that are
aliases share a row by listing them all), the second is the symbol rendered
from the JSON (so it must match it), the third starts with the status:
  same            the gradflow object exists in the matching gradflow module
                  and takes Horovod's parameters in Horovod's order with its
                  literal defaults (extras only after them, and optional);
                  a class keeps Horovod's public members.
  different / not applicable / missing
                  need a reason after the word; a "missing" symbol must
                  really be absent from gradflow (else the row is stale).
Every JSON symbol has exactly one row per module; every row names a JSON symbol.
"""
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "horovod_compat.md")
API = os.path.join(ROOT, "tests", "data", "horovod_0.28.1_api.json")
GRADFLOW = {"horovod.torch": "gradflow.torch", "horovod.tensorflow": "gradflow.tensorflow",
            "horovod.tensorflow.keras": "gradflow.tensorflow.keras",
            "horovod.keras": "gradflow.keras"}
NEEDS = {"horovod.torch": "torch", "horovod.tensorflow": "tensorflow",
         "horovod.tensorflow.keras": "tensorflow", "horovod.keras": "tensorflow"}
STATUSES = ("same", "different", "not applicable", "missing")
ROW = re.compile(r"^\|\s*((?:`horovod[\w.]*`\s*,?\s*)+)\|\s*`([^`]+)`\s*\|\s*(.*?)\s*\|\s*$")

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from horovod_api import render  # noqa: E402  (the one rendering of a JSON symbol)

with open(API, encoding="utf-8") as f:
    SYMBOLS = json.load(f)["symbols"]


def table():
    """[(line number, [modules], rendered symbol, status text)] of every row."""
    out = []
    with open(DOC, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = ROW.match(line)
            if m:
                mods = re.findall(r"`([\w.]+)`", m.group(1))
                out.append((n, mods, m.group(2), m.group(3)))
    return out


ROWS = table()
# (module, name) -> (line, rendered, status); duplicates collected separately.
CELLS, DUPS = {}, []
for _line, _mods, _sig, _status in ROWS:
    _name = _sig.split("(", 1)[0]
    for _m in _mods:
        if (_m, _name) in CELLS:
            DUPS.append(f"{_m}.{_name} (lines {CELLS[(_m, _name)][0]} and {_line})")
        CELLS[(_m, _name)] = (_line, _sig, _status)
EXPECTED = [(m, n) for m in SYMBOLS for n in SYMBOLS[m]]


def test_every_symbol_has_exactly_one_row():
    missing = [f"{m}.{n}" for m, n in EXPECTED if (m, n) not in CELLS]
    assert not missing, f"{DOC}: no row for {missing} (scripts/horovod_api.py --rows prints them)"
    assert not DUPS, f"{DOC}: more than one row for {DUPS}"


def test_every_row_is_a_horovod_symbol():
    extra = [f"line {line}: {m}.{sig}" for (m, _), (line, sig, _) in CELLS.items()
             if m not in SYMBOLS or sig.split("(", 1)[0] not in SYMBOLS[m]]
    assert not extra, f"{DOC}: rows that are not in Horovod 0.28.1's public API: {extra}"


@pytest.mark.parametrize("module,name", EXPECTED, ids=[f"{m}.{n}" for m, n in EXPECTED])
def test_row(module, name):
    if (module, name) not in CELLS:
        pytest.fail(f"{DOC}: no row for {module}.{name}")
    line, sig, status = CELLS[(module, name)]
    spec = SYMBOLS[module][name]
    assert sig == render(name, spec), \
        f"{DOC}:{line}: {module}.{name} is written `{sig}`; Horovod's is `{render(name, spec)}`"
    word = next((s for s in STATUSES if status.lower().startswith(s)), None)
    assert word, f"{DOC}:{line}: status must start with one of {STATUSES}: {status!r}"
    if word != "same":
        reason = status[len(word):].strip(" :-—()")
        assert len(reason) >= 10, f"{DOC}:{line}: '{word}' needs a reason: {status!r}"
    if word not in ("same", "missing"):
        return
    if importlib.util.find_spec(NEEDS[module]) is None:
        pytest.skip(f"{NEEDS[module]} is not installed")
    obj = gradflow_object(module, name)
    if word == "missing":
        assert obj is None, (f"{DOC}:{line}: {module}.{name} is marked missing but "
                             f"{GRADFLOW[module]}.{name} exists: update the row")
        return
    assert obj is not None, \
        f"{DOC}:{line}: marked same but {GRADFLOW[module]}.{name} does not exist"
    check_same(f"{GRADFLOW[module]}.{name}", spec, obj)


def gradflow_object(module, name):
    obj = importlib.import_module(GRADFLOW[module])
    for part in name.split("."):
        if not hasattr(obj, part):
            return None
        obj = getattr(obj, part)
    return obj


def check_same(where, spec, obj):
    kind = spec["kind"]
    if kind == "module":
        assert inspect.ismodule(obj), f"{where}: Horovod's is a module, gradflow's is {obj!r}"
        return
    if kind == "class":
        assert inspect.isclass(obj), f"{where}: Horovod's is a class, gradflow's is {obj!r}"
        absent = [m for m in spec["members"] if not hasattr(obj, m)]
        assert not absent, f"{where}: lacks Horovod's members {absent}"
    if "params" in spec:
        check_params(where, spec["params"], obj.__init__ if inspect.isclass(obj) else obj)


def check_params(where, want, fn):
    have = list(inspect.signature(fn).parameters.values())
    if have and have[0].name in ("self", "cls") and inspect.isfunction(fn):
        have = have[1:]
    var = {inspect.Parameter.VAR_POSITIONAL: "var_positional",
           inspect.Parameter.VAR_KEYWORD: "var_keyword"}
    for kind in ("var_positional", "var_keyword"):
        if any(w["kind"] == kind for w in want):
            assert any(var.get(p.kind) == kind for p in have), \
                f"{where}: Horovod takes {kind} arguments"
    want = [w for w in want if w["kind"] not in var.values()]
    named = [p for p in have if p.kind not in var]
    names = [p.name for p in named]
    assert names[:len(want)] == [w["name"] for w in want], \
        f"{where}: parameters {names}, Horovod's {[w['name'] for w in want]}"
    for w, p in zip(want, named):
        assert (w["kind"] == "keyword_only") == (p.kind == p.KEYWORD_ONLY), \
            f"{where}({w['name']}): {p.kind.name}, Horovod's is {w['kind']}"
        if "default" not in w:
            continue  # required in Horovod; gradflow may give it a default
        assert p.default is not p.empty, \
            f"{where}({w['name']}): needs a default like Horovod's {w['default']}"
        try:
            value = eval(w["default"], {"__builtins__": {}})  # literals only: no names resolve
        except Exception:
            continue  # an expression (Compression.none, Average, global_process_set)
        assert p.default == value and type(p.default) is type(value), \
            f"{where}({w['name']}): default {p.default!r}, Horovod's {value!r}"
    for p in named[len(want):]:
        assert p.kind == p.KEYWORD_ONLY or p.default is not p.empty, \
            f"{where}: extra parameter {p.name} must be optional"


HOROVOD_SDIST = "horovod-0.28.1.tar.gz"


def _horovod_source():
    """Horovod 0.28.1's source: $HOROVOD_SOURCE (an sdist or a directory), else
    the sdist cached in the project's .cache/, else downloaded into it by pip
    (`pip download --no-binary`). None when none of these works (offline)."""
    given = os.environ.get("HOROVOD_SOURCE")
    if given:
        return given if os.path.exists(given) else None
    cached = os.path.join(ROOT, ".cache", HOROVOD_SDIST)
    if os.path.exists(cached):
        return cached
    import subprocess  # noqa: PLC0415
    try:
        # pip, so the index the project installs from is the one asked
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", "horovod==0.28.1", "-d", os.path.dirname(cached)],
                       check=True, capture_output=True, timeout=600)
        return cached if os.path.exists(cached) else None
    except Exception:  # noqa: BLE001 - offline: the test skips and says why
        return None


def test_json_is_what_the_script_reads_from_horovod(tmp_path):
    """The checked-in JSON is regenerated, not hand-edited."""
    import subprocess

    source = _horovod_source()
    if source is None:
        pytest.skip("no Horovod 0.28.1 source: set HOROVOD_SOURCE to its sdist or directory "
                    "(pip could not download it)")
    out = tmp_path / "api.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "horovod_api.py"), "--source",
                    source, "--out", str(out)], check=True, capture_output=True, timeout=300)
    with open(API, encoding="utf-8") as f:
        assert json.load(f) == json.loads(out.read_text()), \
            f"{API} differs from what scripts/horovod_api.py reads from {source}: regenerate it"
