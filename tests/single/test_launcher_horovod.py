"""gradflowrun's horovodrun spellings, without MPI (nothing is run):
-cb, -hostfile, -v/--version, --network-interfaces, --config-file (YAML),
--log-level in any case, --disable-cache, --timeline-mark-cycles and
--horovod-compat (gradflow/runner/horovod_flags.py)."""

import os

import pytest

from gradflow.runner import horovod_flags as HF
from gradflow.runner import launch as L

KEYS = [
    {"env": "GRADFLOW_FUSION_THRESHOLD", "flag": "--fusion-threshold-mb", "type": "int",
     "default": "67108864", "help": "MiB", "scale": 1048576.0, "choices": []},
    {"env": "GRADFLOW_CYCLE_TIME", "flag": "--cycle-time-ms", "type": "float",
     "default": "1.0", "help": "ms", "scale": 1.0, "choices": []},
    {"env": "GRADFLOW_CACHE_CAPACITY", "flag": "--cache-capacity", "type": "int",
     "default": "1024", "help": "entries", "scale": 1.0, "choices": []},
    {"env": "GRADFLOW_TIMELINE", "flag": "--timeline-filename", "type": "string",
     "default": "", "help": "trace", "scale": 1.0, "choices": []},
    {"env": "GRADFLOW_TIMELINE_MARK_CYCLES", "flag": "--timeline-mark-cycles", "type": "bool",
     "default": "0", "help": "cycles", "scale": 1.0, "choices": []},
    {"env": "GRADFLOW_STALL_CHECK_TIME", "flag": "--stall-check-time-seconds", "type": "float",
     "default": "60", "help": "s", "scale": 1.0, "choices": []},
    {"env": "GRADFLOW_STALL_SHUTDOWN_TIME", "flag": "--stall-shutdown-time-seconds",
     "type": "float", "default": "0", "help": "s", "scale": 1.0, "choices": []},
    {"env": "GRADFLOW_LOG_LEVEL", "flag": "--log-level", "type": "choice", "default": "warning",
     "help": "level", "scale": 1.0,
     "choices": ["trace", "debug", "info", "warning", "error", "fatal"]},
    {"env": "GRADFLOW_AUTOTUNE", "flag": "--autotune", "type": "bool",
     "default": "0", "help": "tune", "scale": 1.0, "choices": []},
    {"env": "GRADFLOW_AUTOTUNE_LOG", "flag": "--autotune-log-file", "type": "string",
     "default": "", "help": "csv", "scale": 1.0, "choices": []},
    {"env": "GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE", "flag": "--autotune-steps-per-sample",
     "type": "int", "default": "10", "help": "steps", "scale": 1.0, "choices": []},
]


def parse(argv):
    return L.build_parser(KEYS).parse_args(argv)


def launch(argv, flavor="hydra", base_env=None):
    args = parse(argv)
    return L.build_launch(args, KEYS, mpiexec="mpiexec", flavor=flavor,
                          base_env={} if base_env is None else base_env, status_dir="/tmp/x")


def test_cb_is_check_build():
    assert parse(["-cb"]).check_build and parse(["--check-build"]).check_build


