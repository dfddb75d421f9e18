"""Horovod compatibility mode end to end: unmodified Horovod scripts (torch,
and Keras with its callbacks) under `gradflowrun --horovod-compat` and under
plain mpiexec with GRADFLOW_HOROVOD_COMPAT=1 (the installed .pth hook), at 2
and 3 ranks, checked against a single-process reference without gradflow;
`import horovod` still fails (or finds a real Horovod) when the mode is off;
HOROVOD_* settings reach the core; the rank-0 notices appear once."""

import glob
import os
import re
import shutil
import site
import subprocess
import sys

import numpy as np
import pytest

from _launch import (HERE, ROOT, host_discovery, in_place_build, mpiexec, rank_env, run_cwd,
                     skip_unless_hydra)

TIMEOUT = 420  # Keras start-up on an oversubscribed 2-core machine is slow
PTH = "gradflow-horovod-compat.pth"
_references = {}


def gradflowrun(*args, env=None, timeout=TIMEOUT):
    full = rank_env()
    full.update(env or {})
    cmd = [sys.executable, "-m", "gradflow.runner.launch", *args]
    return subprocess.run(cmd, cwd=run_cwd(), env=full, capture_output=True, text=True,
                          timeout=timeout)


def reference(kind, n, checkpoint):
    """The single-process reference (cached per kind and n) and the script's
    checkpoint read back, from hvd_compat_reference.py in a subprocess."""
    out = os.path.join(os.path.dirname(checkpoint), f"reference-{kind}-{n}.npz")
    r = subprocess.run([sys.executable, os.path.join(HERE, "hvd_compat_reference.py"), kind,
                        str(n), out, checkpoint], env=rank_env(), cwd=HERE, capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-4000:]
    data = np.load(out)
    return data["params"], data["losses"], data["checkpoint"]


def check_run(proc, kind, n, out_dir, module):
    """Every rank ends with the same parameters (bitwise), rank 0's checkpoint
    holds them, and they and the averaged losses match the reference."""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    # Not per line: mpiexec may join two ranks' output (print writes the text
    # and its newline separately), e.g. "...module gradflow.torchrank 0 of 3 ..."
    # or, with rank 0's metric line, "...module gradflow.torchepoch 2 avg_loss ...".
    end = r"(?=rank \d|epoch \d|\s|$)"
    finals = re.findall(r"rank (\d+) of (\d+) params ([0-9a-f]{64}) .*?module ([\w.]+?)" + end,
                        proc.stdout)
    assert sorted(int(r) for r, _, _, _ in finals) == list(range(n)), proc.stdout
    assert {s for _, s, _, _ in finals} == {str(n)}
    assert len({h for _, _, h, _ in finals}) == 1, finals  # bitwise identical on every rank
    assert {m for _, _, _, m in finals} == {module}       # it ran on gradflow
    losses = [float(v) for v in re.findall(r"epoch \d+ avg_loss ([-+0-9.eE]+?)" + end, proc.stdout)]
    ckpts = glob.glob(os.path.join(out_dir, "checkpoint*"))
    assert len(ckpts) == 1, ckpts                          # rank 0 only
    params, ref_losses, ckpt = reference(kind, n, ckpts[0])
    import hashlib
    assert hashlib.sha256(ckpt.astype(np.float32).tobytes()).hexdigest() == finals[0][2]
    np.testing.assert_allclose(ckpt, params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)


