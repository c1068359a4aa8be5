"""The SLURM launch files (examples/slurm/*.sbatch) start the Makefile's commands on every node.

Each test runs the real file under bash as sbatch would on the first node of a 2-node x 8-GPU
allocation: SLURM's variables set, and SLURM's commands (``scontrol``, ``srun``) plus the
environment's ``torchrun`` (and its ``python -m pipelines.launch``, torchrun with janus's signal
handling) replaced by small programs that record their arguments. The recording ``srun`` starts its
command once per node, with that node's ``SLURM_NODEID``, and forwards signals to them, as srun does.
The recorded torchrun command lines are read back with torchrun's own argument parser.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser

from helpers.commands import SLURM_DIR, make_command
from helpers.profiles import file_digests
from janus_train.loop.preemption import PREEMPTED_EXIT_CODE

HOSTS = ("gpu-07", "gpu-08")


NODELIST = "gpu-[07-08]"


GPUS_PER_NODE = 8


CPUS_PER_NODE = 64


JOB_ID = 81234


# Programs that stand in for SLURM's commands and for torchrun: each records how it was called in
# $STUB_LOG (JSON). srun runs its command on every node of $STUB_HOSTS at once, as srun does.
SCONTROL = """
import json, os, sys
log = os.environ["STUB_LOG"]
if sys.argv[1:2] == ["requeue"]:
    with open(os.path.join(log, "scontrol-requeue.json"), "w") as f:
        json.dump(sys.argv[1:], f)
    sys.exit(0)
with open(os.path.join(log, "scontrol.json"), "w") as f:
    json.dump(sys.argv[1:], f)
if sys.argv[1:3] != ["show", "hostnames"]:
    sys.exit("scontrol stand-in: only 'show hostnames' and 'requeue' are known")
print("\\n".join(os.environ["STUB_HOSTS"].split()))
"""


SRUN = """
import json, os, signal, subprocess, sys
args = sys.argv[1:]
first = next(i for i, a in enumerate(args) if not a.startswith("-"))
with open(os.path.join(os.environ["STUB_LOG"], "srun.json"), "w") as f:
    json.dump({"options": args[:first], "command": args[first:]}, f)
nodes = []
for forwarded in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
    signal.signal(forwarded, lambda number, frame: [node.send_signal(number) for node in nodes])
nodes += [
    subprocess.Popen(args[first:], env={**os.environ, "SLURM_NODEID": str(n), "SLURM_PROCID": str(n),
                                        "SLURM_LOCALID": "0", "SLURMD_NODENAME": host})
    for n, host in enumerate(os.environ["STUB_HOSTS"].split())
]
sys.exit(max(node.wait() for node in nodes))
"""


TORCHRUN = """
import json, os, sys
names = ("SLURM_NODEID", "SLURMD_NODENAME", "JANUS_VGGT_PATH", "JANUS_QWEN_PATH")
with open(os.path.join(os.environ["STUB_LOG"], "torchrun-%s.json" % os.environ["SLURMD_NODENAME"]), "w") as f:
    json.dump({"argv": sys.argv[1:], "env": {name: os.environ.get(name) for name in names}}, f)
"""


# The environment's python, for ``python -m pipelines.launch [--launcher-log FILE] TORCHRUN_ARGS``:
# records torchrun's arguments as TORCHRUN does and exits with $STUB_EXIT (0); with $STUB_STOP_SIGNAL,
# only once that signal has arrived (as a run stopping with a checkpoint), else with code 1 after 60 s.
PYTHON = """
import json, os, signal, sys, time
assert sys.argv[1:3] == ["-m", "pipelines.launch"], sys.argv
args, launcher_log = sys.argv[3:], None
if args[:1] == ["--launcher-log"]:
    launcher_log, args = args[1], args[2:]
names = ("SLURM_NODEID", "SLURMD_NODENAME", "JANUS_VGGT_PATH", "JANUS_QWEN_PATH")
host = os.environ["SLURMD_NODENAME"]
stop = os.environ.get("STUB_STOP_SIGNAL")
received = []
if stop:
    signal.signal(getattr(signal, stop), lambda number, frame: received.append(number))
