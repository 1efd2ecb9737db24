"""The video_lora task's pre-flight (`VideoLoraTask.check`): what a config needs on disk and across its
sections, every problem at once.

Why its own module: these checks read the file system (the SVD directory, the data root, Framer's
files) and gather rules owned elsewhere (frame size, data layout, interp_eval, point tracks); the task
supplies only its paths. They run in `framer-ds validate` and before every run, so a wrong path fails
in a second, not after the models load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framer_ds.config.errors import ConfigProblem
from framer_ds.tasks.video_lora.data.video_clips import validate_svd_size
from framer_ds.tasks.video_lora.data_setup import layout_problems
from framer_ds.tasks.video_lora.framer_setup import FramerSetup
from framer_ds.tasks.video_lora.interp_eval import interp_eval_problems
from framer_ds.tasks.video_lora.tracks_setup import track_problems

SVD_SUBFOLDERS = ("unet", "vae", "image_encoder")


def config_problems(
    config: Any, svd_path: Path, data_root: Path, framer: FramerSetup | None
) -> list[ConfigProblem]:
    """Every problem of a video_lora config: `svd_path` and `data_root` as the task resolves them
    (the built-in tiny SVD and synthetic clips live in the cache), `framer` when model.base.name is framer."""
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
    if framer is not None:
        problems += framer.check(data)
    problems += interp_eval_problems(config)
    if model.motion_bucket == "from_data" and data.layout == "image_pairs":
        problems.append(
            ConfigProblem(
                "model.motion_bucket",
                "from_data scores videos; image pairs have no motion to score: set a number such as 127",
            )
        )
    problems += track_problems(data, framer_base=framer is not None)
    return problems + layout_problems(data, model.base.mode, model.fps)
