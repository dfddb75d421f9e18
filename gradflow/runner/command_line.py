"""gradflowrun's argument parser: launcher options, Horovod's flags and one
flag per native setting (generated from the native module's config_keys()),
and the GRADFLOW_* environment those settings flags stand for. launch.py
validates the parsed options and builds the job. Must not import torch or
tensorflow.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, List, Mapping, Sequence

try:
    from . import horovod_flags as _hvd
    from . import monitor_line as _monitor
    from .elastic_launch import add_elastic_flags
except ImportError:  # run as a script: python gradflow/runner/launch.py
    import horovod_flags as _hvd  # type: ignore[no-redef]
    import monitor_line as _monitor  # type: ignore[no-redef]
    from elastic_launch import add_elastic_flags  # type: ignore[no-redef]

LAUNCHERS = ("auto", "mpiexec", "openmpi", "srun")


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


def _seconds(text: str) -> float:
    """--monitor's value: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"expects a number of seconds > 0, got {text!r} (give SECONDS when the command "
            "follows --monitor directly, e.g. --monitor 5 python train.py)")
    return value


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
    # "-hostfile" (horovodrun's spelling) must not be read as -h + "ostfile".
    group.add_argument("-hostfile", "--hostfile", dest="hostfile",
                       help="file with one 'host slots=N' or 'host:N' per line")
    p.add_argument("--verbose", action="store_true", help="print the mpiexec command line")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="print gradflow's version, frameworks, MPI and features, then exit")
    p.add_argument("--start-timeout", type=float, default=30.0, metavar="S",
                   help="seconds for every local rank to start (default 30)")
    p.add_argument("--output-filename", metavar="DIR",
                   help="also write each rank's output to DIR/rank.N/{stdout,stderr}")
    p.add_argument("--mpi-args", default="", metavar="ARGS",
                   help='extra arguments for mpiexec, one quoted string, e.g. "-bind-to core"')
    p.add_argument("--launcher", choices=LAUNCHERS, default="auto",
                   help="how ranks are started: mpiexec (the MPICH/Intel MPI hydra launcher "
                   "beside Python or on PATH, or $GRADFLOW_MPIEXEC), openmpi (Open MPI's "
                   "mpirun), srun (Slurm); auto = srun inside a Slurm allocation "
                   "($SLURM_JOB_ID set, srun on PATH, no -H/--hostfile), else mpiexec")
    p.add_argument("--network-interface", metavar="IFACE",
                   help="network interface for MPI traffic, e.g. eth0 (hydra: -iface; Open MPI: "
                   "btl/oob_tcp_if_include; every launcher: FI_TCP_IFACE, FI_SOCKETS_IFACE, "
                   "UCX_NET_DEVICES)")
    p.add_argument("-p", "--ssh-port", type=int, metavar="PORT",
                   help="ssh port of the other hosts (multi-host mpiexec / openmpi launches)")
    p.add_argument("-i", "--ssh-identity-file", metavar="FILE",
                   help="ssh private key for the other hosts (multi-host mpiexec / openmpi)")
    p.add_argument("--monitor", nargs="?", const=_monitor.DEFAULT_INTERVAL, type=_seconds,
                   metavar="SECONDS", help="print a live status line (steps/s, MB/s sent, "
                   "communication share, slowest rank) to stderr every SECONDS (default "
                   f"{_monitor.DEFAULT_INTERVAL:g}); covers the ranks on this host")
    _hvd.add_horovod_flags(p)
    settings = p.add_argument_group("gradflow settings (each sets a GRADFLOW_* variable)")
    for key in normalize_config_keys(config_keys):
        kwargs: Dict[str, Any] = {"dest": key["env"], "default": None,
                                  "type": _flag_value_type(key)}
        if key["type"] == "choice":
            kwargs["choices"] = key["choices"]
            kwargs["type"] = str.lower  # choices are lower case; accept any case
        elif key["type"] == "bool":
            del kwargs["type"]
            kwargs.update(action="store_const", const=True)
        else:
            kwargs["metavar"] = {"int": "N", "float": "X"}.get(key["type"], "VALUE")
        text, env = key["help"], key["env"]
        if key["type"] == "bool":  # the flag takes no value; "1 | 0" is the variable's
            text, env = text.removeprefix("1 | 0: "), f"{env}=1|0"
        kwargs["help"] = (f"{text} [{env}; default: {_default_in_flag_unit(key)}]"
                          .replace("%", "%%"))
        try:
            settings.add_argument(key["flag"], **kwargs)
        except argparse.ArgumentError as e:
            raise ValueError(f"config key {key['env']}: flag {key['flag']} clashes with a "
                             f"gradflowrun option ({e})") from None
    _hvd.add_setting_aliases(settings, [k["env"] for k in normalize_config_keys(config_keys)])
    add_elastic_flags(p)
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
        if key["type"] == "bool":
            env[key["env"]] = "1" if value else "0"
        elif key["type"] == "int":
            env[key["env"]] = str(int(round(value * key["scale"])))
        elif key["type"] == "float":
            env[key["env"]] = repr(float(value * key["scale"]))
        else:
            env[key["env"]] = str(value)
    return env
