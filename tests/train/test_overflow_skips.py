"""fp16 overflow skips: a step whose update the engine's loss scaler skipped is counted as skipped, not as
trained (train/overflow.py, engine/loss_scale.py).

The in-process runs get torch's GradScaler on the CPU (`fp16_loss_scaler_on_cpu`) and NaN gradients with
a finite loss on chosen micro-batches (the test task's `data.bad_grad_batches`), so the real loop, the
real accelerate optimizer wrapper and the real (fused) AdamW meet a real scaler back-off. The DeepSpeed
run uses the engine's own overflow flag: ZeRO skips an update whose gradient norm is not finite in fp32
as it does in fp16. The stop after `train.nonfinite.max_consecutive` skips in a row is a fault case
(tests/faults/overflow_cases.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import (
    REPO,
    accelerate_launch_cmd,
    fp16_loss_scaler_on_cpu,
    launch_env,
    mlp_config,
    mlp_lr_schedule,
    read_metrics,
    strategy_launch_args,
)
from framer_ds.cli.main import main as cli_main

SKIPPED, SCALE = "train/skipped_steps", "train/loss_scale"
# Micro-batch 8 x accumulation 2: window k holds this process's micro-batches 2k-1 and 2k. Micro-batches
# 5, 6 (window 3) and 9 (window 5) get NaN gradients: windows 3 and 5 are skipped, windows 4 and 6 train
# as steps 3 and 4, and 8 steps take 10 windows.
BAD_BATCHES = [5, 6, 9]


def skip_lines(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: x[k] for k in ("step", SKIPPED, SCALE)} for x in lines if SKIPPED in x and "loss" not in x]


def test_overflow_skipped_steps_are_counted_not_trained_and_survive_a_resume(tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = mlp_config(
        tmp_path / "c.yaml",
        run_dir,
        data={"bad_grad_batches": BAD_BATCHES},
        train={
            "length.steps": 8,
            "optimizer.max_grad_norm": 0.0,
            "checkpoint.every.steps": 4,
            "checkpoint.keep_last": 3,
        },
    )
    with fp16_loss_scaler_on_cpu(init_scale=1024.0):
        assert cli_main(["train", str(config)]) == 0
    out = capsys.readouterr().out
    assert "gradient overflow: optimizer step 3 skipped by the engine; loss scale now 512" in out
    assert "gradient overflow: optimizer step 4 skipped by the engine; loss scale now 256" in out
    assert "done: 8 steps (2 more skipped on overflow)" in out

    # One line per skip, at the step number the skipped step would have had; the scale halves each time.
    assert skip_lines(run_dir) == [
        {"step": 3, SKIPPED: 1.0, SCALE: 512.0},
        {"step": 4, SKIPPED: 2.0, SCALE: 256.0},
    ]
    train = read_metrics(run_dir)[0]
    assert [x["step"] for x in train] == list(range(1, 9))  # each trained step logged once
    assert [x[SKIPPED] for x in train] == [0, 0, 1, 2, 2, 2, 2, 2]
    assert [x[SCALE] for x in train] == [1024, 1024, 512, 256, 256, 256, 256, 256]
    # The LR schedule moves with the trained steps only: 8 steps run at its 8 values, no value is spent
    # on a skipped one (exact: the same float arithmetic as the run's scheduler).
    assert [x["lr"] for x in train] == mlp_lr_schedule(8)
    assert train[-1]["epoch"] == 20 / 64  # 10 windows of 2 of the epoch's 64 micro-batches were read

    step_8 = run_dir / "checkpoints" / "step_8"
    state = json.loads((step_8 / "trainer_state.json").read_text())
    assert (state["global_step"], state["skipped_steps"]) == (8, 2)
    # What really trained: AdamW updated 8 times and the scheduler moved 8 times, like the step counter.
    optimizer = torch.load(step_8 / "optimizer.bin", weights_only=True)
    assert {float(s["step"]) for s in optimizer["state"].values()} == {8.0}
    assert torch.load(step_8 / "scheduler.bin", weights_only=True)["last_epoch"] == 8

    # A resume from step_4 carries on the count (2) and the scale (256); this process's micro-batches
    # are counted from 1 again, so its windows 3 and 5 are skipped too, as steps 7 and 8.
    with fp16_loss_scaler_on_cpu(init_scale=1024.0):
        assert cli_main(["train", str(config), f"train.resume={run_dir / 'checkpoints' / 'step_4'}"]) == 0
    assert "done: 8 steps (4 more skipped on overflow)" in capsys.readouterr().out
    assert skip_lines(run_dir) == [
        {"step": 3, SKIPPED: 1.0, SCALE: 512.0},
        {"step": 4, SKIPPED: 2.0, SCALE: 256.0},
        {"step": 7, SKIPPED: 3.0, SCALE: 128.0},
        {"step": 8, SKIPPED: 4.0, SCALE: 64.0},
    ]
    train = read_metrics(run_dir)[0]
    assert [x["step"] for x in train] == list(range(1, 9))
    assert [x[SKIPPED] for x in train[4:]] == [2, 2, 3, 4]
    assert [x[SCALE] for x in train[4:]] == [256, 256, 128, 64]


@pytest.mark.distributed
def test_a_deepspeed_zero3_skipped_update_is_not_counted(tmp_path):
    """2 processes, ZeRO-3 (the fp16 drivable-space recipe's strategy): the engine skips window 3's update
    (its gradient norm is NaN on both ranks) and reports it through the ZeRO optimizer's overflow flag."""
    run_dir = tmp_path / "run"
    config = mlp_config(
        tmp_path / "c.yaml", run_dir, data={"bad_grad_batches": [5, 6]}, train={"length.steps": 4}
    )
    cmd = accelerate_launch_cmd(
        *strategy_launch_args("zero3", tmp_path), "-m", "framer_ds", "train", str(config)
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "done: 4 steps (1 more skipped on overflow)" in proc.stdout
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(x["step"], x[SKIPPED]) for x in lines if SKIPPED in x and "loss" not in x] == [(3, 1.0)]
    train = read_metrics(run_dir)[0]
    assert [x["step"] for x in train] == [1, 2, 3, 4]
    assert [x["lr"] for x in train] == mlp_lr_schedule(4)
    assert all(SCALE not in x for x in train)  # fp32: DeepSpeed scales no loss
