"""Unit tests for gradflowrun without MPI: settings flags generated from a
config_keys() list, host parsing and rank mapping, input validation, and the
mpiexec command line / environment built by build_launch (nothing is run).
"""

import os
import sys
import time

import pytest

from gradflow.runner import hosts as H
from gradflow.runner import launch as L
from gradflow.runner import rank_wrapper as W
from gradflow.runner import supervise as S

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


def test_first_failed_rank_sets_the_exit_code(capsys):
    statuses = {0: (1, False), 1: (137, False), 2: (1, False)}
    assert S._report(0, statuses, 3, [], "failed", order=[1, 2, 0]) == 137
    err = capsys.readouterr().err
    assert err.index("rank 1 exited with code 137 (SIGKILL)") < err.index("rank 2 exited")
    assert "rank 1 failed first; rank(s) 2, 0 failed after it" in err


def test_an_agreed_error_blames_no_rank(capsys):
    # Every failed rank raised because the job had failed (third field: told,
    # or its runtime reported a peer's failure): e.g. the coordinator found
    # that the ranks' steps differ. No rank is named as the first.
    told = {0: (1, False, True), 1: (1, False, True), 2: (1, False, True)}
    assert S._report(0, told, 3, [], "", order=[1, 0, 2]) == 1
    err = capsys.readouterr().err
    assert "rank(s) 0, 1, 2 failed on one job-wide error" in err
    assert "failed first" not in err
    # One rank failed on its own (not told): it is blamed, as before.
    mixed = {0: (1, False, True), 1: (3, False, False), 2: (1, False, True)}
    assert S._report(0, mixed, 3, [], "", order=[1, 0, 2]) == 3
    err = capsys.readouterr().err
    assert "rank 1 failed first; rank(s) 0, 2 failed after it" in err
    assert "job-wide" not in err
    # Told, and a rank exited 0: the "exited with code 0" explanation instead.
    early = {0: (1, False, True), 1: (0, False, False), 2: (1, False, True)}
    assert S._report(0, early, 3, [], "", order=[0, 2]) == 1
    err = capsys.readouterr().err
    assert "rank(s) 1 exited with code 0" in err and "job-wide" not in err
    # A rank a signal ended failed on its own, even when the notice of the
    # failure reached its wrapper too (CI, SIGKILL inside halving-doubling:
    # the job was reported as one job-wide error and no rank was blamed).
    killed = {0: (1, False, True), 1: (1, False, True), 2: (137, False, True),
              3: (1, False, True)}
    assert S._report(0, killed, 4, [], "", order=[2, 0, 1, 3]) == 137
    err = capsys.readouterr().err
    assert "rank 2 failed first; rank(s) 0, 1, 3 failed after it" in err and "job-wide" not in err


def test_a_rank_that_ended_gradflow_first_is_named(capsys, tmp_path):
    # Rank 1's program ended in order (fourth field: notice.FINISHED_ENV) and
    # waited in MPI_Finalize until stopped; the others' next collective failed
    # ("shutdown() was called on rank R"). It is named; no survivor is
    # blamed as the first to fail.
    statuses = {0: (1, False, False, False), 1: (143, True, False, True),
                2: (1, False, False, False)}
    assert S._report(0, statuses, 3, [], "failed", order=[0, 2]) == 1
    err = capsys.readouterr().err
    assert "gradflowrun: rank(s) 1 had already ended gradflow" in err
    assert "failed first" not in err
    # The wrapper's status line carries it (older lines without it still read).
    (tmp_path / "rank.0.exit").write_text("143 1 0 1\n")
    (tmp_path / "rank.1.exit").write_text("1 0 1\n")
    got = S._read_statuses(str(tmp_path), 2)
    assert got[0].finished and got[0].stopped and not got[1].finished and got[1].notified
    # A failed rank's own exception (fifth field): the usual report, no such guess.
    own = {0: (1, False, False, False, True), 1: (143, True, False, True, False),
           2: (1, False, False, False, False)}
    S._report(0, own, 3, [], "failed", order=[0, 2])
    err = capsys.readouterr().err
    assert "rank 0 failed first" in err and "had already ended" not in err


def test_a_signal_death_is_blamed_before_peers_that_noticed_it():
    statuses = {0: (1, False), 1: (137, False), 2: (1, False)}
    # Rank 0 noticed the dead peer and exited 0.3 s before rank 1's wrapper
    # reported the SIGKILL: rank 1 is still the one that failed first.
    assert S.failure_order({0: 10.0, 2: 10.1, 1: 10.3}, statuses) == [1, 0, 2]
    # A signal death long after an ordinary failure is not moved ahead of it.
    assert S.failure_order({0: 10.0, 1: 14.0}, statuses) == [0, 1]
    # Same instant: the killed rank first, then by rank.
    assert S.failure_order({2: 5.0, 1: 5.0 + S.SIGNAL_HEAD_START_SECONDS, 0: 5.0}, statuses) == [1, 0, 2]


