"""Wan 2.2 two-expert bases (issue 34): configs/tasks/video_lora/wan22_tiny.yaml trains ONE expert of the
tiny two-expert base at its own noise levels (the other transformer never loads); a high- and a
low-noise run's adapters, loaded into diffusers' `WanImageToVideoPipeline` (`load_into_transformer_2` for
the low one), give `framer-ds sample --other-expert`'s frames; each expert exports to ComfyUI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import REPO, read_metrics, train_in_process
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.run_config import load_run_config

CONFIG = REPO / "configs" / "tasks" / "video_lora" / "wan22_tiny.yaml"
PROMPT = "a red ball rolls"
BOUNDARY = 0.9  # the tiny base's model_index boundary_ratio (Wan2.2-I2V-A14B's)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """wan22_tiny.yaml as shipped (the high-noise expert, 30 steps, eval at 15 and 30) and a 6-step
    low-noise run without eval, one latent cache dir in the module's temp dir."""
    root = tmp_path_factory.mktemp("wan22_runs")
    common = [f"data.cache.dir={root / 'cache'}", "train.num_workers=0"]
    train_in_process(CONFIG, [f"output_dir={root / 'high'}", *common])
    low = ["model.base.expert=low_noise", "train.length.steps=6", "train.eval.every=null"]
    train_in_process(CONFIG, [f"output_dir={root / 'low'}", *common, *low, "train.checkpoint.every=null"])
    return root


def _image(path: Path, seed: int) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


@pytest.mark.slow  # the module's two trainings: ~40 s on 2 cores
def test_one_expert_trains_at_its_noise_levels_and_its_export_records_it(runs: Path) -> None:
    train, evals = read_metrics(runs / "high")
    first, last = np.mean([x["loss"] for x in train[:5]]), np.mean([x["loss"] for x in train[-5:]])
    assert last < 0.95 * first, (first, last)  # measured 1.65 -> 1.47 (lr 3e-3, 30 steps)
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"]
    # eval sigmas inside each expert's range: >= 0.9 for high noise (timestep >= 900), below for low
    high = [float(k.split("_")[-1]) for k in evals[0] if k.startswith("eval/loss_sigma_")]
    low = [float(k.split("_")[-1]) for k in read_metrics(runs / "low")[1][0] if "loss_sigma_" in k]
    assert len(high) == len(low) == 3 and min(high) >= BOUNDARY > max(low), (high, low)
    for name in ("high", "low"):
        final = runs / name / "final"
        record = json.loads((final / "framer_ds_export.json").read_text())
        assert record["expert"] == f"{name}_noise" and record["boundary_ratio"] == BOUNDARY
        assert Path(record["base_model"]).name == "tiny_wan22_i2v"
        keys = sorted(load_file(str(final / "pytorch_lora_weights.safetensors")))
        assert keys and all(k.startswith("transformer.blocks.") for k in keys)
        assert not [k for k in keys if "add_k_proj" in k or "add_v_proj" in k]  # no image attention


@pytest.mark.slow  # the module's two trainings: ~40 s on 2 cores
def test_the_cache_holds_no_image_states_and_both_experts_share_it(runs: Path) -> None:
    """No CLIP on Wan 2.2 I2V A14B: entries hold target, condition and prompt states only; the high and
    low runs (same clips, same prompt) share one cache: what it holds does not depend on the expert (the
    noise level is drawn at training time), so the low run encoded nothing."""
    entries = sorted((runs / "cache").glob("*/entry_0000000.safetensors"))
    assert len(entries) == 2  # the train and the eval split, written once by the high run
    for entry in entries:
        with safe_open(str(entry), "pt") as tensors:
            assert set(tensors.keys()) == {"target", "condition", "prompt_emb"}