with open(os.path.join(os.environ["STUB_LOG"], "torchrun-%s.json" % host), "w") as f:
    json.dump({"argv": args, "launcher_log": launcher_log, "env": {name: os.environ.get(name) for name in names}}, f)
if not stop:
    sys.exit(int(os.environ.get("STUB_EXIT", "0")))
open(os.path.join(os.environ["STUB_LOG"], "ready-%s" % host), "w").close()
deadline = time.monotonic() + 60
while not received and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(int(os.environ.get("STUB_EXIT", "0")) if received else 1)
"""


def write_program(path: Path, source: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{source}")
    path.chmod(0o755)


@dataclass(frozen=True)
class Submission:
    """One run of an sbatch file: its exit, output and what srun, scontrol and each torchrun got."""

    returncode: int
    output: str
    log: Path

    def recorded(self, name: str):
        path = self.log / f"{name}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def torchruns(self) -> dict[str, dict]:
        return {host: self.recorded(f"torchrun-{host}") for host in HOSTS if self.recorded(f"torchrun-{host}")}


@dataclass(frozen=True)
class Cluster:
    """Runs an sbatch file as SLURM would on the first node of a 2-node x 8-GPU allocation."""

    root: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / "slurm-bin"

    @property
    def venv(self) -> Path:
        """An environment whose torchrun records its arguments (the default VENV)."""
        return self.root / "venv"

    def submit(self, script: str, *args: str, drop: tuple[str, ...] = (), hosts: tuple[str, ...] = HOSTS,
               timeout: float = 60, signal_when_ready: int | None = None, **variables: str) -> Submission:
        """Run ``script`` with ``args``; ``variables`` added to and ``drop`` removed from the job's
        environment; ``hosts``: the machines srun starts the command on; ``signal_when_ready``: sent
        to the batch shell alone (as ``#SBATCH --signal=B:...``) once every node's launcher runs."""
        log = Path(tempfile.mkdtemp(prefix="log-", dir=self.root))
        slurm = {
            "SLURM_JOB_ID": str(JOB_ID), "SLURM_JOB_NODELIST": NODELIST, "SLURM_NNODES": str(len(HOSTS)),
            "SLURM_JOB_NUM_NODES": str(len(HOSTS)), "SLURM_NODEID": "0", "SLURMD_NODENAME": HOSTS[0],
            "SLURM_GPUS_ON_NODE": str(GPUS_PER_NODE), "SLURM_CPUS_ON_NODE": str(CPUS_PER_NODE),
        }
        env = {"PATH": f"{self.bin_dir}:/usr/bin:/bin", "HOME": str(self.root), "STUB_LOG": str(log),
               "STUB_HOSTS": " ".join(hosts), "VENV": str(self.venv), **slurm, **variables}
        for name in drop:
            env.pop(name)
        shell = subprocess.Popen(["bash", str(SLURM_DIR / script), *args], env=env, cwd=self.root,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            if signal_when_ready is not None:
                deadline = time.monotonic() + timeout
                while not all((log / f"ready-{host}").exists() for host in hosts):
                    assert shell.poll() is None and time.monotonic() < deadline, shell.communicate()[0]
                    time.sleep(0.02)
                shell.send_signal(signal_when_ready)
            output, _ = shell.communicate(timeout=timeout)
        finally:
            if shell.poll() is None:
                shell.kill()
        return Submission(shell.returncode, output, log)


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    cluster = Cluster(tmp_path)
    write_program(cluster.bin_dir / "scontrol", SCONTROL)
    write_program(cluster.bin_dir / "srun", SRUN)
    write_program(cluster.venv / "bin" / "torchrun", TORCHRUN)
    write_program(cluster.venv / "bin" / "python", PYTHON)
    return cluster


def check_launch(submission: Submission, module: str, module_args: list[str]) -> None:
    """Both nodes ran torchrun once, ranked by SLURM_NODEID, joining the first host with 8 processes."""
    assert submission.returncode == 0, submission.output
    assert submission.recorded("scontrol") == ["show", "hostnames", NODELIST]
    srun = submission.recorded("srun")
    assert {"--ntasks-per-node=1", f"--cpus-per-task={CPUS_PER_NODE}", "--kill-on-bad-exit=1"} <= set(srun["options"])
    runs = submission.torchruns()
    assert sorted(runs) == list(HOSTS)
    ports = set()
    for node_id, host in enumerate(HOSTS):
        args = get_args_parser().parse_args(runs[host]["argv"])
        assert runs[host]["env"]["SLURM_NODEID"] == str(node_id)
        assert args.node_rank == node_id
        assert args.nnodes == "2"
        assert args.nproc_per_node == str(GPUS_PER_NODE)
        assert args.rdzv_backend == "static"
        assert args.master_addr == HOSTS[0]
        assert 1024 < args.master_port < 65536
        ports.add(args.master_port)
        assert args.module and args.training_script == module
        assert args.training_script_args == module_args
    assert len(ports) == 1, f"the nodes disagree on the rendezvous port: {ports}"
    if module == "pipelines.train":  # through pipelines.launch, its report in the run, one file per node
        run = Path(module_args[module_args.index("--out") + 1])
        assert [runs[host]["launcher_log"] for host in HOSTS] == [str(run / f"launcher-node{n}.log")
                                                                  for n in range(len(HOSTS))]
    assert f"2 nodes x 8 processes, rendezvous {HOSTS[0]}:{ports.pop()}" in submission.output


def test_precompute_runs_the_makefile_command_on_both_nodes(cluster: Cluster, tmp_path: Path) -> None:
    data, out = tmp_path / "my data", tmp_path / "cache dir"
    submission = cluster.submit("precompute.sbatch", "--workers", "12", DATA=str(data), OUT=str(out), PROFILE="h800",
                         FORMAT="wds")
    expected = [str(data), "--out", str(out), "--profile", "h800", "--format", "wds", "--workers", "12"]
    check_launch(submission, "pipelines.precompute", expected)
    make = make_command("precompute", DATA=str(data), OUT=str(out), PROFILE="h800",
                            FORMAT="wds", PRECOMPUTE_ARGS="--workers 12")
    assert make == ["pipelines.precompute", *expected]


def test_train_runs_the_makefile_command_on_both_nodes(cluster: Cluster, tmp_path: Path) -> None:
    cache, run = tmp_path / "cache dir", tmp_path / "runs" / "r2r"
    submission = cluster.submit("train.sbatch", "--max-steps", "100", CACHE=str(cache), RUN=str(run), PROFILE="h800")
    expected = ["--cache", str(cache), "--out", str(run), "--profile", "h800", "--max-steps", "100"]
    check_launch(submission, "pipelines.train", expected)
    make = make_command("train", CACHE=str(cache), RUN=str(run), PROFILE="h800",
                            TRAIN_ARGS="--max-steps 100")
    assert make == ["pipelines.train", *expected]


@pytest.mark.parametrize("script", ["precompute.sbatch", "train.sbatch"])
def test_every_node_gets_the_model_paths(cluster: Cluster, script: str) -> None:
    submission = cluster.submit(script, JANUS_VGGT_PATH="/models/vggt", JANUS_QWEN_PATH="/models/qwen")
    assert submission.returncode == 0, submission.output
    for run in submission.torchruns().values():
        assert run["env"]["JANUS_VGGT_PATH"] == "/models/vggt"
        assert run["env"]["JANUS_QWEN_PATH"] == "/models/qwen"


@pytest.mark.parametrize("script", ["precompute.sbatch", "train.sbatch"])
def test_the_port_follows_the_job_id_unless_master_port_is_set(cluster: Cluster, script: str) -> None:
    """Two jobs sharing a host get different ports; MASTER_PORT wins when given."""
    ports = []
    for job_id in (JOB_ID, JOB_ID + 1):
        submission = cluster.submit(script, SLURM_JOB_ID=str(job_id))
        assert submission.returncode == 0, submission.output
        ports.append(get_args_parser().parse_args(submission.torchruns()[HOSTS[1]]["argv"]).master_port)
    assert ports[0] != ports[1]
    submission = cluster.submit(script, MASTER_PORT="31337")
    assert submission.returncode == 0, submission.output
    assert get_args_parser().parse_args(submission.torchruns()[HOSTS[1]]["argv"]).master_port == 31337


@pytest.mark.parametrize("script", ["precompute.sbatch", "train.sbatch"])
def test_nproc_overrides_the_gpu_count(cluster: Cluster, script: str) -> None:
    submission = cluster.submit(script, NPROC="4")
    assert submission.returncode == 0, submission.output
    for run in submission.torchruns().values():
        assert get_args_parser().parse_args(run["argv"]).nproc_per_node == "4"


@pytest.mark.parametrize("script", ["precompute.sbatch", "train.sbatch"])
@pytest.mark.parametrize(
    ("problem", "change", "message"),
    [
        ("outside a job", {"drop": ("SLURM_JOB_ID",)}, r"not inside a SLURM job: submit this file with sbatch"),
        ("no environment", {"VENV": "/nowhere/.venv"}, r"no /nowhere/\.venv/bin/torchrun: set VENV"),
        ("no GPUs", {"drop": ("SLURM_GPUS_ON_NODE",)}, r"no GPU count for this node: keep #SBATCH --gpus-per-node"),
        ("no hosts", {"hosts": ()}, r"scontrol show hostnames gave no host for SLURM_JOB_NODELIST=gpu-\[07-08\]"),
    ],
)
def test_a_wrong_setup_stops_before_srun_with_one_line(cluster: Cluster, script: str, problem: str, change: dict,
                                                       message: str) -> None:
    submission = cluster.submit(script, **change)
    assert submission.returncode == 2, submission.output
    assert re.fullmatch(rf"error: {message}[^\n]*\n", submission.output), submission.output
    assert submission.recorded("srun") is None


def test_two_nodes_launched_by_precompute_sbatch_build_the_one_process_cache(
    cluster: Cluster, sample_dataset: Path, tmp_path: Path
) -> None:
    """The real torchrun on both "nodes" (two agents on this machine, one process each) forms one
    job of 2 ranks that writes the cache a single plain process writes, byte for byte."""
    venv = Path(sys.prefix)
    out = tmp_path / "cache"
    submission = cluster.submit("precompute.sbatch", "--workers", "1", hosts=("localhost", "localhost"),
                         timeout=600, VENV=str(venv), DATA=str(sample_dataset), OUT=str(out), PROFILE="tiny",
                         NPROC="1", OMP_NUM_THREADS="1")
    assert submission.returncode == 0, submission.output[-4000:]
    assert "2 nodes x 1 process, rendezvous localhost:" in submission.output
    # Rank 0 alone prints the plan, with the job's world size: one job, not two of one process.
    assert submission.output.count("processes x 1 decode worker ") == 1, submission.output[-4000:]
    assert "with 2 processes x 1 decode worker " in submission.output

    single = tmp_path / "single"
    plain = subprocess.run([str(venv / "bin" / "janus-cache"), "precompute", str(sample_dataset), "--out", str(single),
                            "--profile", "tiny", "--workers", "1"], env={**os.environ, "OMP_NUM_THREADS": "1"},
                           capture_output=True, text=True, timeout=600, check=False)
    assert plain.returncode == 0, (plain.stdout + plain.stderr)[-4000:]
    assert file_digests(out) == file_digests(single)


# ----------------------------------------------------------------------------------- preemption


@pytest.mark.parametrize(("code", "requeued"), [(PREEMPTED_EXIT_CODE, True), (0, False), (1, False)])
def test_train_requeues_itself_only_when_the_run_stopped_with_a_checkpoint(cluster: Cluster, code: int,
                                                                         requeued: bool) -> None:
    submission = cluster.submit("train.sbatch", STUB_EXIT=str(code))
    assert submission.returncode == code, submission.output
    assert submission.recorded("scontrol-requeue") == (["requeue", str(JOB_ID)] if requeued else None)
    assert ("requeueing job" in submission.output) == requeued


def test_sigusr1_to_the_batch_shell_reaches_every_nodes_launcher_and_the_job_requeues(cluster: Cluster) -> None:
    """``--signal=B:USR1@600`` signals the batch shell alone: it forwards to srun, srun to each node's
    launcher; the launchers stop with the preemption code and the job requeues itself."""
    submission = cluster.submit("train.sbatch", signal_when_ready=signal.SIGUSR1, STUB_STOP_SIGNAL="SIGUSR1",
                                STUB_EXIT=str(PREEMPTED_EXIT_CODE))
    assert submission.returncode == PREEMPTED_EXIT_CODE, submission.output
    assert submission.recorded("scontrol-requeue") == ["requeue", str(JOB_ID)]
    assert "janus: SIGUSR1: the ranks save a checkpoint after their step and stop" in submission.output


# The reference evaluation's torchrun (the JanusVLN environment's): records its arguments and, as
# src/evaluation.py does, writes OUTPUT/result.json: one line per episode, then rank 0's summary line.
EVAL_TORCHRUN = """
import json, os, sys
args = sys.argv[1:]
with open(os.path.join(os.environ["STUB_LOG"], "torchrun-eval.json"), "w") as f:
    json.dump({"argv": args, "cwd": os.getcwd()}, f)
out = args[args.index("--output_path") + 1]
os.makedirs(out, exist_ok=True)
episodes = [{"scene_id": "zsNo4HB9uLZ", "episode_id": 1, "success": 1.0, "spl": 0.8, "os": 1.0, "ne": 1.5, "steps": 40,
             "episode_instruction": "walk out of the kitchen"},
            {"scene_id": "zsNo4HB9uLZ", "episode_id": 2, "success": 0.0, "spl": 0.0, "os": 1.0, "ne": 6.5, "steps": 90,
             "episode_instruction": "go up the stairs"}]
with open(os.path.join(out, "result.json"), "a") as f:
    for episode in episodes:
        f.write(json.dumps(episode) + "\\n")
    f.write(json.dumps({"sucs_all": 0.5, "spls_all": 0.4, "oss_all": 1.0, "ones_all": 4.0, "length": 2}) + "\\n")
"""


def test_eval_runs_the_reference_evaluation_on_the_export_and_writes_janus_results(cluster: Cluster,
                                                                                  tmp_path: Path) -> None:
    """``train.eval_command: sbatch examples/slurm/eval.sbatch {export} {results}``: the job runs the
    reference entry point (src/evaluation.py under torchrun, one process per GPU, in the JanusVLN
    checkout) with the export as --model_path, and turns its summary line into the results janus
    reads: SR, SPL, OSR, NE and the episode count."""
    from janus_train.evals.record import read_results

    reference = tmp_path / "JanusVLN"
    (reference / "src").mkdir(parents=True)
    (reference / "src" / "evaluation.py").write_text("# the reference evaluation\n")
    write_program(cluster.bin_dir / "torchrun", EVAL_TORCHRUN)
    folder = tmp_path / "run" / "evals" / "step00001000"
    (folder / "export").mkdir(parents=True)
    submission = cluster.submit("eval.sbatch", str(folder / "export"), str(folder / "results.json"),
                                JANUSVLN_DIR=str(reference))
    assert submission.returncode == 0, submission.output
    torchrun = submission.recorded("torchrun-eval")
    assert torchrun["cwd"] == str(reference)
    args = torchrun["argv"]
    assert args[:1] == [f"--nproc_per_node={GPUS_PER_NODE}"] and args[1].startswith("--master_port=")
    assert args[2:] == ["src/evaluation.py", "--model_path", str(folder / "export"),
                        "--habitat_config_path", "config/vln_r2r.yaml", "--output_path", str(folder / "janusvln"),
                        "--eval_split", "val_unseen"]
    assert read_results(folder / "results.json") == {"SR": 0.5, "SPL": 0.4, "OSR": 1.0, "NE": 4.0, "episodes": 2.0}
    assert not list(folder.glob(".*.tmp"))


def test_eval_without_the_reference_code_stops_in_one_line(cluster: Cluster, tmp_path: Path) -> None:
    submission = cluster.submit("eval.sbatch", str(tmp_path), str(tmp_path / "results.json"),
                                JANUSVLN_DIR=str(tmp_path / "nowhere"))
    assert submission.returncode == 2
    assert re.fullmatch(r"error: \S+/nowhere/src/evaluation\.py does not exist: set JANUSVLN_DIR[^\n]*\n",
                        submission.output), submission.output
