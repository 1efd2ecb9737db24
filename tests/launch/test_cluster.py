"""Every multi-node launch path the README documents, on a real two-node cluster (tests/real_cluster.py:
Slurm, sshd and pdsh, each node its own network, hostname and process table): the runs meet over the
nodes' own addresses and reproduce the losses of one machine's 2-process ZeRO-2 run; Slurm's stop
signals checkpoint, requeue (or cancel) and resume onto those losses; a node that dies fails the job
naming it. Each node's name resolves to 127.0.1.1 on the node itself, as Debian's installer writes it.

The runs train the tests' MLP task (tests/framer_test_tasks.py, 16 steps; `sleep_per_batch_s` slows
the runs a test interrupts, which changes no number). A launch costs ~30 s on 2 cores, mostly imports,
so one launch checks several things. The finding each test covers (issue 49) is named in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import accelerate_launch_cmd, free_port, mlp_config, read_metrics
from real_cluster import ENDED, NODES, Cluster
from real_cluster import cluster as cluster  # the session fixture

pytestmark = [pytest.mark.distributed, pytest.mark.cluster, pytest.mark.timeout(900)]
PYTHON_BIN = Path(sys.executable).parent
# The README's Slurm commands on CPU nodes (docs/cluster.md): no GPUs to ask for, one CPU per rank.
CPU_NODES = ("--gres=none", "--cpus-per-task=1")
SECRET = "not-a-real-wandb-key"
TRAIN = {"checkpoint.every.steps": 2, "checkpoint.keep_last": 8, "eval.every.steps": 16}


def mlp_run(
    cluster: Cluster, name: str, sleep_per_batch_s: float = 0.0, data: dict | None = None, **train
) -> tuple[Path, Path]:
    """(config, run dir) of the MLP task in the cluster's checkout; the sleeps change no number."""
    run_dir = cluster.checkout / "runs" / name
    data = {"sleep_per_batch_s": sleep_per_batch_s, **(data or {})}
    config = mlp_config(cluster.directory / f"{name}.yaml", run_dir, data=data, train={**TRAIN, **train})
    return config, run_dir


def losses(run_dir: Path) -> list[float]:
    return [line["loss"] for line in read_metrics(run_dir)[0]]


def last_step(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    found = 0
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):  # the line being written
            found = max(found, json.loads(line).get("step", 0))
    return found


