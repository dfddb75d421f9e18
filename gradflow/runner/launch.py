"""gradflowrun: validation of the parsed command line (the parser itself is
command_line.py), the choice of launcher and the mpiexec/srun command
line; supervise.py runs and watches the job. Must not import torch or
tensorflow; the native module is imported only to read config_keys()/features().
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

try:
    from . import horovod_flags as _hvd
    from . import hosts as _hosts
    from . import monitor_line as _monitor
    from . import rank_wrapper as _wrapper
    from .check_build import check_build, mpi_mismatch
    from .command_line import build_parser, normalize_config_keys, settings_env
    from .elastic_launch import check_elastic, is_elastic, run_elastic
    from .supervise import run_job
except ImportError:  # run as a script: python gradflow/runner/launch.py
    import horovod_flags as _hvd  # type: ignore[no-redef]
    import hosts as _hosts  # type: ignore[no-redef]
    import monitor_line as _monitor  # type: ignore[no-redef]
    from check_build import check_build, mpi_mismatch  # type: ignore[no-redef]
    from command_line import (build_parser,  # type: ignore[no-redef]
                              normalize_config_keys, settings_env)
    import rank_wrapper as _wrapper  # type: ignore[no-redef]
    from supervise import run_job  # type: ignore[no-redef]
    from elastic_launch import (check_elastic, is_elastic,  # type: ignore[no-redef]
                                run_elastic)

MPIEXEC_ENV = "GRADFLOW_MPIEXEC"
# Environment that pins MPI's data path to one interface: libfabric's tcp and
# sockets providers (MPICH ch4:ofi, Intel MPI) and UCX.
IFACE_ENV_VARS = ("FI_TCP_IFACE", "FI_SOCKETS_IFACE", "UCX_NET_DEVICES")
SSH_WRAPPER_NAME = "ssh"  # written into the job's status directory (see write_ssh_wrapper)


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
    if args.ssh_port is not None and not 0 < args.ssh_port < 65536:
        raise ValueError(f"--ssh-port must be in 1..65535, got {args.ssh_port}")
    if args.ssh_identity_file and not os.path.isfile(args.ssh_identity_file):
        raise ValueError(f"--ssh-identity-file {args.ssh_identity_file}: no such file")
    if args.network_interface is not None and (
            not args.network_interface or any(c.isspace() or c == "," for c in args.network_interface)):
        raise ValueError(f"--network-interface expects one interface name, got "
                         f"{args.network_interface!r}")
    _hvd.interfaces(args)  # raises for a bad --network-interfaces list
    out = args.output_filename
    if out and os.path.lexists(out) and not os.path.isdir(out):
        # Every local rank would fail to create DIR/rank.N/ (exit 2) and the
        # first to exit would be named as if it had failed first.
        raise ValueError(f"--output-filename {out}: exists and is not a directory (each rank "
                         "writes DIR/rank.N/{stdout,stderr})")
    host_list = _host_list(args)
    return _hosts.rank_to_host(host_list, args.np) if host_list else ["localhost"] * args.np


def _host_list(args: argparse.Namespace) -> List[_hosts.HostSlots]:
    # This machine's aliases (localhost, 127.0.0.1, its name and addresses)
    # are one host, so local_rank counts every rank here (merge_local_aliases).
    if args.hosts:
        return _hosts.merge_local_aliases(_hosts.parse_hosts(args.hosts))
    if args.hostfile:
        return _hosts.merge_local_aliases(_hosts.read_hostfile(args.hostfile))
    return []


def ssh_command(args: argparse.Namespace) -> List[str]:
    """The ssh command line the launcher should use for other hosts ([] = its default)."""
    cmd = []
    if args.ssh_port is not None:
        cmd += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        cmd += ["-i", os.path.abspath(args.ssh_identity_file)]
    return ["ssh"] + cmd if cmd else []


def write_ssh_wrapper(path: str, ssh: Sequence[str]) -> None:
    """hydra's -launcher-exec takes one executable, not a command line: write
    a script that runs ``ssh`` with our options and hydra's arguments."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\nexec " + shlex.join(ssh) + ' "$@"\n')
    os.chmod(path, 0o755)


