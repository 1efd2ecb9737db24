"""A LoRA trained here samples in diffusers exactly as in framer_ds: a peft LoRA (WAN_LORA_TARGETS, random
non-zero lora_B, alpha != rank) on the tiny Wan transformer, exported with `to_diffusers_state_dict` and
loaded by diffusers' own `WanImageToVideoPipeline.load_lora_weights`; the pipeline's `__call__` (guidance
3.0, negative prompt, seeded) vs our `encode_* + sample_video` on the peft-wrapped transformer, image-to-
video and first-last-frame.

Tolerances. Frames: 1e-3 max abs (the issue's bar). Both sides run the same float32 modules on the same
inputs, but not the same kernels in the same order: diffusers merges nothing either, yet its LoRA layers
add B(A x) * 1.0 with alpha / r folded into B, where peft adds B(A x) * (alpha / r); and batching differs
(the pipeline encodes one condition and repeats it). Those are float32 rounding differences (~1e-7
relative) carried through 3 Euler steps, guidance x3 and the VAE decoder; measured 9.5e-7 (i2v) and 1.1e-6
(flf2v) here, far below 1e-3, while leaving out the LoRA moves frames by >1e-2 and an unfolded alpha / r by
0.13.
Embeddings: 1e-6 (the same encoder calls; only batch-size-dependent float32 rounding can differ).

The hub folders' scheduler (UniPCMultistepScheduler with flow sigmas, shift 3.0 / 16.0): the tiny bases
with the shipped architecture folders' scheduler_config.json, no LoRA. Then both sides run the same
modules, the same scheduler class and the same ops on the same inputs, so only batching can differ
(float32 rounding, ~1e-7 relative through 4 steps and the decoder): 1e-5 max abs; Euler steps on the
same flow and shift move the frames by > 1e-3, so the bar tells the two solvers apart."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from safetensors.torch import save_file

from framer_ds.config.architectures import shipped_architecture
from framer_ds.tasks.video_lora.wan.conditioning import condition_latents, encode_images, encode_prompts
from framer_ds.tasks.video_lora.wan.lora_layout import WAN_LORA_TARGETS, to_diffusers_state_dict
from framer_ds.tasks.video_lora.wan.sampling import (
    EULER,
    load_base_scheduler,
    pipeline_defaults,
    read_scheduler_config,
    sample_video,
)
from framer_ds.tasks.video_lora.wan.tiny import TINY_WAN_TRANSFORMER

PROMPT, NEGATIVE = "a red ball rolls over the grass", "blurry video"
STEPS, GUIDANCE, FRAMES, MAX_LEN = 3, 3.0, 9, 32
LORA = {"r": 4, "lora_alpha": 6}  # scale 1.5: the export must fold it into lora_B


def _image(seed: int) -> PIL.Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


def _peft_transformer(folder: Path):
    transformer = WanTransformer3DModel.from_pretrained(folder / "transformer")
    model = get_peft_model(transformer, LoraConfig(target_modules=list(WAN_LORA_TARGETS), **LORA))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return model.eval()


def _pipeline_run(folder: Path, adapter: Path | None, last: PIL.Image.Image | None, steps: int = STEPS):
    """diffusers' pipeline (with the exported LoRA if given); records what its transformer is fed."""
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    if adapter is not None:
        pipe.load_lora_weights(adapter.parent, weight_name=adapter.name)
    calls: list[dict[str, torch.Tensor]] = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda _m, _a, kwargs: calls.append({k: v.clone() for k, v in kwargs.items() if torch.is_tensor(v)}),
        with_kwargs=True,
    )
    frames = pipe(
        image=_image(0),
        last_image=last,
        prompt=PROMPT,
        negative_prompt=NEGATIVE,
        height=64,
        width=64,
        num_frames=FRAMES,
        num_inference_steps=steps,
        guidance_scale=GUIDANCE,
        max_sequence_length=MAX_LEN,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    ).frames
    hook.remove()
    return pipe, frames, calls


