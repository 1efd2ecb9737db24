"""The Wan family's pre-flight: what a `model.base.name: wan` config needs on disk and which of the
task's options it cannot honour, every problem at once, one line each naming the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from framer_ds.config.errors import ConfigProblem
from framer_ds.tasks.video_lora.shared.data.buckets import size_problems
from framer_ds.tasks.video_lora.wan.options import TINY_WAN22_BOUNDARY_RATIO

WAN_SUBFOLDERS = ("transformer", "vae", "text_encoder", "image_encoder", "scheduler")
TINY_TWO_EXPERT_BUILTINS = ("tiny_wan22_i2v",)
TINY_TI2V_BUILTINS = ("tiny_wan22_ti2v",)
EXPERT_SUBFOLDERS = {"high_noise": "transformer", "low_noise": "transformer_2"}


def model_index(folder: Path) -> dict[str, Any]:
    """The folder's model_index.json ({} without one)."""
    index = folder / "model_index.json"
    return json.loads(index.read_text()) if index.is_file() else {}


def _listed(index: dict[str, Any], component: str) -> bool:
    entry = index.get(component)
    return bool(entry and entry[0] is not None)


CLIP_VISION_CLASSES = ("CLIPVisionModel", "CLIPVisionModelWithProjection")


def image_encoder_class_name(folder: Path) -> str:
    """The transformers class of the folder's CLIP tower, as its model_index.json names it. Wan-AI's own
    folders ship `CLIPVisionModelWithProjection` (diffusers' pipeline loads that class); reading it as
    `CLIPVisionModel` works but makes transformers print a LOAD REPORT table of the unused projection on
    every rank. Both give the same `hidden_states[-2]` Wan conditions on. Anything else: CLIPVisionModel."""
    entry = model_index(folder).get("image_encoder") or [None, None]
    return entry[1] if entry[1] in CLIP_VISION_CLASSES else "CLIPVisionModel"


def two_experts(folder: Path) -> bool:
    """Whether `folder` is a Wan 2.2 base: a high-noise `transformer` and a low-noise `transformer_2`
    switched at `boundary_ratio` (the pipeline's `t >= boundary_ratio * num_train_timesteps`)."""
    return _listed(model_index(folder), "transformer_2")


def expands_timesteps(folder: Path) -> bool:
    """Whether `folder` is a Wan 2.2 TI2V-5B base: model_index.json's `expand_timesteps` (the first latent
    frame given, per-token timesteps; wan/ti2v.py)."""
    return bool(model_index(folder).get("expand_timesteps", False))


def has_image_encoder(folder: Path) -> bool:
    """Whether the base conditions on CLIP image states: Wan 2.1 I2V/FLF2V yes; Wan 2.2 I2V A14B lists
    image_encoder as null (its condition is the mask + first-frame latents only). A folder without a
    model_index.json is read as Wan 2.1's layout."""
    index = model_index(folder)
    return not index or _listed(index, "image_encoder")


def _expert_problems(base: Any, folder: Path, two: bool) -> list[ConfigProblem]:
    """`expert` required with two experts and refused without, `boundary_ratio` refused without."""
    if not two:
        one = f"{folder} holds one transformer (Wan 2.1, Wan 2.2 TI2V-5B)"
        return [
            ConfigProblem(f"model.base.{key}", f"{one}: drop {key}")
            for key in ("expert", "boundary_ratio")
            if getattr(base, key) is not None
        ]
    if base.expert is None:
        ratio = base.boundary_ratio or model_index(folder).get("boundary_ratio", TINY_WAN22_BOUNDARY_RATIO)
        return [
            ConfigProblem(
                "model.base.expert",
                f"{folder} is a two-expert Wan 2.2 base: set model.base.expert: high_noise (trains "
                f"transformer/ on timesteps >= {ratio} x 1000) or low_noise (trains transformer_2/ on the "
                "timesteps below); a second run trains the other",
            )
        ]
    return []


def vae_temporal_factor(folder: Path) -> int:
    """Pixel frames per latent frame after the first, from the folder's vae/config.json (4 in Wan 2.1
    and 2.2; also before a builtin base is built)."""
    try:
        return int(json.loads((folder / "vae" / "config.json").read_text())["scale_factor_temporal"])
    except (OSError, ValueError, KeyError):
        return 4


def frame_count_problem(num_frames: int, step: int) -> str | None:
    """Why `num_frames` does not fit Wan's VAE (None: it does), which encodes the first frame alone and
    then `step` (its temporal factor) frames per latent frame; the message names the nearest fit."""
    if (num_frames - 1) % step:
        nearest = 1 + step * max(1, int((num_frames - 1) / step + 0.5))
        return f"Wan's VAE needs 1 + a multiple of {step} frames, got {num_frames}: use {nearest}"
    return None


