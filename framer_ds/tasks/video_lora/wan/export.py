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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.export import save_peft_adapter_gathered
from framer_ds.engine.export_load import load_peft_adapter
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.tasks.video_lora.shared.exports import (
    EXPORT_METADATA,
    flag_name,
    load_frame,
    read_adapter_metadata,
    refuse_foreign_flags,
    require_last_image,
)
from framer_ds.tasks.video_lora.wan.options import WanSampleFlags
from framer_ds.tasks.video_lora.wan.preflight import frame_count_problem, vae_temporal_factor

WAN_OUTPUT_FPS = 16  # Wan 2.1's frame rate: the mp4's rate unless --fps says otherwise
WAN22_TI2V_FPS = 24  # Wan 2.2 TI2V-5B's (its repository's sample_fps)

DIFFUSERS_LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' LORA_WEIGHT_NAME_SAFE
COMFYUI_WAN_FILE = "wan_lora_comfyui.safetensors"


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
        """A video from a Wan export, with its frames as PNGs and `<stem>.json` (`sample_record.py`, the
        files every family's sample writes); `--save-frames` also the float frames in [0, 1] it encodes."""
        from framer_ds.tasks.video_lora.shared.data.video_write import to_uint8_frames
        from framer_ds.tasks.video_lora.shared.sample_record import describe, write_sample_outputs

        frames, settings = sample_wan_export(export_dir, options, announce=lambda r: print(describe(r)))
        if options.save_frames is not None:
            np.save(options.save_frames, frames[0].permute(0, 2, 3, 1).numpy())  # [F, H, W, 3]
        pixels = to_uint8_frames(frames[0] * 2 - 1)
        written = write_sample_outputs(
            options.out, pixels, settings["fps"], settings["record"], options.frames
        )
        experts = f", {settings['experts']}" if settings.get("experts") else ""
        return (
            f"wrote {options.out} ({written.codec_name}): {frames.shape[1]} frames at "
            f"{settings['width']}x{settings['height']}, {options.steps} steps, guidance "
            f"{settings['guidance_scale']:g}, shift {settings['shift']:g}, seed {options.seed}{experts}"
            f"{written.files_note()}"
        )

    def export_command(self, export_dir: Path, options: Any) -> str:
        """`--format comfyui` (ComfyUI's Wan LoRA keys) or `peft`; the others are the SVD family's."""
        from framer_ds.tasks.video_lora.shared.comfyui_lora import export_comfyui_lora
        from framer_ds.tasks.video_lora.shared.exports import export_peft

        metadata = read_adapter_metadata(export_dir)
        if options.format == "peft":
            return export_peft(export_dir, options)
        if options.format != "comfyui":
            problem = (
                f"{options.format!r} is an SVD/Framer format; a Wan export takes --format comfyui or peft"
            )
            raise ConfigError([ConfigProblem("--format", problem)], "export")
        from framer_ds.tasks.video_lora.wan.lora_layout import to_comfyui_state_dict

        path, _ = export_comfyui_lora(export_dir, metadata, options, COMFYUI_WAN_FILE, to_comfyui_state_dict)
        return f"wrote {path} (ComfyUI Wan LoRA keys, diffusion_model.blocks.N...)"


def _refuse_frame_count(base: Path, num_frames: int) -> None:
    """A length the VAE cannot decode to is refused before anything loads (the pipeline would round it
    down with a warning and write a shorter video than asked for)."""
    problem = frame_count_problem(num_frames, vae_temporal_factor(base))
    if problem:
        raise ConfigError([ConfigProblem("--num-frames", problem)], "sample")


def _refuse_svd_flags(options: Any, metadata: dict[str, Any]) -> None:
    """The SVD and Framer flags (another family's), --last-image for the mode, a prompt, and Wan 2.2's
    flags on a one-transformer base: refused by name before anything loads."""
    refuse_foreign_flags(options, "wan", (WanSampleFlags,))
    require_last_image(metadata, options, "Wan")
    if options.prompt is None:
        raise ConfigError([ConfigProblem("--prompt", "a Wan export needs a text prompt: pass --prompt")])
    if metadata.get("expert") is None:
        given = [f for f in ("other_expert", "guidance_scale_2") if getattr(options, f) is not None]
        if given:
            flag = flag_name(given[0])
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

    from framer_ds.tasks.video_lora.wan.preflight import EXPERT_SUBFOLDERS

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
def sample_wan_export(
    export_dir: Path, options: Any, announce: Callable[[dict[str, Any]], None] | None = None
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Frames [1, F, 3, H, W] float32 in [0, 1] from a Wan export, and the settings used (`record`:
    the sample's record, which `announce` hears before the denoising starts): the computation a run's
    validation samples make (wan/clip_sampler.sample_clip), on the export's adapter (and on a Wan 2.2 base
    both experts, switched as the pipeline switches them)."""
    from framer_ds.tasks.video_lora.shared.sample_record import sample_record
    from framer_ds.tasks.video_lora.shared.sample_shape import sample_shape
    from framer_ds.tasks.video_lora.wan.clip_sampler import WanSampling, encode_prompt, sample_clip
    from framer_ds.tasks.video_lora.wan.encoders import FrozenWanEncoders

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
    fps = options.fps or (WAN22_TI2V_FPS if defaults.expand_timesteps else WAN_OUTPUT_FPS)
    settings = {"num_frames": num_frames, "height": height, "width": width, "fps": fps}
    settings |= {"steps": options.steps, "prompt": options.prompt, "negative_prompt": negative}
    settings |= {"guidance_scale": guidance, "guidance_scale_2": options.guidance_scale_2}
    settings |= {"shift": defaults.shift, "scheduler": defaults.scheduler_class}
    if metadata.get("expert") is not None:
        other = str(options.other_expert) if options.other_expert is not None else None
        settings |= {"expert": metadata["expert"], "other_expert": other, "experts": experts}
    record = sample_record(export_dir, metadata, options, {**settings, "device": device, "dtype": "float32"})
    if announce is not None:
        announce(record)
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
    return frames.cpu(), {**settings, "experts": experts, "record": record}