def test_single_dash_hostfile_is_not_help(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\nb slots=1\n")
    args = parse(["-np", "2", "-hostfile", str(hostfile), "python", "x.py"])
    assert args.hostfile == str(hostfile) and args.command == ["python", "x.py"]
    assert L.validate(args) == ["a", "b"]


@pytest.mark.parametrize("flag", ["-v", "--version"])
def test_version(flag, capsys):
    with pytest.raises(SystemExit) as e:
        parse([flag])
    assert e.value.code == 0
    out = capsys.readouterr().out
    import gradflow
    assert out.startswith(f"gradflowrun (gradflow {gradflow.__version__};")


def test_network_interfaces_one_name_is_the_singular():
    argv, env = launch(["-np", "2", "--network-interfaces", "eth1", "python", "x.py"])
    assert argv[argv.index("-iface") + 1] == "eth1"
    assert env["FI_TCP_IFACE"] == env["UCX_NET_DEVICES"] == "eth1"


def test_network_interfaces_list_openmpi():
    argv, env = launch(["-np", "2", "--network-interfaces", "eth0, ib0", "python", "x.py"],
                       flavor="openmpi")
    assert " ".join(argv).count("_tcp_if_include eth0,ib0") == 2
    assert env["UCX_NET_DEVICES"] == "eth0,ib0" and "FI_TCP_IFACE" not in env


@pytest.mark.parametrize("flavor", ["hydra", "srun"])
def test_network_interfaces_list_needs_openmpi(flavor):
    with pytest.raises(ValueError, match="2 network interfaces given.*--launcher openmpi"):
        launch(["-np", "2", "--network-interfaces", "eth0,ib0", "python", "x.py"], flavor=flavor)


def test_both_nic_spellings_merge():
    args = parse(["-np", "1", "--network-interface", "eth0", "--network-interfaces",
                  "ib0,eth0", "x"])
    assert HF.interfaces(args) == ["eth0", "ib0"]


@pytest.mark.parametrize("bad", ["", "eth0,", "eth 0,ib0"])
def test_network_interfaces_bad_list(bad):
    with pytest.raises(ValueError, match="--network-interfaces"):
        L.validate(parse(["-np", "1", "--network-interfaces", bad, "x"]))


@pytest.mark.parametrize("value", ["DEBUG", "debug", "Trace"])
def test_log_level_any_case(value):
    env = L.settings_env(parse(["-np", "1", "--log-level", value, "x"]), KEYS)
    assert env == {"GRADFLOW_LOG_LEVEL": value.lower()}


def test_log_level_unknown_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        parse(["-np", "1", "--log-level", "LOUD", "x"])
    assert "invalid choice" in capsys.readouterr().err


def test_disable_cache_is_accepted_and_changes_nothing():
    with_flag = launch(["-np", "2", "--disable-cache", "python", "x.py"])
    assert with_flag == launch(["-np", "2", "python", "x.py"])


def test_timeline_mark_cycles_is_a_flag_without_value():
    args = parse(["-np", "1", "--timeline-filename", "/tmp/t.json", "--timeline-mark-cycles",
                  "python", "x.py"])
    assert args.command == ["python", "x.py"]
    assert L.settings_env(args, KEYS) == {"GRADFLOW_TIMELINE": "/tmp/t.json",
                                          "GRADFLOW_TIMELINE_MARK_CYCLES": "1"}
    assert "GRADFLOW_TIMELINE_MARK_CYCLES" not in L.settings_env(parse(["-np", "1", "x"]), KEYS)


def test_real_native_keys_have_the_horovod_spellings():
    from gradflow import _native
    keys = _native.config_keys()
    args = L.build_parser(keys).parse_args(["-np", "1", "--log-level", "DEBUG",
                                            "--timeline-mark-cycles", "x"])
    env = L.settings_env(args, keys)
    assert env["GRADFLOW_LOG_LEVEL"] == "debug" and env["GRADFLOW_TIMELINE_MARK_CYCLES"] == "1"


def test_horovod_compat_env_and_pythonpath():
    argv, env = launch(["-np", "2", "--horovod-compat", "python", "x.py"],
                       base_env={"PYTHONPATH": "/src"})
    assert env["GRADFLOW_HOROVOD_COMPAT"] == "1"
    assert env["PYTHONPATH"] == HF.SHIM_DIR + os.pathsep + "/src"
    assert os.path.isfile(os.path.join(HF.SHIM_DIR, "horovod", "__init__.py"))
    i = argv.index("GRADFLOW_HOROVOD_COMPAT")
    assert argv[i - 1:i + 2] == ["-genv", "GRADFLOW_HOROVOD_COMPAT", "1"]  # remote ranks too
    _, env = launch(["-np", "2", "python", "x.py"], base_env={"PYTHONPATH": "/src"})
    assert "GRADFLOW_HOROVOD_COMPAT" not in env and env["PYTHONPATH"] == "/src"


# ------------------------------------------------------------ --config-file

CONFIG = """
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 2.5
  cache_capacity: 0
  hierarchical_allreduce: true
timeline:
  filename: /tmp/tl.json
  mark_cycles: true
stall_check:
  warning_time_seconds: 40
  shutdown_time_seconds: 120
logging:
  level: DEBUG
  with_timestamp: true
autotune:
  enabled: true
  log_file: /tmp/at.csv
  steps_per_sample: 4
  bayes_opt_max_samples: 30
library_options:
  num_nccl_streams: 2
controller: mpi
"""


def config_args(tmp_path, text, extra=()):
    path = tmp_path / "hvd.yaml"
    path.write_text(text)
    args = parse(["-np", "2", "--config-file", str(path), *extra, "python", "x.py"])
    warnings = HF.apply_config_file(args, L.normalize_config_keys(KEYS))
    return args, warnings


def test_config_file_maps_gradflow_settings_and_warns_on_the_rest(tmp_path):
    args, warnings = config_args(tmp_path, CONFIG)
    assert L.settings_env(args, KEYS) == {
        "GRADFLOW_FUSION_THRESHOLD": str(32 * 1048576), "GRADFLOW_CYCLE_TIME": "2.5",
        "GRADFLOW_CACHE_CAPACITY": "0", "GRADFLOW_TIMELINE": "/tmp/tl.json",
        "GRADFLOW_TIMELINE_MARK_CYCLES": "1", "GRADFLOW_STALL_CHECK_TIME": "40.0",
        "GRADFLOW_STALL_SHUTDOWN_TIME": "120.0", "GRADFLOW_LOG_LEVEL": "debug",
        "GRADFLOW_AUTOTUNE": "1", "GRADFLOW_AUTOTUNE_LOG": "/tmp/at.csv",
        "GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE": "4"}
    text = "\n".join(warnings)
    for fragment in ("params.hierarchical_allreduce: ignored", "logging.with_timestamp: ignored",
                     "autotune.bayes_opt_max_samples: ignored",
                     "library_options.num_nccl_streams: ignored"):
        assert fragment in text
    assert "controller" not in text  # mpi is what gradflow uses
    assert len(warnings) == 4


def test_command_line_wins_over_config_file(tmp_path):
    args, _ = config_args(tmp_path, CONFIG, ["--cycle-time-ms", "7", "--log-level", "ERROR"])
    env = L.settings_env(args, KEYS)
    assert env["GRADFLOW_CYCLE_TIME"] == "7.0" and env["GRADFLOW_LOG_LEVEL"] == "error"
    assert env["GRADFLOW_FUSION_THRESHOLD"] == str(32 * 1048576)


def test_config_file_stall_check_disabled(tmp_path):
    args, _ = config_args(tmp_path, "stall_check:\n  enabled: false\n  warning_time_seconds: 9\n")
    assert L.settings_env(args, KEYS)["GRADFLOW_STALL_CHECK_TIME"] == "0.0"
    args, _ = config_args(tmp_path, "stall_check:\n  enabled: false\n",
                          ["--stall-check-time-seconds", "5"])
    assert L.settings_env(args, KEYS)["GRADFLOW_STALL_CHECK_TIME"] == "5.0"


@pytest.mark.parametrize("text,fragment", [
    ("params: [1, 2", "not valid YAML"),
    ("- a\n- b\n", "expected a mapping"),
    ("params:\n  cycle_time_ms: fast\n", "params.cycle_time_ms must be a number"),
    ("logging:\n  level: LOUD\n", "logging.level must be one of"),
    ("timeline:\n  mark_cycles: 3\n", "timeline.mark_cycles must be true or false"),
    ("params: 3\n", "section 'params' must be a mapping"),
])
def test_config_file_errors(tmp_path, text, fragment):
    with pytest.raises(ValueError, match=fragment):
        config_args(tmp_path, text)


def test_config_file_unknown_section_and_key_warn(tmp_path):
    _, warnings = config_args(tmp_path, "gpus: 4\nparams:\n  fusion_threshold: 3\n")
    assert warnings == ["section 'gpus' is not a horovodrun config section; ignored",
                        "params.fusion_threshold: ignored (not a horovodrun config key)"]


def test_main_reports_config_file_problems(tmp_path, capsys):
    assert L.main(["-np", "1", "--config-file", str(tmp_path / "none.yaml"), "x"],
                  config_keys=KEYS) == 2
    assert "--config-file" in capsys.readouterr().err
    path = tmp_path / "c.yaml"
    path.write_text("autotune:\n  gaussian_process_noise: 0.5\n")
    assert L.main(["-cb", "--config-file", str(path)], config_keys=KEYS) == 0
    assert "gradflowrun: warning: --config-file: autotune.gaussian_process_noise: ignored" in \
        capsys.readouterr().err


def test_horovodrun_stall_and_timeline_spellings():
    env = L.settings_env(parse(["-np", "1", "--stall-check-warning-time-seconds", "30",
                                "--stall-check-shutdown-time-seconds", "90", "x"]), KEYS)
    assert env == {"GRADFLOW_STALL_CHECK_TIME": "30.0", "GRADFLOW_STALL_SHUTDOWN_TIME": "90.0"}
    env = L.settings_env(parse(["-np", "1", "--no-stall-check", "--timeline-mark-cycles",
                                "--no-timeline-mark-cycles", "x"]), KEYS)
    assert env == {"GRADFLOW_STALL_CHECK_TIME": "0.0", "GRADFLOW_TIMELINE_MARK_CYCLES": "0"}


def test_horovodrun_autotune_flags():
    env = L.settings_env(parse(["-np", "2", "--autotune", "--autotune-log-file", "a.csv",
                                "--autotune-steps-per-sample", "5",
                                "--autotune-bayes-opt-max-samples", "20",
                                "--autotune-gaussian-process-noise", "0.8", "x"]), KEYS)
    assert env == {"GRADFLOW_AUTOTUNE": "1", "GRADFLOW_AUTOTUNE_LOG": "a.csv",
                   "GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE": "5"}
    env = L.settings_env(parse(["-np", "2", "--autotune", "--no-autotune", "x"]), KEYS)
    assert env == {"GRADFLOW_AUTOTUNE": "0"}


@pytest.mark.parametrize("argv", [["--autotune-bayes-opt-max-samples", "0"],
                                  ["--autotune-gaussian-process-noise", "2"],
                                  ["--autotune-steps-per-sample", "many"]])
def test_bad_autotune_flag_values_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse(["-np", "2", *argv, "x"])
    assert e.value.code == 2 and argv[0] in capsys.readouterr().err


# ------------------------------------------- docs/horovod_compat.md drift check

# Every option string of horovodrun 0.28.1 (horovod/runner/launch.py).
HOROVODRUN_FLAGS = [
    "-v", "--version", "-np", "--num-proc", "-cb", "--check-build", "--disable-cache",
    "--start-timeout", "--network-interfaces", "--network-interface", "--output-filename",
    "--verbose", "--config-file", "-p", "--ssh-port", "-i", "--ssh-identity-file",
    "--fusion-threshold-mb", "--cycle-time-ms", "--cache-capacity", "--hierarchical-allreduce",
    "--no-hierarchical-allreduce", "--hierarchical-allgather", "--no-hierarchical-allgather",
    "--torus-allreduce", "--no-torus-allreduce", "--autotune", "--no-autotune",
    "--autotune-log-file", "--autotune-warmup-samples", "--autotune-steps-per-sample",
    "--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise", "--min-np",
    "--min-num-proc", "--max-np", "--max-num-proc", "--slots-per-host", "--elastic-timeout",
    "--reset-limit", "--blacklist-cooldown-range", "--timeline-filename",
    "--timeline-mark-cycles", "--no-timeline-mark-cycles", "--no-stall-check", "--stall-check",
    "--stall-check-warning-time-seconds", "--stall-check-shutdown-time-seconds",
    "--mpi-threads-disable", "--no-mpi-threads-disable", "--mpi-args", "--tcp",
    "--binding-args", "--num-nccl-streams", "--thread-affinity", "--gloo-timeout-seconds",
    "--log-level", "--log-with-timestamp", "--log-without-timestamp", "-prefix-timestamp",
    "--prefix-output-with-timestamp", "--log-hide-timestamp", "--no-log-hide-timestamp", "-H",
    "--hosts", "-hostfile", "--hostfile", "--host-discovery-script", "--gloo", "--mpi",
    "--jsrun",
]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "horovod_compat.md")
# horovodrun's flags as scripts/horovod_api.py read them from Horovod 0.28.1's
# source (runner/launch.py), checked in: the list above cannot drift from it.
API_JSON = os.path.join(ROOT, "tests", "data", "horovod_0.28.1_api.json")


def test_flag_list_matches_horovod_source():
    import json
    with open(API_JSON, encoding="utf-8") as f:
        flags = json.load(f)["horovodrun_flags"]
    found = [flag for entry in flags for flag in entry["flags"] if flag.startswith("-")]
    assert sorted(found) == sorted(HOROVODRUN_FLAGS)


def doc_rows():
    text = open(DOC, encoding="utf-8").read()
    section = text.split("## horovodrun flags", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`-"):
            flags = [f.strip("`") for f in cells[0].split(", ")]
            rows.append((flags, cells[1].split(":")[0].split(" (")[0]))
    return rows


def test_every_horovodrun_flag_has_one_row_and_the_parser_agrees():
    from gradflow import _native
    parser = L.build_parser(_native.config_keys())
    accepted = parser._option_string_actions  # option string -> action
    seen = []
    for flags, status in doc_rows():
        assert status in ("same", "different", "not applicable"), (flags, status)
        for flag in flags:
            seen.append(flag)
            assert (flag in accepted) == (status != "not applicable"), (flag, status)
    assert sorted(seen) == sorted(HOROVODRUN_FLAGS)
