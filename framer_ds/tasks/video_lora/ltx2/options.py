"""The LTX-2 family's options: its folder, `model.base` keys and `framer-ds sample` flags. Pydantic classes
and constants only; config.py assembles them."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from framer_ds.config.schema import StrictModel
from framer_ds.config.source import Source
from framer_ds.tasks.video_lora.shared.options import VideoMode

MAX_SEQUENCE_LENGTH = 1024  # the pipelines' default; the cached prompt states have this length
# the pipelines' default frame_rate, where no rate is known: a clip trains at its own (ltx2/frame_rate.py)
FRAME_RATE = 24.0
IMAGE_CRF = 33  # diffusers' DEFAULT_IMAGE_CRF for a Gemma 3 (LTX-2) text encoder


class Ltx2Source(Source):
    """Where the LTX-2 components come from: one diffusers LTX-2 folder."""

    path: Path | None = Field(
        None,
        description="Local diffusers LTX-2 folder (Lightricks/LTX-2 layout: transformer/ vae/ audio_vae/ "
        "vocoder/ connectors/ text_encoder/ tokenizer/ scheduler/ model_index.json).",
    )
    builtin: Literal["tiny_ltx2"] | None = Field(
        None, description="'tiny_ltx2': a tiny random LTX-2 base built in the cache (tests, demo)."
    )


class Ltx2Base(StrictModel):
    """An LTX-2 base (diffusers' LTX2VideoTransformer3DModel, AutoencoderKLLTX2Video, Gemma 3 + the text
    connectors) trained on video only: the LoRA sits on the video branch, the audio branch is frozen
    and sees noise (docs/video_lora.md, "LTX-2")."""

    # model keys shared with SVD that LTX-2 reads with the same meaning: `model.fps` (its positions are in
    # seconds: the frame rate training conditions on; null = each clip's own, ltx2/frame_rate.py)
    honoured_model_keys: ClassVar[frozenset[str]] = frozenset({"fps"})

    name: Literal["ltx2"] = Field(description="'ltx2': fine-tune an LTX-2 base.")
    mode: VideoMode = Field(
        description="'image_to_video': the first frame (LTX2ImageToVideoPipeline); 'interpolation': the "
        "first AND last frame as keyframes (LTX2ConditionPipeline, conditions at index 0 and -1)."
    )
    source: Ltx2Source = Field(description="The diffusers LTX-2 folder: path or builtin.")
    prompt: str | None = Field(
        None,
        description="One fixed prompt for every clip; null = each video's caption file: <video stem>.txt "
        "beside the video (as for Wan), refused by `data check`/`validate` when missing.",
    )
    eval_sigmas: int = Field(
        3,
        ge=1,
        description="Fixed sigmas of the deterministic eval loss: the quantiles (i + 0.5) / n of the "
        "training distribution (uniform, shifted as the folder's scheduler shifts at the clip's tokens).",
    )
