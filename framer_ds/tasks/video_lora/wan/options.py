"""The Wan family's options: its folder, `model.base` keys and `framer-ds sample` flags. Pydantic classes
and constants only; config.py assembles them."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from framer_ds.config.schema import StrictModel
from framer_ds.config.source import Source
from framer_ds.tasks.video_lora.shared.options import TextSampleFlags, VideoMode

TINY_WAN22_BOUNDARY_RATIO = 0.9  # the tiny Wan 2.2 base's, as Wan2.2-I2V-A14B-Diffusers' model_index


class WanSource(Source):
    """Where the Wan components come from: one diffusers Wan image-to-video folder."""

    path: Path | None = Field(
        None,
        description="Local diffusers Wan image-to-video folder (Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers, "
        "Wan2.1-I2V-14B-480P-Diffusers layout: transformer/ vae/ text_encoder/ tokenizer/ image_encoder/ "
        "image_processor/ scheduler/; Wan2.2-I2V-A14B-Diffusers: transformer/ + transformer_2/, no image "
        "encoder; Wan2.2-TI2V-5B-Diffusers: one transformer, Wan 2.2's VAE, no image encoder, "
        "expand_timesteps).",
    )
    builtin: Literal["tiny_wan_flf2v", "tiny_wan_i2v", "tiny_wan22_i2v", "tiny_wan22_ti2v"] | None = Field(
        None,
        description="'tiny_wan_flf2v' (first + last frame), 'tiny_wan_i2v' (first frame), "
        "'tiny_wan22_i2v' (Wan 2.2's two experts, first frame, no CLIP) or 'tiny_wan22_ti2v' (Wan 2.2 "
        "TI2V-5B: first-frame latents, per-token timesteps, 16x VAE): a tiny random Wan base built in the "
        "cache (tests, demo).",
    )


WanExpert = Literal["high_noise", "low_noise"]


class WanBase(StrictModel):
    """A Wan 2.1 or 2.2 image-to-video base (diffusers' WanTransformer3DModel, AutoencoderKLWan, UMT5, and
    CLIP vision where the base has it) under the rectified-flow objective (diffusion/flow_matching.py).
    A Wan 2.2 base holds two experts; a run trains one of them (`expert`). docs/video_lora.md, "Wan"."""

    name: Literal["wan"] = Field(description="'wan': fine-tune a Wan 2.1 or 2.2 image-to-video base.")
    mode: VideoMode = Field(
        description="'interpolation': first AND last frame (FLF2V; diffusers' last_image), needs an FLF2V "
        "base; 'image_to_video': the first frame (I2V base)."
    )
    source: WanSource = Field(description="The diffusers Wan folder: path or builtin.")
    prompt: str | None = Field(
        None,
        description="One fixed prompt for every clip; null = each video's caption file: <video stem>.txt "
        "beside the video (UTF-8, surrounding whitespace stripped), refused by `data check`/`validate` "
        "when missing.",
    )
    shift: float | None = Field(
        None,
        gt=0,
        description="The flow-matching shift of the training sigmas; null = the folder's "
        "scheduler/scheduler_config.json (Wan: 3.0 at 480p, 5.0 at 720p).",
    )
    timestep_sampling: Literal["uniform", "logit_normal"] = Field(
        "uniform",
        description="'uniform': u ~ U(0,1) on the shifted table (Wan's own); 'logit_normal': u = "
        "sigmoid(N(logit_mean, logit_std)) (SD3).",
    )
    logit_mean: float = Field(0.0, description="logit_normal: the normal's mean.")
    logit_std: float = Field(1.0, gt=0, description="logit_normal: the normal's std.")
    loss_weighting: Literal["none", "sigma_sqrt", "cosmap"] = Field(
        "none", description="Per-sample loss weights (diffusers' compute_loss_weighting_for_sd3); Wan: none."
    )
    eval_sigmas: int = Field(
        5,
        ge=1,
        description="Fixed sigmas of the deterministic eval loss: the training table's quantiles (within "
        "the expert's range on a two-expert base).",
    )
    expert: WanExpert | None = Field(
        None,
        description="Two-expert (Wan 2.2) bases only, and required there: 'high_noise' trains transformer/ "
        "on timesteps >= boundary_ratio * 1000, 'low_noise' trains transformer_2/ on the rest (the "
        "pipeline's switch); the other expert is not loaded. Train both with two runs.",
    )
    boundary_ratio: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Two-expert bases only: where the experts hand over, as a fraction of the 1000 training "
        "timesteps; null = the folder's model_index.json boundary_ratio (0.9 for Wan2.2-I2V-A14B).",
    )


class WanSampleFlags(TextSampleFlags):
    """`framer-ds sample` flags of Wan exports: the text flags every text-conditioned base takes
    (`TextSampleFlags`), and Wan 2.2's second expert."""

    refusal: ClassVar[str] = "a Wan flag; this export's base is {base}: drop {flag}"

    guidance_scale_2: float | None = Field(
        None,
        ge=0,
        description="Wan 2.2 exports: guidance of the low-noise expert's steps; default: the diffusers "
        "pipeline's (= --guidance-scale).",
    )
    other_expert: Path | None = Field(
        None,
        description="Wan 2.2 exports: the final/ of a run that trained the OTHER expert of the same base; "
        "its adapter goes on that expert (without it, that expert samples as the base).",
    )
