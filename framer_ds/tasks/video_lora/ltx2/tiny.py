"""A tiny random LTX-2 base, saved in the Lightricks/LTX-2 diffusers layout.

Tests and CPU runs need diffusers' real LTX-2 classes, configs and `from_pretrained` paths without
downloading ~40 GB: `create_tiny_ltx2` builds every component of `LTX2ImageToVideoPipeline` small and
random (the shapes of diffusers' own LTX-2 pipeline tests) and saves it through `save_pretrained`, so the
folder (`transformer/ vae/ audio_vae/ vocoder/ connectors/ text_encoder/ tokenizer/ scheduler/
model_index.json`) loads exactly like the Hub repo does, by `LTX2ImageToVideoPipeline` and
`LTX2ConditionPipeline` alike (they take the same components).

Shapes: transformer 2 blocks, video width 16 (2 heads of 8), audio width 8, patch 1; video VAE 4
latent channels, LTX-2's 4 px pixel patches and one spatio-temporal down block (8x space, 2x time: 9
frames -> 5 latent frames, 64 px -> 8, so a 64x64 clip is 64 tokens a latent frame; diffusers' test
VAE, `downsample_type="spatial"`, encodes no time at all and decodes twice the frames, so it is not used);
audio VAE 2 latent channels over 8 mel bins; text encoder a 2-layer Gemma 3 (its hidden states of every
layer, stacked, are what the connectors read); tokenizer a local Gemma-style one (`<pad>` 0,
`<eos>` 1, `<bos>` 2, words and single letters, bos prepended) so any ASCII prompt tokenizes offline;
scheduler `FlowMatchEulerDiscreteScheduler` with LTX-2's dynamic shift (base/max image seq len and shift).
"""

from __future__ import annotations

from pathlib import Path

import torch

from framer_ds.storage.atomic import build_once

MARKER = ".framer_tiny_ltx2_complete"
TEXT_DIM, TEXT_LAYERS = 16, 2
WORDS = ("a", "the", "red", "blue", "ball", "rolls", "moves", "camera", "left", "right", "video", "robot")

TINY_LTX2_TRANSFORMER: dict[str, object] = {
    "in_channels": 4,
    "out_channels": 4,
    "patch_size": 1,
    "patch_size_t": 1,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "cross_attention_dim": 16,
    "audio_in_channels": 4,
    "audio_out_channels": 4,
    "audio_num_attention_heads": 2,
    "audio_attention_head_dim": 4,
    "audio_cross_attention_dim": 8,
    "num_layers": 2,
    "qk_norm": "rms_norm_across_heads",
    "caption_channels": TEXT_DIM,
    "rope_double_precision": False,
    "rope_type": "split",
}


def build_tiny_gemma_tokenizer():
    """A Gemma fast tokenizer over a fixed local vocabulary (no download): `<pad>` 0, `<eos>` 1, `<bos>` 2
    prepended to every text, whole words of WORDS, then single letters and digits so any ASCII prompt
    tokenizes. Deterministic: no training."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import GemmaTokenizerFast

    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    vocab = [("<pad>", 0.0), ("<eos>", 0.0), ("<bos>", 0.0), ("<unk>", 0.0), ("\u2581", -3.0)]
    vocab += [(f"\u2581{word}", -1.0) for word in WORDS]
    vocab += [(piece, -5.0) for char in letters for piece in (char, f"\u2581{char}")]
    core = Tokenizer(models.Unigram(vocab, unk_id=3))
    core.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    core.pre_tokenizer = pre_tokenizers.Metaspace()
    core.decoder = decoders.Metaspace()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)]
    )
    return GemmaTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def tiny_gemma3(vocab_size: int):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {
        "vocab_size": vocab_size,
        "hidden_size": TEXT_DIM,
        "intermediate_size": 32,
        "num_hidden_layers": TEXT_LAYERS,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "sliding_window": 16,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    }
    vision = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    return Gemma3ForConditionalGeneration(config)


def build_tiny_ltx2_components(seed: int = 0) -> dict[str, object]:
    """Every component `LTX2ImageToVideoPipeline` takes, tiny and random (module docstring)."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    tokenizer = build_tiny_gemma_tokenizer()
    torch.manual_seed(seed)
    text_encoder = tiny_gemma3(len(tokenizer))
    transformer = LTX2VideoTransformer3DModel(**TINY_LTX2_TRANSFORMER)
    connectors = LTX2TextConnectors(
        caption_channels=TEXT_DIM,
        text_proj_in_factor=TEXT_LAYERS + 1,
        video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=8,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32,
        rope_double_precision=False,
        rope_type="split",
    )
    vae = AutoencoderKLLTX2Video(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8,),
        decoder_block_out_channels=(8,),
        layers_per_block=(1,),
        decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False),
        downsample_type=("spatiotemporal",),
        upsample_residual=(False,),
        upsample_factor=(1,),
        timestep_conditioning=False,
        patch_size=4,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4,
        output_channels=2,
        ch_mult=(1,),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        norm_type="pixel",
        causality_axis="height",
        dropout=0.0,
        mid_block_add_attention=False,
        sample_rate=16000,
        mel_hop_length=160,
        is_causal=True,
        mel_bins=8,
    )
    vocoder = LTX2Vocoder(
        in_channels=2 * 8,
        hidden_channels=32,
        out_channels=2,
        upsample_kernel_sizes=[4, 4],
        upsample_factors=[2, 2],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1,
        output_sampling_rate=16000,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True,
        base_image_seq_len=1024,
        max_image_seq_len=4096,
        base_shift=0.95,
        max_shift=2.05,
    )
    return {
        "transformer": transformer,
        "vae": vae,
        "audio_vae": audio_vae,
        "scheduler": scheduler,
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "connectors": connectors,
        "vocoder": vocoder,
    }


def create_tiny_ltx2(path: Path, seed: int = 0) -> Path:
    """Build (once, atomically: a marker file, a sibling temp folder renamed into place) a tiny random
    LTX-2 base at `path` and return `path`."""
    from diffusers import LTX2ImageToVideoPipeline

    def build(staging: Path) -> None:
        LTX2ImageToVideoPipeline(**build_tiny_ltx2_components(seed)).save_pretrained(staging)

    return build_once(path, MARKER, build, "tiny LTX-2 base")
