"""The Wan family's pre-flight: what a `model.base.name: wan` config needs on disk and which of the
task's options it cannot honour, every problem at once, one line each naming the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from framer_ds.config.errors import ConfigProblem

WAN_SUBFOLDERS = ("transformer", "vae", "text_encoder", "image_encoder", "scheduler")


def two_experts(folder: Path) -> bool:
    """Whether `folder` is a Wan 2.2 base: a high-noise `transformer` and a low-noise `transformer_2`
    switched at `boundary_ratio`. Training the first alone at every noise level would fit an expert
    the pipeline only runs at high noise, so such a base is refused until experts are trained apart."""
    index = folder / "model_index.json"
    if not index.is_file():
        return False
    component = json.loads(index.read_text()).get("transformer_2")
    return bool(component and component[0] is not None)


def _folder_problems(base: Any, folder: Path) -> list[ConfigProblem]:
    """The folder's components, and its transformer's kind against `base.mode` (an FLF2V transformer's
    image embedder needs the last frame; an I2V one has no place for it)."""
    if base.source.builtin is not None:
        flf2v = base.source.builtin == "tiny_wan_flf2v"
    elif two_experts(folder):
        return [
            ConfigProblem(
                "model.base.source.path",
                f"{folder} is a two-expert Wan 2.2 base (transformer_2, boundary_ratio): training one "
                "expert at its own noise levels is not supported yet; use a Wan 2.1 I2V or FLF2V folder",
            )
        ]
    else:
        missing = [s for s in WAN_SUBFOLDERS if not any((folder / s).glob("*config.json"))]
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
    if flf2v != (base.mode == "interpolation"):
        kind, fix = ("an FLF2V", "interpolation") if flf2v else ("an I2V", "image_to_video")
        return [
            ConfigProblem(
                "model.base.mode",
                f"{base.mode} does not fit {kind} base (its image embedder takes "
                f"{'first and last' if flf2v else 'the first'} frame): set model.base.mode: {fix}",
            )
        ]
    return []


def _unsupported(config: Any) -> list[ConfigProblem]:
    """The task's options that belong to the SVD family (ControlNet tracks, motion scores, Framer's
    recipe) or that the Wan family does not run yet."""
    model, data, problems = config.model, config.data, []
    refused = {
        "data.tracks": (data.tracks is not None, "point tracks feed Framer's ControlNet; Wan has none"),
        "data.layout": (data.layout != "videos", "a Wan base trains on videos; set data.layout: videos"),
        "data.buckets": (data.buckets is not None, "not yet for Wan bases; set data.buckets: null"),
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
    """interp_eval needs the last frame (FLF2V); SVD's sampler settings set away from their defaults
    in model.samples / model.interp_eval would be silently ignored, so they are named."""
    problems = []
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
    for key in ("height", "width"):
        value = getattr(data, key)
        if value % multiple:
            problems.append(
                ConfigProblem(f"data.{key}", f"{value} is not a multiple of {multiple} (VAE x patch size)")
            )
    return problems + _unsupported(config) + sampling_problems(config.model)
