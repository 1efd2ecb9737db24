"""A tiny random Wan 2.1 image-to-video base, saved in the Wan-AI/Wan2.1-*-Diffusers layout (or a Wan 2.2
two-expert one, in the Wan-AI/Wan2.2-I2V-A14B-Diffusers layout, or a Wan 2.2 TI2V-5B one, in the
Wan-AI/Wan2.2-TI2V-5B-Diffusers layout).

Tests and CPU smoke runs need diffusers' real Wan classes, configs and `from_pretrained` paths without
downloading ~80 GB: `create_tiny_wan` builds every component small and random and saves it through
`WanImageToVideoPipeline.save_pretrained`, so the folder (`transformer/ vae/ text_encoder/ tokenizer/
image_encoder/ image_processor/ scheduler/ model_index.json`) loads exactly like the Hub repos do.

Shapes follow the real model where it matters:
- transformer in_channels 36 = 16 noisy latents + 4 frame-mask channels (one per frame of a 4-frame VAE
  group) + 16 conditioning latents; out_channels 16; patch (1, 2, 2); `image_dim` is the CLIP vision
  width (the pipeline feeds the penultimate hidden states, not a projection); `added_kv_proj_dim` is the
  transformer width (the image tokens' own key/value projections, as Wan 2.1 I2V has);
- mode "flf2v" (Wan2.1-FLF2V-14B-720P): the image embedder carries a positional embedding over the
  first AND last frame's tokens (`pos_embed_seq_len` = 2 x image tokens), so diffusers' pipeline must be
  given `last_image`; mode "i2v" (Wan2.1-I2V-14B-480P/720P): no positional embedding, first frame only;
- mode "wan22_i2v" (Wan2.2-I2V-A14B): two transformers, `transformer` (high noise) and `transformer_2`
  (low noise, its own random weights), `boundary_ratio` 0.9 in model_index.json, and no image encoder:
  no image_encoder/ image_processor/ (model_index lists them null), transformer `image_dim` and
  `added_kv_proj_dim` null, so the condition is the mask + first-frame latents only;
- mode "wan22_ti2v" (Wan2.2-TI2V-5B): one transformer with in_channels = out_channels = 48 (no mask or
  condition channels, no image embedder), Wan 2.2's VAE (`is_residual`, a 2 x 2 pixel patch before its
  8x convolutional compression: 16x spatial, z_dim 48 with the conversion script's 48 latent statistics),
  no image encoder, saved through `WanPipeline(expand_timesteps=True)` as diffusers' conversion saves the
  hub folder (model_index `_class_name` WanPipeline, `expand_timesteps` true), which
  `WanImageToVideoPipeline.from_pretrained` loads for image-to-video: the first latent frame is the
  image's latent, its tokens at timestep 0; the size rule is 16 x patch 2 = 32 px;
- VAE (all other modes): z_dim 16 (Wan's per-channel `latents_mean`/`latents_std` have 16 entries), 8x
  spatial and 4x temporal compression (3 downsamples, the last two temporal), so 9 frames -> 3 latent frames;
- text encoder: a 2-layer UMT5 encoder whose d_model is the transformer's `text_dim`; tokenizer: a T5
  fast tokenizer (Unigram over a fixed vocabulary of words and single letters, "</s>" appended, "<pad>"
  id 0), so any ASCII prompt tokenizes without a download;
- scheduler: `FlowMatchEulerDiscreteScheduler` with Wan's 480p shift (the objective in
  wan/flow_matching.py follows the same conventions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from diffusers import (
    AutoencoderKLWan,
    FlowMatchEulerDiscreteScheduler,
    WanImageToVideoPipeline,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import CLIPVisionConfig, CLIPVisionModel, UMT5Config, UMT5EncoderModel

from framer_ds.compat import fix_processor_class, image_processor_class
from framer_ds.storage.atomic import build_once
from framer_ds.tasks.video_lora.wan.flow_matching import WAN_SHIFT_480P
from framer_ds.tasks.video_lora.wan.options import TINY_WAN22_BOUNDARY_RATIO

WanMode = Literal["i2v", "flf2v", "wan22_i2v", "wan22_ti2v"]
WAN22_BOUNDARY_RATIO = TINY_WAN22_BOUNDARY_RATIO  # Wan2.2-I2V-A14B-Diffusers' model_index.json
MARKER = ".framer_tiny_wan_complete"
TI2V_ARCHITECTURE = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
WAN22_TI2V_SHIFT = 5.0  # the conversion script's flow_shift for TI2V

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
# Whole-word pieces for the demo captions; any other word falls back to single letters.
TOKENIZER_WORDS = (
    "a",
    "the",
    "red",
    "blue",
    "green",
    "ball",
    "cat",
    "dog",
    "car",
    "camera",
    "pans",
    "left",
    "right",
    "slowly",
    "quickly",
    "rolls",
    "jumps",
    "runs",
    "over",
    "under",
    "grass",
    "road",
    "sky",
    "water",
    "moves",
    "turns",
    "zooms",
    "in",
    "out",
    "of",
    "and",
    "with",
    "video",
    "frame",
)

TEXT_DIM = 16  # UMT5 d_model == transformer text_dim (4096 in the real model)
IMAGE_SIZE, IMAGE_PATCH = 32, 8  # CLIP input 32 px in 8 px patches: 16 patch tokens + 1 class token
IMAGE_TOKENS = (IMAGE_SIZE // IMAGE_PATCH) ** 2 + 1
IMAGE_DIM = 8  # CLIP vision width == transformer image_dim (1280 in the real model)
HEADS, HEAD_DIM = 2, 8  # transformer width 16 (5120 in the 14B model)

TINY_WAN_TRANSFORMER: dict[str, object] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": HEADS,
    "attention_head_dim": HEAD_DIM,
    "in_channels": 36,
    "out_channels": 16,
    "text_dim": TEXT_DIM,
    "freq_dim": 32,
    "ffn_dim": 32,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 32,
    "image_dim": IMAGE_DIM,
    "added_kv_proj_dim": HEADS * HEAD_DIM,
}


def build_tiny_umt5_tokenizer():
    """A T5 fast tokenizer from a fixed local vocabulary: "<pad>" 0, "</s>" 1, "<unk>" 2, then the
    words of TOKENIZER_WORDS (preferred, score -1) and the single letters and digits (score -5, so any
    ASCII word still tokenizes), "</s>" appended as UMT5's tokenizer does. Deterministic: no training."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import T5TokenizerFast

    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    vocab = [(PAD, 0.0), (EOS, 0.0), (UNK, 0.0), ("\u2581", -3.0)]
    vocab += [(f"\u2581{word}", -1.0) for word in TOKENIZER_WORDS]
    vocab += [(piece, -5.0) for char in letters for piece in (char, f"\u2581{char}")]
    core = Tokenizer(models.Unigram(vocab, unk_id=2))
    core.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    core.pre_tokenizer = pre_tokenizers.Metaspace()
    core.decoder = decoders.Metaspace()
    core.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, 1)]
    )
    return T5TokenizerFast(tokenizer_object=core, eos_token=EOS, pad_token=PAD, unk_token=UNK, extra_ids=0)


