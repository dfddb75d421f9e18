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


@pytest.mark.parametrize("name", ["-oProxyCommand=touch${IFS}/tmp/x", "-x", ".hidden",
                                  "a;b", "h$(id)", "h`id`", "a/b"])
def test_host_names_that_are_not_names_are_refused(name, tmp_path, capsys):
    # A leading '-' would reach ssh's / hydra's argv as an option.
    with pytest.raises(ValueError, match="bad host name"):
        H.parse_hosts(f"good:1,{name}:2")
    with pytest.raises(ValueError, match="bad host name"):
        H.parse_hosts(name)
    with pytest.raises(ValueError, match="hostfile:2: bad host name"):
        H.parse_hostfile(["good slots=1\n", f"{name} slots=2\n"])
    with pytest.raises(ValueError, match="bad host name"):
        H.parse_hostfile([f"{name}:2\n"])
    assert L.main(["-np", "2", f"--hosts={name}:2", "python", "x.py"], config_keys=FAKE_KEYS) == 2
    assert "bad host name" in capsys.readouterr().err
    assert H.parse_hosts("node-1.example.com:2,10.0.0.7,gpu_03") == [
        H.HostSlots("node-1.example.com", 2), H.HostSlots("10.0.0.7", 1),
        H.HostSlots("gpu_03", 1)]


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


@pytest.mark.parametrize("elastic", [[], ["--min-np", "1", "--host-discovery-script", "x"]])
def test_out_of_range_settings_flag_fails_before_launching(elastic, capsys, monkeypatch):
    """A settings flag the core refuses (`--sparse-ratio 2`) is a usage error
    of gradflowrun (exit 2, the core's message, nothing launched); it used to
    start the job, and every rank's init() raised the same error ("rank 0
    failed first")."""
    pytest.importorskip("gradflow._native")
    for name in ("run_job", "run_elastic"):
        monkeypatch.setattr(L, name, lambda *a, **k: pytest.fail("the job was launched"))
    assert L.main(["-np", "2", *elastic, "--sparse-ratio", "2", "python", "x.py"]) == 2
    err = capsys.readouterr().err
    assert "error: invalid value '2.0' for GRADFLOW_SPARSE_RATIO (--sparse-ratio)" in err, err
    assert "1e-06 <= value <= 1" in err, err


def test_output_filename_that_is_a_file_fails_before_launching(capsys, monkeypatch, tmp_path):
    """--output-filename naming an existing file: exit 2 before launching.
    It used to start the job; every rank failed to create DIR/rank.N/ (exit
    2) and gradflowrun named one of them as the rank that failed first
    (helper-15's audit). Elastic mode refuses the flag altogether."""
    for name in ("run_job", "run_elastic"):
        monkeypatch.setattr(L, name, lambda *a, **k: pytest.fail("the job was launched"))
    out = tmp_path / "out"
    out.write_text("")
    assert L.main(["-np", "2", "--output-filename", str(out), "python", "x.py"]) == 2
    err = capsys.readouterr().err
    assert f"--output-filename {out}: exists and is not a directory" in err, err


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
    # survivors of a dead rank must live to raise (hydra: -disable-auto-cleanup)
    joined = " ".join(argv)
    assert "--mca orte_abort_on_non_zero_status 0" in joined
    assert "--mca orte_allowed_exit_without_sync 1" in joined


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


# ------------------------------------- network interface, ssh, launcher choice

def test_network_interface_hydra_and_env():
    args = parse(["-np", "2", "-H", "a:1,b:1", "--network-interface", "eth1", "python", "x.py"])
    argv, env = L.build_launch(args, FAKE_KEYS, mpiexec="mpiexec", base_env={})
    assert argv[argv.index("-iface") + 1] == "eth1"
    for name in ("FI_TCP_IFACE", "FI_SOCKETS_IFACE", "UCX_NET_DEVICES"):
        assert env[name] == "eth1"
        i = argv.index(name)
        assert argv[i - 1:i + 2] == ["-genv", name, "eth1"]  # remote ranks get it too