def build_launch(args: argparse.Namespace, config_keys: Sequence[Any], *,
                 mpiexec: str = "mpiexec", flavor: str = "hydra",
                 python: str = sys.executable, status_dir: Optional[str] = None,
                 base_env: Optional[Mapping[str, str]] = None) -> Tuple[List[str], Dict[str, str]]:
    """The launcher argv and the environment for it (pure: starts nothing).

    ``flavor`` is "hydra" (MPICH / Intel MPI mpiexec), "openmpi" (mpirun) or
    "srun" (Slurm; ``mpiexec`` is then the srun path). The settings travel
    twice: exported in the returned env and as ``-genv`` (hydra) / ``-x``
    (Open MPI), so remote ranks get them too; srun exports the environment.
    With ssh options, hydra runs ``<status_dir>/ssh``, which the caller
    writes with write_ssh_wrapper(); Open MPI gets them as plm_rsh_args.
    """
    validate(args)
    settings = settings_env(args, config_keys)
    runner_env = {}
    if status_dir:
        runner_env[_wrapper.STATUS_DIR_ENV] = status_dir
    if status_dir and getattr(args, "monitor", None):
        runner_env[_monitor.DIR_ENV] = status_dir
        runner_env[_monitor.INTERVAL_ENV] = repr(float(args.monitor))
    if args.output_filename:
        runner_env[_wrapper.OUTPUT_DIR_ENV] = os.path.abspath(args.output_filename)
    ifaces = _hvd.interfaces(args)
    iface = ",".join(ifaces)
    if len(ifaces) > 1 and flavor != "openmpi":
        raise ValueError(f"{len(ifaces)} network interfaces given ({iface}): mpiexec (hydra) "
                         "and srun pin exactly one; give one, or use --launcher openmpi")
    if len(ifaces) == 1:
        runner_env.update({name: iface for name in IFACE_ENV_VARS})
    elif ifaces:
        # libfabric's FI_*_IFACE take one name; UCX takes a list.
        runner_env["UCX_NET_DEVICES"] = iface
    env = dict(os.environ if base_env is None else base_env)
    runner_env.update(_hvd.compat_env(args, env))
    ssh = ssh_command(args)
    host_list = _host_list(args)
    argv = [mpiexec]
    if flavor == "srun":
        if ssh:
            raise ValueError("--ssh-port / --ssh-identity-file do not apply to srun "
                             "(Slurm starts the ranks); use --launcher mpiexec")
        # Survivors of a failed rank must live long enough to raise (see above).
        argv += ["--ntasks", str(args.np), "--kill-on-bad-exit=0"]
        # Without a PMI server from srun, each MPICH rank starts as a singleton
        # (size 1, no error: seen with MpiDefault=none). The mpich wheel speaks
        # PMI-2 (srun --mpi=pmix aborts it), so ask for pmi2 unless the user
        # chose a plugin ($SLURM_MPI_TYPE or --mpi in --mpi-args, e.g. pmix for
        # Open MPI builds). Slurm's own MpiDefault is not read: it may be none.
        if not env.get("SLURM_MPI_TYPE") and not any(
                a == "--mpi" or a.startswith("--mpi=") for a in shlex.split(args.mpi_args or "")):
            argv += ["--mpi=pmi2"]
        if host_list:
            used = _hosts.hydra_hosts_arg(host_list, args.np).split(",")
            counts = {int(h.rpartition(":")[2]) for h in used}
            if len(counts) != 1:
                raise ValueError("srun places the same number of ranks on every node; give "
                                 "hosts with equal slots or use --launcher mpiexec")
            argv += ["--nodes", str(len(used)), "--ntasks-per-node", str(counts.pop()),
                     "--nodelist", ",".join(h.rpartition(":")[0] for h in used),
                     "--distribution", "block"]
    elif flavor == "openmpi":
        # Open MPI's analogue of hydra's -disable-auto-cleanup: without these
        # mpirun kills the whole job as soon as one rank exits non-zero (the
        # wrapper reports a signal death as 128+n) or without MPI_Finalize,
        # before the survivors can raise naming the dead rank.
        argv += ["-np", str(args.np), "--oversubscribe",
                 "--mca", "orte_abort_on_non_zero_status", "0",
                 "--mca", "orte_allowed_exit_without_sync", "1"]
        if host_list:
            argv += ["-H", _hosts.hydra_hosts_arg(host_list, args.np)]
        if iface:
            argv += ["--mca", "btl_tcp_if_include", iface, "--mca", "oob_tcp_if_include", iface]
        if ssh:
            argv += ["--mca", "plm_rsh_args", shlex.join(ssh[1:])]
        for name, value in {**settings, **runner_env}.items():
            argv += ["-x", f"{name}={value}"]
    else:
        # Survivors of a failed rank must live long enough to raise (see above).
        argv += ["-disable-auto-cleanup", "-n", str(args.np)]
        if host_list:
            argv += ["-hosts", _hosts.hydra_hosts_arg(host_list, args.np)]
        if iface:
            argv += ["-iface", iface]
        if ssh:
            if not status_dir:
                raise ValueError("ssh options need a status directory for the ssh wrapper")
            argv += ["-launcher", "ssh", "-launcher-exec",
                     os.path.join(status_dir, SSH_WRAPPER_NAME)]
        for name, value in {**settings, **runner_env}.items():
            argv += ["-genv", name, value]
    argv += shlex.split(args.mpi_args or "")
    argv += [python, os.path.abspath(_wrapper.__file__), "--"] + list(args.command)
    env.update(settings)
    env.update(runner_env)
    return argv, env