def _folder_problems(base: Any, folder: Path) -> list[ConfigProblem]:
    """The folder's components, the expert keys, and its transformer's kind against `base.mode` (an
    FLF2V transformer's image embedder needs the last frame; an I2V one has no place for it)."""
    ti2v = base.source.builtin in TINY_TI2V_BUILTINS
    if base.source.builtin is not None:
        flf2v = base.source.builtin == "tiny_wan_flf2v"
        two = base.source.builtin in TINY_TWO_EXPERT_BUILTINS
    else:
        two = two_experts(folder)
        wanted = [s for s in WAN_SUBFOLDERS if s != "image_encoder" or has_image_encoder(folder)]
        wanted += ["transformer_2"] if two else []
        missing = [s for s in wanted if not any((folder / s).glob("*config.json"))]
        if missing:
            return [
                ConfigProblem(
                    "model.base.source.path",
                    f"{folder} is not a diffusers Wan image-to-video folder (missing {', '.join(missing)}/); "
                    "download one, e.g. `huggingface-cli download Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers "
                    "--local-dir DIR`, and point this key at DIR",
                )
            ]
        transformer = json.loads((folder / "transformer" / "config.json").read_text())
        flf2v = transformer.get("pos_embed_seq_len") is not None
        ti2v = expands_timesteps(folder)
        if ti2v and list(transformer.get("patch_size", [])) != [1, 2, 2]:
            problem = (
                f"{folder} sets expand_timesteps with a transformer patch {transformer.get('patch_size')}: "
                "diffusers' pipeline gives one timestep per (1, 2, 2) patch; use a Wan2.2-TI2V-5B folder"
            )
            return [ConfigProblem("model.base.source.path", problem)]
    problems = _expert_problems(base, folder, two)
    if flf2v != (base.mode == "interpolation"):
        kind, fix = ("an FLF2V", "interpolation") if flf2v else ("an I2V", "image_to_video")
        given = "its image embedder takes " + ("first and last" if flf2v else "the first")
        if ti2v:
            kind, given = "a TI2V", "it is given the latents of the first"
        problems.append(
            ConfigProblem(
                "model.base.mode",
                f"{base.mode} does not fit {kind} base ({given} frame): set model.base.mode: {fix}",
            )
        )
    return problems


def _unsupported(config: Any) -> list[ConfigProblem]:
    """The task's options that belong to the SVD family (ControlNet tracks, motion scores, Framer's
    recipe) or that the Wan family does not run yet."""
    model, data, problems = config.model, config.data, []
    refused = {
        "data.tracks": (data.tracks is not None, "point tracks feed Framer's ControlNet; Wan has none"),
        "data.layout": (data.layout != "videos", "a Wan base trains on videos; set data.layout: videos"),
        "model.lora.preset": (model.lora.preset is not None, "'framer' names Framer's UNet layers; drop it"),
    }
    for key, (bad, why) in refused.items():
        if bad:
            problems.append(ConfigProblem(key, why))
    return problems


# SamplingSettings of SVD's sampler; Wan samples at the pipeline's defaults (guidance, shift, negative
# prompt; wan/sampling.pipeline_defaults) and decodes a clip in one VAE call.
SVD_SAMPLING_SETTINGS = (
    "min_guidance_scale",
    "max_guidance_scale",
    "guidance_schedule",
    "noise_aug_strength",
    "decode_chunk_size",
)


def sampling_problems(model: Any) -> list[ConfigProblem]:
    """Samples need both experts of a two-expert base; interp_eval needs the last frame (FLF2V); SVD's
    sampler settings set away from their defaults
    in model.samples / model.interp_eval would be silently ignored, so they are named."""
    problems = []
    if model.base.expert is not None:
        # sampling needs both experts; training holds only its own (the other 14B is never loaded)
        wanted = {
            "model.samples.every": bool(model.samples.every),
            "model.interp_eval.enabled": model.interp_eval.enabled,
        }
        problems += [
            ConfigProblem(
                key,
                "a two-expert Wan 2.2 run trains one expert and never loads the other, which every "
                "sample needs: turn it off and sample the two runs' exports with `framer-ds sample "
                "HIGH/final --other-expert LOW/final`",
            )
            for key, on in wanted.items()
            if on
        ]
    if model.interp_eval.enabled and model.base.mode != "interpolation":
        problems.append(
            ConfigProblem(
                "model.interp_eval.enabled",
                "interpolation metrics compare frames sampled between a first and last frame; an "
                "image_to_video Wan base has no last frame: set false",
            )
        )
    for section in ("samples", "interp_eval"):
        settings = getattr(model, section)
        fields = type(settings).model_fields
        for name in SVD_SAMPLING_SETTINGS:
            if getattr(settings, name) != fields[name].default:
                problems.append(
                    ConfigProblem(
                        f"model.{section}.{name}",
                        "an SVD sampler setting; a Wan base samples at WanImageToVideoPipeline's defaults "
                        "(guidance, shift, negative prompt of the base folder): drop it",
                    )
                )
    return problems


def wan_problems(
    config: Any, folder: Path, data_root: Path, multiple: int, frames: str | None
) -> list[ConfigProblem]:
    """Every problem of a Wan config: the folder, the mode, the data (`multiple`: what H and W must be
    multiples of; `frames`: why data.num_frames does not fit, or None) and the options that do not apply."""
    data = config.data
    problems = _folder_problems(config.model.base, folder)
    if data.source.builtin is None and not data_root.is_dir():
        problems.append(
            ConfigProblem("data.source.path", f"{data_root} does not exist; point it at a video folder.")
        )
    if frames:
        problems.append(ConfigProblem("data.num_frames", frames))
    problems += size_problems(data.height, data.width, multiple)
    return problems + _unsupported(config) + sampling_problems(config.model)