@pytest.mark.parametrize("mode", ["i2v", "flf2v"])
def test_exported_lora_samples_the_same_frames_in_diffusers(
    tiny_wan_bases: dict[str, Path], tmp_path: Path, mode: str
) -> None:
    folder = tiny_wan_bases[mode]
    model = _peft_transformer(folder)
    exported = to_diffusers_state_dict(get_peft_model_state_dict(model), LORA)
    assert all(key.startswith("transformer.blocks.") for key in exported)
    adapter = tmp_path / "pytorch_lora_weights.safetensors"
    save_file(exported, adapter)
    last = _image(1) if mode == "flf2v" else None
    pipe, expected, calls = _pipeline_run(folder, adapter, last)
    assert len(calls) == 2 * STEPS  # conditional + unconditional per step

    to_pixels = lambda image: pipe.video_processor.preprocess(image, height=64, width=64)  # noqa: E731
    first = to_pixels(_image(0))
    last_pixels = None if last is None else to_pixels(last)
    text = encode_prompts(pipe.text_encoder, pipe.tokenizer, [PROMPT], MAX_LEN)
    negative = encode_prompts(pipe.text_encoder, pipe.tokenizer, [NEGATIVE], MAX_LEN)
    image = encode_images(pipe.image_encoder, pipe.image_processor, first, last_pixels)
    condition = condition_latents(pipe.vae, first, last_pixels, FRAMES)
    torch.testing.assert_close(text, calls[0]["encoder_hidden_states"], rtol=0, atol=1e-6)
    torch.testing.assert_close(negative, calls[1]["encoder_hidden_states"], rtol=0, atol=1e-6)
    torch.testing.assert_close(image, calls[0]["encoder_hidden_states_image"], rtol=0, atol=1e-6)
    torch.testing.assert_close(condition, calls[0]["hidden_states"][:, 16:], rtol=0, atol=1e-6)

    scheduler_config = dict(pipe.scheduler.config)
    run = lambda: sample_video(  # noqa: E731
        model,
        pipe.vae,
        scheduler_config,
        text,
        negative,
        image,
        condition,
        STEPS,
        GUIDANCE,
        torch.Generator().manual_seed(0),
    )
    ours = run()
    assert ours.shape == (1, FRAMES, 3, 64, 64)
    difference = np.abs(ours.permute(0, 1, 3, 4, 2).numpy() - expected).max()
    print(f"{mode}: max abs frame difference {difference:.3e}")
    assert difference <= 1e-3
    with model.disable_adapter():  # the LoRA matters: without it the frames move far past the tolerance
        assert np.abs(run().permute(0, 1, 3, 4, 2).numpy() - expected).max() > 1e-2


HUB_SCHEDULERS = {  # tiny base -> the shipped hub folder whose scheduler_config.json it takes
    "i2v": "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",  # UniPC, flow_shift 3.0
    "flf2v": "Wan-AI/Wan2.1-FLF2V-14B-720P-Diffusers",  # UniPC, flow_shift 16.0
}


def _with_hub_scheduler(folder: Path, repo: str, tmp_path: Path) -> Path:
    """A copy of the tiny base with the hub folder's scheduler: its scheduler_config.json and the class
    its model_index.json names (the one from_pretrained builds)."""
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    hub = shipped_architecture(repo)
    shutil.copyfile(hub / "scheduler" / "scheduler_config.json", copy / "scheduler" / "scheduler_config.json")
    index = json.loads((copy / "model_index.json").read_text())
    index["scheduler"] = json.loads((hub / "model_index.json").read_text())["scheduler"]
    (copy / "model_index.json").write_text(json.dumps(index))
    return copy


@pytest.mark.parametrize("mode", ["i2v", "flf2v"])
def test_hub_unipc_scheduler_samples_the_pipelines_frames(
    tiny_wan_bases: dict[str, Path], tmp_path: Path, mode: str
) -> None:
    folder = _with_hub_scheduler(tiny_wan_bases[mode], HUB_SCHEDULERS[mode], tmp_path)
    last = _image(1) if mode == "flf2v" else None
    pipe, expected, _ = _pipeline_run(folder, None, last, steps=4)
    assert type(pipe.scheduler).__name__ == "UniPCMultistepScheduler"

    to_pixels = lambda image: pipe.video_processor.preprocess(image, height=64, width=64)  # noqa: E731
    first = to_pixels(_image(0))
    last_pixels = None if last is None else to_pixels(last)
    inputs = (
        encode_prompts(pipe.text_encoder, pipe.tokenizer, [PROMPT], MAX_LEN),
        encode_prompts(pipe.text_encoder, pipe.tokenizer, [NEGATIVE], MAX_LEN),
        encode_images(pipe.image_encoder, pipe.image_processor, first, last_pixels),
        condition_latents(pipe.vae, first, last_pixels, FRAMES),
    )
    config = read_scheduler_config(folder)
    run = lambda config, **kw: sample_video(  # noqa: E731
        pipe.transformer, pipe.vae, config, *inputs, 4, GUIDANCE, torch.Generator().manual_seed(0), **kw
    )
    ours = run(config, scheduler=load_base_scheduler(folder))
    difference = np.abs(ours.permute(0, 1, 3, 4, 2).numpy() - expected).max()
    print(f"{mode} UniPC (shift {config['flow_shift']}): max abs frame difference {difference:.3e}")
    assert difference <= 1e-5
    assert torch.equal(run(config), ours)  # the config alone builds the same scheduler
    euler = run({"_class_name": EULER, "shift": config["flow_shift"]})
    assert np.abs(euler.permute(0, 1, 3, 4, 2).numpy() - expected).max() > 1e-3
    built = {k: v for k, v in pipe.scheduler.config.items() if k != "_class_name"}  # as a built one's
    with pytest.raises(ValueError, match="without _class_name holds UniPC options"):
        run(built)


