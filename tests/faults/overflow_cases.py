"""Fault cases: fp16 overflows that never end. The engine's loss scaler skips every update (torch's
GradScaler, as accelerate gives an fp16 run; here on the CPU via `fp16_loss_scaler_on_cpu`, with the test
task's NaN gradients behind a finite loss), and the run must stop in one line instead of skipping on."""

from __future__ import annotations

import json
from pathlib import Path

from faults.harness import case, cli, mlp, train_steps

from conftest import fp16_loss_scaler_on_cpu


@case(
    "fp16: from step 3 on every gradient overflows (the loss stays finite), "
    "train.nonfinite.max_consecutive=3, a checkpoint at step 2; then train.resume=latest once the "
    "gradients are fine again",
    "3 skips are logged (train/skipped_steps 1, 2, 3; train/loss_scale 512, 256, 128) and none is counted as "
    "a step; the third stops the run: exit 1, one line naming the loss scale, bf16, a lower learning rate "
    "and step_2; no final/; the resume continues from step_2 with the count and the scale",
)
def overflow_skips_in_a_row_stop_the_run(tmp: Path) -> str:
    config, run = mlp(
        tmp,
        data={"bad_grad_after_batches": 5},  # micro-batches 5, 6, ...: window 3 on
        train={
            "length.steps": 4,
            "optimizer.max_grad_norm": 0.0,
            "checkpoint.every.steps": 2,
            "nonfinite.max_consecutive": 3,
        },
    )
    with fp16_loss_scaler_on_cpu(init_scale=1024.0):
        ran = cli("train", str(config))
    assert ran.rc == 1, (ran.rc, ran.err[-2000:])
    errors = [line for line in ran.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in ran.err, ran.err[-3000:]
    assert errors[0].startswith(
        "error: gradient overflow: the engine skipped 3 optimizer steps in a row after step 2, loss scale "
        "now 128 (train.nonfinite.max_consecutive=3)"
    ), errors[0]
    assert "train.mixed_precision=bf16" in errors[0] and str(run / "checkpoints" / "step_2") in errors[0]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    skipped = [x for x in lines if "train/skipped_steps" in x and "loss" not in x]
    skips = [(x["step"], x["train/skipped_steps"], x["train/loss_scale"]) for x in skipped]
    assert skips == [(3, 1.0, 512.0), (3, 2.0, 256.0), (3, 3.0, 128.0)], skips
    assert train_steps(run) == [1, 2] and not (run / "final").exists()

    with fp16_loss_scaler_on_cpu(init_scale=1024.0):
        resumed = cli(
            "train",
            str(config),
            "train.resume=latest",
            "data.bad_grad_after_batches=0",  # the "fix" that lets this resume train on
            "train.resume_allow_changes=[data.bad_grad_after_batches]",
        )
    assert resumed.rc == 0, resumed.err[-2000:]
    assert "done: 4 steps, " in resumed.out  # no skip before step_2, none after the fix
    assert train_steps(run) == [1, 2, 3, 4]
    return "skipped 3 (scale 512, 256, 128), exit 1 in one line naming step_2; resumed from it to step 4"
