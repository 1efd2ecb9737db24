"""Every launch path trains, proven with real rendezvous over loopback (CPU, gloo, DeepSpeed's CPU
accelerator, ZeRO-2): Slurm multi-node (the exact per-node commands slurm/train_multinode.sh generates,
run by a fake srun as two "machines"), scripts/train/launch.sh over a hostfile (fake ssh / pdsh),
accelerate's DeepSpeed hostfile runner, DeepSpeed's own launcher and torchrun. Each run's losses equal
the same 2-process `accelerate launch`: the launchers differ, the training does not.

The quickstart trains 4 steps in each (~20-40 s a launch, mostly imports)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_stubs import install_cluster_stubs, stub_env
from conftest import REPO, accelerate_launch_cmd, free_port, read_metrics, wait_for_step

QUICKSTART = "configs/quickstart.yaml"
FEW_STEPS = [
    "train.length.steps=4",
    "train.micro_batch_size=16",
    "train.eval.every=null",
    "train.checkpoint.every=null",
    "train.lr_schedule.warmup.steps=2",
]
# Long enough that a stop signal lands mid-run; checkpoints only on the stop.
MANY_STEPS = ["train.length.steps=2000", "train.eval.every=null", "train.checkpoint.every=null"]
PYTHON_BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def losses(run_dir: Path) -> list[float]:
    return [line["loss"] for line in read_metrics(run_dir)[0]]


def run(cmd: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{cmd[:3]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return proc


def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """A launch left running (to be signalled), its output merged in one pipe."""
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


@pytest.fixture(scope="module")
def reference_losses(tmp_path_factory) -> list[float]:
    """`accelerate launch` on one machine, 2 processes, ZeRO-2: what every launcher must reproduce."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    cmd = accelerate_launch_cmd(
        "--config_file", "configs/accelerate_cpu_2proc.yaml", "-m", "framer_ds", "train"
    )
    run([*cmd, QUICKSTART, f"output_dir={run_dir}", *FEW_STEPS], {**os.environ, "OMP_NUM_THREADS": "1"})
    found = losses(run_dir)
    assert len(found) == 4
    return found


@pytest.fixture
def cluster(tmp_path) -> dict[str, str]:
    """Fake srun/scontrol/sbatch/ssh/pdsh first on PATH; a hostfile of two names for this machine."""
    bin_dir = install_cluster_stubs(tmp_path)
    (tmp_path / "hostfile").write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    return stub_env(tmp_path, bin_dir, PYTHON_BIN, FAKE_NODELIST="localhost,127.0.0.1", FAKE_JOB_ID="4242")


def calls(env: dict[str, str], tool: str) -> list[str]:
    path = Path(env["STUB_LOG"]) / f"{tool}_calls"
    return path.read_text().splitlines() if path.exists() else []


# --- Slurm, two nodes --------------------------------------------------------------------------------


def test_slurm_multinode_trains_like_one_machine(cluster, reference_losses, tmp_path):
    """sbatch --nodes=2: the rendezvous check runs first under the same launch, then one srun task per
    node whose machine rank comes from SLURM_NODEID inside the task."""
    run_dir = tmp_path / "run"
    env = {**cluster, "CONFIG": QUICKSTART, "OUTPUT_DIR": str(run_dir), "GPUS_PER_NODE": "1"}
    env["MASTER_PORT"] = str(free_port())
    proc = run(["sbatch", "--nodes=2", "slurm/train_multinode.sh", *FEW_STEPS], env)
    assert losses(run_dir) == reference_losses
    env_check, train = calls(env, "srun")
    assert "framer_ds env" in env_check and "framer_ds train" in train
    # The rank is not fixed on the batch host (it would be the same on every node).
    assert "--machine_rank" not in train and "--num_processes 2" in train and "--num_machines 2" in train
    assert f"--main_process_ip localhost --main_process_port {env['MASTER_PORT']}" in train
    assert "machine rank 0" in proc.stdout and "machine rank 1" in proc.stdout
    assert "rendezvous: 2 ranks" in proc.stdout and "all-reduce ok" in proc.stdout
    assert calls(env, "scontrol") == ["show hostnames localhost,127.0.0.1"]  # no requeue: it finished


