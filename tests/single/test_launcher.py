"""Unit tests for gradflowrun without MPI: settings flags generated from a
config_keys() list, host parsing and rank mapping, input validation, and the
mpiexec command line / environment built by build_launch (nothing is run).
"""

import os
import sys

import pytest

from gradflow.runner import hosts as H
from gradflow.runner import launch as L
from gradflow.runner import rank_wrapper as W

FAKE_KEYS = [
    {"env": "GRADFLOW_FUSION_THRESHOLD", "flag": "--fusion-threshold-mb", "type": "int",
     "default": "67108864", "help": "fusion buffer size in MiB", "scale": 1048576.0,
     "choices": []},
    {"env": "GRADFLOW_CYCLE_TIME", "flag": "--cycle-time-ms", "type": "float",
     "default": "1.0", "help": "background cycle time (ms), 100% busy", "scale": 1.0,
     "choices": []},
    {"env": "GRADFLOW_CACHE_CAPACITY", "flag": "--cache-capacity", "type": "int",
     "default": "1024", "help": "response cache entries", "scale": 1.0, "choices": []},
    {"env": "GRADFLOW_WIRE_DTYPE", "flag": "--wire-dtype", "type": "choice",
     "default": "fp32", "help": "wire format", "scale": 1.0, "choices": ["fp32", "fp16", "bf16"]},
    {"env": "GRADFLOW_TIMELINE", "flag": "--timeline-filename", "type": "string",
     "default": "", "help": "Chrome trace file", "scale": 1.0, "choices": []},
]


def parse(argv, keys=FAKE_KEYS):
    return L.build_parser(keys).parse_args(argv)


# ------------------------------------------------------------ settings flags

def test_flags_map_to_env_with_scale():
    args = parse(["-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
                  "--wire-dtype", "fp16", "--timeline-filename", "/tmp/t.json",
                  "python", "train.py", "--lr", "0.1"])
    assert args.command == ["python", "train.py", "--lr", "0.1"]
    assert L.settings_env(args, FAKE_KEYS) == {
        "GRADFLOW_FUSION_THRESHOLD": str(32 * 1048576),
        "GRADFLOW_CYCLE_TIME": "2.5",
        "GRADFLOW_WIRE_DTYPE": "fp16",
        "GRADFLOW_TIMELINE": "/tmp/t.json",
    }


def test_fractional_value_with_scale_and_plain_int():
    args = parse(["-np", "1", "--fusion-threshold-mb", "0.5", "--cache-capacity", "7", "x"])
    env = L.settings_env(args, FAKE_KEYS)
    assert env["GRADFLOW_FUSION_THRESHOLD"] == "524288"
    assert env["GRADFLOW_CACHE_CAPACITY"] == "7"


def test_unset_flags_leave_env_alone():
    assert L.settings_env(parse(["-np", "1", "x"]), FAKE_KEYS) == {}


@pytest.mark.parametrize("bad", [["--wire-dtype", "fp8"], ["--cache-capacity", "1.5"],
                                 ["--cycle-time-ms", "fast"], ["--no-such-flag", "1"]])
def test_bad_flag_values_are_usage_errors(bad, capsys):
    with pytest.raises(SystemExit) as e:
        parse(["-np", "1"] + bad + ["python", "x.py"])
    assert e.value.code == 2


def test_help_shows_env_name_and_default_in_flag_unit(capsys):
    with pytest.raises(SystemExit):
        parse(["--help"])
    out = capsys.readouterr().out
    assert "--fusion-threshold-mb" in out and "GRADFLOW_FUSION_THRESHOLD" in out
    assert "default: 64]" in out  # 67108864 bytes shown as 64 MiB
    assert "100% busy" in out


def test_config_keys_as_objects_and_clashes():
    class Key:
        env, flag, type, default_value, help = "GRADFLOW_X", "--x-value", "int", "3", "x"
        flag_to_env_scale, choices = 2.0, []

    args = parse(["-np", "1", "--x-value", "4", "cmd"], keys=[Key()])
    assert L.settings_env(args, [Key()]) == {"GRADFLOW_X": "8"}
    clash = dict(FAKE_KEYS[0], flag="--verbose")
    with pytest.raises(ValueError, match="clashes"):
        L.build_parser([clash])
    with pytest.raises(ValueError, match="--flag"):
        L.build_parser([dict(FAKE_KEYS[0], flag="fusion")])


# ---------------------------------------------------------------------- hosts

def test_parse_hosts():
    assert H.parse_hosts("h1:2,h2:3") == [H.HostSlots("h1", 2), H.HostSlots("h2", 3)]
    assert H.parse_hosts("node-a") == [H.HostSlots("node-a", 1)]


@pytest.mark.parametrize("spec", ["", "h1:", "h1:0", "h1:-2", "h1:x", "h1:2,,h2:2",
                                  "h1:2,h1:2", ":3"])
def test_parse_hosts_errors(spec):
    with pytest.raises(ValueError):
        H.parse_hosts(spec)


