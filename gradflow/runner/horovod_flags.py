"""horovodrun's spellings in gradflowrun: the extra option strings a
Horovod user types (-v/--version, --network-interfaces, --disable-cache,
--mpi, the stall/timeline spellings, --horovod-compat; -cb and -hostfile are
added in launch.py), horovodrun's YAML --config-file mapped onto gradflow's
settings flags, and the interface list both NIC flags give.
Must not import torch, tensorflow or the native module (launch.py owns that).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

# The horovod shim's directory, found by path: importing gradflow.horovod_compat
# would import the gradflow package (and its native module) into the launcher.
SHIM_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "horovod_compat", "shim")
COMPAT_ENV = "GRADFLOW_HOROVOD_COMPAT"

# gradflow's autotuner (gradflow/autotune_search.py) walks a small fixed grid.
_NO_BAYES = ("gradflow's autotune is a coordinate descent over a fixed grid, "
             "not Bayesian optimization")

# horovodrun's config file (horovod/runner/common/util/config_parser.py):
# section -> key -> the GRADFLOW_* setting whose gradflowrun flag takes the
# same value in the same unit, or None when gradflow has no such setting
# (the string says why; it is printed as a warning).
CONFIG_FILE_KEYS: Dict[str, Dict[str, Tuple[Optional[str], str]]] = {
    "params": {
        "fusion_threshold_mb": ("GRADFLOW_FUSION_THRESHOLD", "MiB in both"),
        "cycle_time_ms": ("GRADFLOW_CYCLE_TIME", "ms in both"),
        "cache_capacity": ("GRADFLOW_CACHE_CAPACITY", "entries in both"),
        "hierarchical_allreduce": (None, "gradflow has no hierarchical allreduce"),
        "hierarchical_allgather": (None, "gradflow has no hierarchical allgather"),
        "torus_allreduce": (None, "gradflow has no torus allreduce"),
    },
    "timeline": {
        "filename": ("GRADFLOW_TIMELINE", "path"),
        "mark_cycles": ("GRADFLOW_TIMELINE_MARK_CYCLES", "boolean"),
    },
    "stall_check": {
        # enabled: false is handled in apply_config_file (sets the time to 0)
        "enabled": ("GRADFLOW_STALL_CHECK_TIME", "false = 0 seconds"),
        "warning_time_seconds": ("GRADFLOW_STALL_CHECK_TIME", "seconds in both"),
        "shutdown_time_seconds": ("GRADFLOW_STALL_SHUTDOWN_TIME", "seconds in both"),
    },
    "logging": {
        "level": ("GRADFLOW_LOG_LEVEL", "any case"),
        "with_timestamp": (None, "gradflow's log lines carry no timestamp"),
    },
    "autotune": {
        "enabled": ("GRADFLOW_AUTOTUNE", "boolean"),
        "log_file": ("GRADFLOW_AUTOTUNE_LOG", "path"),
        "warmup_samples": ("GRADFLOW_AUTOTUNE_WARMUP_SAMPLES", "samples in both"),
        "steps_per_sample": ("GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE", "steps in both"),
        "bayes_opt_max_samples": (None, _NO_BAYES),
        "gaussian_process_noise": (None, _NO_BAYES),
    },
    "library_options": {
        "mpi_threads_disable": (None, "gradflow needs MPI_THREAD_MULTIPLE"),
        "num_nccl_streams": (None, "gradflow has no NCCL path (CPU only)"),
        "thread_affinity": (None, "gradflow does not pin its background thread"),
        "gloo_timeout_seconds": (None, "gradflow runs over MPI, not Gloo "
                                 "(its peer timeout is --timeout-seconds)"),
    },
    "controller": {"*": (None, "gradflow always uses MPI")},
}


def _version() -> str:
    try:
        from gradflow import __version__  # noqa: PLC0415 - needs the built package
        return __version__
    except ImportError:
        try:
            from importlib import metadata  # noqa: PLC0415
            return metadata.version("gradflow")
        except Exception:  # not installed either
            return "unknown"


class _VersionAction(argparse.Action):
    """-v/--version: print gradflow's version and exit (read only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"gradflowrun (gradflow {_version()}; Horovod API 0.28.1)")
        parser.exit()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expects an integer >= 1, got {text!r}")
    return value