def test_example_batch_of_a_base_without_image_encoder_has_no_image_states(tmp_path: Path) -> None:
    from framer_ds.tasks.video_lora.task import VideoLoraTask

    task = VideoLoraTask(load_run_config(CONFIG, [f"output_dir={tmp_path / 'run'}"]))
    task.family.prepare()
    batch = task.family.example_batch(task.config, 2)
    assert set(batch) == {"target", "condition", "prompt_emb"}
    assert batch["condition"].shape[:2] == (2, 20)  # 4 mask channels + 16 latents (in_channels 36 - 16)


@pytest.mark.slow  # the module's two trainings: ~40 s on 2 cores
def test_framer_ds_sample_with_both_experts_equals_the_pipeline_with_both_loras(
    runs: Path, tmp_path: Path
) -> None:
    """The done-when test of the Wan 2.2 step: `framer-ds sample HIGH/final --other-expert LOW/final`
    equals diffusers' pipeline with the high LoRA on `transformer` and the low one loaded with
    `load_into_transformer_2=True`, same seed and inputs: max abs <= 1e-3 (the same float32 operations
    on the CPU; measured 0.0). 3 steps at shift 3 run timesteps 1000 (high) then 750 and ~9 (low), so
    both adapters act; without them the frames differ."""
    from diffusers import WanImageToVideoPipeline

    from framer_ds.cli.main import main

    high, low = runs / "high" / "final", runs / "low" / "final"
    first, frames = _image(tmp_path / "a.png", 1), tmp_path / "x.npy"
    args = ["sample", str(high), "--other-expert", str(low), "--image", str(first), "--prompt", PROMPT]
    args += ["--num-frames", "9", "--height", "64", "--width", "64", "--seed", "0"]
    args += ["--num-inference-steps", "3", "--out", str(tmp_path / "x.mp4"), "--save-frames", str(frames)]
    assert main(args) == 0
    ours = np.load(frames)
    base = json.loads((high / "framer_ds_export.json").read_text())["base_model"]
    pipe = WanImageToVideoPipeline.from_pretrained(base)
    pipe.load_lora_weights(high)
    pipe.load_lora_weights(low, load_into_transformer_2=True)

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
    pipe.transformer_2.unload_lora()  # the low-noise LoRA matters on its own (measured 0.061)
    assert np.abs(pipeline_frames() - theirs).max() > 1e-2
    pipe.unload_lora_weights()  # measured 0.128
    assert np.abs(pipeline_frames() - theirs).max() > 1e-2