@pytest.fixture(scope="module", autouse=True)
def no_real_horovod():
    r = subprocess.run([sys.executable, "-c", "import horovod"], env=rank_env(), cwd=run_cwd(),
                       capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        pytest.skip("a real Horovod is installed here; these tests need an environment without")


@pytest.mark.parametrize("n", [2, 3])
def test_unmodified_torch_script_under_gradflowrun(n, tmp_path):
    proc = gradflowrun("--horovod-compat", "-np", str(n), sys.executable,
                       os.path.join(HERE, "hvd_torch_compat_script.py"), str(tmp_path))
    check_run(proc, "torch", n, str(tmp_path), "gradflow.torch")
    assert "horovod 0.28.1" in proc.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_unmodified_keras_script_under_gradflowrun(n, tmp_path):
    proc = gradflowrun("--horovod-compat", "-np", str(n), sys.executable,
                       os.path.join(HERE, "hvd_keras_compat_script.py"), str(tmp_path))
    check_run(proc, "keras", n, str(tmp_path), "gradflow.tensorflow.keras")


def test_without_the_flag_import_horovod_fails(tmp_path):
    proc = gradflowrun("-np", "2", sys.executable, "-c", "import horovod.torch")
    assert proc.returncode != 0
    assert "ModuleNotFoundError: No module named 'horovod'" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def installed_python(tmp_path_factory):
    """A Python whose site-packages holds gradflow's .pth hook, as after
    `pip install gradflow`. In developer mode: a throwaway venv (no pip) whose
    site-packages points at this source tree and at this venv's packages."""
    if not in_place_build():
        hooks = [p for p in site.getsitepackages() if os.path.exists(os.path.join(p, PTH))]
        assert hooks, f"the installed gradflow did not install {PTH} into site-packages"
        return sys.executable
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    lib = glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0]
    # site.py reads .pth files in name order: the paths first, then the hook.
    with open(os.path.join(lib, "00-gradflow-test-paths.pth"), "w") as f:
        f.write("\n".join([ROOT] + site.getsitepackages()) + "\n")
    shutil.copy(os.path.join(ROOT, "gradflow", "horovod_compat", PTH), lib)
    # mpi4py looks for the MPI wheel's libmpi (and it for its own libraries)
    # under sys.prefix/lib.
    for entry in glob.glob(os.path.join(sys.prefix, "lib", "*")):
        if not os.path.basename(entry).startswith("python"):
            os.symlink(entry, os.path.join(str(venv), "lib", os.path.basename(entry)))
    return str(venv / "bin" / "python")


def plain_env(**extra):
    env = rank_env()
    env.pop("PYTHONPATH", None)  # the venv's .pth files find gradflow
    env.pop("GRADFLOW_HOROVOD_COMPAT", None)
    env.update(extra)
    return env