def test_slurm_multinode_usr1_checkpoints_every_node_and_requeues(cluster, tmp_path):
    run_dir = tmp_path / "run"
    env = {
        **cluster,
        "CONFIG": QUICKSTART,
        "OUTPUT_DIR": str(run_dir),
        "GPUS_PER_NODE": "1",
        "ENV_CHECK": "0",
    }
    env["MASTER_PORT"] = str(free_port())
    job = start(["sbatch", "--nodes=2", "slurm/train_multinode.sh", *MANY_STEPS], env)
    wait_for_step(run_dir, 3, job)
    job.send_signal(signal.SIGUSR1)  # Slurm's B:USR1 goes to the batch shell only
    out, _ = job.communicate(timeout=180)
    assert job.returncode == 0, out[-4000:]
    assert "requeue 4242" in calls(env, "scontrol"), out[-3000:]
    marker = (run_dir / "preempted.json").read_text()
    step = int(marker.split('"step": ')[1].split(",")[0])
    assert 3 <= step < 2000 and (run_dir / "checkpoints" / f"step_{step}").is_dir()
    assert out.count("USR1 received") >= 3  # the batch shell, then each node's task


# --- hostfile: scripts/train/launch.sh and accelerate's DeepSpeed runner -------------------------------


def test_launch_sh_over_ssh_trains_like_one_machine(cluster, reference_losses, tmp_path):
    run_dir = tmp_path / "run"
    env = {**cluster, "HOSTFILE": str(tmp_path / "hostfile"), "REMOTE_LAUNCHER": "ssh"}
    env |= {"CONFIG_NAME": "quickstart", "OUTPUT_DIR": str(run_dir), "MASTER_PORT": str(free_port())}
    proc = run(["bash", "scripts/train/launch.sh", *FEW_STEPS], env)
    assert losses(run_dir) == reference_losses
    node_launches = [c for c in calls(env, "ssh") if "node_launch.sh" in c]
    # ssh -o X -o Y HOST COMMAND: each host in the hostfile's order gets its machine rank
    rank_of = {c.split()[4]: c.split("MACHINE_RANK=")[1].split()[0] for c in node_launches}
    assert rank_of == {"localhost": "0", "127.0.0.1": "1"}
    assert "[127.0.0.1] [framer_ds] node" in proc.stdout


def test_launch_sh_over_pdsh_stops_every_host_at_a_checkpoint(cluster, tmp_path):
    """pdsh (installed) starts the hosts; TERM to the launcher (as Ctrl-C) checkpoints and stops them."""
    run_dir = tmp_path / "run"
    env = {**cluster, "HOSTFILE": str(tmp_path / "hostfile"), "CONFIG": QUICKSTART}
    env |= {"OUTPUT_DIR": str(run_dir), "MASTER_PORT": str(free_port())}
    launcher = start(["bash", "scripts/train/launch.sh", *MANY_STEPS], env)
    wait_for_step(run_dir, 3, launcher)
    launcher.send_signal(signal.SIGTERM)
    out, _ = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, out[-4000:]
    assert "MACHINE_RANK=%n" in calls(env, "pdsh")[0]
    assert "stopped at a checkpoint" in out and "train.resume=latest" in out
    assert list((run_dir / "checkpoints").glob("step_*"))