def test_parse_hostfile_formats(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\nh1 slots=4\n\nh2:2   # comment\nh3\n")
    assert H.read_hostfile(str(f)) == [H.HostSlots("h1", 4), H.HostSlots("h2", 2),
                                       H.HostSlots("h3", 1)]


@pytest.mark.parametrize("text", ["h1 slots=0\n", "h1 slots=two\n", "h1 extra words\n",
                                  "h1:2 slots=2\n", "# nothing\n", "h1 2\n"])
def test_parse_hostfile_errors(text):
    with pytest.raises(ValueError):
        H.parse_hostfile(text.splitlines(True))


def test_missing_hostfile(tmp_path):
    with pytest.raises(ValueError, match="--hostfile"):
        H.read_hostfile(str(tmp_path / "nope"))


def test_rank_to_host_block_mapping():
    hs = H.parse_hosts("a:2,b:2,c:4")
    assert H.rank_to_host(hs, 5) == ["a", "a", "b", "b", "c"]
    assert H.hydra_hosts_arg(hs, 5) == "a:2,b:2,c:1"
    assert H.hydra_hosts_arg(hs, 1) == "a:1"
    with pytest.raises(ValueError, match="only 8"):
        H.rank_to_host(hs, 9)
    with pytest.raises(ValueError):
        H.rank_to_host(hs, 0)


def test_localhost_is_local():
    assert H.is_local_host("localhost")
    assert H.is_local_host(__import__("socket").gethostname())


# ----------------------------------------------------------------- validation

@pytest.mark.parametrize("argv,msg", [
    (["python", "x.py"], "-np is required"),
    (["-np", "0", "python", "x.py"], ">= 1"),
    (["-np", "-3", "python", "x.py"], ">= 1"),
    (["-np", "2"], "no command"),
    (["-np", "3", "-H", "a:1,b:1", "python", "x.py"], "only 2"),
    (["-np", "2", "--start-timeout", "0", "python", "x.py"], "start-timeout"),
])
def test_validate_errors(argv, msg):
    with pytest.raises(ValueError, match=msg):
        L.validate(parse(argv))


def test_hostfile_with_too_few_slots(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("h1 slots=1\n")
    with pytest.raises(ValueError, match="needs 2 slots"):
        L.validate(parse(["-np", "2", "--hostfile", str(f), "python", "x.py"]))


def test_hosts_and_hostfile_are_exclusive():
    with pytest.raises(SystemExit):
        parse(["-np", "2", "-H", "a:2", "--hostfile", "f", "python", "x.py"])


def test_main_reports_usage_errors(capsys):
    assert L.main(["-np", "0", "python", "x.py"], config_keys=FAKE_KEYS) == 2
    assert "-np must be >= 1" in capsys.readouterr().err


# --------------------------------------------------------- the command line

def test_build_launch_hydra():
    args = parse(["-np", "3", "-H", "h1:2,h2:2", "--fusion-threshold-mb", "1",
                  "--mpi-args", "-bind-to core", "python", "train.py", "--epochs", "2"])
    argv, env = L.build_launch(args, FAKE_KEYS, mpiexec="/opt/mpi/mpiexec", python="/py",
                               status_dir="/tmp/st", base_env={"PATH": "/bin"})
    assert argv[:4] == ["/opt/mpi/mpiexec", "-disable-auto-cleanup", "-n", "3"]
    assert argv[argv.index("-hosts") + 1] == "h1:2,h2:1"
    i = argv.index("GRADFLOW_FUSION_THRESHOLD")
    assert argv[i - 1:i + 2] == ["-genv", "GRADFLOW_FUSION_THRESHOLD", "1048576"]
    assert argv[argv.index(W.STATUS_DIR_ENV) + 1] == "/tmp/st"
    assert "-bind-to" in argv and argv[argv.index("-bind-to") + 1] == "core"
    assert argv[-4:] == ["python", "train.py", "--epochs", "2"]
    assert argv[-7:-4] == ["/py", os.path.abspath(W.__file__), "--"]
    assert env["GRADFLOW_FUSION_THRESHOLD"] == "1048576" and env["PATH"] == "/bin"
    assert env[W.STATUS_DIR_ENV] == "/tmp/st"


def test_build_launch_local_no_hosts_and_output_dir(tmp_path):
    args = parse(["-np", "2", "--output-filename", "logs", "python", "-c", "pass"])
    argv, env = L.build_launch(args, FAKE_KEYS, base_env={})
    assert argv[:4] == ["mpiexec", "-disable-auto-cleanup", "-n", "2"] and "-hosts" not in argv
    assert not any(a.startswith("GRADFLOW_") for a in argv)
    assert env[W.OUTPUT_DIR_ENV] == os.path.abspath("logs")
    assert argv[-3:] == ["python", "-c", "pass"]


def test_build_launch_openmpi():
    args = parse(["-np", "2", "-H", "a:1,b:1", "--wire-dtype", "bf16", "python", "x.py"])
    argv, _ = L.build_launch(args, FAKE_KEYS, mpiexec="mpirun", flavor="openmpi", base_env={})
    assert argv[:3] == ["mpirun", "-np", "2"]
    assert argv[argv.index("-H") + 1] == "a:1,b:1"
    assert "GRADFLOW_WIRE_DTYPE=bf16" in argv


def test_find_mpiexec():
    assert L.find_mpiexec({"GRADFLOW_MPIEXEC": "/my/mpiexec"}) == "/my/mpiexec"
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        assert L.find_mpiexec({}) == beside


def test_rank_detection():
    assert W.detect_rank({"PMI_RANK": "3"}) == "3"
    assert W.detect_rank({"OMPI_COMM_WORLD_RANK": "1"}) == "1"
    assert W.detect_rank({}) == "?"


def test_check_build_without_native():
    text = L.check_build(None, "gradflow._native is not importable")
    assert "PyTorch" in text and "TensorFlow" in text and "MPI" in text
    assert "not available" in text


def test_check_build_with_features():
    class Native:
        @staticmethod
        def features():
            return {"allreduce_algos": ["ring", "two-sync", "mpi", "auto"],
                    "wire_dtypes": ["fp32", "fp16", "bf16"]}

    text = L.check_build(Native(), "")
    assert "ring, two-sync, mpi, auto" in text and "fp32, fp16, bf16" in text
