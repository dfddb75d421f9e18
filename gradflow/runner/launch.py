"""gradflowrun: the command line (settings flags generated from the native
module's config_keys()), the mpiexec command line, and the job's lifetime:
signals, failed-rank detection and exit codes. Must not import torch or
tensorflow; the native module is imported only to read config_keys()/features().
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

try:
    from . import hosts as _hosts
    from . import rank_wrapper as _wrapper
    from .check_build import check_build
except ImportError:  # run as a script: python gradflow/runner/launch.py
    import hosts as _hosts  # type: ignore[no-redef]
    from check_build import check_build  # type: ignore[no-redef]
    import rank_wrapper as _wrapper  # type: ignore[no-redef]

MPIEXEC_ENV = "GRADFLOW_MPIEXEC"
# After a rank fails, the others get time to raise their own error before the
# launcher stops them (hydra's auto-cleanup is off so they can): gradflow
# ranks learn of a peer's exception within a cycle (FAILURE_GRACE_SECONDS is
# plenty), of a peer killed by a signal only after GRADFLOW_TIMEOUT.
FAILURE_GRACE_SECONDS = 5.0
DEFAULT_TIMEOUT_SECONDS = 60.0
KILL_GRACE_SECONDS = 5.0  # between the stages of stopping a job (see _Stopper)


def normalize_config_keys(config_keys: Sequence[Any]) -> List[Dict[str, Any]]:
    """Accept config_keys() entries as dicts or attribute objects; fill defaults."""
    out = []
    for k in config_keys:
        get = (lambda n, d=None: k.get(n, d)) if isinstance(k, Mapping) else (
            lambda n, d=None: getattr(k, n, d))
        key = {
            "env": get("env"), "flag": get("flag"), "type": get("type") or "string",
            "default": get("default", get("default_value", "")) or "",
            "help": get("help") or "",
            "scale": float(get("scale", get("flag_to_env_scale", 1.0)) or 1.0),
            "choices": list(get("choices") or []),
        }
        if not key["env"] or not key["flag"] or not str(key["flag"]).startswith("--"):
            raise ValueError(f"bad config key {k!r}: needs env and a --flag")
        out.append(key)
    return out


def _flag_value_type(key: Dict[str, Any]):
    """argparse type= for one setting: validates the flag's own unit."""
    def convert(text: str):
        try:
            if key["type"] == "int" and key["scale"] == 1.0:
                return int(text)
            if key["type"] in ("int", "float"):
                return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{key['flag']} expects a number, got {text!r}") from None
        return text
    return convert


def _default_in_flag_unit(key: Dict[str, Any]) -> str:
    if key["scale"] == 1.0 or key["type"] not in ("int", "float"):
        return key["default"]
    try:
        value = float(key["default"]) / key["scale"]
    except ValueError:
        return key["default"]
    return str(int(value)) if value.is_integer() else repr(value)


class _Parser(argparse.ArgumentParser):
    """Adds why settings flags may be missing to every usage error."""

    note = ""

    def error(self, message: str):  # type: ignore[override]
        super().error(message + (f"\n({self.note})" if self.note else ""))


