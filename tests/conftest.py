"""Test setup: tests import the installed gradflow; a source tree with an
in-place build (`python setup.py build_ext --inplace`) is used instead when present."""
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if glob.glob(os.path.join(ROOT, "gradflow", "_native*.so")) and not os.environ.get("GRADFLOW_TEST_INSTALLED"):
    sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "parallel"))
