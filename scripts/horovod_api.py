#!/usr/bin/env python3
# scripts/horovod_api.py — owns the reference list of Horovod 0.28.1's public
# API that docs/horovod_compat.md is checked against. Horovod cannot be
# imported without compiling it, so this reads its *source* with `ast`: the
# names each public package's __init__ binds (following `from X import a` to
# where `a` is defined), their signatures, and horovodrun's flags (the
# argparse calls in horovod/runner/launch.py). The output is checked in
# (tests/data/horovod_0.28.1_api.json) so the compat test needs no network.
"""Write the public API of Horovod 0.28.1 (read from its source) as JSON.

Usage: python scripts/horovod_api.py [--source DIR_OR_SDIST] [--out FILE]
       python scripts/horovod_api.py --rows horovod.torch   (table rows to fill)

Without --source, the sdist is fetched with
`pip download --no-deps --no-binary :all: horovod==0.28.1`.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from typing import Dict, List, Optional

VERSION = "0.28.1"
MODULES = ["horovod.torch", "horovod.tensorflow", "horovod.tensorflow.keras", "horovod.keras"]
# Submodules whose public names a user reaches through the package
# (hvd.callbacks.X) and that gradflow implements: listed name by name.
# Other submodules bound in an __init__ (elastic) are one symbol each.
EXPAND = {"callbacks"}
# Names an __init__ imports for its own use, not Horovod's API (none is in
# Horovod's API docs): helpers from the util modules and these few.
INTERNAL_MODULES = {"horovod.common.util", "horovod.tensorflow.util"}
INTERNAL_NAMES = {"handle_average_backwards_compatibility", "check_num_rank_power_of_2",
                  "LocalGradientAggregationHelper"}


class Source:
    """The .py files of a Horovod source tree or sdist, by module name."""

    def __init__(self, path: str):
        self.files: Dict[str, str] = {}
        if os.path.isdir(path):
            for root, _, names in os.walk(path):
                for n in names:
                    if n.endswith(".py"):
                        full = os.path.join(root, n)
                        with open(full, encoding="utf-8") as f:
                            self._add(os.path.relpath(full, path), f.read())
        else:
            with tarfile.open(path) as tar:
                for m in tar.getmembers():
                    if m.isfile() and m.name.endswith(".py"):
                        self._add(m.name.split("/", 1)[1] if "/" in m.name else m.name,
                                  tar.extractfile(m).read().decode("utf-8"))
        if "horovod/__init__.py" not in self.files:
            sys.exit(f"{path}: no horovod/__init__.py (not a Horovod source tree or sdist)")
        self._trees: Dict[str, ast.Module] = {}

    def _add(self, rel: str, text: str) -> None:
        self.files[rel.replace(os.sep, "/")] = text

    def path_of(self, module: str) -> Optional[str]:
        base = module.replace(".", "/")
        for p in (base + "/__init__.py", base + ".py"):
            if p in self.files:
                return p
        return None

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            self._trees[module] = ast.parse(self.files[self.path_of(module)])
        return self._trees[module]


def flat(body) -> List[ast.stmt]:
    """Top-level statements, looking inside if/try/with (Horovod binds many
    names under `if _MPI_LIB_AVAILABLE:` or version checks). Later wins."""
    out = []
    for s in body:
        if isinstance(s, ast.If):
            out += flat(s.body) + flat(s.orelse)
        elif isinstance(s, ast.Try):
            out += flat(s.body)
            for h in s.handlers:
                out += flat(h.body)
            out += flat(s.orelse) + flat(s.finalbody)
        elif isinstance(s, ast.With):
            out += flat(s.body)
        else:
            out.append(s)
    return out


def bindings(src: Source, module: str) -> Dict[str, tuple]:
    """name -> how the module binds it, in source order (last binding wins)."""
    out: Dict[str, tuple] = {}
    pkg = module if src.path_of(module).endswith("__init__.py") else module.rsplit(".", 1)[0]
    for s in flat(src.tree(module).body):
        if isinstance(s, ast.ImportFrom):
            base = s.module or ""
            if s.level:
                parts = pkg.split(".")[:len(pkg.split(".")) - s.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in s.names:
                out[a.asname or a.name] = ("from", base, a.name)
        elif isinstance(s, ast.Import):
            for a in s.names:
                top = a.name.split(".")[0]  # `import a.b` binds a; `import a.b as c` binds a.b
                out[a.asname or top] = ("module", a.name if a.asname else top)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[s.name] = ("def", s)
        elif isinstance(s, ast.ClassDef):
            out[s.name] = ("class", s)
        elif isinstance(s, ast.Assign):
            for t in s.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = ("assign", s.value)
    return out


def default(node: Optional[ast.expr]) -> dict:
    return {} if node is None else {"default": ast.unparse(node)}


def params(fn: ast.FunctionDef, drop_self: bool = False) -> List[dict]:
    """Parameters in order: name, kind, and the default's source text."""
    a = fn.args
    out = []
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    for i, (p, d) in enumerate(zip(pos, defaults)):
        kind = "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword"
        out.append({"name": p.arg, "kind": kind, **default(d)})
    if a.vararg:
        out.append({"name": a.vararg.arg, "kind": "var_positional"})
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append({"name": p.arg, "kind": "keyword_only", **default(d)})
    if a.kwarg:
        out.append({"name": a.kwarg.arg, "kind": "var_keyword"})
    if drop_self and out and out[0]["name"] in ("self", "cls"):
        out = out[1:]
    return out


