"""The shipped Wan architecture folders (framer_ds/config/architectures/Wan-AI/, written by
scripts/dev/make_wan_architectures.py from diffusers' conversion script) build on the meta device with
the parameter counts of the published models, and their scheduler gives the pipeline's defaults."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection, UMT5Config, UMT5EncoderModel

from framer_ds.config.architectures import shipped_architecture
from framer_ds.tasks.video_lora.wan.sampling import load_base_scheduler, pipeline_defaults

DIM, LAYERS, CLIP = 5120, 40, 1280
LINEAR = DIM * DIM + DIM
# Wan 2.1 I2V over the 14.29e9 text-to-video-shaped network: per block the image tokens' key/value
# projections (2 linear 5120 -> 5120) and their RMSNorm (5120), plus the image embedder (LayerNorm 1280,
# Linear 1280 -> 1280, Linear 1280 -> 5120, LayerNorm 5120).
IMAGE_PART = LAYERS * (2 * LINEAR + DIM) + 2 * CLIP + (CLIP * CLIP + CLIP) + (CLIP * DIM + DIM) + 2 * DIM
EXPERT = 14_288_901_184  # Wan 2.2 A14B: each expert is the 14B text-to-video shape with 36 input channels
EXPECTED = {
    "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers": EXPERT + IMAGE_PART,
    "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers": EXPERT + IMAGE_PART,
    # FLF2V: plus the positional embedding over first + last frame's 257 CLIP tokens each
    "Wan-AI/Wan2.1-FLF2V-14B-720P-Diffusers": EXPERT + IMAGE_PART + 2 * 257 * CLIP,
    "Wan-AI/Wan2.2-I2V-A14B-Diffusers": EXPERT,
    # TI2V-5B: width 3072 (24 heads of 128), 30 blocks, FFN 14336, 48 input and output channels: "5B"
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": 4_999_787_712,
}


# The hub's Wan2.1-I2V-14B-480P-Diffusers model_index.json as FastVideo's docs quote it (hao-ai-lab/FastVideo
# docs/inference/add_pipeline.md at 2f3d4074): diffusers 0.33 wrote no boundary_ratio / transformer_2 keys,
# and the image encoder is saved as CLIPVisionModelWithProjection (the pipeline's type hint: CLIPVisionModel).
HUB_WAN21_INDEX = {
    "_class_name": "WanImageToVideoPipeline",
    "_diffusers_version": "0.33.0.dev0",
    "image_encoder": ["transformers", "CLIPVisionModelWithProjection"],
    "image_processor": ["transformers", "CLIPImageProcessor"],
    "scheduler": ["diffusers", "UniPCMultistepScheduler"],
    "text_encoder": ["transformers", "UMT5EncoderModel"],
    "tokenizer": ["transformers", "T5TokenizerFast"],
    "transformer": ["diffusers", "WanTransformer3DModel"],
    "vae": ["diffusers", "AutoencoderKLWan"],
}


def _count(module: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


@pytest.mark.parametrize("repo", sorted(EXPECTED))
def test_transformer_builds_with_the_published_size(repo: str) -> None:
    """Wan 2.1 I2V/FLF2V: 16.39e9 parameters (the "14B" of the name is the text-to-video network,
    14.29e9; the image cross-attention adds 2.1e9), Wan 2.2 A14B: two experts of 14.29e9, Wan 2.2
    TI2V-5B: one of 5.00e9."""
    folder = shipped_architecture(repo)
    assert folder is not None
    index = json.loads((folder / "model_index.json").read_text())
    experts = [name for name in ("transformer", "transformer_2") if index.get(name, [None])[0] is not None]
    assert experts == (["transformer", "transformer_2"] if "A14B" in repo else ["transformer"])
    for expert in experts:
        with torch.device("meta"):
            model = WanTransformer3DModel.from_config(WanTransformer3DModel.load_config(folder / expert))
        assert _count(model) == EXPECTED[repo], (repo, expert, _count(model))
    assert 14.0e9 < EXPERT < 14.5e9 and 16.3e9 < EXPERT + IMAGE_PART < 16.5e9
    assert 4.95e9 < EXPECTED["Wan-AI/Wan2.2-TI2V-5B-Diffusers"] < 5.05e9


def test_ti2v_5b_folder_is_the_conversions() -> None:
    """Wan2.2-TI2V-5B-Diffusers as diffusers' conversion script saves it: `WanPipeline` with
    `expand_timesteps` (no image encoder, one transformer), Wan 2.2's VAE (16x spatial, z_dim 48, its 48
    latent statistics; 0.705e9 parameters), UniPC with flow_shift 5.0; its pipeline defaults say so."""
    folder = shipped_architecture("Wan-AI/Wan2.2-TI2V-5B-Diffusers")
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline" and index["expand_timesteps"] is True
    assert index["transformer_2"] == [None, None] and "image_encoder" not in index
    with torch.device("meta"):
        vae = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(folder / "vae"))
    config = vae.config
    assert (config.z_dim, config.scale_factor_spatial, config.patch_size) == (48, 16, 2)
    assert config.is_residual
    assert len(config.latents_mean) == len(config.latents_std) == 48 and _count(vae) == 704_688_668
    defaults = pipeline_defaults(folder)
    assert (defaults.shift, defaults.expand_timesteps, defaults.boundary_ratio) == (5.0, True, None)


def test_frozen_components_build() -> None:
    """The VAE (0.127e9), UMT5-XXL encoder (5.68e9) and OpenCLIP ViT-H/14 (0.632e9) build from the files."""
    folder = shipped_architecture("Wan-AI/Wan2.1-FLF2V-14B-720P-Diffusers")
    with torch.device("meta"):
        vae = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(folder / "vae"))
        text = UMT5EncoderModel(UMT5Config.from_pretrained(folder / "text_encoder"))
        image = CLIPVisionModelWithProjection(CLIPVisionConfig.from_pretrained(folder / "image_encoder"))
    assert vae.config.z_dim == 16 and len(vae.config.latents_mean) == 16
    assert (_count(vae), _count(text), _count(image)) == (126_892_531, 5_680_910_336, 632_076_800)


@pytest.mark.parametrize(
    ("repo", "shift", "boundary"),
    [
        ("Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", 3.0, None),
        ("Wan-AI/Wan2.1-FLF2V-14B-720P-Diffusers", 16.0, None),
        ("Wan-AI/Wan2.2-I2V-A14B-Diffusers", 3.0, 0.9),
    ],
)
def test_pipeline_defaults_of_the_hub_folders(repo: str, shift: float, boundary: float | None) -> None:
    """The conversion's UniPC flow scheduler and its flow_shift; `load_base_scheduler` builds diffusers'
    own UniPC class from the folder (what `sample_video(..., scheduler=)` steps with)."""
    folder = shipped_architecture(repo)
    defaults = pipeline_defaults(folder)
    assert (defaults.shift, defaults.boundary_ratio, defaults.guidance_scale) == (shift, boundary, 5.0)
    assert defaults.scheduler_class == "UniPCMultistepScheduler"
    scheduler = load_base_scheduler(folder)
    assert type(scheduler).__name__ == "UniPCMultistepScheduler"
    assert scheduler.config.use_flow_sigmas and scheduler.config.prediction_type == "flow_prediction"
    assert scheduler.config.flow_shift == shift and load_base_scheduler(folder, 7.0).config.flow_shift == 7.0


@pytest.mark.parametrize("repo", [repo for repo in sorted(EXPECTED) if "2.1" in repo])
def test_wan21_model_index_is_the_hubs(repo: str) -> None:
    """Every Wan 2.1 folder's model_index.json has the hub file's keys and classes (FLF2V: the version of
    the diffusers that added its conversion)."""
    index = json.loads((shipped_architecture(repo) / "model_index.json").read_text())
    version = "0.34.0.dev0" if "FLF2V" in repo else "0.33.0.dev0"
    assert index == {**HUB_WAN21_INDEX, "_diffusers_version": version}
