"""The one-machine launchers without accelerate's CLI train as `accelerate launch` does, proven with real
rendezvous over loopback (CPU, gloo, DeepSpeed's CPU accelerator, ZeRO-2): DeepSpeed's own launcher and
torchrun, each run's losses equal to the same 2-process `accelerate launch`; and `framer-ds env` under
torchrun. The multi-node paths (Slurm, scripts/train/launch.sh over ssh and pdsh, accelerate's and
DeepSpeed's hostfile runners) run on a real two-node cluster: tests/launch/test_cluster.py.

The quickstart trains 4 steps in each (~20-40 s a launch, mostly imports)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, accelerate_launch_cmd, free_port, read_metrics

QUICKSTART = "configs/quickstart.yaml"
FEW_STEPS = [
    "train.length.steps=4",
    "train.micro_batch_size=16",
    "train.eval.every=null",
    "train.checkpoint.every=null",
    "train.lr_schedule.warmup.steps=2",
]
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