def build_parser(config_keys: Sequence[Any], native_note: str = "") -> argparse.ArgumentParser:
    """The gradflowrun parser: launcher options plus one flag per config key."""
    p = _Parser(
        prog="gradflowrun", allow_abbrev=False,
        description="Launch a gradflow data-parallel job: one process per rank, via mpiexec.",
        epilog="example: gradflowrun -np 4 -H host1:2,host2:2 python train.py --epochs 3"
        + (f"\n\nnote: {native_note}" if native_note else ""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="number of ranks")
    group = p.add_mutually_exclusive_group()
    group.add_argument("-H", "--hosts", dest="hosts", help="host1:slots,host2:slots,... "
                       "(default: all ranks on this machine)")
    group.add_argument("--hostfile", help="file with one 'host slots=N' or 'host:N' per line")
    p.add_argument("--verbose", action="store_true", help="print the mpiexec command line")
    p.add_argument("--check-build", action="store_true",
                   help="print gradflow's version, frameworks, MPI and features, then exit")
    p.add_argument("--start-timeout", type=float, default=30.0, metavar="S",
                   help="seconds for every local rank to start (default 30)")
    p.add_argument("--output-filename", metavar="DIR",
                   help="also write each rank's output to DIR/rank.N/{stdout,stderr}")
    p.add_argument("--mpi-args", default="", metavar="ARGS",
                   help='extra arguments for mpiexec, one quoted string, e.g. "-bind-to core"')
    settings = p.add_argument_group("gradflow settings (each sets a GRADFLOW_* variable)")
    for key in normalize_config_keys(config_keys):
        kwargs: Dict[str, Any] = {"dest": key["env"], "default": None,
                                  "type": _flag_value_type(key)}
        if key["type"] == "choice":
            kwargs["choices"] = key["choices"]
        else:
            kwargs["metavar"] = {"int": "N", "float": "X"}.get(key["type"], "VALUE")
        kwargs["help"] = (f"{key['help']} [{key['env']}; default: {_default_in_flag_unit(key)}]"
                          .replace("%", "%%"))
        try:
            settings.add_argument(key["flag"], **kwargs)
        except argparse.ArgumentError as e:
            raise ValueError(f"config key {key['env']}: flag {key['flag']} clashes with a "
                             f"gradflowrun option ({e})") from None
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    p.note = native_note
    return p


def settings_env(args: argparse.Namespace, config_keys: Sequence[Any]) -> Dict[str, str]:
    """GRADFLOW_* values for the settings flags given on the command line
    (unset flags are left out, so the environment or the native default applies)."""
    env = {}
    for key in normalize_config_keys(config_keys):
        value = getattr(args, key["env"], None)
        if value is None:
            continue
        if key["type"] == "int":
            env[key["env"]] = str(int(round(value * key["scale"])))
        elif key["type"] == "float":
            env[key["env"]] = repr(float(value * key["scale"]))
        else:
            env[key["env"]] = str(value)
    return env


def validate(args: argparse.Namespace) -> List[str]:
    """Check the parsed options; returns rank -> host (["localhost"] * np if no hosts given).

    Raises ValueError with a message for the user."""
    if args.np is None:
        raise ValueError("-np is required (number of ranks)")
    if args.np < 1:
        raise ValueError(f"-np must be >= 1, got {args.np}")
    if not args.command:
        raise ValueError("no command given, e.g. gradflowrun -np 2 python train.py")
    if args.command[0].startswith("-"):
        raise ValueError(f"unknown gradflowrun option {args.command[0]!r} "
                         "(options go before the command)")
    if args.start_timeout <= 0:
        raise ValueError(f"--start-timeout must be > 0, got {args.start_timeout}")
    host_list = _host_list(args)
    return _hosts.rank_to_host(host_list, args.np) if host_list else ["localhost"] * args.np


def _host_list(args: argparse.Namespace) -> List[_hosts.HostSlots]:
    if args.hosts:
        return _hosts.parse_hosts(args.hosts)
    if args.hostfile:
        return _hosts.read_hostfile(args.hostfile)
    return []


def build_launch(args: argparse.Namespace, config_keys: Sequence[Any], *,
                 mpiexec: str = "mpiexec", flavor: str = "hydra",
                 python: str = sys.executable, status_dir: Optional[str] = None,
                 base_env: Optional[Mapping[str, str]] = None) -> Tuple[List[str], Dict[str, str]]:
    """The mpiexec argv and the environment for it (pure: starts nothing).

    The settings travel twice: exported in the returned env and as
    ``-genv`` (hydra) / ``-x`` (Open MPI), so remote ranks get them too.
    """
    validate(args)
    settings = settings_env(args, config_keys)
    runner_env = {}
    if status_dir:
        runner_env[_wrapper.STATUS_DIR_ENV] = status_dir
    if args.output_filename:
        runner_env[_wrapper.OUTPUT_DIR_ENV] = os.path.abspath(args.output_filename)
    host_list = _host_list(args)
    argv = [mpiexec]
    if flavor == "openmpi":
        argv += ["-np", str(args.np), "--oversubscribe"]
        if host_list:
            argv += ["-H", _hosts.hydra_hosts_arg(host_list, args.np)]
        for name, value in {**settings, **runner_env}.items():
            argv += ["-x", f"{name}={value}"]
    else:
        # Survivors of a failed rank must live long enough to raise (see above).
        argv += ["-disable-auto-cleanup", "-n", str(args.np)]
        if host_list:
            argv += ["-hosts", _hosts.hydra_hosts_arg(host_list, args.np)]
        for name, value in {**settings, **runner_env}.items():
            argv += ["-genv", name, value]
    argv += shlex.split(args.mpi_args or "")
    argv += [python, os.path.abspath(_wrapper.__file__), "--"] + list(args.command)
    env = dict(os.environ if base_env is None else base_env)
    env.update(settings)
    env.update(runner_env)
    return argv, env


def find_mpiexec(environ: Mapping[str, str] = os.environ) -> str:
    """$GRADFLOW_MPIEXEC, else mpiexec next to this Python (the venv's MPI
    wheel), else mpiexec/mpirun on PATH."""
    if environ.get(MPIEXEC_ENV):
        return environ[MPIEXEC_ENV]
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise ValueError("no mpiexec found next to Python or on PATH; install the 'mpich' "
                         f"wheel or set {MPIEXEC_ENV}")
    return found


def detect_flavor(mpiexec: str) -> str:
    """'openmpi' or 'hydra' (MPICH, Intel MPI and the default) from --version."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return "hydra"
    return "openmpi" if ("Open MPI" in out or "OpenRTE" in out) else "hydra"


def load_native() -> Tuple[Any, str]:
    """(gradflow._native or None, a note saying why it is missing)."""
    try:
        from gradflow import _native  # noqa: PLC0415 - optional until built
        return _native, ""
    except ImportError as e:
        return None, f"gradflow._native is not importable ({e}); settings flags are unavailable"


class _Stopper:
    """Stops mpiexec in stages: the first signal (SIGTERM, or the user's
    SIGINT), then SIGINT (hydra's "force abort": SIGKILL to every rank) after
    KILL_GRACE_SECONDS, then SIGKILL of mpiexec after as long again."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.stage, self.since, self.why = proc, 0, 0.0, ""

    def start(self, signum: int, why: str) -> None:
        if self.stage == 0:
            self.why = why
            self._send(signum)

    def escalate(self, force: bool = False) -> None:
        if self.stage and (force or time.monotonic() - self.since > KILL_GRACE_SECONDS):
            if self.stage == 1:
                self._send(signal.SIGINT)
            elif self.stage == 2:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                self.stage, self.since = 3, float("inf")

    def _send(self, signum: int) -> None:
        try:
            self.proc.send_signal(signum)
        except OSError:
            pass
        self.stage, self.since = self.stage + 1, time.monotonic()


def run_job(argv: List[str], env: Dict[str, str], np: int, local_ranks: Sequence[int],
            start_timeout: float, status_dir: str) -> int:
    """Run mpiexec until it ends; stop the job when a rank fails, a local rank
    misses --start-timeout, or on SIGINT/SIGTERM/SIGHUP (a second one skips the
    grace period); report failed ranks; return the exit code."""
    received: List[int] = []
    seen = 0
    try:
        grace = float(env.get("GRADFLOW_TIMEOUT", DEFAULT_TIMEOUT_SECONDS)) + FAILURE_GRACE_SECONDS
    except ValueError:
        grace = DEFAULT_TIMEOUT_SECONDS + FAILURE_GRACE_SECONDS
    wait_for = grace

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signum)

    # Handlers before Popen: mpiexec then starts with default dispositions,
    # even when this process was started with SIGINT ignored.
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        stdin = subprocess.DEVNULL if sys.stdin is None or sys.stdin.isatty() else None
        proc = subprocess.Popen(argv, env=env, stdin=stdin, start_new_session=True)
        stopper = _Stopper(proc)
        started, failed_at = time.monotonic(), None
        while proc.poll() is None:
            if len(received) > seen:
                if seen:
                    stopper.escalate(force=True)
                stopper.start(received[0], "interrupted")
                seen = len(received)
            codes = [c for c, _ in _read_statuses(status_dir, np).values()]
            if failed_at is None and any(c != 0 for c in codes):
                failed_at = time.monotonic()
                killed = any(c < 0 or c > 128 for c in codes)
                wait_for = grace if killed else FAILURE_GRACE_SECONDS
            if failed_at and time.monotonic() - failed_at > wait_for:
                stopper.start(signal.SIGTERM, "failed")
            if stopper.stage == 0 and time.monotonic() - started > start_timeout:
                missing = [r for r in local_ranks if not os.path.exists(
                    os.path.join(status_dir, f"rank.{r}.start"))]
                if missing:
                    print(f"gradflowrun: rank(s) {_ranks(missing)} did not start within "
                          f"{start_timeout:g} s (--start-timeout); stopping the job",
                          file=sys.stderr, flush=True)
                    stopper.start(signal.SIGTERM, "start timeout")
            stopper.escalate()
            time.sleep(0.05)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return _report(proc.returncode, _read_statuses(status_dir, np), np, received, stopper.why)


def _read_statuses(status_dir: str, np: int) -> Dict[int, Tuple[int, bool]]:
    """rank -> (exit code, stopped by a forwarded signal) from the wrappers' files."""
    out = {}
    for r in range(np):
        try:
            with open(os.path.join(status_dir, f"rank.{r}.exit"), encoding="utf-8") as f:
                code, stopped = f.read().split()
            out[r] = (int(code), stopped == "1")
        except (OSError, ValueError):
            continue
    return out


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _report(mpiexec_rc: int, statuses: Dict[int, Tuple[int, bool]], np: int,
            received: List[int], why: str) -> int:
    failed = sorted(r for r, (code, stopped) in statuses.items() if code != 0 and not stopped)
    for r in failed:
        code = statuses[r][0]
        sig = f" ({signal.Signals(code - 128).name})" if _is_sig(code - 128) else ""
        print(f"gradflowrun: rank {r} exited with code {code}{sig}", file=sys.stderr, flush=True)
    if received:
        print(f"gradflowrun: interrupted by {signal.Signals(received[0]).name}; stopped all ranks",
              file=sys.stderr, flush=True)
        return 128 + received[0]
    if failed:
        others = [r for r in range(np) if r not in failed]
        if others and why == "failed":
            print(f"gradflowrun: stopped rank(s) {_ranks(others)} after the failure",
                  file=sys.stderr, flush=True)
        return statuses[failed[0]][0]
    if mpiexec_rc != 0:
        rc = mpiexec_rc if mpiexec_rc > 0 else 128 - mpiexec_rc
        print(f"gradflowrun: mpiexec exited with code {rc}" + (f" ({why})" if why else ""),
              file=sys.stderr, flush=True)
        return rc
    return 0


def _is_sig(n: int) -> bool:
    if n <= 0:
        return False
    try:
        signal.Signals(n)
        return True
    except ValueError:
        return False


def main(argv: Optional[Sequence[str]] = None, config_keys: Optional[Sequence[Any]] = None) -> int:
    """gradflowrun's entry point. ``config_keys`` defaults to the native
    module's config_keys(); tests pass a list instead."""
    native, note = (None, "") if config_keys is not None else load_native()
    if config_keys is None:
        config_keys = native.config_keys() if native is not None else []
    parser = build_parser(config_keys, native_note=note)
    args = parser.parse_args(argv)
    if args.check_build:
        if native is None and not note:
            native, note = load_native()
        print(check_build(native, note))
        return 0
    try:
        rank_hosts = validate(args)
        mpiexec = find_mpiexec()
    except ValueError as e:
        print(f"gradflowrun: error: {e}", file=sys.stderr)
        return 2
    status_dir = tempfile.mkdtemp(prefix="gradflowrun-")
    try:
        cmd, env = build_launch(args, config_keys, mpiexec=mpiexec,
                                flavor=detect_flavor(mpiexec), status_dir=status_dir)
        if args.verbose:
            print("gradflowrun: " + shlex.join(cmd), file=sys.stderr, flush=True)
        is_local = {h: _hosts.is_local_host(h) for h in set(rank_hosts)}
        local = [r for r, h in enumerate(rank_hosts) if is_local[h]]
        return run_job(cmd, env, args.np, local, args.start_timeout, status_dir)
    except OSError as e:
        print(f"gradflowrun: error: cannot run {mpiexec}: {e.strerror}", file=sys.stderr)
        return 127
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
