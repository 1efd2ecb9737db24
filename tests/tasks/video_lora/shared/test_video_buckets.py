"""data.buckets (issue 33 §1): clips of several aspect ratios and lengths train at their own shapes, one
bucket per step on every rank, resuming exactly; the shapes are named in metrics.jsonl, the run
summary, `data check`, the planner and the export.

Why exact loss equality on resume: as in test_video_resume.py, both runs are fp32 CPU with the same
operations in the same order, so only an order or a draw that is not replayed can move a loss.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from accelerate.data_loader import prepare_data_loader
from PIL import Image
from safetensors import safe_open
from torch.utils.data import DataLoader

from conftest import REPO, launch_ddp_train, read_metrics, train_in_process
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.video_lora.config import VideoSampleCommandOptions
from framer_ds.tasks.video_lora.shared.data.bucket_sampler import BucketBlockSampler
from framer_ds.tasks.video_lora.shared.data.buckets import (
    Bucket,
    assign_buckets,
    auto_buckets,
    bucket_problems,
)
from framer_ds.tasks.video_lora.shared.data.synthetic_video import write_moving_shape_clip
from framer_ds.tasks.video_lora.shared.data.video_index import VideoRecord
from framer_ds.tasks.video_lora.shared.exports import EXPORT_METADATA
from framer_ds.tasks.video_lora.svd.export import sample_to_file
from framer_ds.tasks.video_lora.task import VideoLoraTask
from video_resume_runs import COMMON, STEPS, resumable_copy

TINY = REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml"
# (height, width, frames) of the folder's clips: three aspect ratios, 8 to 12 frames
CLIPS = [(64, 64, 8), (64, 64, 12), (64, 96, 9), (64, 96, 12), (96, 64, 10), (96, 64, 12)]
# At area 64x64 and the tiny model's multiple 16 (VAE /8, two UNet down blocks /2): 64x64, and for the
# 3:2 and 2:3 clips sqrt(4096 * 1.5) = 78.4 -> 80 and sqrt(4096 / 1.5) = 52.3 -> 48.
AUTO_BUCKETS = {"64x64x8", "48x80x8", "80x48x8"}


def record(video_id: str, height: int, width: int, frames: int) -> VideoRecord:
    return VideoRecord(Path(f"{video_id}.mp4"), video_id, frames, 12.0, width, height, frames / 12)


def test_a_bucket_list_is_validated_line_by_line():
    problems = bucket_problems(["64x96x8", "60x96x8", "64x96x2", "64x96x8", "wide"], 32, 3)
    assert problems == [
        "60x96x8: height 60 is not a multiple of 32 (what this base's VAE and denoiser downsample by); "
        "use 64",
        "64x96x2: 2 frames, this base needs at least 3",
        "64x96x8 is listed twice",
        "'wide' is not a bucket: write HxWxF in pixels and frames, e.g. 64x96x8",
    ]
    assert Bucket.parse("64x96x8").name == "64x96x8"


def test_auto_buckets_follow_the_clips_aspect_and_length():
    clips = [record("square", 64, 64, 30), record("wide", 64, 96, 30), record("short", 96, 64, 6)]
    found = auto_buckets(clips, area=64 * 64, max_frames=8, multiple=16, stride=1, min_frames=3)
    # the short clip: 6 frames rounded down to a multiple of 4
    assert [b.name for b in found] == ["48x80x8", "64x64x8", "80x48x4"]


def test_each_clip_goes_to_its_nearest_bucket_and_the_rest_say_why():
    buckets = [Bucket(64, 64, 8), Bucket(64, 96, 8), Bucket(64, 96, 12)]
    clips = [
        record("square", 70, 70, 20),
        record("wide_long", 128, 192, 20),
        record("wide_short", 128, 192, 9),
        record("tall", 192, 64, 20),  # 1:3 against 1:1 at best: 67% cropped
        record("tiny", 64, 64, 5),
    ]
    plan = assign_buckets(clips, buckets, stride=1)
    assert {k: b.name for k, b in plan.assigned.items()} == {
        "square": "64x64x8",
        "wide_long": "64x96x12",  # the longest of the equally near
        "wide_short": "64x96x8",
    }
    assert plan.unfit["tiny"] == "too short: 5 frames at stride 1, the shortest bucket needs 8"
    assert plan.unfit["tall"].startswith("aspect 64x192: the nearest bucket 64x64x8 would crop 67%")
    assert plan.lines()[:3] == ["64x64x8: 1 clips", "64x96x8: 1 clips", "64x96x12: 1 clips"]


def _rank_batches(sampler: BucketBlockSampler, names: list[str], rank: int, epoch: int) -> list[list[str]]:
    loader = DataLoader(list(range(len(names))), batch_size=2, sampler=sampler, drop_last=True)
    sharded = prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False)
    sharded.set_epoch(epoch)
    return [[names[i] for i in batch.tolist()] for batch in sharded]


def test_every_rank_trains_the_same_bucket_in_each_step():
    names = ["a"] * 5 + ["b"] * 9 + ["c"] * 3
    sampler = BucketBlockSampler(names, micro_batch_size=2, world_size=2, seed=7)
    # each bucket padded to a multiple of 4 (2 ranks x 2) with its own clips: 8 + 12 + 4
    assert len(sampler) == 24
    epochs = []
    for epoch in (0, 1):
        rank0, rank1 = (_rank_batches(sampler, names, rank, epoch) for rank in (0, 1))
        assert len(rank0) == len(rank1) == 6
        for mine, theirs in zip(rank0, rank1, strict=True):
            assert len(set(mine + theirs)) == 1  # one bucket per step, on both ranks
        epochs.append([batch[0] for batch in rank0])
        seen = {i for i in sampler}
        assert seen == set(range(len(names)))  # every clip at least once an epoch
    assert epochs[0] != epochs[1]  # a new order each epoch...
    again = BucketBlockSampler(names, micro_batch_size=2, world_size=2, seed=7)
    again.set_epoch(1)
    assert list(again) == list(sampler)  # ...that is a pure function of (seed, epoch)


@pytest.fixture(scope="module")
def mixed_clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of 64x64, 64x96 and 96x64 clips of 8-12 frames (the project's synthetic writer)."""
    root = tmp_path_factory.mktemp("mixed_clips")
    for i, (height, width, frames) in enumerate(CLIPS):
        write_moving_shape_clip(root / f"clip_{i}_{height}x{width}.mp4", frames, width, height, 12, seed=i)
    return root


