"""Step 7: what the per-micro-batch non-finite-loss check costs, in s/step.

Why: framer_ds reads every micro-batch's loss on the host (`torch.isfinite(...)` -> bool, a device sync)
and, with several ranks, all-reduces the flags, so a NaN on one rank skips the step on all of them. On a
GPU the sync stops the host from queueing the next micro-batch's kernels early. This runs the same
training in one process with the check as shipped and with `framer_ds.train.step.loss_flags` replaced
by a stand-in that never syncs, alternating the two so machine noise hits both, and reports the median
s/step of each (one process: the all-reduce part is not in this figure).
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cells import CONFIGS
from step_overhead import reset_accelerate
from torch.optim.optimizer import register_optimizer_step_post_hook

VIT_BASE = {
    "image_size": 224,
    "patch_size": 16,
    "num_channels": 3,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
}
WARMUP = 5


def overrides(work: Path, smoke: bool, steps: int) -> list[str]:
    common = [
        f"train.length.steps={steps}",
        "train.eval.every=null",
        "train.checkpoint.every=null",
        "train.gradient_accumulation_steps=4",
        f"output_dir={work}",
    ]
    if smoke:
        return [*common, "train.micro_batch_size=16"]
    vit = [f"model.source.config.{key}={value}" for key, value in VIT_BASE.items()]
    return [
        *common,
        *vit,
        "data.image_size=224",
        "train.micro_batch_size=64",
        "train.mixed_precision=bf16",
        "train.num_workers=8",
    ]


@contextmanager
def check_removed(enabled: bool):
    """The shipped check, or a stand-in giving the same answer for finite losses without a device sync."""
    from framer_ds.train import step

    shipped = step.loss_flags
    if not enabled:
        step.loss_flags = lambda accelerator, loss, stop_requested: (False, stop_requested())
    try:
        yield
    finally:
        step.loss_flags = shipped


def seconds_per_step(work: Path, smoke: bool, steps: int, check: bool) -> float:
    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.train.loop import run_training

    stamps: list[float] = []
    handle = register_optimizer_step_post_hook(lambda *_: stamps.append(time.perf_counter()))
    try:
        with check_removed(check):
            run_training(load_run_config(CONFIGS / "quickstart.yaml", overrides(work, smoke, steps)))
    finally:
        handle.remove()
        reset_accelerate()
    # Under accumulation the hook fires once per optimizer step (the inner optimizer steps at the boundary).
    kept = stamps[WARMUP - 1 :]
    return (kept[-1] - kept[0]) / max(len(kept) - 1, 1)


def run(work: Path, smoke: bool) -> list[dict[str, Any]]:
    steps, repeats = (WARMUP + 4, 1) if smoke else (WARMUP + 20, 3)
    timings: dict[bool, list[float]] = {True: [], False: []}
    for repeat in range(repeats):
        for check in (True, False) if repeat % 2 == 0 else (False, True):  # neither always goes first
            run_dir = work / f"nonfinite_{'on' if check else 'off'}_{repeat}"
            timings[check].append(seconds_per_step(run_dir, smoke, steps, check))
    on, off = statistics.median(timings[True]), statistics.median(timings[False])
    model = "quickstart ViT" if smoke else "ViT-B/16 224, bf16, micro-batch 64 x 4 accumulation"
    return [
        {
            "name": f"{model}: non-finite check on vs off",
            "strategy": "plain",
            "ok": True,
            "s_per_step": on,
            "s_per_step_without_check": off,
            "note": f"{on:.4f} s/step with the check, {off:.4f} without: {(on - off) / off:+.2%} "
            f"(median of {repeats}, steps {WARMUP}..{steps})",
        }
    ]
