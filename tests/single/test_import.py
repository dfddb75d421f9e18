"""Importing a gradflow source tree that has no compiled extension (Python
started in the repository root after `pip install .`) explains itself
instead of a "circular import" ImportError."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_source_tree_without_extension_says_what_to_do(tmp_path):
    shutil.copytree(os.path.join(ROOT, "gradflow"), tmp_path / "gradflow",
                    ignore=shutil.ignore_patterns("_native*", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", "import gradflow"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: gradflow: the compiled extension gradflow._native is "
                           f"missing in {tmp_path / 'gradflow'}"), r.stderr
    assert "circular import" not in r.stderr
    assert "Run Python from another directory" in last and "build_ext --inplace" in last