def test_network_interface_openmpi_and_srun():
    args = parse(["-np", "2", "--network-interface", "ib0", "python", "x.py"])
    argv, _ = L.build_launch(args, FAKE_KEYS, mpiexec="mpirun", flavor="openmpi", base_env={})
    assert " ".join(argv).count("_tcp_if_include ib0") == 2
    assert "FI_TCP_IFACE=ib0" in argv
    argv, env = L.build_launch(args, FAKE_KEYS, mpiexec="srun", flavor="srun", base_env={})
    assert "-iface" not in argv and env["UCX_NET_DEVICES"] == "ib0"


@pytest.mark.parametrize("bad", ["", "eth0,eth1", "eth 0"])
def test_network_interface_must_be_one_name(bad):
    with pytest.raises(ValueError, match="--network-interface"):
        L.validate(parse(["-np", "1", "--network-interface", bad, "x"]))


def test_ssh_options_hydra_use_a_wrapper_script(tmp_path):
    key = tmp_path / "id_test"
    key.write_text("not a real key")
    args = parse(["-np", "2", "-H", "a:1,b:1", "-p", "2222", "-i", str(key),
                  "python", "x.py"])
    assert L.ssh_command(args) == ["ssh", "-p", "2222", "-i", str(key)]
    argv, _ = L.build_launch(args, FAKE_KEYS, status_dir=str(tmp_path), base_env={})
    wrapper = str(tmp_path / L.SSH_WRAPPER_NAME)
    i = argv.index("-launcher")
    assert argv[i:i + 4] == ["-launcher", "ssh", "-launcher-exec", wrapper]
    # hydra execs -launcher-exec as one file name, so the options live in a script.
    L.write_ssh_wrapper(wrapper, L.ssh_command(args))
    assert os.access(wrapper, os.X_OK)
    body = open(wrapper).read()
    assert body.startswith("#!/bin/sh\n") and f'exec ssh -p 2222 -i {key} "$@"' in body


