"""data.buckets on a Wan base (issue 34): bucket shapes follow the Wan family's rules (H and W multiples
of the VAE x patch size, 16; frame counts 1 + a multiple of the VAE's temporal factor, 4), the tiny
FLF2V base trains one bucket per step with and without the latent cache, evaluates at the configured
shape, and its export samples only at the shapes it trained.

Single-process only: a 2-process Wan bucket run costs well over 30 s on 2 shared cores; the one-bucket-
per-step order across ranks is the family-independent sampler's, tested on 2 processes in
test_video_buckets.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import REPO, read_metrics, train_in_process
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.video_lora.shared.data.synthetic_video import write_moving_shape_clip
from framer_ds.tasks.video_lora.task import VideoLoraTask

CONFIG = REPO / "configs" / "tasks" / "video_lora" / "wan_tiny.yaml"
# (height, width, frames): three aspect ratios; the 96x64 clips hold 7 and 8 frames, fewer than
# data.num_frames 9, so auto gives them the longest Wan length they hold: 1 + 4 = 5 (SVD's rule, a
# multiple of 4, made 80x48x4 and 80x48x8, which Wan's VAE cannot encode as the pipeline does).
CLIPS = [(64, 64, 13), (64, 64, 9), (64, 96, 12), (64, 96, 9), (96, 64, 7), (96, 64, 8)]
# At area 64x64 and Wan's multiple 16: 64x64, sqrt(4096 * 1.5) = 78.4 -> 80, sqrt(4096 / 1.5) = 52.3 -> 48.
AUTO_BUCKETS = {"64x64x9", "48x80x9", "80x48x5"}
STEPS = 3  # micro-batch 2: clip_0 is held out, so each bucket is one block of 2, an epoch 3 steps


@pytest.fixture(scope="module")
def wan_clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wan_clips")
    for i, (height, width, frames) in enumerate(CLIPS):
        write_moving_shape_clip(root / f"clip_{i}_{height}x{width}.mp4", frames, width, height, 12, seed=i)
    return root


def bucket_overrides(clips: Path, run: Path, *more: str) -> list[str]:
    """wan_tiny.yaml on `clips` with auto buckets; one held-out clip (clip_0, 13 frames: evaluated at
    the configured 64x64x9)."""
    return [
        f"output_dir={run}",
        "data.source.builtin=null",
        f"data.source.path={clips}",
        "data.buckets=auto",
        "data.val_fraction=0.2",
        f"train.length.steps={STEPS}",
        f"train.eval.every.steps={STEPS}",
        "train.checkpoint.every=null",
        "train.num_workers=0",
        "train.log_every=1",
        *more,
    ]


@pytest.fixture(scope="module")
def cached_run(wan_clips: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wan_bucket_run")
    train_in_process(CONFIG, bucket_overrides(wan_clips, root / "run", f"data.cache.dir={root / 'cache'}"))
    return root


def test_auto_buckets_take_wan_lengths(wan_clips: Path, tmp_path: Path) -> None:
    task = VideoLoraTask(load_run_config(CONFIG, bucket_overrides(wan_clips, tmp_path / "run")))
    plan = task._data().bucket_plan(task._data().index().records)
    assert {b.name for b in plan.buckets} == AUTO_BUCKETS
    assert not plan.unfit


def test_clips_that_fit_no_listed_wan_bucket_are_named(wan_clips: Path, tmp_path: Path) -> None:
    """As for SVD (`data check` and the run summary): the 7- and 8-frame clips are too short for 9."""
    listed = "data.buckets=[48x80x9, 64x64x13]"
    task = VideoLoraTask(load_run_config(CONFIG, [*bucket_overrides(wan_clips, tmp_path / "run"), listed]))
    report = task.data_report()
    assert "2 clips fit no bucket:" in report
    assert "clip_4_96x64.mp4: too short: 7 frames at stride 1, the shortest bucket needs 9" in report


def test_wan_bucket_lists_are_refused_at_validate_with_the_fix(tmp_path: Path) -> None:
    """The Wan rules, one line each naming the legal value; a legal list passes (no "not yet" line)."""
    listed = "data.buckets=[64x64x8, 60x96x9, 64x96x4, 48x80x13]"
    task = VideoLoraTask(load_run_config(CONFIG, [f"output_dir={tmp_path}", listed]))
    task.prepare_data()  # the tiny base's config.json files: the rules are read from them
    problems = [p.message for p in task.check() if p.where == "data.buckets"]
    assert problems == [
        "64x64x8: Wan's VAE needs 1 + a multiple of 4 frames, got 8: use 9",
        "60x96x9: height 60 is not a multiple of 16 (what this base's VAE and denoiser downsample by); "
        "use 64",
        "64x96x4: 4 frames, this base needs at least 5",
    ]
    fine = VideoLoraTask(
        load_run_config(CONFIG, [f"output_dir={tmp_path}", "data.buckets=[48x80x13, 64x64x9]"])
    )
    assert fine.check() == []


def test_the_planner_sizes_a_wan_run_by_its_largest_bucket(tmp_path: Path) -> None:
    listed = "data.buckets=[48x80x13, 64x64x9, 96x96x5]"
    task = VideoLoraTask(load_run_config(CONFIG, [f"output_dir={tmp_path}", listed]))
    # 48*80*13 = 49920 > 96*96*5 = 46080 > 64*64*9 = 36864 pixels x frames
    assert task.plan_assumptions() == ["memory sized by the largest bucket 48x80x13 of 3 (data.buckets)"]
    task.prepare_model_assets()
    batch = task.example_batch(1)
    # latents: (13 - 1) / 4 + 1 = 4 frames, 48 / 8 x 80 / 8
    assert tuple(batch["target"].shape[2:]) == tuple(batch["condition"].shape[2:]) == (4, 6, 10)


def test_wan_trains_each_bucket_and_the_export_records_them(cached_run: Path) -> None:
    train, evals = read_metrics(cached_run / "run")
    assert [x["step"] for x in train] == list(range(1, STEPS + 1))
    assert {x["bucket"] for x in train} == AUTO_BUCKETS  # one bucket per step, each named
    assert all(np.isfinite(x["loss"]) for x in train)
    assert len(evals) == 1 and np.isfinite(evals[0]["eval/loss"])  # clip_0 at 64x64x9
    metadata = json.loads((cached_run / "run" / "final" / "framer_ds_video_lora.json").read_text())
    assert sorted(map(tuple, metadata["trained_shapes"])) == [(48, 80, 9), (64, 64, 9), (80, 48, 5)]
    entries = sorted((cached_run / "cache").glob("*/entry_*.safetensors"))
    assert len(entries) == 6  # the 5 training clips (one copy each) + the held-out clip_0


def test_without_the_cache_the_bucket_run_gets_the_cached_losses(
    cached_run: Path, wan_clips: Path, tmp_path: Path
) -> None:
    """Encoding each batch at its bucket gives the cached entries' losses (same order, same draws; the
    VAE's mode is deterministic: float32 batched-vs-single rounding ~1e-7 relative, 1e-4 leaves room)."""
    train_in_process(CONFIG, bucket_overrides(wan_clips, tmp_path / "fresh", "data.cache.enabled=false"))
    fresh = [(x["bucket"], x["loss"]) for x in read_metrics(tmp_path / "fresh")[0]]
    cached = [(x["bucket"], x["loss"]) for x in read_metrics(cached_run / "run")[0]]
    assert [b for b, _ in fresh] == [b for b, _ in cached]
    assert [v for _, v in fresh] == pytest.approx([v for _, v in cached], rel=1e-4)


