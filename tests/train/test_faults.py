"""Preemption signals, non-finite losses and a dying rank: the job stops cleanly, loses nothing and
never hangs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import (
    REPO,
    accelerate_launch_cmd,
    launch_env,
    mlp_config,
    mlp_lr_schedule,
    rank_processes,
    read_metrics,
    start_process,
    strategy_launch_args,
    wait_for_step,
)
from framer_ds.cli.main import main as cli_main
from framer_ds.train.faults import EXIT_PREEMPTED, PREEMPTED_MARKER, Preempted

pytestmark = pytest.mark.timeout(600)


def slow_config(tmp_path: Path, **train) -> tuple[Path, Path]:
    run_dir = tmp_path / "run"
    config = mlp_config(
        tmp_path / "c.yaml",
        run_dir,
        data={"sleep_per_batch_s": 0.15},
        train={"checkpoint.keep_last": 5, **train},
    )
    return config, run_dir


@pytest.fixture(scope="module")
def reference_losses(ddp_reference_run) -> list[float]:
    """The uninterrupted 2-process DDP run (sleeping and checkpoint cadence change nothing numerically)."""
    return [x["loss"] for x in read_metrics(ddp_reference_run)[0]]


def assert_preempted_then_resumes(
    run_dir: Path, config: Path, strategy_args: list[str], reference: list[float]
):
    marker = json.loads((run_dir / PREEMPTED_MARKER).read_text())
    step = marker["step"]
    assert 3 <= step < 16
    assert (run_dir / "checkpoints" / f"step_{step}" / "trainer_state.json").is_file()
    assert read_metrics(run_dir)[0][-1]["step"] == step  # the step in flight finished and was logged
    cmd = accelerate_launch_cmd(
        *strategy_args, "-m", "framer_ds", "train", str(config), "train.resume=latest"
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = [x["loss"] for x in read_metrics(run_dir)[0]]
    assert len(losses) == 16
    assert losses == pytest.approx(reference, rel=1e-5)


@pytest.mark.distributed
def test_sigterm_to_the_job_checkpoints_and_resumes_exactly(tmp_path, reference_losses):
    """Slurm's time limit: SIGTERM to every process of the job step (launcher and ranks)."""
    config, run_dir = slow_config(tmp_path)
    args = ["--multi_gpu", "--num_processes", "2"]
    proc = start_process(accelerate_launch_cmd(*args, "-m", "framer_ds", "train", str(config)))
    wait_for_step(run_dir, 3, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "stopped by SIGTERM" in err
    assert_preempted_then_resumes(run_dir, config, args, reference_losses)


@pytest.mark.distributed
def test_sigusr1_to_one_rank_stops_every_rank(tmp_path, reference_losses):
    """`--signal=USR1@90` may reach one task only: all ranks must still agree to stop together."""
    config, run_dir = slow_config(tmp_path)
    args = strategy_launch_args("zero2", tmp_path)
    proc = start_process(accelerate_launch_cmd(*args, "-m", "framer_ds", "train", str(config)))
    wait_for_step(run_dir, 3, proc)
    ranks = rank_processes(proc)
    assert len(ranks) == 2
    ranks[1].send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert "stopped by SIGUSR1" in err or "stopped by a stop signal on another rank" in err
    assert_preempted_then_resumes(run_dir, config, args, reference_losses)


def test_single_process_exits_with_the_requeue_status(tmp_path):
    config, run_dir = slow_config(tmp_path)
    proc = start_process([sys.executable, "-m", "framer_ds", "train", str(config)])
    wait_for_step(run_dir, 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, err[-3000:]
    assert "resume with train.resume=latest" in err
    assert (run_dir / PREEMPTED_MARKER).is_file()


# --- non-finite losses -------------------------------------------------------------------------------


def test_nan_loss_skips_the_step_and_training_continues(tmp_path, capsys):
    run_dir = tmp_path / "run"
    # single process, micro-batch 8 x accumulation 2: sample 3 poisons exactly one of the 32 windows of
    # epoch 0, so 31 counted steps consume the whole epoch and meet it exactly once.
    config = mlp_config(tmp_path / "c.yaml", run_dir, data={"poison_ids": [3]}, train={"length.steps": 31})
    assert cli_main(["train", str(config)]) == 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    skipped = [x for x in lines if "nonfinite_skipped_steps" in x]
    assert len(skipped) == 1 and skipped[0]["nonfinite_skipped_steps"] == 1
    losses = [x for x in lines if "loss" in x]
    assert [x["step"] for x in losses] == list(range(1, 32))  # the skipped step is not counted
    assert all(isinstance(x["loss"], float) for x in losses)
    weights = load_file(run_dir / "final" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert "non-finite loss: optimizer step" in capsys.readouterr().out


def test_repeated_nan_aborts_without_writing_poisoned_weights(tmp_path, capsys):
    run_dir = tmp_path / "run"
    poison = list(range(0, 512, 2))  # every micro-batch holds a NaN sample
    config = mlp_config(
        tmp_path / "c.yaml",
        run_dir,
        data={"poison_ids": poison},
        train={"checkpoint.every.steps": 1, "nonfinite.max_consecutive": 3},
    )
    assert cli_main(["train", str(config)]) == 1
    err = capsys.readouterr().err
    assert "non-finite loss (NaN/inf)" in err and "3 steps in a row" in err
    # no checkpoint to name: the advice says so and suggests a tenth of the learning rate (1e-3)
    assert f"There is no checkpoint in {run_dir / 'checkpoints'}" in err
    assert "train.optimizer.learning_rate=0.0001 --overwrite" in err
    assert not (run_dir / "final").exists()
    assert not list((run_dir / "checkpoints").glob("step_*")) if (run_dir / "checkpoints").exists() else True


def test_abort_policy_stops_at_the_first_nan(tmp_path, capsys):
    config = mlp_config(
        tmp_path / "c.yaml",
        tmp_path / "run",
        data={"poison_ids": [3]},
        train={"nonfinite.policy": "abort", "length.steps": 32},
    )
    assert cli_main(["train", str(config)]) == 1
    assert "non-finite loss (NaN/inf) at optimizer step" in capsys.readouterr().err


def test_a_stop_after_a_non_finite_step_names_the_checkpoint_a_requeue_resumes():
    """SaveCheckpoint skips a non-finite state even for a stop signal: preempted.json and the message
    then name the newest (finite) checkpoint, not one of the step the signal stopped."""
    root = Path("run/checkpoints")
    assert (
        str(Preempted(8, "SIGTERM", root / "step_8")) == "stopped by SIGTERM after step 8; checkpoint written"
    )
    skipped = str(Preempted(8, "SIGTERM", root / "step_6"))
    assert skipped.endswith(
        "after step 8; its state was not finite, so no checkpoint was written (the newest is step_6)"
    )
    assert str(Preempted(8, "SIGTERM", None)).endswith("no checkpoint was written (there is none)")


@pytest.mark.distributed
@pytest.mark.parametrize("strategy", ["ddp", "zero2"])
def test_nan_on_one_rank_is_skipped_by_all_ranks(tmp_path, strategy):
    run_dir = tmp_path / "run"
    config = mlp_config(tmp_path / "c.yaml", run_dir, data={"poison_ids": [3]})
    cmd = accelerate_launch_cmd(
        *strategy_launch_args(strategy, tmp_path), "-m", "framer_ds", "train", str(config)
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["nonfinite_skipped_steps"] for x in lines if "nonfinite_skipped_steps" in x] == [1]
    assert [x["step"] for x in lines if "loss" in x] == list(range(1, 17))
    # The skipped window moves no LR: step k trains at the schedule's k-th value (under DeepSpeed it used
    # to be set back one step, as if the engine had stepped it).
    assert [x["lr"] for x in lines if "loss" in x] == mlp_lr_schedule(16)
    weights = load_file(run_dir / "final" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())


# --- a rank that dies --------------------------------------------------------------------------------


@pytest.mark.distributed
def test_a_killed_rank_fails_the_job_naming_the_rank(tmp_path):
    config, run_dir = slow_config(tmp_path, collective_timeout_s=60)
    proc = start_process(
        accelerate_launch_cmd("--multi_gpu", "--num_processes", "2", "-m", "framer_ds", "train", str(config))
    )
    wait_for_step(run_dir, 2, proc)
    killed_at = time.monotonic()
    rank_processes(proc)[1].kill()
    _, err = proc.communicate(timeout=180)
    assert proc.returncode != 0
    assert time.monotonic() - killed_at < 120, "the job should fail fast, not wait on a dead rank"
    assert "rank      : 1" in err or "local_rank: 1" in err, err[-3000:]
