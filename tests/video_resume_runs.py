"""The video_lora resume runs several test files and a fault matrix case share: a run of the tiny SVD or
Framer base trained STEPS steps, copied as if stopped after its step-2 checkpoint, and resumed from it.
(Here, at the tests' root, so tests/faults imports it whatever else pytest collected.)"""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import REPO, read_metrics, train_in_process

CONFIGS = REPO / "configs" / "tasks" / "video_lora"
BASES = {"svd": CONFIGS / "tiny.yaml", "framer": CONFIGS / "framer_tiny.yaml"}
STEPS = 5
# Checkpoints at steps 2, 4 and 5; the resumed run starts from step 2: mid-epoch (8 training clips,
# 4 micro-batches an epoch on one process, 4 per rank on two with micro-batch 1), and its steps cross
# into the next epoch. No eval set and no samples: neither touches training, and both cost time.
COMMON = [
    f"train.length.steps={STEPS}",
    "train.checkpoint.every.steps=2",
    "train.checkpoint.keep_last=5",
    "train.eval.every=null",
    "train.num_workers=0",
    "train.log_every=1",
    "data.val_fraction=0",
    "model.samples.every=0",
    "model.interp_eval.enabled=false",
]


def resumable_copy(run: Path, to: Path) -> Path:
    """`run` as if it had been stopped right after its step-2 checkpoint."""
    shutil.copytree(run, to)
    for later in ("step_4", f"step_{STEPS}"):
        shutil.rmtree(to / "checkpoints" / later)
    shutil.rmtree(to / "final")
    return to


def trajectories(full: Path, resumed: Path) -> tuple[list, list]:
    """(step, loss, lr) of the resumed steps in the resumed run and in the uninterrupted one."""
    straight, again = read_metrics(full)[0], read_metrics(resumed)[0]
    assert [x["step"] for x in again] == list(range(1, STEPS + 1))
    return [(x["step"], x["loss"], x["lr"]) for x in again[2:]], [
        (x["step"], x["loss"], x["lr"]) for x in straight[2:]
    ]


def assert_same_trajectory(full: Path, resumed: Path) -> None:
    again, straight = trajectories(full, resumed)
    assert again == straight  # exact: same fp32 CPU operations in the same order (module docstring)


def resumed_and_straight_losses(base: str, tmp_path: Path) -> tuple[list, list]:
    """Train `base` STEPS steps straight, then again from the step-2 checkpoint. The resumed run loads
    its clips in 2 DataLoader workers (a change resume applies): the clips they read draw their
    augmentation as the main process did in the uninterrupted run. The SVD base runs as the fault
    matrix case `video_lora_resumes_onto_its_own_trajectory` (tests/faults/concurrency_cases.py)."""
    config = BASES[base]
    train_in_process(config, [f"output_dir={tmp_path / 'full'}", *COMMON])
    resumed = resumable_copy(tmp_path / "full", tmp_path / "resumed")
    workers = [*COMMON, "train.num_workers=2", "train.resume=latest"]
    train_in_process(config, [f"output_dir={resumed}", *workers])
    return trajectories(tmp_path / "full", resumed)