def _unit_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expects a number in [0, 1], got {text!r}")
    return value


def add_horovod_flags(p: argparse.ArgumentParser) -> None:
    """horovodrun options gradflowrun accepts besides its own."""
    p.add_argument("-v", "--version", action=_VersionAction, help="print gradflow's version")
    p.add_argument("--network-interfaces", metavar="IFACES",
                   help="comma-separated network interfaces for MPI traffic (horovodrun's "
                   "spelling; hydra and srun launches take exactly one)")
    p.add_argument("--config-file", metavar="FILE",
                   help="horovodrun's YAML config file: params, timeline, stall_check and "
                   "logging keys set gradflow's settings (flags given on the command line "
                   "win); keys gradflow has no setting for are warned about")
    p.add_argument("--disable-cache", action="store_true",
                   help="accepted for horovodrun compatibility; does nothing: gradflowrun "
                   "caches no start-up checks (the core's response cache is --cache-capacity 0)")
    p.add_argument("--mpi", action="store_true", dest="use_mpi",
                   help="accepted for horovodrun compatibility: gradflow always runs over MPI")
    # Horovod's Bayesian-optimization knobs: accepted (checked, so a typo is
    # still an error) and ignored, gradflow's search being a fixed grid.
    p.add_argument("--autotune-bayes-opt-max-samples", type=_positive_int, metavar="N",
                   help="accepted for horovodrun compatibility; ignored: " + _NO_BAYES)
    p.add_argument("--autotune-gaussian-process-noise", type=_unit_float, metavar="X",
                   help="accepted for horovodrun compatibility; ignored: " + _NO_BAYES)
    p.add_argument("--horovod-compat", action="store_true",
                   help="run an unmodified Horovod script: `import horovod.torch` etc. give "
                   f"gradflow's modules, HOROVOD_* settings are honoured (sets {COMPAT_ENV}=1 "
                   "and puts gradflow's horovod shim first on PYTHONPATH)")


# horovodrun's spellings of gradflow settings flags: option -> (GRADFLOW_*
# setting, constant or None when the option takes a value in the flag's unit).
SETTING_ALIASES: Dict[str, Tuple[str, Any]] = {
    "--stall-check-warning-time-seconds": ("GRADFLOW_STALL_CHECK_TIME", None),
    "--stall-check-shutdown-time-seconds": ("GRADFLOW_STALL_SHUTDOWN_TIME", None),
    "--no-stall-check": ("GRADFLOW_STALL_CHECK_TIME", 0.0),  # both constants mean "=0"
    "--no-timeline-mark-cycles": ("GRADFLOW_TIMELINE_MARK_CYCLES", False),
    "--no-autotune": ("GRADFLOW_AUTOTUNE", False),
}


def add_setting_aliases(group, settings: Sequence[str]) -> None:
    """Add SETTING_ALIASES for the settings this build has (``settings``:
    GRADFLOW_* names); each writes the same destination as gradflow's flag."""
    for option, (env, const) in SETTING_ALIASES.items():
        if env not in settings:
            continue
        if const is None:
            group.add_argument(option, dest=env, type=float, default=None, metavar="S",
                               help=f"horovodrun's name for the {env} flag")
        else:
            group.add_argument(option, dest=env, action="store_const", const=const,
                               default=None, help=f"horovodrun's spelling of {env}=0")


def interfaces(args: argparse.Namespace) -> List[str]:
    """The network interfaces given by --network-interface and
    --network-interfaces together, in order, without repeats.

    Raises ValueError for an empty or blank name."""
    names: List[str] = []
    if args.network_interface is not None:
        names.append(args.network_interface)
    if getattr(args, "network_interfaces", None) is not None:
        parts = [n.strip() for n in args.network_interfaces.split(",")]
        if not all(parts) or any(any(c.isspace() for c in n) for n in parts):
            raise ValueError("--network-interfaces expects comma-separated interface names, "
                             f"got {args.network_interfaces!r}")
        names += parts
    return list(dict.fromkeys(names))