def test_sample_accepts_a_trained_bucket_and_refuses_another_shape(cached_run: Path, tmp_path: Path) -> None:
    from framer_ds.cli.main import main

    frame = tmp_path / "frame.png"
    Image.new("RGB", (80, 48), (200, 40, 40)).save(frame)
    final = cached_run / "run" / "final"
    args = ["sample", str(final), "--image", str(frame), "--last-image", str(frame), "--prompt", "a ball"]
    args += ["--num-inference-steps", "2", "--seed", "0", "--out"]
    frames = tmp_path / "wide.npy"
    assert (
        main(
            [
                *args,
                str(tmp_path / "wide.mp4"),
                "--height",
                "48",
                "--width",
                "80",
                "--save-frames",
                str(frames),
            ]
        )
        == 0
    )
    assert np.load(frames).shape == (9, 48, 80, 3)  # the longest trained at 48x80
    from framer_ds.tasks.video_lora.config import VideoSampleCommandOptions
    from framer_ds.tasks.video_lora.wan.export import sample_wan_export

    options = VideoSampleCommandOptions(
        out=tmp_path / "x.mp4", image=frame, last_image=frame, prompt="a ball", height=64, width=96
    )
    with pytest.raises(ConfigError) as refused:
        sample_wan_export(final, options)
    assert (
        "64x96x9 (HxWxF) is not a shape this export was trained at; trained: 48x80x9, 64x64x9, 80x48x5"
        in str(refused.value)
    )
