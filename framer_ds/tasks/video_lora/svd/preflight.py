"""The SVD family's pre-flight (`SvdFamily.check`, Framer's too): what a config needs on disk and across
its sections, every problem at once.

Why its own module: these checks read the file system (the SVD directory, the data root) and gather
rules owned elsewhere (frame size, data layout, interp_eval); a family that extends SVD's (Framer) adds
its own problems through the family's hooks. They run in `framer-ds validate` and before every run, so
a wrong path fails in a second, not after the models load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framer_ds.config.errors import ConfigProblem
from framer_ds.tasks.video_lora.shared.data_setup import layout_problems
from framer_ds.tasks.video_lora.shared.interp_eval import interp_eval_problems

SVD_SUBFOLDERS = ("unet", "vae", "image_encoder")


def validate_svd_size(height: int, width: int, where: str = "data") -> list[ConfigProblem]:
    """SVD's VAE downsamples by 8 and its UNet by 8 more, so both sides must be multiples of 64."""
    problems = []
    for name, value in (("height", height), ("width", width)):
        if value < 64 or value % 64:
            nearest = max(64, round(value / 64) * 64)
            problems.append(
                ConfigProblem(
                    f"{where}.{name}",
                    f"{value} is not a multiple of 64 (>= 64), which Stable Video Diffusion needs "
                    f"(VAE /8, UNet /8); use {nearest}, e.g. 576x1024 as SVD was trained.",
                )
            )
    return problems


def tracks_unused(data: Any) -> list[ConfigProblem]:
    """data.tracks on a base without a trajectory ControlNet: nothing would read them."""
    if data.tracks is None:
        return []
    return [
        ConfigProblem(
            "data.tracks",
            "point tracks feed Framer's trajectory ControlNet, and model.base.name svd has none, so "
            "nothing would read them: set model.base.name framer "
            "(configs/tasks/video_lora/framer_tiny.yaml) or drop data.tracks.",
        )
    ]


def config_problems(
    config: Any,
    svd_path: Path,
    data_root: Path,
    base_problems: list[ConfigProblem],
    track_problems: list[ConfigProblem],
) -> list[ConfigProblem]:
    """Every problem of an SVD-family config: `svd_path` and `data_root` as the task resolves them (the
    built-in tiny SVD and synthetic clips live in the cache); `base_problems` and `track_problems`: the
    family's own (`SvdFamily.base_problems`, `track_problems`: Framer's checkpoint and point tracks)."""
    model, data = config.model, config.data
    problems = validate_svd_size(data.height, data.width)
    if model.source.builtin is None:
        missing = [s for s in SVD_SUBFOLDERS if not (svd_path / s / "config.json").is_file()]
        if missing:
            problems.append(
                ConfigProblem(
                    "model.source.path",
                    f"{svd_path} is not a diffusers SVD directory (missing {', '.join(missing)}/"
                    "config.json). Download it once, e.g. `huggingface-cli download "
                    "stabilityai/stable-video-diffusion-img2vid-xt --local-dir DIR`, and point this "
                    "key at DIR.",
                )
            )
    if data.source.builtin is None and not data_root.is_dir():
        problems.append(
            ConfigProblem("data.source.path", f"{data_root} does not exist; point it at a video folder.")
        )
    problems += base_problems
    problems += interp_eval_problems(config)
    if model.motion_bucket == "from_data" and data.layout == "image_pairs":
        problems.append(
            ConfigProblem(
                "model.motion_bucket",
                "from_data scores videos; image pairs have no motion to score: set a number such as 127",
            )
        )
    problems += track_problems
    return problems + layout_problems(data, model.base.mode, model.fps)
