"""Wan 2.2 TI2V-5B (issue 50, part 2): configs/tasks/video_lora/wan22_ti2v_tiny.yaml trains a LoRA on the
tiny TI2V base (one 48-channel transformer, Wan 2.2's 16x VAE, model_index `expand_timesteps`, no CLIP);
its final/ adapter, loaded into diffusers' `WanImageToVideoPipeline` with `load_lora_weights`, gives
`framer-ds sample`'s frames; training feeds the transformer what the pipeline feeds it (the first latent
frame replaced by the image's latent, its tokens at timestep 0) and leaves that frame out of the loss."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from conftest import REPO, read_metrics, train_in_process
from framer_ds.tasks.run_config import load_run_config

CONFIG = REPO / "configs" / "tasks" / "video_lora" / "wan22_ti2v_tiny.yaml"
PROMPT = "a red ball rolls"


@pytest.fixture(scope="module")
def ti2v_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """wan22_ti2v_tiny.yaml as shipped (30 steps, eval at 15 and 30; ~15 s on 2 cores)."""
    root = tmp_path_factory.mktemp("ti2v_run")
    overrides = [f"output_dir={root / 'run'}", f"data.cache.dir={root / 'cache'}", "train.num_workers=0"]
    train_in_process(CONFIG, overrides)
    return root


def _image(path: Path, seed: int) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def test_ti2v_trains_and_its_cache_holds_the_first_frames_latents(ti2v_run: Path) -> None:
    train, evals = read_metrics(ti2v_run / "run")
    first, last = np.mean([x["loss"] for x in train[:5]]), np.mean([x["loss"] for x in train[-5:]])
    assert last < first, (first, last)  # measured 1.478 -> 1.452 (lr 3e-3, 30 steps; one sigma a clip)
    # the deterministic eval loss (fixed sigmas and noise): measured 1.4403 at step 15, 1.4157 at 30
    assert evals[-1]["eval/loss"] < 0.99 * evals[0]["eval/loss"], evals
    record = json.loads((ti2v_run / "run" / "final" / "framer_ds_export.json").read_text())
    assert Path(record["base_model"]).name == "tiny_wan22_ti2v"
    # no CLIP states; the condition is the first frame's latents alone: z 48, 1 frame, 64 / 16 px
    entries = sorted((ti2v_run / "cache").glob("*/entry_0000000.safetensors"))
    assert len(entries) == 2
    with safe_open(str(entries[0]), "pt") as tensors:
        assert set(tensors.keys()) == {"target", "condition", "prompt_emb"}
        assert tuple(tensors.get_tensor("target").shape) == (48, 3, 4, 4)
        assert tuple(tensors.get_tensor("condition").shape) == (48, 1, 4, 4)


def test_framer_ds_sample_equals_the_diffusers_pipeline_with_load_lora_weights(
    ti2v_run: Path, tmp_path: Path
) -> None:
    """The done-when test of part 2: same seed and inputs, max abs <= 1e-3 (both run the same float32
    operations on the CPU: measured 0.0). The pipeline's transformer sees the per-token timesteps of
    `expand_timesteps` (0 on the first frame's 2 x 2 tokens), and the LoRA matters (without it the frames
    move by ~0.2)."""
    from diffusers import WanImageToVideoPipeline

    from framer_ds.cli.main import main

    final = ti2v_run / "run" / "final"
    first, frames = _image(tmp_path / "a.png", 1), tmp_path / "x.npy"
    args = ["sample", str(final), "--image", str(first), "--prompt", PROMPT, "--num-frames", "9"]
    args += ["--height", "64", "--width", "64", "--seed", "0", "--num-inference-steps", "3"]
    assert main([*args, "--out", str(tmp_path / "x.mp4"), "--save-frames", str(frames)]) == 0
    ours = np.load(frames)
    assert json.loads((tmp_path / "x.json").read_text())["fps"] == 24  # TI2V-5B's frame rate
    base = json.loads((final / "framer_ds_export.json").read_text())["base_model"]
    pipe = WanImageToVideoPipeline.from_pretrained(base)  # model_index: WanPipeline, expand_timesteps
    assert pipe.config.expand_timesteps and pipe.image_encoder is None
    pipe.load_lora_weights(final)
    timesteps: list[torch.Tensor] = []
    pipe.transformer.register_forward_pre_hook(
        lambda _m, _a, kwargs: timesteps.append(kwargs["timestep"].clone()), with_kwargs=True
    )

    def pipeline_frames() -> np.ndarray:  # the sample command's inputs, through diffusers' pipeline
        return pipe(
            image=Image.open(first),
            prompt=PROMPT,
            num_frames=9,
            height=64,
            width=64,
            num_inference_steps=3,
            generator=torch.Generator("cpu").manual_seed(0),
            output_type="np",
        ).frames[0]

    theirs = pipeline_frames()
    assert ours.shape == theirs.shape == (9, 64, 64, 3)
    assert np.abs(ours - theirs).max() <= 1e-3
    # 3 latent frames of 2 x 2 tokens: the first frame's 4 at 0, the 8 others at t
    assert timesteps[0].shape == (1, 12)
    assert timesteps[0][0, :4].eq(0).all() and timesteps[0][0, 4:].gt(0).all()
    pipe.unload_lora_weights()
    assert np.abs(pipeline_frames() - theirs).max() > 1e-2


class _Recorder(torch.nn.Module):
    """Stands in for the transformer: records its inputs, returns its hidden states plus `first_frame`
    on the first latent frame (what the loss must not see)."""

    def __init__(self, first_frame: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.first_frame, self.calls = first_frame, []

    def forward(self, hidden_states, timestep, **kwargs):
        self.calls.append((hidden_states.clone(), timestep.clone()))
        out = hidden_states + self.weight
        out[:, :, 0] += self.first_frame
        return (out,)


def test_training_gives_the_first_frame_at_timestep_0_and_leaves_it_out_of_the_loss(tmp_path: Path) -> None:
    """The loss on a recorded stand-in: the transformer's first latent frame is the image's latent (not
    the noisy one), its tokens' timestep is 0 and the others' sigma x 1000 per clip, and whatever the
    transformer says about the first frame does not change the loss (before, i.e. Wan 2.1's
    concatenation, the input had 96 channels and the first frame counted)."""
    from framer_ds.tasks.video_lora.task import VideoLoraTask
    from framer_ds.tasks.video_lora.wan.encoders import WanEncodedClip

    task = VideoLoraTask(load_run_config(CONFIG, [f"output_dir={tmp_path / 'run'}"]))
    family = task.family
    assert family.expand_timesteps and family.size_multiple() == 32  # before the base is built
    generator = torch.Generator().manual_seed(0)
    encoded = WanEncodedClip(
        target=torch.randn(2, 48, 3, 4, 4, generator=generator),
        condition=torch.randn(2, 48, 1, 4, 4, generator=generator),
        prompt_emb=torch.randn(2, 8, 16, generator=generator),
    )
    noise, sigmas = torch.randn(2, 48, 3, 4, 4, generator=generator), torch.tensor([0.25, 0.75])
    losses = {}
    for first_frame in (0.0, 100.0):
        model = _Recorder(first_frame)
        losses[first_frame] = family._loss_at(model, encoded, noise, sigmas, reduce=False)
        hidden, timestep = model.calls[0]
        assert hidden.shape == (2, 48, 3, 4, 4)
        torch.testing.assert_close(hidden[:, :, :1], encoded.condition, rtol=0, atol=0)
        noisy = (1 - sigmas.view(2, 1, 1, 1, 1)) * encoded.target + sigmas.view(2, 1, 1, 1, 1) * noise
        torch.testing.assert_close(hidden[:, :, 1:], noisy[:, :, 1:])
        assert timestep.shape == (2, 12)
        assert timestep[:, :4].eq(0).all()
        torch.testing.assert_close(timestep[:, 4:], (sigmas * 1000).view(2, 1).expand(2, 8))
    torch.testing.assert_close(losses[0.0], losses[100.0], rtol=0, atol=0)


def test_ti2v_sizes_follow_its_vae_and_interpolation_is_refused(tmp_path: Path) -> None:
    """80 px is a multiple of Wan 2.1's 16 but not of TI2V's 32 (16x VAE x patch 2); a TI2V base is given
    the first frame only: both refused by name at validate, before anything is built."""
    from framer_ds.tasks.video_lora.task import VideoLoraTask

    overrides = [f"output_dir={tmp_path / 'run'}", "data.height=80", "model.base.mode=interpolation"]
    problems = {p.where: p.message for p in VideoLoraTask(load_run_config(CONFIG, overrides)).check()}
    assert "32" in problems["data.height"], problems
    assert "TI2V" in problems["model.base.mode"] and "image_to_video" in problems["model.base.mode"]


def test_the_hub_folders_unipc_scheduler_samples_the_pipelines_frames(ti2v_run: Path, tmp_path: Path) -> None:
    """The tiny TI2V base with Wan2.2-TI2V-5B-Diffusers' scheduler (UniPC, flow sigmas, shift 5.0), no
    LoRA: `sample_video` on our `first_frame_latents` with `num_latent_frames` (the `expand_timesteps`
    path) vs the pipeline, 4 steps at guidance 3. Both run the same modules, scheduler class and ops on
    the same inputs, so only float32 rounding of batching can differ: 1e-5; Euler steps on the same flow
    and shift move the frames by > 1e-3, so the bar tells the solvers apart and the multistep solver is
    stepped on the latents as the pipeline steps them (the first frame's noise included)."""
    from diffusers import WanImageToVideoPipeline

    from framer_ds.config.architectures import shipped_architecture
    from framer_ds.tasks.video_lora.wan.conditioning import encode_prompts
    from framer_ds.tasks.video_lora.wan.sampling import (
        load_base_scheduler,
        read_scheduler_config,
        sample_video,
    )
    from framer_ds.tasks.video_lora.wan.ti2v import first_frame_latents

    base = Path(json.loads((ti2v_run / "run" / "final" / "framer_ds_export.json").read_text())["base_model"])
    folder, hub = tmp_path / "base", shipped_architecture("Wan-AI/Wan2.2-TI2V-5B-Diffusers")
    shutil.copytree(base, folder)
    shutil.copyfile(
        hub / "scheduler" / "scheduler_config.json", folder / "scheduler" / "scheduler_config.json"
    )
    index = json.loads((folder / "model_index.json").read_text())
    index["scheduler"] = json.loads((hub / "model_index.json").read_text())["scheduler"]
    (folder / "model_index.json").write_text(json.dumps(index))
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    image = Image.open(_image(tmp_path / "a.png", 3))
    expected = pipe(
        image=image,
        prompt=PROMPT,
        negative_prompt="blurry",
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=4,
        guidance_scale=3.0,
        max_sequence_length=32,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    ).frames
    assert type(pipe.scheduler).__name__ == "UniPCMultistepScheduler"
    texts = [encode_prompts(pipe.text_encoder, pipe.tokenizer, [text], 32) for text in (PROMPT, "blurry")]
    first = pipe.video_processor.preprocess(image, height=64, width=64)
    condition = first_frame_latents(pipe.vae, first)

    def run(config, **kwargs) -> np.ndarray:
        generator = torch.Generator().manual_seed(0)
        frames = sample_video(
            pipe.transformer, pipe.vae, config, *texts, None, condition, 4, 3.0, generator, **kwargs
        )
        return frames.permute(0, 1, 3, 4, 2).numpy()

    ours = run(read_scheduler_config(folder), scheduler=load_base_scheduler(folder), num_latent_frames=3)
    assert np.abs(ours - expected).max() <= 1e-5
    euler = run({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 5.0}, num_latent_frames=3)
    assert np.abs(euler - expected).max() > 1e-3


def test_a_ti2v_folder_is_recognised_by_its_model_index_and_another_patch_is_refused(tmp_path: Path) -> None:
    """The shipped Wan2.2-TI2V-5B-Diffusers configs as a base folder (no weights): `expand_timesteps` in
    its model_index.json makes it TI2V (size rule 16 x 2 = 32 read from its configs, interpolation
    refused as for the tiny base); a transformer patch other than the pipeline's (1, 2, 2), whose
    `[:, ::2, ::2]` gives one timestep per token only for that patch, is refused by name."""
    from framer_ds.config.architectures import shipped_architecture
    from framer_ds.tasks.video_lora.task import VideoLoraTask

    folder = tmp_path / "ti2v"
    shutil.copytree(shipped_architecture("Wan-AI/Wan2.2-TI2V-5B-Diffusers"), folder)
    overrides = [f"output_dir={tmp_path / 'run'}", "model.base.source.builtin=null"]
    overrides += [f"model.base.source.path={folder}", "data.height=80", "model.base.mode=interpolation"]
    task = VideoLoraTask(load_run_config(CONFIG, overrides))
    assert task.family.expand_timesteps and task.family.size_multiple() == 32
    problems = {p.where: p.message for p in task.check()}
    assert "32" in problems["data.height"] and "TI2V" in problems["model.base.mode"], problems
    transformer = folder / "transformer" / "config.json"
    transformer.write_text(transformer.read_text().replace("[\n    1,\n    2,\n    2\n  ]", "[1, 4, 4]"))
    problems = {p.where: p.message for p in VideoLoraTask(load_run_config(CONFIG, overrides)).check()}
    assert "(1, 2, 2) patch" in problems["model.base.source.path"], problems
