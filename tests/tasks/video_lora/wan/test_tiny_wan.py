"""The tiny random Wan image-to-video base: a complete diffusers folder that diffusers' own
`WanImageToVideoPipeline.from_pretrained` loads and runs on CPU (first frame; first + last frame; Wan 2.2's
two experts)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline

from framer_ds.tasks.video_lora.wan.flow_matching import (
    WAN_SHIFT_480P,
    euler_step,
    inference_sigmas,
    sigmas_to_timesteps,
)
from framer_ds.tasks.video_lora.wan.tiny import (
    EOS,
    IMAGE_TOKENS,
    MARKER,
    PAD,
    build_tiny_umt5_tokenizer,
    create_tiny_wan,
)

COMPONENTS = {
    "transformer",
    "vae",
    "text_encoder",
    "tokenizer",
    "image_encoder",
    "image_processor",
    "scheduler",
}


@pytest.fixture(scope="module")
def wan_bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_wan")
    return {mode: create_tiny_wan(root / mode, mode=mode) for mode in ("i2v", "flf2v")}


def _image(seed: int) -> PIL.Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


def _generate(pipe: WanImageToVideoPipeline, last_image: PIL.Image.Image | None) -> np.ndarray:
    return pipe(
        image=_image(0),
        last_image=last_image,
        prompt="a red ball rolls over the grass",
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=2,
        max_sequence_length=16,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    ).frames[0]


def test_folder_is_a_complete_diffusers_wan_i2v_base(wan_bases: dict[str, Path]) -> None:
    for mode, folder in wan_bases.items():
        index = json.loads((folder / "model_index.json").read_text())
        assert index["_class_name"] == "WanImageToVideoPipeline"
        present = {name for name, value in index.items() if isinstance(value, list) and value[0] is not None}
        assert present == COMPONENTS, mode
        assert index["image_processor"] == ["transformers", "CLIPImageProcessor"]
        assert all((folder / name).is_dir() for name in COMPONENTS)
        assert (folder / MARKER).is_file()
        size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
        assert size < 4 * 2**20, f"{mode} base is {size} bytes; keep it a few MB"
        transformer = json.loads((folder / "transformer" / "config.json").read_text())
        assert transformer["in_channels"] == 36 and transformer["image_dim"] is not None
        expected_pos = 2 * IMAGE_TOKENS if mode == "flf2v" else None
        assert transformer["pos_embed_seq_len"] == expected_pos
    # Idempotent: a finished folder is returned as is, not rebuilt.
    stamp = (wan_bases["flf2v"] / "transformer").stat().st_mtime_ns
    assert create_tiny_wan(wan_bases["flf2v"], mode="flf2v") == wan_bases["flf2v"]
    assert (wan_bases["flf2v"] / "transformer").stat().st_mtime_ns == stamp


def test_unknown_mode_names_the_choices_and_builds_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"use 'i2v' \(first frame\), 'flf2v' .* or 'wan22_ti2v'"):
        create_tiny_wan(tmp_path / "base", mode="t2v")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_wan22_folder_loads_in_diffusers_with_two_experts_and_no_image_encoder(tmp_path: Path) -> None:
    """The tiny Wan 2.2 base as Wan2.2-I2V-A14B-Diffusers lays it out: model_index.json with
    boundary_ratio and transformer_2, image_encoder/image_processor null; diffusers' pipeline loads it
    and its 3-step run calls BOTH experts (timesteps 1000 >= 900 on `transformer`, 750 and ~9 below on
    `transformer_2`)."""
    folder = create_tiny_wan(tmp_path / "wan22", mode="wan22_i2v")
    index = json.loads((folder / "model_index.json").read_text())
    assert index["boundary_ratio"] == 0.9 and index["transformer_2"] == ["diffusers", "WanTransformer3DModel"]
    assert index["image_encoder"] == [None, None] and index["image_processor"] == [None, None]
    assert not (folder / "image_encoder").exists()
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    assert pipe.transformer.config.image_dim is None and pipe.image_encoder is None
    high, low = pipe.transformer.state_dict(), pipe.transformer_2.state_dict()
    assert any(not torch.equal(high[k], low[k]) for k in high)  # two experts, each its own weights
    pipe.set_progress_bar_config(disable=True)
    seen: list[str] = []
    for name in ("transformer", "transformer_2"):
        getattr(pipe, name).register_forward_pre_hook(lambda *_, name=name: seen.append(name))
    frames = pipe(
        image=_image(0),
        prompt="a red ball rolls",
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=3,
        guidance_scale=1.0,
        max_sequence_length=16,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    ).frames[0]
    assert frames.shape == (9, 64, 64, 3) and np.isfinite(frames).all()
    assert seen == ["transformer", "transformer_2", "transformer_2"]


def test_tokenizer_needs_no_download_and_ends_with_eos() -> None:
    tokenizer = build_tiny_umt5_tokenizer()
    assert tokenizer.pad_token == PAD and tokenizer.pad_token_id == 0 and tokenizer.eos_token == EOS
    ids = tokenizer("A red ball zigzags", padding="max_length", max_length=16).input_ids
    words = tokenizer.convert_ids_to_tokens(ids)
    assert words[:3] == ["\u2581a", "\u2581red", "\u2581ball"]  # known words are single pieces
    assert tokenizer.unk_token_id not in ids  # unknown words fall back to letters, never <unk>
    assert ids[ids.index(tokenizer.eos_token_id) + 1 :] == [0] * (16 - ids.index(tokenizer.eos_token_id) - 1)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a red ball zigzags"


def test_diffusers_pipeline_loads_and_generates(wan_bases: dict[str, Path]) -> None:
    """diffusers' own pipeline loads each folder and generates 9 frames at 2 steps: image-to-video from
    the first frame, and first-last-frame interpolation through `last_image` (which must change the
    frames: the last frame's latents and CLIP tokens reach the transformer)."""
    i2v = WanImageToVideoPipeline.from_pretrained(wan_bases["i2v"])
    assert isinstance(i2v.scheduler, FlowMatchEulerDiscreteScheduler)
    assert i2v.scheduler.config.shift == WAN_SHIFT_480P
    i2v.set_progress_bar_config(disable=True)
    frames = _generate(i2v, None)
    assert frames.shape == (9, 64, 64, 3)
    assert np.isfinite(frames).all() and frames.min() >= 0 and frames.max() <= 1

    flf2v = WanImageToVideoPipeline.from_pretrained(wan_bases["flf2v"])
    flf2v.set_progress_bar_config(disable=True)
    one = _generate(flf2v, _image(1))
    other = _generate(flf2v, _image(2))
    assert one.shape == (9, 64, 64, 3) and np.isfinite(one).all()
    assert np.abs(one - other).max() > 1e-4
    np.testing.assert_array_equal(one, _generate(flf2v, _image(1)))  # seeded: reproducible


def test_our_sampler_reproduces_the_pipelines_denoising(wan_bases: dict[str, Path]) -> None:
    """Replaying diffusers' Wan first-last-frame loop with our schedule, timesteps and Euler steps on the
    same tiny transformer gives the pipeline's final latents: the flow-matching sampler is the one the
    Wan base will sample with. The transformer's inputs are recorded with a forward hook; guidance 1.0
    (one transformer call a step). Tolerance 1e-6: identical float32 operations on unit-scale latents,
    so only float32 rounding (~1e-7) can differ; a wrong sigma or timestep moves the latents by ~1e-2."""
    pipe = WanImageToVideoPipeline.from_pretrained(wan_bases["flf2v"])
    pipe.set_progress_bar_config(disable=True)
    calls: list[dict[str, torch.Tensor]] = []

    def record(_module, _args, kwargs):
        calls.append({key: value.clone() for key, value in kwargs.items() if torch.is_tensor(value)})

    handle = pipe.transformer.register_forward_pre_hook(record, with_kwargs=True)
    steps, shift = 3, pipe.scheduler.config.shift
    expected = pipe(
        image=_image(0),
        last_image=_image(1),
        prompt="a cat jumps over the road",
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=steps,
        guidance_scale=1.0,
        max_sequence_length=16,
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
    ).frames
    handle.remove()
    assert len(calls) == steps

    channels = pipe.vae.config.z_dim
    sigmas = inference_sigmas(steps, shift)
    sample = calls[0]["hidden_states"][:, :channels]
    condition = calls[0]["hidden_states"][:, channels:]
    with torch.no_grad():
        for index, call in enumerate(calls):
            timestep = sigmas_to_timesteps(sigmas[index : index + 1]).expand(sample.shape[0])
            torch.testing.assert_close(timestep, call["timestep"], rtol=0, atol=0)
            velocity = pipe.transformer(
                hidden_states=torch.cat([sample, condition], dim=1),
                timestep=timestep,
                encoder_hidden_states=call["encoder_hidden_states"],
                encoder_hidden_states_image=call["encoder_hidden_states_image"],
                return_dict=False,
            )[0]
            sample = euler_step(sample, velocity, sigmas[index], sigmas[index + 1])
    torch.testing.assert_close(sample, expected, rtol=0, atol=1e-6)
