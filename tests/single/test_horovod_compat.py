"""Drift test for docs/horovod_compat.md: every row whose gradflow column
starts with "same" names a Horovod 0.28 signature that the gradflow symbol
must match — the same parameter names in the same order (gradflow may add
keyword-only extras after them) and the same literal defaults. A row that
drifts fails here instead of surprising a Horovod user."""
import ast
import importlib
import inspect
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "horovod_compat.md")
ROW = re.compile(r"^\|\s*`([\w.]+)`\s*\|\s*`([^`]+)`\s*\|\s*(.*?)\s*\|\s*$")


def rows():
    with open(DOC, encoding="utf-8") as f:
        for line in f:
            m = ROW.match(line)
            if m and m.group(3).lower().startswith("same"):
                yield m.group(1), m.group(2)


def parse(sig: str):
    """'name(a, b=1, *, c=None)' -> name, [(param, default or inspect._empty)]."""
    call = ast.parse(sig, mode="eval").body
    assert isinstance(call, ast.Call), sig
    name = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id
    # ast.Call cannot hold "a=1, b" or bare names as defaults: re-parse as a def.
    fn = ast.parse(f"def {name}{sig[sig.index('('):]}: pass").body[0]
    args = fn.args
    params = [a.arg for a in args.posonlyargs + args.args]
    defaults = [inspect.Parameter.empty] * (len(params) - len(args.defaults)) + list(args.defaults)
    out = list(zip(params, defaults))
    out += [(a.arg, d if d is not None else inspect.Parameter.empty)
            for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return name, out


def literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return NotImplemented  # an expression (Compression.none, ...): names only


ROWS = list(rows()) if os.path.exists(DOC) else []


def test_the_table_has_rows():
    assert ROWS, f"{DOC}: no rows marked 'same'"


@pytest.mark.parametrize("module,sig", ROWS, ids=[f"{m}.{s.split('(')[0]}" for m, s in ROWS])
def test_signature_matches_horovod(module, sig):
    if module.startswith(("gradflow.torch", )):
        pytest.importorskip("torch")
    if module.startswith(("gradflow.tensorflow", "gradflow.keras")):
        pytest.importorskip("tensorflow")
    name, want = parse(sig)
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    target = obj.__init__ if inspect.isclass(obj) else obj
    have = [p for p in inspect.signature(target).parameters.values()
            if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    names = [p.name for p in have]
    assert names[:len(want)] == [w for w, _ in want], f"{module}.{name}: {names} vs Horovod {[w for w, _ in want]}"
    for p in have[len(want):]:
        assert p.kind == p.KEYWORD_ONLY or p.default is not p.empty, \
            f"{module}.{name}: extra parameter {p.name} must be optional"
    for (w, d), p in zip(want, have):
        if d is inspect.Parameter.empty:
            continue  # required in Horovod; gradflow may give it a default
        v = literal(d)
        if v is not NotImplemented:
            assert p.default == v, f"{module}.{name}({w}): default {p.default!r}, Horovod {v!r}"
        else:
            assert p.default is not p.empty, f"{module}.{name}({w}) needs a default like Horovod's"