def test_launcher_teardown_failure_after_every_rank_succeeded(capsys):
    ok = {0: (0, False), 1: (0, False)}
    assert S._report(-13, ok, 2, [], "") == 0  # mpiexec SIGPIPE at teardown
    assert "every rank exited with code 0; ignoring mpiexec's exit code 141" in capsys.readouterr().err
    assert S._report(-13, {0: (0, False)}, 2, [], "") == 141  # rank 1 unknown: trust mpiexec
    assert "mpiexec exited with code 141" in capsys.readouterr().err


# ------------------------------------------------ failure notices (notice.py)

def test_failure_notice_reaches_the_watcher():
    from gradflow.runner import notice as N
    r, w, env = N.open_channel()
    got = []
    try:
        assert N._claim({N.FD_ENV: str(r), N.ID_ENV: "0:0"}) is None  # not our pipe
        assert N._claim({N.FD_ENV: "x", N.ID_ENV: env[N.ID_ENV]}) is None
        env_copy = dict(env)
        assert not N._watching  # importing gradflow outside gradflowrun watches nothing
        try:
            assert N.watch(got.append, environ=env_copy)
        finally:
            N._watching = False
        assert N.FD_ENV not in env_copy  # children of the rank do not claim it again
        N.send(w, "rank 1 was killed\nby SIGKILL")
        for _ in range(200):
            if got:
                break
            time.sleep(0.01)
        assert got == ["rank 1 was killed by SIGKILL"]
    finally:
        os.close(w)
    assert N.describe_exit(1, 137) == "rank 1 was killed by SIGKILL"
    assert N.describe_exit(2, 3) == "rank 2 exited with code 3"


def test_a_notice_the_rank_could_not_read_does_not_count_as_told(tmp_path):
    """A rank SIGKILLed before gradflowrun's notice, whose wrapper a busy
    machine ran only after the notice was written, was marked "notified"
    and so was not blamed first (a CI failure of test_faults.py's
    3-1-mid-ring case). Only a notice the rank could still read counts."""
    import threading
    from gradflow.runner import notice as N
    (tmp_path / W.NOTICE_FILE).write_text("rank 2 exited with code 1\n")
    for alive in (True, False):
        r, w = os.pipe()
        if not alive:
            os.close(r)  # the rank is dead: nobody holds the read end
        told = threading.Event()
        W._watch_peers(str(tmp_path), "1", threading.Event(), w, told)
        assert told.is_set() == alive
        if alive:
            assert os.read(r, 200).startswith(b"gradflowrun reports that rank 2 exited")
            os.close(r)
        os.close(w)
    r, w = os.pipe()
    assert N.send(w, "x")
    os.close(r)
    assert not N.send(w, "x")  # EPIPE: never raises
    os.close(w)


def test_ranks_told_of_a_failure_are_blamed_after_it():
    # Rank 0 failed at the same instant, but only after it was told of rank 2's failure.
    statuses = {0: (1, False, True), 2: (3, False, False)}
    assert S.failure_order({0: 5.0, 2: 5.0}, statuses) == [2, 0]
    assert S.failure_order({0: 4.0, 2: 9.0}, statuses) == [2, 0]


def test_hydra_notice_names_the_failed_peer(tmp_path):
    (tmp_path / "rank.1.exit").write_text("137 0 0\n")
    (tmp_path / "rank.2.exit").write_text("0 0 0\n")
    assert W._hydra_notice(str(tmp_path), "0") == "rank 1 was killed by SIGKILL"
    # Rank 0 raised after being told (third field 1) and ended later: rank 1,
    # the first failure, is named first whatever the rank numbers say.
    (tmp_path / "rank.0.exit").write_text("1 0 1\n")
    os.utime(tmp_path / "rank.1.exit", (1000.0, 1000.0))
    os.utime(tmp_path / "rank.0.exit", (1001.0, 1001.0))
    assert W._hydra_notice(str(tmp_path), "2") == (
        "rank 1 was killed by SIGKILL; rank 0 exited with code 1")
    (tmp_path / "rank.0.exit").write_text("1 0 0\n")  # not told, but ended later
    os.utime(tmp_path / "rank.0.exit", (1001.0, 1001.0))
    assert W._hydra_notice(str(tmp_path), "2") == (
        "rank 1 was killed by SIGKILL; rank 0 exited with code 1")
    (tmp_path / "rank.0.exit").unlink()
    (tmp_path / "rank.1.exit").unlink()
    assert W._hydra_notice(str(tmp_path), "0") == (
        "a rank ended without finalizing MPI (hydra sent SIGUSR1); rank 2 exited with code 0")


