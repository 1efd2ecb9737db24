"""Samples during training and `model.interp_eval` on a Wan base (issue 34): the tiny FLF2V base of
configs/tasks/video_lora/wan_tiny.yaml, 4 steps, 2 inference steps. The validation videos are written as
SVD's are and equal `framer-ds sample` on the same step's adapter; the interpolation metrics are the
same after a resume and without the latent cache; under the cache UMT5 is loaded once a run (for the
negative prompt: the clips' prompt states come from the cache)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_wan_family import sample_and_command_frames

from conftest import REPO, read_metrics, train_in_process
from framer_ds.tasks.run_config import load_run_config

CONFIG = REPO / "configs" / "tasks" / "video_lora" / "wan_tiny.yaml"
PROMPT = "a red ball rolls"  # wan_tiny.yaml's fixed prompt
INTERP_KEYS = ("psnr", "psnr_mid", "psnr_ends", "ssim", "flicker_ratio", "clip_distance")
# eval every step (step 1 trains at lr 0: warmup), checkpoints and samples at 2 and 4
ARGS = [
    "train.num_workers=0",
    "train.length.steps=4",
    "train.eval.every.steps=1",
    "train.checkpoint.every.steps=2",
    "model.samples.every=2",
    "model.samples.num_inference_steps=2",
    "model.interp_eval.enabled=true",
    "model.interp_eval.num_inference_steps=2",
]


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The run with the latent cache (as shipped), and how often it loaded UMT5."""
    from framer_ds.tasks.video_lora.wan.encoders import FrozenWanEncoders

    root, loads = tmp_path_factory.mktemp("wan_samples"), []
    load_text = FrozenWanEncoders.load_text
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FrozenWanEncoders, "load_text", lambda self: loads.append(1) or load_text(self))
        train_in_process(CONFIG, [f"output_dir={root / 'run'}", f"data.cache.dir={root / 'cache'}", *ARGS])
    return root, len(loads)


def _interp(line: dict) -> dict:
    return {key: line[f"eval/{key}"] for key in INTERP_KEYS}


@pytest.mark.slow  # the module's training run: ~40 s on 2 cores
def test_samples_are_written_at_every_round_as_svds_are(sampled_run: tuple[Path, int]) -> None:
    """samples/step_N/<index>_<clip>.mp4 + .json + _frames/ for the held-out clips at steps 2 and 4; the
    record names the prompt and where its states came from (the cache: UMT5 loaded once, for the
    negative prompt, as the cache was filled before the run and never for a clip's prompt)."""
    root, umt5_loads = sampled_run
    samples = root / "run" / "samples"
    assert sorted(p.name for p in samples.iterdir()) == ["step_2", "step_4"]
    for step in (2, 4):
        videos = sorted((samples / f"step_{step}").glob("*.mp4"))
        assert len(videos) == 2 and all(v.stat().st_size > 0 for v in videos)
        for video in videos:
            record = json.loads(video.with_suffix(".json").read_text())
            assert record["prompt"] == PROMPT and record["prompt_states"] == "the latent cache"
            assert record["guidance_scale"] == 5.0 and record["num_inference_steps"] == 2
            assert len(list((samples / f"step_{step}" / f"{video.stem}_frames").glob("*.png"))) == 9
    # the cache filled in this run loads UMT5 once; the negative prompt ("") once more, then kept
    assert umt5_loads == 2


@pytest.mark.slow  # the module's training run
def test_a_training_sample_equals_framer_ds_sample_on_that_steps_adapter(
    sampled_run: tuple[Path, int], tmp_path: Path
) -> None:
    """The step-2 sample of the first held-out clip and `framer-ds sample` on checkpoints/step_2/adapter
    with its first and last frames, prompt and seed 0: the same uint8 frames. Exact, because both run
    the same float32 CPU operations: the frames read back from the reference half are the clip's own
    pixel values (checked), the prompt states of the cache are UMT5's on the prompt alone, as the
    command encodes it, and the adapter holds the trained weights bit for bit."""
    run = sampled_run[0] / "run"
    video = run / "samples" / "step_2" / "00_clip_000.mp4"
    assert json.loads(video.with_suffix(".json").read_text())["seed"] == 0
    trained, command = sample_and_command_frames(video, run / "checkpoints" / "step_2" / "adapter", tmp_path)
    assert command.shape == trained.shape == (9, 64, 64, 3)
    assert np.array_equal(command, trained)


