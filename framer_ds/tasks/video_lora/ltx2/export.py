"""Export and sampling of the LTX-2 family.

`final/` holds the peft adapter (adapter_model.safetensors + adapter_config.json, what `framer-ds eval`
and resume read) AND the same LoRA in diffusers' layout, `pytorch_lora_weights.safetensors` written by
diffusers' own `save_lora_weights` (keys `transformer.transformer_blocks.N.attn1.to_q.lora_A.weight`,
peft's rank and alpha in its `lora_adapter_metadata` header), which `LTX2ImageToVideoPipeline` /
`LTX2ConditionPipeline.load_lora_weights(final/)` load as is; with the metadata
(`framer_ds_video_lora.json`: the base folder, mode, shape, and the frame rate training used: `fps`,
`fps_source`, `fps_range`, as SVD's, `framer-ds sample`'s default). `framer-ds sample` runs the mode's
pipeline with the adapter (ltx2/sampling.py), so its frames are the pipeline's for the same seed and
inputs. `framer-ds export --format comfyui` writes the LoRA in LTX-2's own layout, which ComfyUI loads
(`export_comfyui`; golden-tested against ComfyUI's code: tests/golden/ltx2_lora_keys).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.export import save_peft_adapter_gathered
from framer_ds.engine.export_load import load_peft_adapter
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.tasks.video_lora.shared.exports import (
    EXPORT_METADATA,
    load_frame,
    read_adapter_metadata,
    refuse_foreign_flags,
    require_last_image,
    trained_fps_metadata,
)
from framer_ds.tasks.video_lora.shared.options import TextSampleFlags

DIFFUSERS_LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' LORA_WEIGHT_NAME_SAFE
COMFYUI_LTX2_FILE = "ltx2_lora_comfyui.safetensors"


def write_diffusers_lora(adapter_dir: Path) -> None:
    """The peft adapter of `adapter_dir` beside it in diffusers' layout, through diffusers' own writer."""
    from diffusers import LTX2ImageToVideoPipeline

    from framer_ds.tasks.video_lora.ltx2.lora import to_diffusers_state_dict

    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    layers = {k.removeprefix("transformer."): v for k, v in to_diffusers_state_dict(tensors).items()}
    metadata = {
        key: config[key] for key in ("r", "lora_alpha", "target_modules", "use_rslora") if key in config
    }
    metadata["target_modules"] = sorted(metadata.get("target_modules") or [])
    LTX2ImageToVideoPipeline.save_lora_weights(
        adapter_dir,
        transformer_lora_layers=layers,
        transformer_lora_adapter_metadata=metadata,
        weight_name=DIFFUSERS_LORA_FILE,
    )


class Ltx2Exports:
    """`export`, `load_export`, `sample`, `export_command` of `Ltx2Family` (needs its config, base path)."""

    def export(self, accelerator, model, out_dir: Path, run_facts: dict[str, Any]) -> None:
        save_peft_adapter_gathered(accelerator, model, out_dir)
        if not accelerator.is_main_process:
            return
        out_dir, data = Path(out_dir), self.config.data
        write_diffusers_lora(out_dir)
        metadata = {
            "base": "ltx2",
            "base_model": str(self.base_path()),
            "mode": self.config.model.base.mode,
            "num_frames": data.num_frames,
            "height": data.height,
            "width": data.width,
            **trained_fps_metadata(self.config.model.fps, run_facts["trained_fps"]),
            "trained_shapes": run_facts["trained_shapes"],
        }
        atomic_write_json(out_dir / EXPORT_METADATA, metadata)

    def load_export(self, model, export_dir: Path) -> torch.nn.Module:
        load_peft_adapter(model, Path(export_dir))
        return model

    def sample(self, export_dir: Path, options: Any) -> str:
        """A video from an LTX-2 export, with its frames as PNGs and `<stem>.json` (the files every
        family's sample writes); `--save-frames` also the float frames in [0, 1] it encodes."""
        from framer_ds.tasks.video_lora.shared.data.video_write import to_uint8_frames
        from framer_ds.tasks.video_lora.shared.sample_record import describe, write_sample_outputs

        frames, settings = sample_ltx2_export(export_dir, options, announce=lambda r: print(describe(r)))
        if options.save_frames is not None:
            np.save(options.save_frames, frames[0].permute(0, 2, 3, 1).numpy())  # [F, H, W, 3]
        pixels = to_uint8_frames(frames[0] * 2 - 1)
        written = write_sample_outputs(
            options.out, pixels, settings["fps"], settings["record"], options.frames
        )
        return (
            f"wrote {options.out} ({written.codec_name}): {frames.shape[1]} frames at "
            f"{settings['width']}x{settings['height']}, {options.steps} steps, {settings['pipeline']}, "
            f"seed {options.seed}{written.files_note()}"
        )

    def export_command(self, export_dir: Path, options: Any) -> str:
        """`--format peft` or `comfyui`; the diffusers layout is in final/ already
        (pytorch_lora_weights.safetensors)."""
        from framer_ds.tasks.video_lora.shared.exports import export_peft

        if options.format == "peft":
            return export_peft(export_dir, options)
        if options.format == "comfyui":
            return export_comfyui(Path(export_dir), options)
        problem = (
            f"{options.format!r} is not an LTX-2 format; an LTX-2 export takes --format peft or comfyui "
            f"(final/ also holds {DIFFUSERS_LORA_FILE}, which the diffusers pipelines' load_lora_weights "
            "reads)"
        )
        raise ConfigError([ConfigProblem("--format", problem)], "export")


def export_comfyui(export_dir: Path, options: Any) -> str:
    """`--format comfyui`: one file in LTX-2's own LoRA layout (ltx2/lora.py: the keys ComfyUI's LoRA
    loader maps for its LTX-2 model, scale folded into lora_B), added beside the files in --out."""
    from framer_ds.tasks.video_lora.ltx2.lora import to_comfyui_state_dict
    from framer_ds.tasks.video_lora.shared.comfyui_lora import export_comfyui_lora

    metadata = read_adapter_metadata(export_dir)
    if options.base is not None:  # the key names are the transformer's own: no base is read
        problem = "an LTX-2 comfyui export reads no base model (its keys are the transformer's): drop --base"
        raise ConfigError([ConfigProblem("--base", problem)], "export")
    path, tensors = export_comfyui_lora(
        export_dir, metadata, options, COMFYUI_LTX2_FILE, to_comfyui_state_dict
    )
    return (
        f"wrote {path}: {len(tensors) // 2} LoRA modules in LTX-2's own layout (diffusion_model."
        "transformer_blocks.N...): put it in ComfyUI/models/loras and apply it with LoraLoaderModelOnly "
        "to an LTX-2 model"
    )


def export_frame_rate(metadata: dict[str, Any]) -> float:
    """The rate an export trained at (`fps`); exports written before it was recorded trained every clip
    at the pipelines' 24 fps (`frame_rate`)."""
    from framer_ds.tasks.video_lora.ltx2.options import FRAME_RATE

    return metadata.get("fps") or metadata.get("frame_rate") or FRAME_RATE


@torch.no_grad()
def sample_ltx2_export(export_dir: Path, options: Any, announce=None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Frames [1, F, 3, H, W] float32 in [0, 1] from an LTX-2 export, and the settings used (`record`:
    the sample's record, which `announce` hears before the denoising starts)."""
    from diffusers import LTX2VideoTransformer3DModel
    from peft import PeftModel

    from framer_ds.tasks.video_lora.ltx2.conditioning import compression
    from framer_ds.tasks.video_lora.ltx2.preflight import frame_count_problem
    from framer_ds.tasks.video_lora.ltx2.sampling import load_pipeline, pipeline_class, run_pipeline, to_image
    from framer_ds.tasks.video_lora.shared.sample_record import sample_record
    from framer_ds.tasks.video_lora.shared.sample_shape import sample_shape

    metadata = read_adapter_metadata(export_dir)
    refuse_foreign_flags(options, "ltx2", (TextSampleFlags,))
    require_last_image(metadata, options, "LTX-2")
    if options.prompt is None:
        raise ConfigError([ConfigProblem("--prompt", "an LTX-2 export needs a text prompt: pass --prompt")])
    device, base, mode = options.resolved_device(), Path(metadata["base_model"]), metadata["mode"]
    height, width, num_frames = sample_shape(metadata, options.height, options.width, options.num_frames)
    temporal = compression(json.loads((base / "vae" / "config.json").read_text()))[1]
    problem = frame_count_problem(num_frames, temporal)
    if problem:
        raise ConfigError([ConfigProblem("--num-frames", problem)], "sample")
    frames = [load_frame(options.image, height, width, "cpu", options.resize)]
    if options.last_image:
        frames.append(load_frame(options.last_image, height, width, "cpu", options.resize))
    images = (to_image(frames[0]), to_image(frames[1]) if len(frames) > 1 else None)
    transformer = LTX2VideoTransformer3DModel.from_pretrained(base, subfolder="transformer")
    adapted = PeftModel.from_pretrained(transformer, Path(export_dir)).get_base_model()
    pipe = load_pipeline(base, mode, adapted.eval(), device)
    fps = options.fps or export_frame_rate(metadata)  # LTX-2's RoPE time axis and the mp4's rate
    settings = {"num_frames": num_frames, "height": height, "width": width, "fps": fps}
    settings |= {"steps": options.steps, "prompt": options.prompt, "negative_prompt": options.negative_prompt}
    settings |= {"guidance_scale": options.guidance_scale, "pipeline": pipeline_class(mode).__name__}
    record = sample_record(export_dir, metadata, options, {**settings, "device": device, "dtype": "float32"})
    if announce is not None:
        announce(record)
    video = run_pipeline(
        pipe,
        mode,
        images,
        options.prompt,
        (num_frames, height, width),
        options.steps,
        torch.Generator(device=device).manual_seed(options.seed),
        negative_prompt=options.negative_prompt,
        guidance_scale=options.guidance_scale,
        frame_rate=fps,
    )
    return video.cpu(), {**settings, "record": record}