def bucket_overrides(clips: Path, run: Path) -> list[str]:
    return [
        f"output_dir={run}",
        "data.source.builtin=null",
        f"data.source.path={clips}",
        "data.buckets=auto",
        "data.num_frames=8",
        "data.stride=1",
        *COMMON,  # the resume tests' steps, checkpoints, no eval set, no samples
    ]


def losses_and_buckets(run: Path) -> list[tuple[int, float, str]]:
    return [(x["step"], x["loss"], x["bucket"]) for x in read_metrics(run)[0]]


@pytest.mark.slow
def test_mixed_clips_train_in_buckets_and_resume_exactly(mixed_clips, tmp_path, capsys):
    """Done when (issue 33 §1): every bucket appears in metrics.jsonl; 2 steps + resume = 4 straight.
    tiny.yaml's micro-batch 2: each bucket (2 clips) is one step, an epoch 3 steps."""
    train_in_process(TINY, bucket_overrides(mixed_clips, tmp_path / "full"))
    straight = losses_and_buckets(tmp_path / "full")
    assert [step for step, _, _ in straight] == list(range(1, STEPS + 1))
    assert {bucket for _, _, bucket in straight} == AUTO_BUCKETS
    assert "64x64x8: 2 clips" in capsys.readouterr().out  # the run summary
    metadata = json.loads((tmp_path / "full" / "final" / EXPORT_METADATA).read_text())
    assert sorted(map(tuple, metadata["trained_shapes"])) == [(48, 80, 8), (64, 64, 8), (80, 48, 8)]
    resumed = resumable_copy(tmp_path / "full", tmp_path / "resumed")
    train_in_process(TINY, [*bucket_overrides(mixed_clips, resumed), "train.resume=latest"])
    assert losses_and_buckets(resumed)[2:] == straight[2:]  # exact (module docstring)
    sample_at_trained_shapes_only(tmp_path / "full" / "final", tmp_path)


