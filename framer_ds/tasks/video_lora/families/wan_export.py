"""Export and sampling of the Wan family.

`final/` holds the peft adapter (adapter_model.safetensors + adapter_config.json, what `framer-ds eval`
and resume read) AND the same LoRA in diffusers' Wan layout, `pytorch_lora_weights.safetensors`, which
`WanImageToVideoPipeline.load_lora_weights(final/)` loads as is (wan/lora_layout.py), with the metadata
(`framer_ds_video_lora.json`: the base folder, mode, shape, shift; on a Wan 2.2 base the expert and
its boundary). `framer-ds sample` runs the pipeline's own computation (wan/sampling.py, with the base
folder's own scheduler) with the pipeline's defaults for that base (guidance, shift, negative prompt), so
its frames equal diffusers' for the same seed and inputs.

Wan 2.2: an export holds ONE expert's LoRA, in the same diffusers layout whichever expert (diffusers'
`load_lora_weights(final/, load_into_transformer_2=True)` puts a low-noise one on `transformer_2`).
`framer-ds sample` runs both experts switched at the boundary, as the pipeline does, the export's LoRA on
its expert and, with `--other-expert RUN2/final`, the other run's LoRA on the other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.export import save_peft_adapter_gathered
from framer_ds.engine.export_load import load_peft_adapter
from framer_ds.engine.export_out import export_file
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.tasks.video_lora.families.wan_preflight import frame_count_problem, vae_temporal_factor
from framer_ds.tasks.video_lora.inference import EXPORT_METADATA, load_frame, read_adapter_metadata

WAN_OUTPUT_FPS = 16  # Wan 2.1's frame rate: the mp4's rate unless --fps says otherwise

DIFFUSERS_LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' LORA_WEIGHT_NAME_SAFE
COMFYUI_WAN_FILE = "wan_lora_comfyui.safetensors"
# `framer-ds sample` flags of the SVD family that a Wan export cannot honour (--fps is only the mp4's rate).
SVD_ONLY_FLAGS = (
    "motion_bucket",
    "noise_aug",
    "min_guidance",
    "max_guidance",
    "guidance_schedule",
    "tracks",
    "controlnet_scale",
    "controlnet_step_range",
)


def diffusers_lora_state_dict(adapter_dir: Path) -> dict[str, torch.Tensor]:
    """The peft adapter of `adapter_dir` in diffusers' Wan layout (peft's alpha / r folded into B)."""
    from framer_ds.tasks.video_lora.wan.lora_layout import to_diffusers_state_dict

    config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    return to_diffusers_state_dict(load_file(str(Path(adapter_dir) / "adapter_model.safetensors")), config)


class WanExports:
    """`export`, `load_export`, `sample`, `export_command` of `WanFamily` (needs its config, base path,
    shift)."""

    def export(self, accelerator, model, out_dir: Path, run_facts: dict[str, Any]) -> None:
        save_peft_adapter_gathered(accelerator, model, out_dir)
        if not accelerator.is_main_process:
            return
        out_dir, data = Path(out_dir), self.config.data
        save_file(diffusers_lora_state_dict(out_dir), str(out_dir / DIFFUSERS_LORA_FILE))
        metadata = {
            "base": "wan",
            "base_model": str(self.base_path()),
            "mode": self.config.model.base.mode,
            "num_frames": data.num_frames,
            "height": data.height,
            "width": data.width,
            "shift": self.shift(),
            "trained_shapes": run_facts["trained_shapes"],
            **self.export_record_fields(),
        }
        atomic_write_json(out_dir / EXPORT_METADATA, metadata)

    def export_record_fields(self) -> dict[str, Any]:
        """A Wan 2.2 run's expert and boundary (what `--other-expert` and diffusers' loader need)."""
        expert = self.config.model.base.expert
        return {} if expert is None else {"expert": expert, "boundary_ratio": self.boundary_ratio()}

    def load_export(self, model, export_dir: Path) -> torch.nn.Module:
        load_peft_adapter(model, Path(export_dir))
        return model

    def sample(self, export_dir: Path, options: Any) -> str:
        """A video (+ `--save-frames` the float frames in [0, 1] it encodes) from a Wan export."""
        from framer_ds.tasks.video_lora.data.video_write import H264, to_uint8_frames, write_video

        frames, settings = sample_wan_export(export_dir, options)
        if options.save_frames is not None:
            np.save(options.save_frames, frames[0].permute(0, 2, 3, 1).numpy())  # [F, H, W, 3]
        codec = write_video(options.out, to_uint8_frames(frames[0] * 2 - 1), settings["fps"])
        experts = f", {settings['experts']}" if settings.get("experts") else ""
        return (
            f"wrote {options.out} ({'H.264' if codec == H264 else codec}): {frames.shape[1]} frames at "
            f"{settings['width']}x{settings['height']}, {options.steps} steps, guidance "
            f"{settings['guidance_scale']:g}, shift {settings['shift']:g}, seed {options.seed}{experts}"
        )

    def export_command(self, export_dir: Path, options: Any) -> str:
        """`--format comfyui` (ComfyUI's Wan LoRA keys) or `peft`; the others are the SVD family's."""
        from framer_ds.tasks.video_lora.export_formats import comfyui_file_metadata, export_peft

        metadata = read_adapter_metadata(export_dir)
        if options.format == "peft":
            return export_peft(export_dir, options)
        if options.format != "comfyui":
            problem = (
                f"{options.format!r} is an SVD/Framer format; a Wan export takes --format comfyui or peft"
            )
            raise ConfigError([ConfigProblem("--format", problem)], "export")
        from framer_ds.tasks.video_lora.wan.lora_layout import to_comfyui_state_dict

        config = json.loads((Path(export_dir) / "adapter_config.json").read_text())
        tensors = load_file(str(Path(export_dir) / "adapter_model.safetensors"))
        header = comfyui_file_metadata({**metadata, "format": "comfyui"})
        with export_file(options.out, COMFYUI_WAN_FILE, options.overwrite) as path:  # beside the others
            save_file(to_comfyui_state_dict(tensors, config), str(path), metadata=header)
        return (
            f"wrote {Path(options.out) / COMFYUI_WAN_FILE} (ComfyUI Wan LoRA keys, "
            "diffusion_model.blocks.N...)"
        )


def _refuse_frame_count(base: Path, num_frames: int) -> None:
    """A length the VAE cannot decode to is refused before anything loads (the pipeline would round it
    down with a warning and write a shorter video than asked for)."""
    problem = frame_count_problem(num_frames, vae_temporal_factor(base))
    if problem:
        raise ConfigError([ConfigProblem("--num-frames", problem)], "sample")


def _refuse_svd_flags(options: Any, metadata: dict[str, Any]) -> None:
    given = [name for name in SVD_ONLY_FLAGS if name in options.model_fields_set]
    if given:
        flag = "--" + given[0].replace("_", "-")
        problem = f"an SVD/Framer conditioning flag; this export's base is Wan: drop {flag}"
        raise ConfigError([ConfigProblem(flag, problem)], "sample")
    if (metadata["mode"] == "interpolation") != (options.last_image is not None):
        need = "required" if metadata["mode"] == "interpolation" else "not used"
        problem = f"this is a {metadata['mode']} Wan adapter: --last-image is {need}"
        raise ConfigError([ConfigProblem("--last-image", problem)], "sample")
    if options.prompt is None:
        raise ConfigError([ConfigProblem("--prompt", "a Wan export needs a text prompt: pass --prompt")])
    if metadata.get("expert") is None:
        given = [f for f in ("other_expert", "guidance_scale_2") if getattr(options, f) is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            problem = "a Wan 2.2 (two-expert) flag; this export's base has one transformer: drop it"
            raise ConfigError([ConfigProblem(flag, problem)], "sample")


def _expert_adapters(metadata: dict[str, Any], export_dir: Path, options: Any) -> dict[str, Path]:
    """{expert: adapter dir}: the export's own, and `--other-expert`'s, refused (before anything loads)
    unless it trained the other expert of the same base at the same boundary (an adapter on the wrong
    expert or base would sample silently wrong frames)."""
    expert = metadata.get("expert") or "high_noise"  # a one-transformer base: its only transformer
    adapters = {expert: Path(export_dir)}
    if options.other_expert is None:
        return adapters
    other_dir = Path(options.other_expert)
    other = read_adapter_metadata(other_dir)
    wanted = "low_noise" if expert == "high_noise" else "high_noise"
    if other.get("expert") != wanted or other.get("base_model") != metadata["base_model"]:
        problem = (
            f"{other_dir} is an export of expert {other.get('expert')!r} of {other.get('base_model')}; "
            f"pass the final/ of a run that trained {wanted!r} of {metadata['base_model']}"
        )
        raise ConfigError([ConfigProblem("--other-expert", problem)], "sample")
    if other.get("boundary_ratio") != metadata["boundary_ratio"]:
        problem = (
            f"{other_dir} trained at boundary_ratio {other.get('boundary_ratio')}, this export at "
            f"{metadata['boundary_ratio']}: train both experts at one boundary"
        )
        raise ConfigError([ConfigProblem("--other-expert", problem)], "sample")
    return {**adapters, wanted: other_dir}


def _transformers(
    base: Path, metadata: dict[str, Any], adapters: dict[str, Path], device: str
) -> tuple[torch.nn.Module, torch.nn.Module | None, str]:
    """(transformer, transformer_2 or None, what runs): one transformer with the export's LoRA, or on a
    Wan 2.2 base both experts, each with its run's LoRA (`_expert_adapters`)."""
    from diffusers import WanTransformer3DModel
    from peft import PeftModel

    from framer_ds.tasks.video_lora.families.wan_preflight import EXPERT_SUBFOLDERS

    expert = metadata.get("expert")
    models = {}
    for name in ("high_noise",) if expert is None else EXPERT_SUBFOLDERS:
        model = WanTransformer3DModel.from_pretrained(base, subfolder=EXPERT_SUBFOLDERS[name]).to(device)
        if name in adapters:
            model = PeftModel.from_pretrained(model, adapters[name])
        models[name] = model.eval()
    what = "" if expert is None else "experts with a LoRA: " + " + ".join(sorted(adapters))
    return models["high_noise"], models.get("low_noise"), what


@torch.no_grad()
def sample_wan_export(export_dir: Path, options: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Frames [1, F, 3, H, W] float32 in [0, 1] from a Wan export, and the settings used: the
    computation a run's validation samples make (wan_sampling.sample_clip), on the export's adapter (and
    on a Wan 2.2 base both experts, switched as the pipeline switches them)."""
    from framer_ds.tasks.video_lora.families.wan_parts import FrozenWanEncoders
    from framer_ds.tasks.video_lora.families.wan_sampling import WanSampling, encode_prompt, sample_clip
    from framer_ds.tasks.video_lora.sample_shape import sample_shape

    metadata = read_adapter_metadata(export_dir)
    _refuse_svd_flags(options, metadata)
    adapters = _expert_adapters(metadata, Path(export_dir), options)
    device, base = options.resolved_device(), Path(metadata["base_model"])
    height, width, num_frames = sample_shape(metadata, options.height, options.width, options.num_frames)
    _refuse_frame_count(base, num_frames)
    sampling = WanSampling.for_base(base)
    defaults = sampling.defaults
    first = load_frame(options.image, height, width, device, options.resize)[None]
    last = (
        load_frame(options.last_image, height, width, device, options.resize)[None]
        if options.last_image
        else None
    )
    encoders = FrozenWanEncoders(base).for_sampling(device)
    transformer, transformer_2, experts = _transformers(base, metadata, adapters, device)
    negative = options.negative_prompt or defaults.negative_prompt
    texts = [
        encode_prompt(encoders, text, defaults.max_sequence_length) for text in (options.prompt, negative)
    ]
    guidance = options.guidance_scale if options.guidance_scale is not None else defaults.guidance_scale
    frames = sample_clip(
        transformer,
        encoders,
        sampling,
        (texts[0], texts[1]),
        (first, last),
        num_frames,
        options.steps,
        guidance,
        torch.Generator(device=device).manual_seed(options.seed),
        transformer_2=transformer_2,
        boundary_ratio=metadata.get("boundary_ratio"),
        guidance_scale_2=options.guidance_scale_2,  # None: the pipeline's default, = guidance
    )
    settings = {"height": height, "width": width, "guidance_scale": guidance, "shift": defaults.shift}
    settings["experts"] = experts
    return frames.cpu(), {**settings, "fps": options.fps or WAN_OUTPUT_FPS}