def choose_launcher(args: argparse.Namespace, environ: Mapping[str, str] = os.environ,
                    which=shutil.which) -> Tuple[str, str]:
    """(launcher executable, flavor) for --launcher; flavor as in build_launch.

    Raises ValueError when the requested launcher is not available."""
    kind = args.launcher
    if kind == "auto":
        in_slurm = bool(environ.get("SLURM_JOB_ID")) and which("srun") is not None
        kind = "srun" if in_slurm and not (args.hosts or args.hostfile) else "mpiexec"
    if kind == "srun":
        srun = which("srun")
        if not srun:
            raise ValueError("--launcher srun: no srun on PATH")
        return srun, "srun"
    if kind == "openmpi":
        mpirun = environ.get(MPIEXEC_ENV) or which("mpirun") or which("mpiexec")
        if not mpirun or detect_flavor(mpirun) != "openmpi":
            raise ValueError("--launcher openmpi: no Open MPI mpirun found on PATH (or in "
                             f"${MPIEXEC_ENV}); gradflow must also be built against Open MPI")
        return mpirun, "openmpi"
    mpiexec = find_mpiexec(environ)
    return mpiexec, detect_flavor(mpiexec)


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


def main(argv: Optional[Sequence[str]] = None, config_keys: Optional[Sequence[Any]] = None) -> int:
    """gradflowrun's entry point. ``config_keys`` defaults to the native
    module's config_keys(); tests pass a list instead."""
    native, note = (None, "") if config_keys is not None else load_native()
    if config_keys is None:
        config_keys = native.config_keys() if native is not None else []
    parser = build_parser(config_keys, native_note=note)
    args = parser.parse_args(argv)
    try:
        _hvd.warn(_hvd.apply_config_file(args, normalize_config_keys(config_keys)))
        # A settings flag out of range (--sparse-ratio 2) fails here, once,
        # with exit code 2 as any usage error; it used to start the job and
        # fail in every rank's init(): a traceback per rank and "rank 0
        # failed first" (the core's own parser decides, as at init()).
        settings = settings_env(args, config_keys) if native is not None else {}
        if settings:
            try:
                native.validate_config(settings)
            except native.GradflowError as e:
                raise ValueError(str(e).removeprefix("gradflow: ")) from None
    except ValueError as e:
        print(f"gradflowrun: error: {e}", file=sys.stderr)
        return 2
    if args.check_build:
        if native is None and not note:
            native, note = load_native()
        print(check_build(native, note))
        mismatch = mpi_mismatch(native)
        if mismatch:
            print(f"gradflowrun: error: {mismatch}", file=sys.stderr)
            return 1
        return 0
    status_dir = tempfile.mkdtemp(prefix="gradflowrun-")
    try:
        if is_elastic(args):
            return _main_elastic(args, config_keys, status_dir)
        if args.elastic_timeout is not None:  # said, not silently dropped
            print("gradflowrun: warning: --elastic-timeout has no effect: the job is not elastic "
                  "(elastic mode needs --min-np, --max-np, --host-discovery-script, "
                  "--slots-per-host, --reset-limit or --blacklist-cooldown-range)",
                  file=sys.stderr)
        try:
            rank_hosts = validate(args)
            mpiexec, flavor = choose_launcher(args)
            cmd, env = build_launch(args, config_keys, mpiexec=mpiexec, flavor=flavor,
                                    status_dir=status_dir)
        except ValueError as e:
            print(f"gradflowrun: error: {e}", file=sys.stderr)
            return 2
        if flavor == "hydra" and ssh_command(args):
            write_ssh_wrapper(os.path.join(status_dir, SSH_WRAPPER_NAME), ssh_command(args))
        if args.verbose:
            print("gradflowrun: " + shlex.join(cmd), file=sys.stderr, flush=True)
        is_local = {h: _hosts.is_local_host(h) for h in set(rank_hosts)}
        local = [r for r, h in enumerate(rank_hosts) if is_local[h]]
        if flavor == "srun" and not (args.hosts or args.hostfile):
            local = []  # Slurm chose the nodes: which ranks are here is unknown
        return run_job(cmd, env, args.np, local, args.start_timeout, status_dir,
                       monitor_interval=args.monitor)
    except OSError as e:
        print(f"gradflowrun: error: cannot run {mpiexec}: {e.strerror}", file=sys.stderr)
        return 127
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)


def _main_elastic(args: argparse.Namespace, config_keys: Sequence[Any], status_dir: str) -> int:
    try:
        hosts = check_elastic(args)
        mpiexec, flavor = choose_launcher(args)
        if flavor != "hydra":
            raise ValueError("elastic mode needs MPICH's mpiexec (hydra)")
        saved = args.hosts, args.hostfile
        args.hosts = args.hostfile = None  # env only: the driver places workers itself
        try:
            _, env = build_launch(args, config_keys, mpiexec=mpiexec, flavor=flavor,
                                  status_dir=status_dir)
        finally:
            args.hosts, args.hostfile = saved
        return run_elastic(args, hosts, env, mpiexec)
    except ValueError as e:
        print(f"gradflowrun: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
