"""The tasks and bases the contract suite (`test_task_contract.py`) runs, one `ContractCase` line each.

Adding a task or a base model to the suite is one more line in `CASES` (plus, for a new task, the
function that writes the inputs its `framer-ds sample` reads). Every config key the suite sets lives in
this file and nowhere else: `run_overrides` holds the shared `train:` keys (step counts, cadences, the
output directory), so a rename of those keys is one edit here; each case's `overrides` hold its task's
own keys (`model.*`, `data.*`), so a rename of a task's keys is one edit in its line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"


def run_overrides(
    steps: int, checkpoint_every: int, output_dir: Path, resume: bool = False, workers: int = 0
) -> list[str]:
    """The shared `train:` keys of every contract run: `steps` optimizer steps, a checkpoint every
    `checkpoint_every` steps (all of them kept, so a run can be cut back to its first checkpoint), a
    loss line every step, one evaluation (at the end, which the loop always does when there is an eval
    set) that `best/` keeps (so the run directory holds every kind of export), `workers` DataLoader
    workers, and `train.resume=latest` when `resume`. Setting a cadence's steps replaces a config's
    epochs (quickstart's)."""
    return [
        f"output_dir={output_dir}",
        f"train.length.steps={steps}",
        f"train.checkpoint.every.steps={checkpoint_every}",
        f"train.checkpoint.keep_last={steps}",
        "train.eval.every=null",
        "train.eval.best_metric=eval/loss",
        "train.eval.best_mode=min",
        "train.log_every=1",
        f"train.num_workers={workers}",
        *(["train.resume=latest"] if resume else []),
    ]


@dataclass(frozen=True)
class SampleCall:
    """`framer-ds sample EXPORT <args>` and the files it must write."""

    args: list[str]
    writes: list[Path] = field(default_factory=list)


def _image(path: Path, size: int, seed: int) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def vit_sample(scratch: Path) -> SampleCall:
    return SampleCall(["--image", str(_image(scratch / "digit.png", 8, 0)), "--device", "cpu"])


def video_sample(scratch: Path) -> SampleCall:
    """First and last frame (an interpolation adapter needs both), 2 Euler steps."""
    first, last = _image(scratch / "first.png", 64, 1), _image(scratch / "last.png", 64, 2)
    out = scratch / "video.mp4"
    args = ["--image", str(first), "--last-image", str(last), "--out", str(out), "--steps", "2"]
    return SampleCall([*args, "--device", "cpu"], [out])


def wan_sample(scratch: Path) -> SampleCall:
    """A Wan FLF2V export: first and last frame, a prompt, 2 steps, the float frames saved too."""
    first, last = _image(scratch / "first.png", 64, 1), _image(scratch / "last.png", 64, 2)
    out, frames = scratch / "video.mp4", scratch / "frames.npy"
    args = ["--image", str(first), "--last-image", str(last), "--prompt", "a red ball rolls"]
    args += ["--num-inference-steps", "2", "--out", str(out), "--save-frames", str(frames)]
    return SampleCall([*args, "--device", "cpu"], [out, frames])


def wan22_sample(scratch: Path) -> SampleCall:
    """A Wan 2.2 export (one expert of A14B: 2 steps on both experts; or TI2V-5B): first frame, a prompt,
    2 steps, frames saved."""
    first = _image(scratch / "first.png", 64, 1)
    out, frames = scratch / "video.mp4", scratch / "frames.npy"
    args = ["--image", str(first), "--prompt", "a red ball rolls"]
    args += ["--num-inference-steps", "2", "--out", str(out), "--save-frames", str(frames)]
    return SampleCall([*args, "--device", "cpu"], [out, frames])


def ltx2_sample(scratch: Path) -> SampleCall:
    """An LTX-2 keyframe-interpolation export: first and last frame, a prompt, 2 steps, frames saved."""
    first, last = _image(scratch / "first.png", 64, 1), _image(scratch / "last.png", 64, 2)
    out, frames = scratch / "video.mp4", scratch / "frames.npy"
    args = ["--image", str(first), "--last-image", str(last), "--prompt", "a red ball rolls"]
    args += ["--steps", "2", "--out", str(out), "--save-frames", str(frames)]
    return SampleCall([*args, "--device", "cpu"], [out, frames])


def tts_sample(scratch: Path) -> SampleCall:
    out = scratch / "speech.wav"
    args = ["--text", "hello world", "--out", str(out), "--max-new-tokens", "70", "--device", "cpu"]
    return SampleCall(args, [out])


def drivable_sample(scratch: Path) -> SampleCall:
    """3 frames x 3 views (the tiny config's) of 32 px, frame by frame, and a [3, 9] ego motion."""
    images = [str(_image(scratch / f"view_{i}.png", 32, 10 + i)) for i in range(9)]
    ego = scratch / "ego.json"
    ego.write_text(json.dumps(np.zeros((3, 9)).tolist()))
    out = scratch / "masks"
    return SampleCall(
        ["--images", *images, "--ego-motion", str(ego), "--out", str(out)], [out / "overlay.png"]
    )


@dataclass(frozen=True)
class ContractCase:
    """One task (or one base of a task) as the contract suite runs it.

    `overrides`: the task's own keys, e.g. media written once, at the end (`samples.every` past the
    run's length: the run directory then holds samples too, at the cost of one round) or augmentation
    switched on (its draws must survive a resume too). `exports`: the `framer-ds export --format`
    values its export takes (none: the task has no `framer-ds export`)."""

    name: str
    config: Path
    sample: Callable[[Path], SampleCall]
    overrides: tuple[str, ...] = ()
    exports: tuple[str, ...] = ()


VIDEO = CONFIGS / "tasks" / "video_lora"
AT_THE_END = "model.samples.every=1000"  # past every contract run's length: one round, at the end
ONE_VIDEO = (AT_THE_END, "model.samples.count=1", "model.samples.num_inference_steps=2")
CASES = [
    ContractCase(  # train-time augmentation on: its draws must survive a resume too
        "vit_classification",
        CONFIGS / "quickstart.yaml",
        vit_sample,
        ("data.hflip=true", "data.random_crop_padding=1"),
    ),
    ContractCase("video_lora_svd", VIDEO / "tiny.yaml", video_sample, ONE_VIDEO, ("peft", "merged")),
    ContractCase(
        "video_lora_framer",
        VIDEO / "framer_tiny.yaml",
        video_sample,
        (*ONE_VIDEO, "model.interp_eval.enabled=false"),
        ("peft", "merged", "framer"),
    ),
    ContractCase("video_lora_wan", VIDEO / "wan_tiny.yaml", wan_sample, ONE_VIDEO, ("peft", "comfyui")),
    # a Wan 2.2 run trains one expert and cannot sample while training (refused): no samples/
    ContractCase("video_lora_wan22", VIDEO / "wan22_tiny.yaml", wan22_sample, (), ("peft", "comfyui")),
    ContractCase("video_lora_ltx2", VIDEO / "ltx2_tiny.yaml", ltx2_sample, ONE_VIDEO, ("peft", "comfyui")),
    ContractCase(
        "video_lora_wan22_ti2v", VIDEO / "wan22_ti2v_tiny.yaml", wan22_sample, ONE_VIDEO, ("peft", "comfyui")
    ),
    ContractCase(
        "tts_lm",
        CONFIGS / "tasks" / "tts_lm" / "tiny.yaml",
        tts_sample,
        # the quality gates have their own test (tts_lm/test_quality_eval_run.py); here they would only
        # add minutes to `framer-ds eval` and metrics the runs never logged
        (AT_THE_END, "model.samples.prompts=[hello]", "model.quality_eval.enabled=false"),
    ),
    ContractCase(
        "drivable_vit",
        CONFIGS / "tasks" / "drivable_vit" / "tiny.yaml",
        drivable_sample,
        (AT_THE_END, "model.samples.count=1"),
    ),
]