def forwards_to(fn: ast.FunctionDef) -> Optional[ast.expr]:
    """For `def f(*args, **kwargs): ... g(*args, **kwargs)`, the callee g:
    such wrappers take exactly g's parameters."""
    a = fn.args
    if not (a.vararg and a.kwarg and not a.args and not a.kwonlyargs):
        return None
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and any(isinstance(x, ast.Starred) for x in node.args) \
                and any(k.arg is None for k in node.keywords):
            return node.func
    return None


class Resolver:
    def __init__(self, src: Source):
        self.src = src
        self._bind: Dict[str, Dict[str, tuple]] = {}

    def bind(self, module: str) -> Dict[str, tuple]:
        if module not in self._bind:
            self._bind[module] = bindings(self.src, module)
        return self._bind[module]

    def is_module(self, module: str) -> bool:
        return self.src.path_of(module) is not None

    def symbol(self, module: str, name: str, depth: int = 0) -> Optional[dict]:
        """What `module.name` is, followed to its definition; None when it is
        not Horovod's (a third-party import) or not found."""
        if depth > 20:
            return None
        if self.is_module(f"{module}.{name}") and name not in self.bind(module):
            return {"kind": "module", "defined_in": f"{module}.{name}"}
        b = self.bind(module).get(name)
        if b is None:
            return None
        how = b[0]
        if how == "from":
            base, orig = b[1], b[2]
            if not base.startswith("horovod"):
                return None
            if self.is_module(f"{base}.{orig}"):
                return {"kind": "module", "defined_in": f"{base}.{orig}"}
            return self.symbol(base, orig, depth + 1)
        if how == "module":
            return {"kind": "module", "defined_in": b[1]} if b[1].startswith("horovod") else None
        if how == "def":
            fwd = forwards_to(b[1])
            if fwd is not None:
                target = self.expr(module, fwd, depth + 1)
                if target is not None and target["kind"] == "function":
                    return dict(target, forwarded_by=f"{module}.{name}")
            return {"kind": "function", "defined_in": module, "params": params(b[1])}
        if how == "class":
            return self.klass(module, b[1], depth)
        return self.expr(module, b[1], depth + 1)

    def klass(self, module: str, node: ast.ClassDef, depth: int) -> dict:
        init = next((s for s in node.body
                     if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        members = sorted({s.name for s in node.body
                          if isinstance(s, (ast.FunctionDef, ast.ClassDef))
                          and not s.name.startswith("_")}
                         | {t.id for s in node.body if isinstance(s, ast.Assign)
                            for t in s.targets
                            if isinstance(t, ast.Name) and not t.id.startswith("_")})
        out = {"kind": "class", "defined_in": module, "bases": [ast.unparse(b) for b in node.bases],
               "members": members}
        if init is not None:
            out["params"] = params(init, drop_self=True)
        else:  # inherited: from the first base defined in Horovod that has one
            for base in node.bases:
                r = self.expr(module, base, depth + 1)
                if r is not None and r["kind"] == "class" and "params" in r:
                    out["params"] = r["params"]
                    break
        return out

    def expr(self, module: str, node: ast.expr, depth: int) -> Optional[dict]:
        """What an expression bound at module level is (name, attribute of a
        module-level instance, call, literal)."""
        if isinstance(node, ast.Name):
            return self.symbol(module, node.id, depth + 1)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name):
                owner = self.bind(module).get(node.value.id)
                if owner and owner[0] == "module":
                    if not owner[1].startswith("horovod"):
                        return None
                    return self.symbol(owner[1], node.attr, depth + 1)
                if owner and owner[0] == "from" and self.is_module(f"{owner[1]}.{owner[2]}"):
                    return self.symbol(f"{owner[1]}.{owner[2]}", node.attr, depth + 1)
                if owner and owner[0] == "assign" and isinstance(owner[1], ast.Call):
                    # `_basics = HorovodBasics(...)`: an instance of a Horovod class
                    cls = self.expr(module, owner[1].func, depth + 1)
                    if cls and cls["kind"] == "class":
                        return self.member(cls, node.attr)
                if owner:
                    cls = self.symbol(module, node.value.id, depth + 1)
                    if cls and cls["kind"] == "class":
                        return self.member(cls, node.attr)
            return {"kind": "value", "defined_in": module, "source": ast.unparse(node)}
        if isinstance(node, ast.Call):
            cls = self.expr(module, node.func, depth + 1)
            kind = "instance" if cls and cls["kind"] == "class" else "value"
            return {"kind": kind, "defined_in": module, "source": ast.unparse(node)}
        try:
            return {"kind": "constant", "defined_in": module, "value": ast.literal_eval(node)}
        except ValueError:
            return {"kind": "value", "defined_in": module, "source": ast.unparse(node)}

    def member(self, cls: dict, attr: str) -> dict:
        """A method (bound: no self) or an instance attribute of a Horovod class."""
        module = cls["defined_in"]
        node = next(s for s in flat(self.src.tree(module).body)
                    if isinstance(s, ast.ClassDef) and s.bases is not None
                    and [ast.unparse(b) for b in s.bases] == cls["bases"]
                    and self.klass(module, s, 0)["members"] == cls["members"])
        for s in node.body:
            if isinstance(s, ast.FunctionDef) and s.name == attr:
                return {"kind": "function", "defined_in": f"{module}.{node.name}",
                        "params": params(s, drop_self=True)}
        # `self.Average = ...` in __init__: a value fixed at run time (ctypes here).
        return {"kind": "constant", "defined_in": f"{module}.{node.name}", "value": None}


def public_api(src: Source) -> dict:
    r = Resolver(src)
    out, excluded = {}, {}
    for module in MODULES:
        syms, skip = {}, {}
        for name, b in sorted(r.bind(module).items()):
            if name.startswith("_"):
                continue
            if b[0] == "from" and (b[1] in INTERNAL_MODULES or name in INTERNAL_NAMES):
                skip[name] = f"internal helper imported from {b[1]}"
                continue
            if name in INTERNAL_NAMES:
                skip[name] = "internal helper"
                continue
            s = r.symbol(module, name)
            if s is None:
                continue  # a third-party module or name (tf, keras, warnings, ...)
            if s["kind"] == "module" and name in EXPAND:
                sub = s["defined_in"]
                for n in sorted(r.bind(sub)):
                    if not n.startswith("_"):
                        t = r.symbol(sub, n)
                        if t is not None and t["kind"] == "class" and t["defined_in"] == sub:
                            syms[f"{name}.{n}"] = t
            syms[name] = s
        out[module] = syms
        excluded[module] = skip
    return {"symbols": out, "excluded": excluded}


def horovodrun_flags(src: Source) -> List[dict]:
    """Every parser.add_argument(...) in horovod/runner/launch.py."""
    flags = []
    for node in ast.walk(src.tree("horovod.runner.launch")):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant)]
            kw = {k.arg: ast.unparse(k.value) for k in node.keywords if k.arg != "help"}
            flags.append({"flags": names, **kw})
    flags.sort(key=lambda f: f["flags"])
    return flags


