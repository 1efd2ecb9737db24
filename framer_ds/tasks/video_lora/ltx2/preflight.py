"""The LTX-2 family's pre-flight: what a `model.base.name: ltx2` config needs on disk and which of the
task's options it cannot honour, every problem at once, one line each naming the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framer_ds.config.errors import ConfigProblem
from framer_ds.tasks.video_lora.shared.data.buckets import size_problems

LTX2_SUBFOLDERS = ("transformer", "vae", "text_encoder", "connectors", "scheduler", "audio_vae", "vocoder")
# SamplingSettings of SVD's sampler; LTX-2 samples with its pipelines' own defaults
SVD_SAMPLING_SETTINGS = (
    "min_guidance_scale",
    "max_guidance_scale",
    "guidance_schedule",
    "noise_aug_strength",
    "decode_chunk_size",
)


def frame_count_problem(num_frames: int, step: int) -> str | None:
    """Why `num_frames` does not fit LTX-2's VAE (None: it does): the first frame alone, then `step`
    frames per latent frame; the message names the nearest fit."""
    if (num_frames - 1) % step:
        nearest = 1 + step * max(1, int((num_frames - 1) / step + 0.5))
        return f"LTX-2's VAE needs 1 + a multiple of {step} frames, got {num_frames}: use {nearest}"
    return None


def _folder_problems(base: Any, folder: Path) -> list[ConfigProblem]:
    if base.source.builtin is not None:
        return []
    missing = [s for s in LTX2_SUBFOLDERS if not any((folder / s).glob("*config.json"))]
    if not missing:
        return []
    return [
        ConfigProblem(
            "model.base.source.path",
            f"{folder} is not a diffusers LTX-2 folder (missing {', '.join(missing)}/); download one, e.g. "
            "`huggingface-cli download Lightricks/LTX-2 --local-dir DIR`, and point this key at DIR",
        )
    ]


def _unsupported(config: Any) -> list[ConfigProblem]:
    model, data, problems = config.model, config.data, []
    refused = {
        "data.tracks": (data.tracks is not None, "point tracks feed Framer's ControlNet; LTX-2 has none"),
        "data.layout": (data.layout != "videos", "an LTX-2 base trains on videos; set data.layout: videos"),
        "model.lora.preset": (model.lora.preset is not None, "'framer' names Framer's UNet layers; drop it"),
    }
    problems += [ConfigProblem(key, why) for key, (bad, why) in refused.items() if bad]
    if model.interp_eval.enabled and model.base.mode != "interpolation":
        problems.append(
            ConfigProblem(
                "model.interp_eval.enabled",
                "interpolation metrics compare frames sampled between a first and last frame; an "
                "image_to_video LTX-2 run has no last frame: set false",
            )
        )
    if model.interp_eval.enabled and model.interp_eval.clip_distance:
        problems.append(
            ConfigProblem(
                "model.interp_eval.clip_distance",
                "eval/clip_distance compares CLIP embeddings of the run's image encoder; LTX-2 has none: "
                "set false",
            )
        )
    for section in ("samples", "interp_eval"):
        settings = getattr(model, section)
        fields = type(settings).model_fields
        problems += [
            ConfigProblem(
                f"model.{section}.{name}",
                "an SVD sampler setting; an LTX-2 base samples at its diffusers pipeline's defaults: drop it",
            )
            for name in SVD_SAMPLING_SETTINGS
            if getattr(settings, name) != fields[name].default
        ]
    return problems


def ltx2_problems(
    config: Any, folder: Path, data_root: Path, multiple: int, frames: str | None
) -> list[ConfigProblem]:
    """Every problem of an LTX-2 config: the folder, the data (`multiple`: what H and W must be multiples
    of; `frames`: why data.num_frames does not fit) and the options that do not apply."""
    data = config.data
    problems = _folder_problems(config.model.base, folder)
    if data.source.builtin is None and not data_root.is_dir():
        problems.append(
            ConfigProblem("data.source.path", f"{data_root} does not exist; point it at a video folder.")
        )
    if frames:
        problems.append(ConfigProblem("data.num_frames", frames))
    problems += size_problems(data.height, data.width, multiple)
    return problems + _unsupported(config)