def test_ssh_wrapper_passes_arguments_through(tmp_path):
    fake_ssh = tmp_path / "bin"
    fake_ssh.mkdir()
    (fake_ssh / "ssh").write_text('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    (fake_ssh / "ssh").chmod(0o755)
    wrapper = str(tmp_path / "w")
    L.write_ssh_wrapper(wrapper, ["ssh", "-p", "22", "-i", "/k ey"])
    import subprocess
    out = subprocess.run([wrapper, "-x", "host1", "proxy --arg 'a b'"], capture_output=True,
                         text=True, env={"PATH": f"{fake_ssh}:/usr/bin:/bin"}, check=True).stdout
    assert out.split("\n")[:7] == ["[-p]", "[22]", "[-i]", "[/k ey]", "[-x]", "[host1]",
                                   "[proxy --arg 'a b']"]


def test_ssh_options_openmpi_and_srun(tmp_path):
    args = parse(["-np", "2", "--ssh-port", "2200", "python", "x.py"])
    argv, _ = L.build_launch(args, FAKE_KEYS, mpiexec="mpirun", flavor="openmpi", base_env={})
    i = argv.index("plm_rsh_args")
    assert argv[i - 1:i + 2] == ["--mca", "plm_rsh_args", "-p 2200"]
    with pytest.raises(ValueError, match="do not apply to srun"):
        L.build_launch(args, FAKE_KEYS, mpiexec="srun", flavor="srun", base_env={})


@pytest.mark.parametrize("argv,msg", [
    (["-np", "1", "-p", "0", "x"], "ssh-port"),
    (["-np", "1", "-p", "70000", "x"], "ssh-port"),
    (["-np", "1", "--ssh-identity-file", "/no/such/key", "x"], "no such file"),
])
def test_ssh_option_errors(argv, msg):
    with pytest.raises(ValueError, match=msg):
        L.validate(parse(argv))


def test_build_launch_srun():
    args = parse(["-np", "4", "--cache-capacity", "9", "python", "x.py"])
    argv, env = L.build_launch(args, FAKE_KEYS, mpiexec="/usr/bin/srun", flavor="srun",
                               python="/py", status_dir="/tmp/st", base_env={})
    assert argv[:5] == ["/usr/bin/srun", "--ntasks", "4", "--kill-on-bad-exit=0", "--mpi=pmi2"]
    assert argv[5:8] == ["/py", os.path.abspath(W.__file__), "--"]
    assert env["GRADFLOW_CACHE_CAPACITY"] == "9" and env[W.STATUS_DIR_ENV] == "/tmp/st"
    args = parse(["-np", "3", "-H", "n1:2,n2:2", "python", "x.py"])
    with pytest.raises(ValueError, match="equal slots"):  # 3 ranks on 2+2 slots: 2 and 1
        L.build_launch(args, FAKE_KEYS, mpiexec="srun", flavor="srun", base_env={})
    args = parse(["-np", "4", "-H", "n1:2,n2:2", "--mpi-args=--mpi=pmi2", "python", "x.py"])
    argv, _ = L.build_launch(args, FAKE_KEYS, mpiexec="srun", flavor="srun", base_env={})
    line = " ".join(argv)
    assert "--nodes 2 --ntasks-per-node 2 --nodelist n1,n2 --distribution block --mpi=pmi2" in line
    assert line.count("--mpi") == 1  # the user's choice, not a second default
    # A plugin chosen in the environment (srun reads $SLURM_MPI_TYPE) is kept.
    args = parse(["-np", "2", "--mpi-args=--mpi pmix", "python", "x.py"])
    argv, _ = L.build_launch(args, FAKE_KEYS, mpiexec="srun", flavor="srun", base_env={})
    assert "--mpi=pmi2" not in argv and argv[-7:-5] == ["--mpi", "pmix"]
    args = parse(["-np", "2", "python", "x.py"])
    argv, _ = L.build_launch(args, FAKE_KEYS, mpiexec="srun", flavor="srun",
                             base_env={"SLURM_MPI_TYPE": "pmix"})
    assert not [a for a in argv if a.startswith("--mpi")]


def fake_which(*present):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def test_choose_launcher_auto_detects_slurm(monkeypatch):
    args = parse(["-np", "2", "python", "x.py"])
    slurm = {"SLURM_JOB_ID": "42"}
    assert L.choose_launcher(args, slurm, fake_which("srun")) == ("/usr/bin/srun", "srun")
    # No srun, or hosts given explicitly: the MPI launcher.
    monkeypatch.setattr(L, "detect_flavor", lambda exe: "hydra")
    env = dict(slurm, GRADFLOW_MPIEXEC="/my/mpiexec")
    assert L.choose_launcher(args, env, fake_which()) == ("/my/mpiexec", "hydra")
    with_hosts = parse(["-np", "2", "-H", "a:2", "python", "x.py"])
    assert L.choose_launcher(with_hosts, env, fake_which("srun")) == ("/my/mpiexec", "hydra")
    # Outside Slurm, auto never picks srun.
    assert L.choose_launcher(args, {"GRADFLOW_MPIEXEC": "/m"}, fake_which("srun"))[1] == "hydra"


def test_choose_launcher_explicit(monkeypatch):
    srun = parse(["-np", "2", "--launcher", "srun", "python", "x.py"])
    assert L.choose_launcher(srun, {}, fake_which("srun")) == ("/usr/bin/srun", "srun")
    with pytest.raises(ValueError, match="no srun"):
        L.choose_launcher(srun, {}, fake_which())
    ompi = parse(["-np", "2", "--launcher", "openmpi", "python", "x.py"])
    monkeypatch.setattr(L, "detect_flavor", lambda exe: "openmpi" if "ompi" in exe else "hydra")
    assert L.choose_launcher(ompi, {"GRADFLOW_MPIEXEC": "/opt/ompi/mpirun"}, fake_which()) == (
        "/opt/ompi/mpirun", "openmpi")
    with pytest.raises(ValueError, match="no Open MPI"):
        L.choose_launcher(ompi, {}, fake_which("mpirun"))  # an MPICH mpirun is not Open MPI