def render(name: str, spec: dict) -> str:
    """How docs/horovod_compat.md writes a symbol: `name(params)` for
    functions and classes with a known __init__, the bare name otherwise."""
    if "params" not in spec:
        return name
    parts, star = [], False
    for p in spec["params"]:
        if p["kind"] == "var_positional":
            parts.append("*" + p["name"])
            star = True
        elif p["kind"] == "var_keyword":
            parts.append("**" + p["name"])
        else:
            if p["kind"] == "keyword_only" and not star:
                parts.append("*")
                star = True
            parts.append(p["name"] + (f"={p['default']}" if "default" in p else ""))
    return f"{name}({', '.join(parts)})"


def print_rows(data: dict, module: str) -> None:
    """Rows for every symbol of `module`, for pasting into the table; the
    status column is left for a person to fill (TODO)."""
    for name, spec in data["symbols"][module].items():
        print(f"| `{module}` | `{render(name, spec)}` | TODO |")


def fetch_sdist(dest: str) -> str:
    subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                           ":all:", f"horovod=={VERSION}", "-d", dest])
    return os.path.join(dest, next(n for n in os.listdir(dest) if n.startswith("horovod")))


def main() -> None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", help="unpacked horovod-0.28.1 directory or its sdist (.tar.gz)")
    ap.add_argument("--out", default=os.path.join(here, "tests", "data",
                                                  f"horovod_{VERSION}_api.json"))
    ap.add_argument("--rows", metavar="MODULE",
                    help="print table rows for MODULE from --out (no regeneration)")
    args = ap.parse_args()
    if args.rows:
        with open(args.out, encoding="utf-8") as f:
            print_rows(json.load(f), args.rows)
        return
    with tempfile.TemporaryDirectory() as tmp:
        src = Source(args.source or fetch_sdist(tmp))
    data = {"horovod_version": VERSION,
            "generated_by": "scripts/horovod_api.py (ast over Horovod's source; "
                            "do not edit by hand)",
            **public_api(src), "horovodrun_flags": horovodrun_flags(src)}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    n = sum(len(v) for v in data["symbols"].values())
    print(f"{args.out}: {n} symbols in {len(MODULES)} modules, "
          f"{len(data['horovodrun_flags'])} flags")


if __name__ == "__main__":
    main()