def _wan22_transformers() -> dict[str, object]:
    """Wan 2.2's high- and low-noise experts (no image embedder), each with its own random weights."""
    config = {**TINY_WAN_TRANSFORMER, "image_dim": None, "added_kv_proj_dim": None}
    return {name: WanTransformer3DModel(**config) for name in ("transformer", "transformer_2")}


def _wan22_ti2v_vae() -> AutoencoderKLWan:
    """Wan 2.2's VAE at a tiny width: the conversion script's `vae22_diffusers_config` (residual blocks,
    12 = 3 x 2 x 2 patched input channels, 16x spatial, z_dim 48 and its latent statistics, read from
    the shipped architecture folder) with base widths 8 and one residual block per level."""
    from framer_ds.config.architectures import shipped_architecture

    folder = shipped_architecture(TI2V_ARCHITECTURE)
    assert folder is not None, TI2V_ARCHITECTURE
    config = AutoencoderKLWan.load_config(folder / "vae")
    small = {"base_dim": 8, "decoder_base_dim": 8, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1}
    return AutoencoderKLWan.from_config({**config, **small})


def _build_ti2v_pipeline(common: dict[str, object]) -> WanPipeline:
    """Wan 2.2 TI2V-5B: one 48-channel transformer, no image embedder, `expand_timesteps`."""
    config = {**TINY_WAN_TRANSFORMER, "in_channels": 48, "out_channels": 48}
    transformer = WanTransformer3DModel(**{**config, "image_dim": None, "added_kv_proj_dim": None})
    return WanPipeline(**common, vae=_wan22_ti2v_vae(), transformer=transformer, expand_timesteps=True)


