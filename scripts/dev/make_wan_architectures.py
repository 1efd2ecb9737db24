"""Writes the Wan base folders under framer_ds/config/architectures/Wan-AI/ (config files only, no
weights): model_index.json and the transformer / VAE / text encoder / image encoder / scheduler configs of
the diffusers hub folders the Wan recipes name, so `framer-ds plan` sizes a Wan job offline.

Source: diffusers' own conversion script, the one that produced the Wan-AI/*-Diffusers folders:
huggingface/diffusers `scripts/convert_wan_to_diffusers.py` at commit 58eb52c080 (read with
`git --git-dir=<fetched diffusers> show 58eb52c080:scripts/convert_wan_to_diffusers.py`), no patches:
- transformer: `get_transformer_config(model_type)`'s `diffusers_config` for "Wan-I2V-14B-480p",
  "Wan-I2V-14B-720p", "Wan-FLF2V-14B-720P" and "Wan2.2-I2V-14B-720p" (two experts, `transformer` = high
  noise, `transformer_2` = low noise, the same architecture; `boundary_ratio` 0.9; no CLIP image encoder);
  "Wan2.2-TI2V-5B" (one transformer, 48 input and output channels: no mask or condition channels);
- VAE: `AutoencoderKLWan()` with diffusers' defaults (`convert_vae` builds it so); TI2V-5B: the script's
  `vae22_diffusers_config` (Wan 2.2's VAE: residual blocks, a 2 x 2 patch, 16x spatial, z_dim 48 and its
  48 latent statistics), less `clip_output`, an argument diffusers 58d2b10a2e removed again (the pinned
  class has none);
- scheduler: `UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
  num_train_timesteps=1000, flow_shift=...)` with flow_shift 16.0 for FLF2V, 5.0 for TI2V, 3.0
  otherwise (as the script sets it; Wan 2.2's own repository samples I2V-A14B at shift 5.0, but the
  diffusers folder the script writes says 3.0);
- text encoder: google/umt5-xxl as `UMT5EncoderModel` (d_model 4096, 24 layers, 64 heads of 64, gated-GELU
  FFN 10240, vocabulary 256384); image encoder: laion/CLIP-ViT-H-14-laion2B-s32B-b79K as
  `CLIPVisionModelWithProjection` (the same OpenCLIP ViT-H/14 tower shipped for SVD);
- model_index.json: Wan 2.1 (I2V, FLF2V) exactly the hub's Wan2.1-I2V-14B-480P-Diffusers file as FastVideo's
  docs quote it (hao-ai-lab/FastVideo `docs/inference/add_pipeline.md` at 2f3d4074): seven components,
  the image encoder `CLIPVisionModelWithProjection` (also what the script saves, and the class diffusers PR
  #11007 links the hub's image_encoder/config.json as), no `boundary_ratio` / `transformer_2` /
  `expand_timesteps` keys (diffusers 0.33 had none); Wan 2.2 as `save_pretrained` writes it at the commit
  that added the Wan 2.2 conversion (a6d9f6a1a9: `boundary_ratio` 0.9, `transformer_2`, no image
  encoder or processor); TI2V-5B likewise, through `WanPipeline(..., expand_timesteps=True)` as the
  script builds it (`_class_name` WanPipeline, `boundary_ratio` null, `expand_timesteps` true,
  `transformer_2` null; `WanImageToVideoPipeline.from_pretrained` loads it for image-to-video).
- `_diffusers_version`: 0.33.0.dev0 for Wan 2.1 I2V (the hub file quoted above); for FLF2V and Wan 2.2
  the version diffusers' setup.py had at the commit adding their conversion (0021bfa1e1: 0.34.0.dev0,
  a6d9f6a1a9: 0.35.0.dev0), which is inferred: the hub files themselves are in no corpus searched.
Each diffusers config is the full one (every `__init__` argument) of the class built on the meta device.
Run from the repository root: `python scripts/dev/make_wan_architectures.py`; deterministic output.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel

ROOT = Path(__file__).resolve().parents[2] / "framer_ds" / "config" / "architectures" / "Wan-AI"
SVD_CLIP = ROOT.parent / "stabilityai" / "stable-video-diffusion-img2vid-xt" / "image_encoder" / "config.json"

WAN_14B = {
    "added_kv_proj_dim": 5120,
    "attention_head_dim": 128,
    "cross_attn_norm": True,
    "eps": 1e-06,
    "ffn_dim": 13824,
    "freq_dim": 256,
    "image_dim": 1280,
    "in_channels": 36,
    "num_attention_heads": 40,
    "num_layers": 40,
    "out_channels": 16,
    "patch_size": [1, 2, 2],
    "qk_norm": "rms_norm_across_heads",
    "text_dim": 4096,
}
FOLDERS = {
    "Wan2.1-I2V-14B-480P-Diffusers": {"transformer": WAN_14B, "flow_shift": 3.0, "version": "0.33.0.dev0"},
    "Wan2.1-I2V-14B-720P-Diffusers": {"transformer": WAN_14B, "flow_shift": 3.0, "version": "0.33.0.dev0"},
    "Wan2.1-FLF2V-14B-720P-Diffusers": {
        "transformer": {**WAN_14B, "rope_max_seq_len": 1024, "pos_embed_seq_len": 257 * 2},
        "flow_shift": 16.0,
        "version": "0.34.0.dev0",
    },
    "Wan2.2-I2V-A14B-Diffusers": {
        "transformer": {**WAN_14B, "added_kv_proj_dim": None, "image_dim": None},
        "flow_shift": 3.0,
        "boundary_ratio": 0.9,
        "version": "0.35.0.dev0",
    },
    "Wan2.2-TI2V-5B-Diffusers": {
        "transformer": {
            **WAN_14B,
            "added_kv_proj_dim": None,
            "image_dim": None,
            "ffn_dim": 14336,
            "in_channels": 48,
            "num_attention_heads": 24,
            "num_layers": 30,
            "out_channels": 48,
        },
        "vae": "wan22",
        "flow_shift": 5.0,
        "expand_timesteps": True,
        "version": "0.35.0.dev0",
    },
}
# the conversion script's `vae22_diffusers_config`, `clip_output` left out (see the module docstring)
# fmt: off
WAN22_VAE = {
    "base_dim": 160,
    "z_dim": 48,
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "decoder_base_dim": 256,
    "scale_factor_temporal": 4,
    "scale_factor_spatial": 16,
    "patch_size": 2,
    "latents_mean": [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
    0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
    -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
    ],
    "latents_std": [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901, 0.6885,
    0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659, 0.7069, 0.5338,
    0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458,
    1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
    ],
}
# fmt: on
UMT5_XXL = {
    "architectures": ["UMT5EncoderModel"],
    "classifier_dropout": 0.0,
    "d_ff": 10240,
    "d_kv": 64,
    "d_model": 4096,
    "decoder_start_token_id": 0,
    "dense_act_fn": "gelu_new",
    "dropout_rate": 0.1,
    "eos_token_id": 1,
    "feed_forward_proj": "gated-gelu",
    "initializer_factor": 1.0,
    "is_encoder_decoder": True,
    "is_gated_act": True,
    "layer_norm_epsilon": 1e-06,
    "model_type": "umt5",
    "num_decoder_layers": 24,
    "num_heads": 64,
    "num_layers": 24,
    "pad_token_id": 0,
    "relative_attention_max_distance": 128,
    "relative_attention_num_buckets": 32,
    "scalable_attention": True,
    "tie_word_embeddings": False,
    "tokenizer_class": "T5Tokenizer",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 256384,
}


def diffusers_config(cls, version: str, **kwargs) -> dict:
    """The full config diffusers saves for `cls(**kwargs)` (every argument, defaults included)."""
    with torch.device("meta"):
        config = dict(cls(**kwargs).config)
    config = {key: value for key, value in config.items() if not key.startswith("_")}
    return {"_class_name": cls.__name__, "_diffusers_version": version, **config}


def model_index(version: str, boundary_ratio: float | None, expand_timesteps: bool = False) -> dict:
    """model_index.json of the hub folder: Wan 2.1's seven components, Wan 2.2's two experts, or TI2V's
    `WanPipeline` (one transformer, no image encoder, `expand_timesteps`)."""
    if expand_timesteps:
        return {
            "_class_name": "WanPipeline",
            "_diffusers_version": version,
            "boundary_ratio": None,
            "expand_timesteps": True,
            "scheduler": ["diffusers", "UniPCMultistepScheduler"],
            "text_encoder": ["transformers", "UMT5EncoderModel"],
            "tokenizer": ["transformers", "T5TokenizerFast"],
            "transformer": ["diffusers", "WanTransformer3DModel"],
            "transformer_2": [None, None],
            "vae": ["diffusers", "AutoencoderKLWan"],
        }
    index = {
        "_class_name": "WanImageToVideoPipeline",
        "_diffusers_version": version,
        "image_encoder": ["transformers", "CLIPVisionModelWithProjection"],
        "image_processor": ["transformers", "CLIPImageProcessor"],
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    if boundary_ratio is None:
        return index
    experts = {
        "image_encoder": [None, None],
        "image_processor": [None, None],
        "boundary_ratio": boundary_ratio,
    }
    return index | experts | {"transformer_2": ["diffusers", "WanTransformer3DModel"]}


def write(path: Path, content: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


def main() -> None:
    clip = json.loads(SVD_CLIP.read_text())
    for name, spec in FOLDERS.items():
        folder = ROOT / name
        version = spec["version"]
        two_experts = "boundary_ratio" in spec
        vae_kwargs = WAN22_VAE if spec.get("vae") == "wan22" else {}
        vae = diffusers_config(AutoencoderKLWan, version, **vae_kwargs)
        transformer = diffusers_config(WanTransformer3DModel, version, **spec["transformer"])
        scheduler = UniPCMultistepScheduler(
            prediction_type="flow_prediction",
            use_flow_sigmas=True,
            num_train_timesteps=1000,
            flow_shift=spec["flow_shift"],
        ).config
        scheduler = {"_class_name": "UniPCMultistepScheduler", "_diffusers_version": version} | {
            key: value for key, value in dict(scheduler).items() if not key.startswith("_")
        }
        index = model_index(version, spec.get("boundary_ratio"), spec.get("expand_timesteps", False))
        write(folder / "model_index.json", index)
        write(folder / "transformer" / "config.json", transformer)
        if two_experts:
            write(folder / "transformer_2" / "config.json", transformer)
        elif not spec.get("expand_timesteps"):
            write(folder / "image_encoder" / "config.json", clip)
        write(folder / "vae" / "config.json", vae)
        write(folder / "text_encoder" / "config.json", UMT5_XXL)
        write(folder / "scheduler" / "scheduler_config.json", scheduler)
        print(f"wrote {folder}")


if __name__ == "__main__":
    main()