def test_pipeline_defaults_are_the_pipelines(tiny_wan_bases: dict[str, Path], tmp_path: Path) -> None:
    defaults = pipeline_defaults(tiny_wan_bases["flf2v"])
    assert (defaults.guidance_scale, defaults.negative_prompt, defaults.max_sequence_length) == (5.0, "", 512)
    assert defaults.shift == 3.0 and defaults.scheduler_class == EULER and defaults.boundary_ratio is None
    with pytest.raises(FileNotFoundError, match="point at a diffusers Wan folder"):
        pipeline_defaults(tmp_path)


def _expert(seed: int) -> WanTransformer3DModel:
    """A tiny Wan 2.2-style expert: no image cross-attention (2.2 I2V has no CLIP encoder)."""
    torch.manual_seed(seed)
    config = {k: v for k, v in TINY_WAN_TRANSFORMER.items() if k not in ("image_dim", "added_kv_proj_dim")}
    return WanTransformer3DModel(**config).eval()


@pytest.mark.parametrize("hub_scheduler", [False, True])
def test_two_experts_switch_at_the_boundary_as_the_pipeline(
    tiny_wan_bases: dict[str, Path], hub_scheduler: bool
) -> None:
    """Wan 2.2 I2V: the high-noise expert for timesteps >= 0.9 * 1000 at guidance 3.0, the low-noise
    expert after at guidance_scale_2 2.0; no image embeddings; the tiny base's Euler scheduler or the
    Wan2.2-I2V-A14B folder's UniPC one. Same tolerances and reasons as above (1e-3 with Euler, 1e-5 with
    the pipeline's own scheduler)."""
    base = WanImageToVideoPipeline.from_pretrained(tiny_wan_bases["i2v"])
    high, low = _expert(1), _expert(2)
    hub = shipped_architecture("Wan-AI/Wan2.2-I2V-A14B-Diffusers")
    scheduler = load_base_scheduler(hub) if hub_scheduler else base.scheduler
    pipe = WanImageToVideoPipeline(
        tokenizer=base.tokenizer,
        text_encoder=base.text_encoder,
        vae=base.vae,
        scheduler=scheduler,
        transformer=high,
        transformer_2=low,
        boundary_ratio=0.9,
    )
    pipe.set_progress_bar_config(disable=True)
    used = {"high": 0, "low": 0}
    hooks = [
        expert.register_forward_pre_hook(lambda *_, name=name: used.__setitem__(name, used[name] + 1))
        for name, expert in (("high", high), ("low", low))
    ]
    kwargs = {"num_inference_steps": STEPS, "guidance_scale": GUIDANCE, "guidance_scale_2": 2.0}
    expected = pipe(
        image=_image(0),
        prompt=PROMPT,
        negative_prompt=NEGATIVE,
        height=64,
        width=64,
        num_frames=FRAMES,
        max_sequence_length=MAX_LEN,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
        **kwargs,
    ).frames
    for hook in hooks:
        hook.remove()
    assert used == {"high": 2, "low": 4}  # timesteps 1000 | 750, ~3 (shift 3), two calls each (guidance)

    first = pipe.video_processor.preprocess(_image(0), height=64, width=64)
    text = encode_prompts(pipe.text_encoder, pipe.tokenizer, [PROMPT], MAX_LEN)
    negative = encode_prompts(pipe.text_encoder, pipe.tokenizer, [NEGATIVE], MAX_LEN)
    ours = sample_video(
        high,
        pipe.vae,
        dict(pipe.scheduler.config),
        text,
        negative,
        None,
        condition_latents(pipe.vae, first, None, FRAMES),
        STEPS,
        GUIDANCE,
        torch.Generator().manual_seed(0),
        transformer_2=low,
        boundary_ratio=0.9,
        guidance_scale_2=2.0,
        scheduler=scheduler if hub_scheduler else None,
    )
    difference = np.abs(ours.permute(0, 1, 3, 4, 2).numpy() - expected).max()
    print(f"two experts ({type(scheduler).__name__}): max abs frame difference {difference:.3e}")
    assert difference <= (1e-5 if hub_scheduler else 1e-3)
    with pytest.raises(ValueError, match="transformer_2 and boundary_ratio go together"):
        sample_video(high, pipe.vae, {}, text, negative, None, first, 1, 1.0, None, transformer_2=low)