@pytest.mark.slow  # one more run resumed from step 2 (~25 s)
def test_interp_eval_metrics_repeat_after_a_resume(sampled_run: tuple[Path, int], tmp_path: Path) -> None:
    """Resumed from the step-2 checkpoint, the evaluations at steps 3 and 4 give the same interpolation
    metrics (per-clip seeds, the same weights: exact on the CPU), and the step-4 samples are the same."""
    root = sampled_run[0]
    resumed = tmp_path / "resumed"
    shutil.copytree(root / "run", resumed)
    for later in (resumed / "checkpoints" / "step_4", resumed / "final", resumed / "samples" / "step_4"):
        shutil.rmtree(later)
    checkpoint = resumed / "checkpoints" / "step_2"
    train_in_process(
        CONFIG,
        [f"output_dir={resumed}", f"data.cache.dir={root / 'cache'}", *ARGS, f"train.resume={checkpoint}"],
    )
    straight = {x["step"]: x for x in read_metrics(root / "run")[1]}
    again = {x["step"]: x for x in read_metrics(resumed)[1]}
    assert set(straight) == {1, 2, 3, 4} and "eval/psnr_mid" in straight[4]
    for step in (3, 4):
        assert _interp(again[step]) == _interp(straight[step]), step
    frames = [sorted((run / "samples" / "step_4").rglob("*.png")) for run in (root / "run", resumed)]
    assert len(frames[0]) == 18
    for a, b in zip(*frames, strict=True):
        assert np.array_equal(np.asarray(Image.open(a)), np.asarray(Image.open(b)))


@pytest.mark.slow  # one more 1-step run without the cache (~15 s)
def test_interp_eval_without_the_cache_gives_the_cached_metrics(
    sampled_run: tuple[Path, int], tmp_path: Path
) -> None:
    """data.cache.enabled false: clips and prompts encoded live (UMT5 on the prompt alone, as the cache
    stored it), pixels straight from the loader; at step 1 (lr 0 in warmup: the same model) the
    interpolation metrics equal those computed from the cache, exactly (same float32 operations)."""
    fresh = tmp_path / "fresh"
    train_in_process(
        CONFIG, [f"output_dir={fresh}", "data.cache.enabled=false", *ARGS, "train.length.steps=1"]
    )
    cached = read_metrics(sampled_run[0] / "run")[1][0]
    live = read_metrics(fresh)[1][0]
    assert cached["step"] == live["step"] == 1
    assert _interp(live) == _interp(cached)
    record = json.loads((fresh / "samples" / "step_1" / "00_clip_000.json").read_text())
    assert record["prompt_states"] == "UMT5"


def _config(tmp_path: Path, *overrides: str):
    return load_run_config(CONFIG, [f"output_dir={tmp_path / 'run'}", *overrides])


def test_wan_sampling_options_that_do_not_apply_are_refused_by_name(tmp_path: Path) -> None:
    """interp_eval in image_to_video mode (no last frame) and SVD's sampler settings: one problem each."""
    from framer_ds.tasks.video_lora.wan.preflight import sampling_problems

    config = _config(
        tmp_path,
        "model.interp_eval.enabled=true",
        "model.base.mode=image_to_video",
        "model.samples.max_guidance_scale=7",
        "model.interp_eval.noise_aug_strength=0.1",
    )
    problems = {p.where: p.message for p in sampling_problems(config.model)}
    assert set(problems) == {
        "model.interp_eval.enabled",
        "model.samples.max_guidance_scale",
        "model.interp_eval.noise_aug_strength",
    }
    assert "no last frame" in problems["model.interp_eval.enabled"]
    assert (
        sampling_problems(_config(tmp_path, "model.samples.every=5", "model.interp_eval.enabled=true").model)
        == []
    )


def test_plan_counts_a_wan_runs_sampling_phase(tmp_path: Path) -> None:
    """`framer-ds plan` of a Wan run with samples: the census counts the VAE, CLIP and UMT5 (their own
    dtypes: the VAE in float32) for the sampling phase under the cache, and as resident helpers without
    it; the probe measures what a sampling round computes beyond the step (a guided forward and the
    VAE decode of a whole clip). Both raised `zip() argument 2 is shorter` (SVD's two helper dtypes for
    Wan's three helpers)."""
    from framer_ds.lab.activations import probe_activations
    from framer_ds.lab.census import task_census
    from framer_ds.tasks.registry import get_task_class

    def task(*overrides: str):
        config = _config(tmp_path, "model.samples.every=2", *overrides)
        built = get_task_class(config.task)(config)
        built.prepare_model_assets()
        return built

    cached = task()
    census = task_census(cached)
    assert census.helper_bytes == 0 and census.eval_helper_bytes > 0
    assert probe_activations(cached).eval_transient > 0
    live = task_census(task("data.cache.enabled=false"))
    assert live.helper_bytes > 0 and live.eval_helper_bytes == 0
