"""Fault cases: a run that diverges. Its weights go NaN in an update whose loss was still finite (the test
task's `data.bad_grad_after_batches`: a finite loss with a NaN gradient, as when a backward overflows),
so the loss check only notices on the next step. No checkpoint, best/ or final/ may hold those weights."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
from faults.harness import case, cli, ddp_train_cmd, mlp
from safetensors.torch import load_file

from conftest import REPO, launch_env, read_metrics

# Micro-batch 8 x accumulation 2 (the test config): optimizer step k trains micro-batches 2k-1 and 2k, so
# a NaN gradient from micro-batch 15 on poisons the weights in the update of step 8.
POISONED_STEP = 8
SMALL = {"model": {"width": 32, "depth": 2}, "data": {"num_samples": 256, "eval_samples": 16, "dim": 8}}


def nonfinite_tensors(checkpoint: Path) -> int:
    """How many of a checkpoint's model and optimizer-state tensors hold a NaN or an inf."""
    tensors = list(load_file(str(checkpoint / "model.safetensors")).values())
    optimizer = torch.load(checkpoint / "optimizer.bin", weights_only=True)
    tensors += [v for state in optimizer["state"].values() for v in state.values() if torch.is_tensor(v)]
    return sum(not bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def diverging(
    tmp: Path, name: str = "run", task_data: dict | None = None, train: dict | None = None
) -> tuple[Path, Path]:
    data = {**SMALL["data"], "bad_grad_after_batches": 2 * POISONED_STEP - 1, **(task_data or {})}
    settings = {"length.steps": 12, "checkpoint.every.steps": 2, "checkpoint.keep_last": 2, **(train or {})}
    return mlp(tmp, name, model=SMALL["model"], data=data, train=settings)


@case(
    "the weights go NaN in a checkpoint step's update (its loss still finite); the next steps' losses "
    "are NaN and the run aborts; then train.resume=latest with a lower learning rate",
    "step_8 is not written (a warning names it), keep_last=2 keeps the finite step_4 and step_6, the "
    "abort names step_6 and suggests resume=latest with a lower learning rate; the resume continues "
    "from step_6",
)
def divergence_keeps_the_finite_checkpoints(tmp: Path) -> str:
    config, run = diverging(tmp)
    ran = cli("train", str(config))
    assert ran.rc == 1, (ran.rc, ran.err[-2000:])
    assert f"step {POISONED_STEP}: the trainable weights and the optimizer state are not finite" in ran.out
    assert f"checkpoint step_{POISONED_STEP} NOT written" in ran.out, ran.out[-2000:]
    kept = sorted((run / "checkpoints").iterdir(), key=lambda p: int(p.name.split("_")[1]))
    assert [p.name for p in kept] == ["step_4", "step_6"], kept
    assert [nonfinite_tensors(p) for p in kept] == [0, 0]
    newest = run / "checkpoints" / "step_6"
    assert f"The newest finite checkpoint is {newest} (step 6" in ran.err, ran.err[-2000:]
    assert "train.resume=latest train.optimizer.learning_rate=0.0001" in ran.err, ran.err[-2000:]
    resumed = cli(
        "train",
        str(config),
        "train.resume=latest",
        "train.optimizer.learning_rate=1e-4",
        "data.bad_grad_after_batches=0",  # the "fix" that lets this resume train on
        "train.resume_allow_changes=[data.bad_grad_after_batches]",
    )
    assert resumed.rc == 0, resumed.err[-2000:]
    assert f"resumed from {newest} at step 6" in resumed.out, resumed.out[-2000:]
    assert (run / "final" / "model.safetensors").is_file()
    return "step_8 skipped with a warning; kept step_4, step_6 (finite); abort names step_6; resumed from it"


@case(
    "the weights go NaN in the last step's update while the scripted eval/score still improves",
    "best/ stays the export of step 6 (a warning says so), final/ is not exported: exit 1, naming the "
    "newest finite checkpoint",
)
def divergence_never_exports_best_or_final(tmp: Path) -> str:
    config, run = diverging(
        tmp,
        task_data={"eval_script": [1.0, 2.0, 3.0, 4.0]},
        train={
            "length.steps": POISONED_STEP,
            "eval.every.steps": 2,
            "eval.best_metric": "eval/score",
            "eval.best_mode": "max",
        },
    )
    ran = cli("train", str(config), "task=test_scripted_eval")
    assert ran.rc == 1, (ran.rc, ran.err[-2000:])
    assert f"step {POISONED_STEP}: the trainable weights are not finite (NaN/inf); best/ is kept" in ran.out
    assert json.loads((run / "best" / "best.json").read_text())["step"] == 6
    best = load_file(str(run / "best" / "model.safetensors"))
    assert all(bool(torch.isfinite(t).all()) for t in best.values())
    assert not (run / "final").exists(), "final/ was exported from NaN weights"
    assert f"after the last optimizer step ({POISONED_STEP}) the trainable weights" in ran.err, ran.err[
        -2000:
    ]
    assert f"The newest finite checkpoint is {run / 'checkpoints' / 'step_6'}" in ran.err
    return "best/ kept at step 6, no final/, exit 1 naming checkpoints/step_6"


@case(
    "the same divergence under 2-process DDP: the weights go NaN in step 8's update on both ranks",
    "both ranks skip the step_8 save together (no hang), step_4 and step_6 stay; exit non-zero naming step_6",
    multi_process=True,
)
def divergence_under_ddp_skips_the_save_on_every_rank(tmp: Path) -> str:
    config, run = diverging(tmp)
    cmd = ddp_train_cmd(config)
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode != 0
    assert f"checkpoint step_{POISONED_STEP} NOT written" in proc.stdout, proc.stdout[-2000:]
    assert f"The newest finite checkpoint is {run / 'checkpoints' / 'step_6'}" in proc.stderr, proc.stderr[
        -3000:
    ]
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert kept == ["step_4", "step_6"], kept
    assert [nonfinite_tensors(run / "checkpoints" / name) for name in kept] == [0, 0]
    return "step_8 skipped on both ranks; kept step_4, step_6 (finite); exit non-zero naming step_6"


@case(
    "gradients of ~1e20 (finite) from step 8 on, no clipping: Adam's squared-gradient moment overflows "
    "to inf while the weights stay finite",
    "the checkpoints from step 8 on are not written (a warning names the optimizer state); the run "
    "finishes and final/ is exported from its finite weights",
)
def an_overflowing_optimizer_state_is_not_checkpointed(tmp: Path) -> str:
    config, run = diverging(tmp, task_data={"bad_grad": "huge"}, train={"optimizer.max_grad_norm": 0.0})
    ran = cli("train", str(config))
    assert ran.rc == 0, ran.err[-2000:]
    for step in (8, 10, 12):
        warning = (
            f"step {step}: the optimizer state is not finite (NaN/inf); checkpoint step_{step} NOT written"
        )
        assert warning in ran.out, ran.out[-2000:]
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert kept == ["step_4", "step_6"], kept
    assert [nonfinite_tensors(run / "checkpoints" / name) for name in kept] == [0, 0]
    assert (run / "final" / "model.safetensors").is_file()
    return "step_8, step_10, step_12 not written (optimizer state); kept step_4, step_6; final/ exported"


@case(
    "the run diverges long after its best evaluation (eval/score best at step 4; the weights go NaN in "
    "step 12's update), checkpoints and evaluations every 2 steps, keep_last=2; then train.resume=best",
    "step_4 (the best) is kept beside step_8 and step_10; the abort names step_10 with its loss and "
    "step_4 with eval/score, suggesting train.resume=best; the resume continues from step_4 with the "
    "same losses, step_8 and step_10 moved to checkpoints/abandoned/",
)
def divergence_after_the_best_keeps_and_names_it(tmp: Path) -> str:
    poisoned = 12  # micro-batch 8 x accumulation 2: a NaN gradient from micro-batch 23 on poisons step 12
    config, run = diverging(
        tmp,
        task_data={"bad_grad_after_batches": 2 * poisoned - 1, "eval_script": [0.5, 0.2, 0.4, 0.6, 0.7, 0.8]},
        train={
            "length.steps": 16,
            "eval.every.steps": 2,
            "eval.best_metric": "eval/score",
            "eval.best_mode": "min",
        },
    )
    ran = cli("train", str(config), "task=test_scripted_eval")
    assert ran.rc == 1, (ran.rc, ran.err[-2000:])
    checkpoints = run / "checkpoints"
    kept = sorted((p for p in checkpoints.glob("step_*")), key=lambda p: int(p.name.split("_")[1]))
    assert [p.name for p in kept] == ["step_4", "step_8", "step_10"], kept  # was step_8, step_10
    assert [nonfinite_tensors(p) for p in kept] == [0, 0, 0]
    diverged = {line["step"]: line["loss"] for line in read_metrics(run)[0]}
    message = " ".join(ran.err.split())  # the message as one line, whatever the console wrapped
    assert (
        f"The newest finite checkpoint is {checkpoints / 'step_10'} (step 10, loss {diverged[10]:.4g};"
        in message
    ), message[-2000:]
    assert f"The best checkpoint is {checkpoints / 'step_4'} (step 4, eval/score=0.2 at step 4)" in message
    assert "train.resume=best train.optimizer.learning_rate=0.0001" in message
    resumed = cli(
        "train",
        str(config),
        "task=test_scripted_eval",
        "train.resume=best",
        "data.bad_grad_after_batches=0",  # the "fix"; the learning rate stays, so the losses can be compared
        "train.resume_allow_changes=[data.bad_grad_after_batches]",
    )
    assert resumed.rc == 0, resumed.err[-2000:]
    assert f"resumed from {checkpoints / 'step_4'} at step 4" in resumed.out, resumed.out[-2000:]
    (abandoned,) = (checkpoints / "abandoned").iterdir()
    assert sorted(p.name for p in abandoned.iterdir()) == ["step_10", "step_8"]
    again = {line["step"]: line["loss"] for line in read_metrics(run)[0]}
    assert sorted(again) == list(range(1, 17))
    # Exact: the same state at step 4, data position and RNG; steps 5..12 trained the same batches (the
    # bad gradient of step 12 changed only what came after it).
    assert [again[step] for step in range(5, 13)] == [diverged[step] for step in range(5, 13)]
    # The best stays step 4 (the resumed evaluations score 0.5, then 0.2: not strictly better), so it is
    # still kept beside the newest two.
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_14", "step_16", "step_4"]
    return "kept step_4 (best), step_8, step_10; abort names both; resume=best continued from step_4 exactly"