def test_unreachable_host_fails_fast_with_its_name(cluster, tmp_path):
    hostfile = tmp_path / "hostfile_bad"
    hostfile.write_text("localhost slots=1\nunreachable-b slots=1\n")
    env = {**cluster, "HOSTFILE": str(hostfile), "CONFIG": QUICKSTART}
    proc = subprocess.run(
        ["bash", "scripts/train/launch.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "cannot reach unreachable-b over ssh" in proc.stderr and "EXCLUDE=unreachable-b" in proc.stderr
    assert not any("node_launch.sh" in c for c in calls(env, "ssh"))


def test_accelerate_hostfile_yaml_trains_like_one_machine(cluster, reference_losses, tmp_path):
    """configs/accelerate_hostfile.yaml: accelerate hands the launch to DeepSpeed's pdsh runner."""
    run_dir = tmp_path / "run"
    cmd = accelerate_launch_cmd(
        "--config_file",
        "configs/accelerate_hostfile.yaml",
        "--deepspeed_hostfile",
        str(tmp_path / "hostfile"),
        "--num_machines",
        "2",
        "--num_processes",
        "2",
    )
    try:
        proc = run(
            [*cmd, "-m", "framer_ds", "train", QUICKSTART, f"output_dir={run_dir}", *FEW_STEPS], cluster
        )
    finally:
        (REPO / ".deepspeed_env").unlink(missing_ok=True)  # accelerate writes it for the runner
    assert (run_dir / "metrics.jsonl").is_file(), proc.stdout[-4000:] + proc.stderr[-4000:]
    assert losses(run_dir) == reference_losses
    assert "-w localhost,127.0.0.1" in calls(cluster, "pdsh")[0]


# --- DeepSpeed's launcher and torchrun, without accelerate's CLI -------------------------------------


@pytest.mark.parametrize(
    "launcher",
    [
        ["deepspeed", "--num_gpus", "2", "--master_port", "{port}", "--module", "framer_ds"],
        ["torchrun", "--nproc_per_node", "2", "--master_port", "{port}", "-m", "framer_ds"],
    ],
    ids=["deepspeed", "torchrun"],
)
def test_deepspeed_and_torchrun_build_the_same_accelerator(launcher, reference_losses, tmp_path):
    run_dir = tmp_path / "run"
    port = str(free_port())
    cmd = [str(PYTHON_BIN / part) if i == 0 else part.format(port=port) for i, part in enumerate(launcher)]
    cmd += ["train", QUICKSTART, f"output_dir={run_dir}", *FEW_STEPS]
    try:
        proc = run(
            [*cmd, "--deepspeed-config", "configs/deepspeed/zero2.json"],
            {**os.environ, "OMP_NUM_THREADS": "1"},
        )
    finally:
        # DeepSpeed's launcher sets LOCAL_SIZE, so on a CPU each rank creates a 66 MiB shared-memory
        # allreduce workspace that DeepSpeed never unlinks: /dev/shm (RAM) would keep it after the test.
        for leftover in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"):
            leftover.unlink(missing_ok=True)
    assert "DeepSpeed ZeRO-2 on 2 CPU process(es)" in proc.stdout + proc.stderr
    assert losses(run_dir) == reference_losses


# --- framer-ds env under a launch --------------------------------------------------------------------


def test_env_smoke_test_under_torchrun(tmp_path):
    import json

    cmd = [str(PYTHON_BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port())]
    proc = run([*cmd, "-m", "framer_ds", "env", "--json", "--output-dir", str(tmp_path)], dict(os.environ))
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert report["distributed"]["all_reduce"] == "ok" and report["distributed"]["world_size"] == 2
    assert [r["rank"] for r in report["distributed"]["ranks"]] == [0, 1]
    assert report["distributed"]["broadcast_mib"] == 64 and report["distributed"]["broadcast_gib_per_s"] > 0
    assert report["machine"]["packages"]["torch"]


def test_env_with_a_wrong_port_fails_within_its_timeout_with_a_hint():
    """Rank 1 looks for the head on another port: both fail in ~timeout, naming the likely causes."""
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "framer_ds", "env", "--timeout", "6"],
            cwd=REPO,
            env={
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": "0",
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port + rank),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for rank, proc in enumerate(ranks):
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 1, err[-2000:]
        assert f"rank {rank} of 2 could not complete the rendezvous" in err and "hint:" in err, err[-2000:]
