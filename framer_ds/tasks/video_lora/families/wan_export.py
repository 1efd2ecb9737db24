"""Export and sampling of the Wan family.

`final/` holds the peft adapter (adapter_model.safetensors + adapter_config.json, what `framer-ds eval`
and resume read) AND the same LoRA in diffusers' Wan layout, `pytorch_lora_weights.safetensors`, which
`WanImageToVideoPipeline.load_lora_weights(final/)` loads as is (wan/lora_layout.py), with the metadata
(`framer_ds_video_lora.json`: the base folder, mode, shape, shift). `framer-ds sample` runs the
pipeline's own computation (wan/sampling.py, with the base folder's own scheduler) with the pipeline's
defaults for that base (guidance, shift, negative prompt), so its frames equal diffusers' for the same
seed and inputs.
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
from framer_ds.storage.atomic import atomic_write_json, building_dir, publish_dir
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
        }
        atomic_write_json(out_dir / EXPORT_METADATA, metadata)

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
        return (
            f"wrote {options.out} ({'H.264' if codec == H264 else codec}): {frames.shape[1]} frames at "
            f"{settings['width']}x{settings['height']}, {options.steps} steps, guidance "
            f"{settings['guidance_scale']:g}, shift {settings['shift']:g}, seed {options.seed}"
        )

    def export_command(self, export_dir: Path, options: Any) -> str:
        """`--format comfyui` (ComfyUI's Wan LoRA keys) or `peft`; the others are the SVD family's."""
        from framer_ds.tasks.video_lora.export_formats import export_peft

        read_adapter_metadata(export_dir)
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
        with building_dir(options.out) as staging:
            save_file(to_comfyui_state_dict(tensors, config), str(staging / COMFYUI_WAN_FILE))
        publish_dir(staging, options.out)
        return f"wrote {options.out / COMFYUI_WAN_FILE} (ComfyUI Wan LoRA keys, diffusion_model.blocks.N...)"


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


@torch.no_grad()
def sample_wan_export(export_dir: Path, options: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Frames [1, F, 3, H, W] float32 in [0, 1] from a Wan export, and the settings used: the
    computation a run's validation samples make (wan_sampling.sample_clip), on the export's adapter."""
    from diffusers import WanTransformer3DModel
    from peft import PeftModel

    from framer_ds.tasks.video_lora.families.wan_parts import FrozenWanEncoders
    from framer_ds.tasks.video_lora.families.wan_sampling import WanSampling, encode_prompt, sample_clip
    from framer_ds.tasks.video_lora.sample_shape import sample_shape

    metadata = read_adapter_metadata(export_dir)
    _refuse_svd_flags(options, metadata)
    device, base = options.resolved_device(), Path(metadata["base_model"])
    height, width, num_frames = sample_shape(metadata, options.height, options.width, options.num_frames)
    sampling = WanSampling.for_base(base)
    defaults = sampling.defaults
    first = load_frame(options.image, height, width, device, options.resize)[None]
    last = (
        load_frame(options.last_image, height, width, device, options.resize)[None]
        if options.last_image
        else None
    )
    encoders = FrozenWanEncoders(base).for_sampling(device)
    transformer = WanTransformer3DModel.from_pretrained(base, subfolder="transformer").to(device)
    transformer = PeftModel.from_pretrained(transformer, Path(export_dir)).eval()
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
    )
    settings = {"height": height, "width": width, "guidance_scale": guidance, "shift": defaults.shift}
    return frames.cpu(), {**settings, "fps": options.fps or WAN_OUTPUT_FPS}