def wait_for_step(run_dir: Path, step: int, alive, timeout: float = 480) -> None:
    """Until metrics.jsonl has `step`; `alive()` False first fails (the run ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if last_step(run_dir) >= step:
            return
        assert alive(), f"the run ended before step {step}"
        time.sleep(0.3)
    raise AssertionError(f"step {step} not reached in {timeout} s")


@pytest.fixture(scope="module")
def reference(cluster: Cluster) -> list[float]:
    """The MLP run as 2 processes on one machine under ZeRO-2: what every launch must reproduce."""
    config, run_dir = mlp_run(cluster, "reference")
    cmd = accelerate_launch_cmd("--config_file", "configs/accelerate_cpu_2proc.yaml", "-m", "framer_ds")
    proc = cluster.run([*cmd, "train", str(config)])
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert len(losses(run_dir)) == 16
    return losses(run_dir)


@pytest.fixture(autouse=True)
def nothing_left_over(cluster: Cluster):
    """After each test, jobs, launches and ranks it left are stopped (a failed test leaves some), so the
    next test finds idle nodes; a test that passed must have left nothing."""
    yield
    left = cluster.clean_up()
    assert not left, f"the test left this behind (now stopped):\n{left}"


def job_alive(cluster: Cluster, job_id: str):
    return lambda: cluster.job(job_id).get("JobState") in ("PENDING", "RUNNING", "REQUEUED")


# --- Slurm -------------------------------------------------------------------------------------------


def test_slurm_multinode_from_a_fresh_clone_on_cpu_nodes(cluster, reference):
    """`sbatch --nodes=2 --gres=none --cpus-per-task=1 --export=ALL,CONFIG=..,OUTPUT_DIR=..
    slurm/train_multinode.sh` in a fresh clone: the rendezvous check (`framer-ds env` on both nodes),
    then training across them. Findings 1 (the job failed with no output: no logs/ for #SBATCH
    --output), 8 (4 ranks per node and 8 threads each: GPU numbers on CPU nodes) and 5 (gloo told
    the peers to connect to 127.0.1.1)."""
    config, run_dir = mlp_run(cluster, "slurm_multinode")
    export = f"--export=ALL,CONFIG={config},OUTPUT_DIR={run_dir}"
    job = cluster.sbatch(
        "--nodes=2", *CPU_NODES, export, "slurm/train_multinode.sh", drop=("OMP_NUM_THREADS",)
    )
    cluster.wait_job(job, lambda j: "[framer_ds] job" in cluster.log(job) or j.get("JobState") in ENDED)
    started = cluster.log(job)  # ranks per node and threads per rank from the allocation, at once
    assert "2 node(s) x 1, head fds-node1" in started and "OMP_NUM_THREADS=1" in started, started[-3000:]
    state = cluster.wait_job(job)["JobState"]
    log = cluster.log(job)
    assert state == "COMPLETED", f"{state}\n{log[-5000:]}\n{cluster.daemon_logs()}"
    assert "rendezvous: 2 ranks at fds-node1" in log and "rank 1: host fds-node2" in log
    assert "resolves to 127.0.1.1 (loopback" in log and "using GLOO_SOCKET_IFNAME=eth0" in log
    assert losses(run_dir) == reference


def test_slurm_usr1_and_scontrol_requeue_resume_onto_the_uninterrupted_losses(cluster, reference):
    """`scancel --signal=USR1 --batch` (what the time limit's --signal=B:USR1@300 sends): every node
    checkpoints, the script requeues the job, it resumes; then `scontrol requeue` (TERM; Slurm requeues
    it itself): checkpoint, resume, finish.
    Finding 4: USR1 reached torchrun's agent too, which died at once (exit 138), and srun tore the step
    down before the ranks had written preempted.json. Finding 9: the USR1 checkpoint here takes 32 s
    (rank 0 sleeps in it, as a large state's write would): torchrun's agent SIGKILLed the ranks 30 s
    after passing the signal on, so it never completed and the job failed instead of requeueing."""
    flag = cluster.directory / "slow_checkpoint"
    data = {"slow_checkpoint_flag": str(flag), "slow_checkpoint_s": 32}
    config, run_dir = mlp_run(cluster, "requeue", sleep_per_batch_s=0.4, data=data)
    export = f"--export=ALL,CONFIG={config},OUTPUT_DIR={run_dir},ENV_CHECK=0"
    job = cluster.sbatch("--nodes=2", *CPU_NODES, export, "slurm/train_multinode.sh")
    marker = run_dir / "preempted.json"
    stops: list[int] = []
    for stop in (["scancel", "--signal=USR1", "--batch", job], ["scontrol", "requeue", job]):
        wait_for_step(run_dir, (stops[-1] if stops else 0) + 3, job_alive(cluster, job))
        if not stops:
            flag.touch()  # the USR1 checkpoint outlasts torch's 30 s
        assert cluster.run(stop, timeout=30).returncode == 0
        cluster.wait_job(job, lambda j: marker.exists() or j.get("JobState") in ENDED, timeout=120)
        assert marker.exists(), f"no checkpoint on {stop[:2]}: {cluster.job(job)}\n{cluster.log(job)[-4000:]}"
        stops.append(json.loads(marker.read_text())["step"])
        restarts = str(len(stops))
        cluster.wait_job(job, lambda j, n=restarts: j.get("Restarts") == n and j.get("JobState") == "RUNNING")
    info = cluster.wait_job(job)
    log = cluster.log(job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "2", log[-5000:]
    assert "Exited with exit code" not in log, log[-5000:]  # 138: the agent killed by USR1
    # by the script, after USR1 only; said before the requeue, which kills the script (under load the
    # kill beat a line echoed after it: 0 such lines in a suite run on 3 busy workers)
    assert log.count(f"[framer_ds] requeueing job {job}: it resumes from this checkpoint") == 1
    assert "TERM (scancel, scontrol requeue or preemption): not requeued by this script" in log
    assert "to write, but a stop signal leaves 30 s (Slurm's KillWait=30" in log  # the 32 s one
    assert log.count("resumed from") == 2
    assert 3 <= stops[0] < stops[1] < 16
    assert losses(run_dir) == reference


def test_a_plain_scancel_cancels_after_a_checkpoint(cluster):
    """slurm/train_4gpu.sh on a CPU node (one node, 2 ranks). `scancel JOB` (TERM): the ranks checkpoint
    and the job ends CANCELLED. Finding 3: the script requeued itself on TERM, so a cancelled job
    trained to the end."""
    config, run_dir = mlp_run(cluster, "scancel", sleep_per_batch_s=0.4)
    export = (
        f"--export=ALL,CONFIG={config},OUTPUT_DIR={run_dir},ACCELERATE_CONFIG=configs/accelerate_cpu_2proc.yaml,"
        "DEEPSPEED_CONFIG=configs/deepspeed/zero2.json"
    )
    job = cluster.sbatch("--gres=none", "--cpus-per-task=2", export, "slurm/train_4gpu.sh")
    wait_for_step(run_dir, 3, job_alive(cluster, job))
    assert cluster.run(["scancel", job], timeout=30).returncode == 0
    info = cluster.wait_job(job)
    log = cluster.log(job)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", f"{info}\n{log[-4000:]}"
    marker = json.loads((run_dir / "preempted.json").read_text())
    assert marker["signal"] == "SIGTERM" and (run_dir / "checkpoints" / f"step_{marker['step']}").is_dir()
    assert "not requeued by this script" in log
    assert "--deepspeed_config_file configs/deepspeed/zero2.json" in log  # DEEPSPEED_CONFIG reached it


def test_a_crashed_node_fails_the_job_naming_it_and_its_checkpoint_resumes(cluster, reference):
    """Everything on fds-node2 killed at once mid-run (slurmd, slurmstepd, its rank): the rank on fds-node1
    fails at its next collective at once (gloo: the peer closed the connection), not after
    train.collective_timeout_s; once slurmctld declares the node down (SlurmdTimeout, 20 s here) srun
    names it and the job ends NODE_FAIL. Submitted again once the node is back, it resumes from the
    newest checkpoint before the crash onto the uninterrupted losses.
    (--no-requeue: with its --requeue Slurm requeues the job itself, but here the node reboots at once
    and a requeue waits only 10 s, so the requeued job can start on it before slurmctld's retried kill
    of the crashed incarnation arrives there, and that kill stops the new one.)"""
    config, run_dir = mlp_run(cluster, "crash", sleep_per_batch_s=0.4, collective_timeout_s=60)
    args = (
        "--nodes=2",
        *CPU_NODES,
        "--no-requeue",
        f"--export=ALL,CONFIG={config},OUTPUT_DIR={run_dir},ENV_CHECK=0",
    )
    job = cluster.sbatch(*args, "slurm/train_multinode.sh")
    wait_for_step(run_dir, 5, job_alive(cluster, job))
    crashed_at = time.monotonic()
    cluster.script("crash-node", "fds-node2")
    try:
        info = cluster.wait_job(job, timeout=120)
        took = time.monotonic() - crashed_at
    finally:
        cluster.script("boot-node", "fds-node2")
    log = cluster.log(job)
    assert info["JobState"] == "NODE_FAIL" and took < 60, (
        f"{info['JobState']} after {took:.0f} s\n{log[-4000:]}"
    )
    # srun names the node. How the rank on fds-node1 learns of it is a race (gloo's "Connection closed
    # by peer", or srun stopping the step first once the node is declared down): `took < 60` above,
    # within train.collective_timeout_s=60, is what shows it did not wait for the timeout. (A fresh-clone
    # run had the node named and NODE_FAIL in time without gloo's line in the log.)
    assert "srun: error: Node failure on fds-node2" in log, log[-4000:]
    again = cluster.sbatch(*args, "slurm/train_multinode.sh")
    log = cluster.log(again)
    assert cluster.wait_job(again)["JobState"] == "COMPLETED", log[-4000:]
    resumed = re.search(r"resumed from \S+/step_(\d+) at step", cluster.log(again))
    assert resumed and int(resumed[1]) >= 4, cluster.log(again)[-4000:]
    assert losses(run_dir) == reference


# --- a hostfile: scripts/train/launch.sh, accelerate's and DeepSpeed's runners ----------------------------


def test_launch_sh_over_pdsh_trains_across_both(cluster, reference):
    """`HOSTFILE=... CONFIG=... scripts/train/launch.sh` with pdsh installed (its default launcher).
    Finding 2: Debian's pdsh defaults to rsh, and launch.sh did not pass `-R ssh`: `connect: Connection
    refused`, rc 254, after the ssh pre-check had passed."""
    config, run_dir = mlp_run(cluster, "pdsh")
    proc = cluster.run(
        ["bash", "scripts/train/launch.sh"],
        HOSTFILE=str(cluster.hostfile(*NODES)),
        CONFIG=str(config),
        MASTER_PORT=str(free_port()),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fds-node2: [framer_ds] node fds-node2: machine rank 1" in proc.stdout
    assert losses(run_dir) == reference


def test_hostfile_runners_and_ctrl_c_over_ssh(cluster, reference):
    """1. `accelerate launch --config_file configs/accelerate_hostfile.yaml` (DeepSpeed's pdsh runner)
    trains. 2. launch.sh over ssh, Ctrl-C (SIGINT to its process group, as a terminal sends it): every
    node checkpoints and its output reaches the console. 3. `deepspeed --hostfile --module framer_ds`
    resumes that run onto the uninterrupted losses.
    Finding 7: accelerate's ./.deepspeed_env (its whole environment) was left behind, and 3 failed on
    every rank; launch.sh put WANDB_API_KEY on every node's command line. Finding 9 (Ctrl-C): launch.sh
    exited 130 at once and the nodes' output was lost.
    Finding 6: the README's `deepspeed -m framer_ds` is not DeepSpeed's syntax (`--module`)."""
    hostfile = str(cluster.hostfile(*NODES))
    config, run_dir = mlp_run(cluster, "accelerate_hostfile")
    hosts = ["--deepspeed_hostfile", hostfile, "--num_machines", "2", "--num_processes", "2"]
    cmd = accelerate_launch_cmd("--config_file", "configs/accelerate_hostfile.yaml", *hosts)
    proc = cluster.run([*cmd, "-m", "framer_ds", "train", str(config)], WANDB_API_KEY=SECRET)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert losses(run_dir) == reference
    assert not (cluster.checkout / ".deepspeed_env").exists()
    assert "removed ./.deepspeed_env" in proc.stderr and "WANDB_API_KEY" in proc.stderr

    # 2 s a batch until the run has stopped (the whole run: 64 s): at 0.4 s it could finish before the
    # checks below and the signal on a loaded machine (it did: "done: 16 steps", no stop); the resume: full
    # speed
    hold = cluster.directory / "hold_ssh_run"
    hold.touch()
    data = {"sleep_flag": str(hold)}
    config, run_dir = mlp_run(cluster, "ssh_then_deepspeed", sleep_per_batch_s=2.0, data=data)
    env = {
        "HOSTFILE": hostfile,
        "CONFIG": str(config),
        "REMOTE_LAUNCHER": "ssh",
        "MASTER_PORT": str(free_port()),
    }
    launcher = cluster.start(["bash", "scripts/train/launch.sh"], **env, WANDB_API_KEY=SECRET)
    wait_for_step(run_dir, 3, lambda: launcher.poll() is None)
    # The token reached the ranks on the nodes, but no command line (`ps` shows those to every user).
    ranks_env = 'for p in $(pgrep -f "framer_ds train"); do tr "\\0" "\\n" < /proc/$p/environ; done'
    assert f"WANDB_API_KEY={SECRET}" in cluster.run(["ssh", "fds-node2", ranks_env]).stdout
    assert (
        SECRET
        not in cluster.run(["ps", "-eo", "args"]).stdout
        + cluster.run(["ssh", "fds-node2", "ps -eo args"]).stdout
    )
    # A terminal's Ctrl-C reaches a launch.sh that traps it (a suite run in the background handed it SIGINT
    # ignored, which bash cannot trap: 3 of 4 such runs failed below, the run training to its end)
    assert _catches(launcher.pid, signal.SIGINT), Path(f"/proc/{launcher.pid}/status").read_text()
    os.killpg(launcher.pid, signal.SIGINT)
    # The hold stays until the launch has ended: the signal reaches the ranks through launch.sh and ssh,
    # and a run let go at full speed as it was sent finished all 16 steps first (a fresh-clone run did)
    out, _ = launcher.communicate(timeout=180)
    hold.unlink()
    assert launcher.returncode == 0, out[-4000:]
    node2_stopped = r"\[fds-node2\] stopped by .* after step \d+; checkpoint written"
    assert re.search(node2_stopped, out), out[-4000:]  # the nodes' output reached the console
    assert "[framer_ds] stopped at a checkpoint" in out
    assert not list(cluster.checkout.glob(".framer_ds_env.*"))  # the token's file went with the launch

    deepspeed = [str(PYTHON_BIN / "deepspeed"), "--hostfile", hostfile, "--master_port", str(free_port())]
    train = ["--module", "framer_ds", "train", str(config), "train.resume=latest"]
    proc = cluster.run([*deepspeed, *train, "--deepspeed-config", "configs/deepspeed/zero2.json"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert losses(run_dir) == reference


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has a handler for `sig` (its SigCgt mask in /proc/PID/status: bit sig - 1)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    raise AssertionError(f"no SigCgt line in /proc/{pid}/status")


def test_an_unreachable_host_fails_fast_with_its_name(cluster):
    hostfile = cluster.hostfile("fds-node1", "fds-node9")
    proc = cluster.run(
        ["bash", "scripts/train/launch.sh"], HOSTFILE=str(hostfile), CONFIG="configs/quickstart.yaml"
    )
    assert proc.returncode == 2
    assert "cannot reach fds-node9 over ssh" in proc.stderr and "EXCLUDE=fds-node9" in proc.stderr