@pytest.mark.slow  # the module's two trainings: ~40 s on 2 cores
def test_other_expert_of_the_same_expert_or_another_base_is_refused(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One line naming --other-expert and the expert it needs, before anything loads or is written."""
    from framer_ds.cli.main import main

    high = runs / "high" / "final"
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(runs / "low" / "final", elsewhere)
    metadata = json.loads((elsewhere / "framer_ds_video_lora.json").read_text())
    (elsewhere / "framer_ds_video_lora.json").write_text(json.dumps({**metadata, "base_model": "/other"}))
    image = _image(tmp_path / "a.png", 1)
    for other, named in ((high, "'high_noise'"), (elsewhere, "/other")):
        out = tmp_path / "x.mp4"
        args = ["sample", str(high), "--other-expert", str(other), "--image", str(image), "--prompt", PROMPT]
        assert main([*args, "--out", str(out)]) != 0
        error = capsys.readouterr().err
        assert "--other-expert" in error and named in error and "'low_noise'" in error
        assert "Traceback" not in error and not out.exists()


@pytest.mark.slow  # the module's two trainings: ~40 s on 2 cores
def test_export_comfyui_of_either_expert_has_wan21s_keys_without_image_attention(
    runs: Path, tmp_path: Path
) -> None:
    """ComfyUI loads each expert's LoRA on its own model with Wan 2.1's key layout; Wan 2.2 has no
    img_emb / k_img / v_img, and none are written."""
    from framer_ds.cli.main import main

    found = {}
    for name in ("high", "low"):
        out = tmp_path / name
        assert main(["export", str(runs / name / "final"), "--format", "comfyui", "--out", str(out)]) == 0
        found[name] = set(load_file(str(out / "wan_lora_comfyui.safetensors")))
    assert found["high"] == found["low"]
    assert "diffusion_model.blocks.0.self_attn.q.lora_down.weight" in found["high"]
    assert not [k for k in found["high"] if "img" in k]


def _problems(tmp_path: Path, *overrides: str) -> dict[str, str]:
    from framer_ds.tasks.video_lora.task import VideoLoraTask

    config = load_run_config(CONFIG, [f"output_dir={tmp_path / 'run'}", *overrides])
    return {p.where: p.message for p in VideoLoraTask(config).check()}


def _shipped_wan22(tmp_path: Path) -> list[str]:
    from framer_ds.config.architectures import shipped_architecture

    folder = tmp_path / "wan22"
    shutil.copytree(shipped_architecture("Wan-AI/Wan2.2-I2V-A14B-Diffusers"), folder)
    return ["model.base.source.builtin=null", f"model.base.source.path={folder}"]


def test_a_two_expert_folder_without_an_expert_is_named_in_one_line(tmp_path: Path) -> None:
    """The shipped Wan2.2-I2V-A14B folder (no image_encoder/, which is not asked for): one problem, on
    model.base.expert, saying which value trains which subfolder."""
    folder = _shipped_wan22(tmp_path)
    problems = _problems(tmp_path, *folder, "model.base.expert=null")
    assert list(problems) == ["model.base.expert"], problems
    message = problems["model.base.expert"]
    assert "high_noise (trains transformer/ on timesteps >= 0.9 x 1000)" in message
    assert "low_noise (trains transformer_2/" in message
    assert _problems(tmp_path, *folder) == {}


def test_expert_and_boundary_on_a_one_transformer_base_are_refused(tmp_path: Path) -> None:
    one = ["model.base.source.builtin=tiny_wan_i2v"]
    problems = _problems(tmp_path, *one, "model.base.boundary_ratio=0.8")
    assert set(problems) == {"model.base.expert", "model.base.boundary_ratio"}
    assert all("holds one transformer" in m for m in problems.values())
    with pytest.raises(ConfigError, match=r"model\.base\.boundary_ratio"):
        load_run_config(CONFIG, [f"output_dir={tmp_path}", "model.base.boundary_ratio=1.0"])


def test_samples_and_interp_eval_in_a_one_expert_run_are_refused_naming_other_expert(tmp_path: Path) -> None:
    """A sample needs both experts and the run loads only its own: both options refused, each in one
    line pointing at `framer-ds sample --other-expert` (before: validate passed and the first sampling
    round ran the high-noise expert alone at every noise level)."""
    from framer_ds.tasks.video_lora.task import VideoLoraTask

    on = ["model.samples.every=2", "model.interp_eval.enabled=true"]
    config = load_run_config(CONFIG, [f"output_dir={tmp_path / 'run'}", *on])
    problems = VideoLoraTask(config).check()
    for key in ("model.samples.every", "model.interp_eval.enabled"):
        assert any(p.where == key and "--other-expert" in p.message for p in problems), problems


def test_the_low_noise_expert_builds_transformer_2_and_never_loads_transformer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from framer_ds.tasks.video_lora.task import VideoLoraTask
    from framer_ds.tasks.video_lora.wan import family as wan_family

    loaded: list[str] = []
    real = wan_family.load_pretrained

    def spy(cls, folder, subfolder):
        loaded.append(subfolder)
        return real(cls, folder, subfolder=subfolder)

    monkeypatch.setattr(wan_family, "load_pretrained", spy)
    task = VideoLoraTask(load_run_config(CONFIG, [f"output_dir={tmp_path}", "model.base.expert=low_noise"]))
    task.family.prepare()
    task.family.build_model(gradient_checkpointing=False)
    assert loaded == ["transformer_2"]


@pytest.mark.slow  # the module's two trainings: ~40 s on 2 cores
def test_guidance_scale_2_and_no_other_expert_sample_as_the_pipeline(runs: Path, tmp_path: Path) -> None:
    """Without --other-expert the low-noise expert samples as the base; --guidance-scale-2 guides its
    steps as the pipeline's guidance_scale_2 does (max abs <= 1e-3 as above; a scale the low-noise steps
    do not use would move the frames by far more)."""
    from diffusers import WanImageToVideoPipeline

    from framer_ds.cli.main import main

    high = runs / "high" / "final"
    first, frames = _image(tmp_path / "a.png", 3), tmp_path / "x.npy"
    args = ["sample", str(high), "--guidance-scale-2", "2.0", "--image", str(first), "--prompt", PROMPT]
    args += ["--num-frames", "9", "--height", "64", "--width", "64", "--seed", "1"]
    args += ["--num-inference-steps", "3", "--out", str(tmp_path / "x.mp4"), "--save-frames", str(frames)]
    assert main(args) == 0
    pipe = WanImageToVideoPipeline.from_pretrained(
        json.loads((high / "framer_ds_export.json").read_text())["base_model"]
    )
    pipe.load_lora_weights(high)
    common = {"image": Image.open(first), "prompt": PROMPT, "num_frames": 9, "height": 64, "width": 64}
    common["num_inference_steps"] = 3

    def pipeline_frames(**guidance: float) -> np.ndarray:
        generator = torch.Generator("cpu").manual_seed(1)
        return pipe(**common, **guidance, generator=generator, output_type="np").frames[0]

    ours = np.load(frames)
    assert np.abs(ours - pipeline_frames(guidance_scale_2=2.0)).max() <= 1e-3
    assert np.abs(ours - pipeline_frames()).max() > 1e-3  # the default (= guidance 5.0) differs


def test_two_expert_flags_are_refused_for_a_one_transformer_or_svd_export(tmp_path: Path) -> None:
    """--other-expert and --guidance-scale-2 mean nothing without two experts: one line naming the flag."""
    from framer_ds.tasks.video_lora.config import VideoSampleCommandOptions
    from framer_ds.tasks.video_lora.svd.export import require_flags_fit_adapter
    from framer_ds.tasks.video_lora.wan.export import _refuse_svd_flags

    common = {"image": tmp_path / "a.png", "out": tmp_path / "x.mp4", "prompt": PROMPT}
    for flag, value in (("other_expert", tmp_path), ("guidance_scale_2", 2.0)):
        options = VideoSampleCommandOptions(**common, **{flag: value})
        named = "--" + flag.replace("_", "-")
        with pytest.raises(ConfigError, match=f"{named}: a Wan 2.2 .two-expert. flag"):
            _refuse_svd_flags(options, {"base": "wan", "mode": "image_to_video"})
        svd = VideoSampleCommandOptions(**{**common, "prompt": None}, **{flag: value})
        with pytest.raises(ConfigError, match=f"{named}: a Wan flag"):
            require_flags_fit_adapter({"base": "svd", "mode": "image_to_video"}, svd)


def test_boundary_ratio_override_moves_both_experts_ranges(tmp_path: Path) -> None:
    """model.base.boundary_ratio replaces the folder's 0.9 for the training draws and the eval sigmas:
    at 0.5 the high-noise expert reaches down to sigma 0.5 and the low-noise one stays below it."""
    from framer_ds.tasks.video_lora.task import VideoLoraTask
    from framer_ds.tasks.video_lora.wan import flow_matching as fm

    def family(*overrides: str):
        config = load_run_config(
            CONFIG, [f"output_dir={tmp_path}", "model.base.boundary_ratio=0.5", *overrides]
        )
        found = VideoLoraTask(config).family
        found.prepare()
        return found

    high, low = family(), family("model.base.expert=low_noise")
    assert high.boundary_ratio() == low.boundary_ratio() == 0.5
    assert min(high.eval_sigmas()) >= 0.5 > max(low.eval_sigmas()) and min(high.eval_sigmas()) < BOUNDARY
    for expert, inside in ((high, lambda s: s >= 0.5), (low, lambda s: s < 0.5)):
        draws = fm.sample_training_sigmas(4096, expert.shift(), index_range=expert._expert_range())
        assert bool(inside(draws).all())