def test_failures_seen_only_after_the_launcher_ended_are_still_ordered(tmp_path, capsys,
                                                                        monkeypatch):
    # All ranks end within one poll, together with mpiexec: ranks 0 and 2
    # failed after being told of rank 1's failure, so rank 1 is named first.
    # Two races of the test's own, not the launcher's (3 in 300 runs under
    # load, 2026-11-29): a poll reads the files one by one, so it can miss
    # rank.0.exit, then find rank.2.exit written meanwhile: rank 2 is seen a
    # poll before rank 0 and listed first among the ranks told ("2, 0"; the
    # writes' atomicity does not matter, an empty read is skipped and read
    # again). And a shell descheduled for FAILURE_GRACE_SECONDS (3 s)
    # between its writes is stopped before it writes the rest.
    monkeypatch.setattr(S, "FAILURE_GRACE_SECONDS", 600.0)
    d = str(tmp_path)
    script = (f"echo '1 0 1' > {d}/rank.0.exit; echo '3 0 0' > {d}/rank.1.exit; "
              f"echo '1 0 1' > {d}/rank.2.exit; exit 3")
    assert S.run_job(["sh", "-c", script], dict(os.environ), 3, [], 30.0, d) == 3
    err = capsys.readouterr().err
    assert ("rank 1 failed first; rank(s) 0, 2 failed after it" in err
            or "rank 1 failed first; rank(s) 2, 0 failed after it" in err), err


def test_failures_one_poll_finds_are_ordered_by_when_they_ended(tmp_path, capsys, monkeypatch):
    """Rank 2 fails (exit 3), then rank 0 (exit 1), neither told of the
    other, both before the launcher's next poll: rank 0 was named first
    (one poll's failures tied; lower rank won: 10 of 10 real 3-rank jobs
    with the two exits 10 ms apart). The wrappers' exit files say when each
    rank ended; that orders them. No timing here: rank 2's file is written
    first, so no poll can see rank 0's without it (a poll between the two
    writes sees rank 2 a poll earlier: the same answer), and the times are
    written by hand. The grace period is long so that a descheduled shell
    is not stopped between its writes."""
    monkeypatch.setattr(S, "FAILURE_GRACE_SECONDS", 600.0)
    d = str(tmp_path)
    script = (f"echo '3 0 0 0 0 1000.500000' > {d}/rank.2.exit; "
              f"echo '1 0 0 0 0 1000.510000' > {d}/rank.0.exit; exit 1")
    assert S.run_job(["sh", "-c", script], dict(os.environ), 3, [], 30.0, d) == 3
    err = capsys.readouterr().err
    assert "rank 2 failed first; rank(s) 0 failed after it" in err, err
    assert err.index("rank 2 exited with code 3") < err.index("rank 0 exited with code 1"), err
    # Without a time in the file (an older wrapper's line): its mtime.
    (tmp_path / "rank.0.exit").write_text("1 0 0\n")
    (tmp_path / "rank.2.exit").write_text("3 0 0\n")
    os.utime(tmp_path / "rank.2.exit", (900.0, 900.0))
    os.utime(tmp_path / "rank.0.exit", (901.0, 901.0))
    statuses = S._read_statuses(d, 3)
    assert (statuses[2].ended, statuses[0].ended) == (900.0, 901.0)
    assert S.failure_order({0: 7.0, 2: 7.0}, statuses) == [2, 0]
    # A rank whose process the launcher saw dead before its wrapper wrote
    # (a busy machine ran the wrapper late) counts from when it was seen.
    assert S.failure_order({0: 7.0, 2: 7.0}, statuses, gone_wall={0: 800.0}) == [0, 2]
    # Seen by different polls: the poll order stands.
    assert S.failure_order({0: 6.0, 2: 7.0}, statuses) == [0, 2]


def test_the_wrapper_writes_when_its_command_ended(tmp_path):
    """rank_wrapper's exit file: code stopped notified finished own ended."""
    import subprocess
    env = dict(os.environ, PMI_RANK="1", **{W.STATUS_DIR_ENV: str(tmp_path)})
    before = time.time()
    r = subprocess.run([sys.executable, W.__file__, "--", "sh", "-c", "exit 3"], env=env)
    after = time.time()
    assert r.returncode == 3
    fields = (tmp_path / "rank.1.exit").read_text().split()
    assert fields[:5] == ["3", "0", "0", "0", "0"], fields
    got = S._read_statuses(str(tmp_path), 2)[1]
    assert got.code == 3 and before <= got.ended <= after, (before, got, after)