def sample_at_trained_shapes_only(final: Path, tmp_path: Path) -> None:
    """`framer-ds sample --height/--width` at a trained bucket writes that size; another is refused."""
    frame = tmp_path / "frame.png"
    Image.new("RGB", (96, 64), (200, 40, 40)).save(frame)
    shape = {"image": frame, "last_image": frame, "steps": 2, "device": "cpu"}
    out = tmp_path / "wide.mp4"
    line = sample_to_file(final, VideoSampleCommandOptions(out=out, height=48, width=80, **shape))
    assert "8 frames at 80x48" in line
    with pytest.raises(ConfigError) as refused:
        sample_to_file(final, VideoSampleCommandOptions(out=out, height=64, width=96, **shape))
    assert (
        "64x96x8 (HxWxF) is not a shape this export was trained at; trained: 48x80x8, 64x64x8, 80x48x8"
        in (str(refused.value))
    )


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_process_resume_with_buckets_repeats_the_straight_losses(mixed_clips, tmp_path):
    """DDP on 2 CPU processes, micro-batch 1: each step both ranks draw one block of the same bucket."""
    one = ["train.micro_batch_size=1"]
    full = tmp_path / "full"
    launch_ddp_train(TINY, [*bucket_overrides(mixed_clips, full), *one])
    straight = losses_and_buckets(full)
    assert {bucket for _, _, bucket in straight} <= AUTO_BUCKETS
    resumed = resumable_copy(full, tmp_path / "resumed")
    launch_ddp_train(TINY, [*bucket_overrides(mixed_clips, resumed), *one, "train.resume=latest"])
    assert losses_and_buckets(resumed)[2:] == straight[2:]


def test_data_check_and_the_planner_name_the_buckets(mixed_clips, tmp_path):
    """Only the 12-frame clips fill these buckets; the others are named with the reason."""
    listed = "data.buckets=[48x80x12, 64x64x12, 80x48x12]"
    task = VideoLoraTask(load_run_config(TINY, [*bucket_overrides(mixed_clips, tmp_path / "run"), listed]))
    report = task.data_report()
    for bucket in ("48x80x12", "64x64x12", "80x48x12"):
        assert f"{bucket}: 1 clips" in report
    assert "3 clips fit no bucket:" in report
    assert "clip_2_64x96.mp4: too short: 9 frames at stride 1, the shortest bucket needs 12" in report
    assert task.plan_assumptions() == ["memory sized by the largest bucket 64x64x12 of 3 (data.buckets)"]
    task.prepare_model_assets()  # the tiny SVD's config.json files, as `framer-ds plan` does
    assert tuple(task.example_batch(1)["target"].shape[1:]) == (12, 4, 8, 8)  # latents: 64 / 8


def test_a_wrong_bucket_list_is_refused_at_validation(tmp_path):
    overrides = [f"output_dir={tmp_path}", "data.buckets=[64x90x8, 64x64x2]"]
    task = VideoLoraTask(load_run_config(TINY, overrides))
    problems = [p.message for p in task.check() if p.where == "data.buckets"]
    assert len(problems) == 2 and "use 96" in problems[0] and "at least 3" in problems[1]
    with pytest.raises(ConfigError):
        load_run_config(TINY, [f"output_dir={tmp_path}", "data.buckets=[]"])


@pytest.mark.slow
def test_the_latent_cache_keeps_each_entry_in_its_bucket(mixed_clips, tmp_path):
    """Two cached copies of each clip (12 entries): entry i is clip i % 6 and keeps its bucket, so every
    micro-batch still holds one shape (a mixed one would not collate) and names it."""
    cache = [
        "data.cache.enabled=true",
        f"data.cache.dir={tmp_path / 'cache'}",
        "data.cache.clips_per_video=2",
    ]
    train_in_process(TINY, [*bucket_overrides(mixed_clips, tmp_path / "run"), *cache, "train.length.steps=3"])
    assert {x["bucket"] for x in read_metrics(tmp_path / "run")[0]} <= AUTO_BUCKETS
    entries = sorted((tmp_path / "cache").glob("*/entry_*.safetensors"))
    assert len(entries) == 12
    with safe_open(str(entries[7]), framework="pt") as handle:  # clip 1: 64x64, 12 frames
        assert (json.loads(handle.metadata()["bucket"]), handle.get_slice("target").get_shape()[-2:]) == (
            "64x64x8",
            [8, 8],
        )


def test_a_run_whose_clips_fit_no_bucket_stops_with_the_reasons(mixed_clips, tmp_path):
    overrides = [*bucket_overrides(mixed_clips, tmp_path / "run"), "data.buckets=[64x64x20]"]
    with pytest.raises(ConfigError) as refused:
        VideoLoraTask(load_run_config(TINY, overrides)).build_datasets()
    message = str(refused.value)
    assert "no training video fits a bucket" in message
    assert "clip_0_64x64.mp4: too short: 8 frames at stride 1, the shortest bucket needs 20" in message