def compat_env(args: argparse.Namespace, base_env: Dict[str, str]) -> Dict[str, str]:
    """Environment for --horovod-compat ({} without it)."""
    if not getattr(args, "horovod_compat", False):
        return {}
    path = base_env.get("PYTHONPATH", "")
    return {COMPAT_ENV: "1", "PYTHONPATH": SHIM_DIR + (os.pathsep + path if path else "")}


def _to_flag_unit(value: Any, key: Dict[str, Any], where: str) -> Any:
    """A config-file value as the settings flag's parsed value would be."""
    if key["type"] == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"--config-file: {where} must be true or false, got {value!r}")
        return value
    if key["type"] in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"--config-file: {where} must be a number, got {value!r}")
        return value
    text = str(value)
    if key["type"] == "choice":
        text = text.lower()
        if text not in key["choices"]:
            raise ValueError(f"--config-file: {where} must be one of "
                             f"{', '.join(key['choices'])}, got {value!r}")
    return text


def apply_config_file(args: argparse.Namespace, keys: Sequence[Dict[str, Any]]) -> List[str]:
    """Fill settings from args.config_file where the command line left them
    unset. ``keys`` are normalized config keys. Returns warnings for keys
    gradflow has no setting for. Raises ValueError for an unreadable file,
    bad YAML or a bad value."""
    if not args.config_file:
        return []
    try:
        import yaml  # noqa: PLC0415 - only --config-file needs it
    except ImportError:
        raise ValueError("--config-file needs PyYAML (pip install pyyaml)") from None
    try:
        with open(args.config_file, encoding="utf-8") as f:
            config = yaml.safe_load(f) or {}
    except OSError as e:
        raise ValueError(f"--config-file {args.config_file}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"--config-file {args.config_file}: not valid YAML ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"--config-file {args.config_file}: expected a mapping of sections")
    by_env = {k["env"]: k for k in keys}
    # Settings the command line gave win over the file, as with horovodrun.
    cli = {env for env in by_env if getattr(args, env, None) is not None}
    warnings: List[str] = []
    for section, body in config.items():
        known = CONFIG_FILE_KEYS.get(section)
        if known is None:
            warnings.append(f"section {section!r} is not a horovodrun config section; ignored")
            continue
        if "*" in known:
            if section != "controller" or str(body).lower() != "mpi":
                warnings.append(f"{section}: ignored ({known['*'][1]})")
            continue
        if not isinstance(body, dict):
            raise ValueError(f"--config-file: section {section!r} must be a mapping")
        for name, value in body.items():
            where = f"{section}.{name}"
            env, why = known.get(name, (None, "not a horovodrun config key"))
            if env is None:
                warnings.append(f"{where}: ignored ({why})")
                continue
            if env not in by_env:
                warnings.append(f"{where}: ignored (this gradflow build has no {env})")
                continue
            if env in cli:
                continue
            if where == "stall_check.enabled":
                if not isinstance(value, bool):
                    raise ValueError(f"--config-file: {where} must be true or false, "
                                     f"got {value!r}")
                continue  # applied below, after any warning time in the file
            setattr(args, env, _to_flag_unit(value, by_env[env], where))
    # stall_check.enabled: false beats a warning time given in the same file
    # (horovodrun: --no-stall-check disables the check whatever the time).
    stall = config.get("stall_check")
    if isinstance(stall, dict) and stall.get("enabled") is False and \
            "GRADFLOW_STALL_CHECK_TIME" in by_env and "GRADFLOW_STALL_CHECK_TIME" not in cli:
        setattr(args, "GRADFLOW_STALL_CHECK_TIME", 0.0)
    return warnings


def warn(lines: Sequence[str], stream=None) -> None:
    for line in lines:
        print(f"gradflowrun: warning: --config-file: {line}", file=stream or sys.stderr)
