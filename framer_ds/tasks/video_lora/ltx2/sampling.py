"""LTX-2 sampling is diffusers' own: `LTX2ImageToVideoPipeline` (image_to_video) or `LTX2ConditionPipeline`
with keyframes at index 0 and -1 (interpolation), built from the base folder around the transformer that
carries the LoRA (peft's layers are injected into the transformer itself, so the pipeline calls the
adapted model). `framer-ds sample` (an export) and the samples and interp_eval of a run (the model being
trained) go through `run_pipeline` alike, so both give the pipeline's frames for the same adapter, seed
and inputs, and `load_lora_weights` on the diffusers-layout export gives them too (the parity test).

Why not a loop of our own, as for Wan: LTX-2's loop carries classifier-free, spatio-temporal and
modality guidance with rescaling, a joint audio denoising that the video attends to, H.264 re-compression
of image conditions and keyframe tokens; a copy would drift from diffusers with every release.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from framer_ds.tasks.video_lora.shared.protocol import ClipToSample, FamilySampler


def pipeline_class(mode: str) -> Any:
    from diffusers import LTX2ConditionPipeline, LTX2ImageToVideoPipeline

    return LTX2ConditionPipeline if mode == "interpolation" else LTX2ImageToVideoPipeline


def pipeline_defaults(mode: str) -> dict[str, Any]:
    """The pipeline's own defaults (its `__call__` signature: they follow the installed diffusers)."""
    call = inspect.signature(pipeline_class(mode).__call__).parameters
    return {name: call[name].default for name in ("guidance_scale", "frame_rate", "num_inference_steps")}


def load_pipeline(base: Path, mode: str, transformer: torch.nn.Module | None, device: Any) -> Any:
    """The mode's pipeline from the base folder, with `transformer` (the LoRA'd one) in place of the
    folder's when given, in float32 on `device`."""
    kwargs = {} if transformer is None else {"transformer": transformer}
    pipe = pipeline_class(mode).from_pretrained(base, **kwargs).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def to_image(frame: Tensor) -> Image.Image:
    """[3, H, W] in [-1, 1] -> the PIL image the pipelines take (their CRF re-compression needs one)."""
    pixels = ((frame.detach().float().cpu() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return Image.fromarray(np.ascontiguousarray(pixels.permute(1, 2, 0).numpy()))


@torch.no_grad()
def run_pipeline(
    pipe: Any,
    mode: str,
    frames: tuple[Image.Image, Image.Image | None],
    prompt: str,
    shape: tuple[int, int, int],
    steps: int,
    generator: torch.Generator,
    negative_prompt: str | None = None,
    guidance_scale: float | None = None,
    frame_rate: float | None = None,
    on_step: Callable[[], Any] | None = None,
) -> Tensor:
    """Frames [1, F, 3, H, W] float32 in [0, 1]: `frames` (first, last) PIL images (last only for
    interpolation), `shape` (num_frames, height, width); None = the pipeline's default."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition

    num_frames, height, width = shape
    kwargs: dict[str, Any] = {
        "prompt": prompt,
        "negative_prompt": negative_prompt,
        "num_frames": num_frames,
        "height": height,
        "width": width,
        "num_inference_steps": steps,
        "generator": generator,
        "output_type": "pt",
    }
    kwargs |= {
        k: v for k, v in (("guidance_scale", guidance_scale), ("frame_rate", frame_rate)) if v is not None
    }
    if on_step is not None:
        kwargs["callback_on_step_end"] = lambda *args: (on_step(), {})[1]
    first, last = frames
    if mode == "interpolation":
        conditions = [LTX2VideoCondition(frames=first, index=0), LTX2VideoCondition(frames=last, index=-1)]
        return pipe(conditions=conditions, **kwargs).frames.float()
    return pipe(image=first, **kwargs).frames.float()


class Ltx2ClipSampler(FamilySampler):
    """The model being trained inside the base folder's pipeline (loaded once per round, dropped with
    the sampler), at the pipeline's defaults; `family`: the run's `Ltx2Family` (prompts, folder, mode)."""

    def __init__(self, model: torch.nn.Module, family: Any, device: Any):
        from framer_ds.tasks.video_lora.ltx2.lora import unwrapped

        self.family, self.mode = family, family.config.model.base.mode
        self.pipe = load_pipeline(family.base_path(), self.mode, unwrapped(model), device)

    def sample(
        self,
        clip: ClipToSample,
        settings: Any,
        generator: torch.Generator,
        on_step: Callable[[], Any] | None = None,
    ) -> Tensor:
        last = to_image(clip.last) if clip.last is not None else None
        height, width = clip.first.shape[-2:]
        video = run_pipeline(
            self.pipe,
            self.mode,
            (to_image(clip.first), last),
            self.family.prompts[clip.video_id],
            (clip.num_frames, height, width),
            settings.num_inference_steps,
            generator,
            frame_rate=clip_frame_rate(clip),
            on_step=on_step,
        )
        return video[0].to(clip.first.device) * 2 - 1

    def steps(self, settings: Any) -> int:
        return settings.num_inference_steps

    def embed(self, frames: Tensor) -> Tensor:
        """LTX-2 has no CLIP image encoder: pre-flight refuses interp_eval.clip_distance (preflight.py)."""
        raise NotImplementedError(
            "an LTX-2 base has no image encoder; set model.interp_eval.clip_distance false"
        )

    def record(self, clip: ClipToSample, settings: Any) -> dict[str, Any]:
        defaults = pipeline_defaults(self.mode)
        return {
            "prompt": self.family.prompts.get(clip.video_id),
            "pipeline": pipeline_class(self.mode).__name__,
            "guidance_scale": defaults["guidance_scale"],
            "num_inference_steps": settings.num_inference_steps,
            "fps": clip_frame_rate(clip),
        }


def clip_frame_rate(clip: ClipToSample) -> float:
    """The rate a training sample or interp_eval clip is sampled at: the one training conditioned it on
    (`model.fps`, else the clip's own source fps / stride), as SVD's sampler takes `clip.fps`."""
    from framer_ds.tasks.video_lora.ltx2.options import FRAME_RATE

    return clip.fps if clip.fps is not None else FRAME_RATE