def _build_pipeline(seed: int, mode: WanMode) -> WanImageToVideoPipeline | WanPipeline:
    tokenizer = build_tiny_umt5_tokenizer()
    torch.manual_seed(seed)
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(tokenizer),
            d_model=TEXT_DIM,
            d_kv=4,
            d_ff=32,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    )
    if mode == "wan22_ti2v":
        scheduler = FlowMatchEulerDiscreteScheduler(shift=WAN22_TI2V_SHIFT)
        return _build_ti2v_pipeline(
            {"tokenizer": tokenizer, "text_encoder": text_encoder, "scheduler": scheduler}
        )
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    image_encoder = CLIPVisionModel(
        CLIPVisionConfig(
            image_size=IMAGE_SIZE,
            patch_size=IMAGE_PATCH,
            hidden_size=IMAGE_DIM,
            intermediate_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
        )
    )
    common = {
        "tokenizer": tokenizer,
        "text_encoder": text_encoder,
        "vae": vae,
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=WAN_SHIFT_480P),
    }
    if mode == "wan22_i2v":
        return WanImageToVideoPipeline(**common, **_wan22_transformers(), boundary_ratio=WAN22_BOUNDARY_RATIO)
    transformer = WanTransformer3DModel(
        **TINY_WAN_TRANSFORMER, pos_embed_seq_len=2 * IMAGE_TOKENS if mode == "flf2v" else None
    )
    # Wan's CLIP preprocessing (OpenAI CLIP mean/std, resize + centre crop), at the tiny encoder's size.
    image_processor = image_processor_class("CLIPImageProcessor")(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    return WanImageToVideoPipeline(
        **common, image_processor=image_processor, image_encoder=image_encoder, transformer=transformer
    )


def create_tiny_wan(path: Path, mode: WanMode = "flf2v", seed: int = 0) -> Path:
    """Build (once) a tiny random Wan image-to-video base at `path` and return `path`: "flf2v" (first +
    last frame, the interpolation base), "i2v" (first frame only), "wan22_i2v" (Wan 2.2's two experts) or
    "wan22_ti2v" (Wan 2.2 TI2V-5B: first-frame latents, per-token timesteps).

    Idempotent and atomic like `create_tiny_svd`: a finished folder carries a marker file; everything is
    written in a sibling temp folder renamed into place, so concurrent creators never see half a folder.
    """

    if mode not in ("i2v", "flf2v", "wan22_i2v", "wan22_ti2v"):
        raise ValueError(
            f"unknown Wan mode {mode!r}; use 'i2v' (first frame), 'flf2v' (first + last), 'wan22_i2v' "
            "(Wan 2.2's two experts) or 'wan22_ti2v' (Wan 2.2 TI2V-5B)"
        )

    def build(staging: Path) -> None:
        _build_pipeline(seed, mode).save_pretrained(staging)
        if mode in ("i2v", "flf2v"):
            fix_processor_class(staging, "image_processor")

    return build_once(path, MARKER, build, f"tiny Wan {mode} base")