def run_plain(python, args, env, n=None):
    cmd = ([mpiexec(), "-n", str(n)] if n else []) + [python, *args]
    return subprocess.run(cmd, env=env, cwd=HERE, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.parametrize("n", [2, 3])
def test_env_switch_under_plain_mpiexec(n, tmp_path, installed_python):
    env = plain_env(GRADFLOW_HOROVOD_COMPAT="1", HOROVOD_LOG_LEVEL="DEBUG",
                    HOROVOD_CYCLE_TIME="2", GRADFLOW_CYCLE_TIME="0.5",
                    HOROVOD_HIERARCHICAL_ALLREDUCE="1")
    proc = run_plain(installed_python, [os.path.join(HERE, "hvd_torch_compat_script.py"),
                                        str(tmp_path)], env, n)
    check_run(proc, "torch", n, str(tmp_path), "gradflow.torch")
    err = proc.stderr
    # HOROVOD_LOG_LEVEL reached the core on every rank (any case accepted).
    for r in range(n):
        assert f"[gradflow rank {r}] DEBUG: cycle" in err
    # Rank 0 alone, once: the overridden and the ignored HOROVOD_* names.
    assert err.count("HOROVOD_CYCLE_TIME is ignored: GRADFLOW_CYCLE_TIME is set") == 1
    assert err.count("ignored (no gradflow equivalent): HOROVOD_HIERARCHICAL_ALLREDUCE") == 1
    assert "shadowed" not in err


@pytest.mark.parametrize("value", [None, "0", "off"])
def test_switch_off_import_horovod_fails(value, installed_python):
    env = plain_env() if value is None else plain_env(GRADFLOW_HOROVOD_COMPAT=value)
    proc = run_plain(installed_python, ["-c", "import horovod"], env)
    assert proc.returncode != 0
    assert "ModuleNotFoundError: No module named 'horovod'" in proc.stderr


def test_real_horovod_is_shadowed_only_when_asked(tmp_path, installed_python):
    fake = tmp_path / "site" / "horovod"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    code = ("import sys, horovod.torch as hvd, horovod\nhvd.init()\n"
            "sys.stdout.write(f\"rank {hvd.rank()} \"\n"
            "                 f\"{'real' if hasattr(horovod, 'REAL') else hvd.__name__}\\n\")")
    off = run_plain(installed_python, ["-c", "import horovod; print(horovod.REAL)"],
                    plain_env(PYTHONPATH=str(tmp_path / "site")))
    assert off.returncode == 0 and off.stdout.strip() == "True", off.stderr
    on = run_plain(installed_python, ["-c", code],
                   plain_env(PYTHONPATH=str(tmp_path / "site"), GRADFLOW_HOROVOD_COMPAT="1"), 2)
    assert on.returncode == 0, on.stderr[-4000:]
    # (mpiexec may join the two ranks' lines: match, do not split)
    assert sorted(re.findall(r"rank (\d) (real|gradflow\.torch)", on.stdout)) == \
        [("0", "gradflow.torch"), ("1", "gradflow.torch")], on.stdout
    assert on.stderr.count(f"a Horovod installation at {fake / '__init__.py'} is shadowed") == 1


@pytest.mark.parametrize("n", [2, 3])
def test_bad_switch_and_bad_horovod_value_fail_on_every_rank(n):
    # One write per line: print() writes its pieces separately, and mpiexec
    # may interleave the ranks' pieces.
    code = ("import sys, gradflow\ntry:\n    gradflow.init()\n"
            "except (ValueError, gradflow.GradflowError) as e:\n"
            "    sys.stdout.write(f'{type(e).__name__} {e}\\n'); sys.stdout.flush()\n"
            "else:\n    sys.stdout.write('no error\\n')")
    bad_switch = {**rank_env(), "GRADFLOW_HOROVOD_COMPAT": "maybe"}
    proc = run_plain(sys.executable, ["-c", code], bad_switch, n)
    assert proc.stdout.count("ValueError GRADFLOW_HOROVOD_COMPAT='maybe'") == n, proc.stdout
    bad_value = {**rank_env(), "GRADFLOW_HOROVOD_COMPAT": "1", "HOROVOD_CYCLE_TIME": "fast"}
    proc = run_plain(sys.executable, ["-c", code], bad_value, n)
    lines = [ln for ln in proc.stdout.splitlines() if "GRADFLOW_CYCLE_TIME" in ln]
    assert len(lines) == n and all("set from HOROVOD_CYCLE_TIME" in ln for ln in lines), proc.stdout


def elastic_finals(stdout):
    """{rank: fields} from hvd_elastic_torch_compat_script.py's last lines
    (matched, not split: mpiexec may join two ranks' lines)."""
    pattern = (r"rank (\d+) of (\d+) params ([0-9a-f]{64}) lr ([0-9.]+) resets (\d+) "
               r"epoch (\d+) first_loss ([0-9.]+) last_loss ([0-9.]+) test_loss ([0-9.]+)")
    return {int(m[0]): m[1:] for m in re.findall(pattern, stdout)}


@skip_unless_hydra("elastic mode starts each worker with MPICH's mpiexec")
@pytest.mark.parametrize("kill", [False, True])
def test_elastic_horovod_script_under_gradflowrun(kill, tmp_path):
    """Horovod's elastic recipe (examples/elastic/pytorch), unmodified
    imports, under `--horovod-compat` with horovodrun's elastic flags; with
    `kill`, rank 2 is SIGKILLed mid-epoch: the two survivors roll back, the
    reset callback rescales the learning rate to 2 ranks, and both end with
    the same parameters and a lower loss."""
    _, script = host_discovery(tmp_path, "localhost:3\n")
    # -np 3: the three workers start together and form generation 0. Without
    # it gradflowrun starts --min-np (2) and the third joins when discovery
    # finds its slot; on a loaded machine (CI, 2026-11-29) that came after the
    # first two had built their sampler from hvd.size() == 2, so the
    # newcomer's epoch had 8 batches to their 12 (the script's sampler, as
    # Horovod's example's, is made once) and the last allreduce stalled.
    args = ["--horovod-compat", "--start-timeout", "150", "-np", "3", "--min-np", "2",
            "--max-np", "3",
            "--host-discovery-script", str(script), sys.executable,
            os.path.join(HERE, "hvd_elastic_torch_compat_script.py"), str(tmp_path)]
    proc = gradflowrun(*(args + (["2"] if kill else [])), timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    finals = elastic_finals(proc.stdout)
    size = 2 if kill else 3
    assert sorted(finals) == list(range(size)), proc.stdout[-4000:]
    assert {f[0] for f in finals.values()} == {str(size)}
    assert len({f[1] for f in finals.values()}) == 1, finals     # bitwise identical
    assert {f[2] for f in finals.values()} == {f"{0.05 * size:.4f}"}  # reset callback ran
    assert {f[3] for f in finals.values()} == {"1" if kill else "0"}
    assert len({f[7] for f in finals.values()}) == 1              # hvd.allreduce'd metric
    for f in finals.values():
        assert float(f[6]) < 0.5 * float(f[5]), f                 # it learned
    assert ("generation 1: 2 worker(s)" in proc.stderr) == kill, proc.stderr[-3000:]
