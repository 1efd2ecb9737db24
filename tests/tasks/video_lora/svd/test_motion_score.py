"""The motion score (gradient-weighted normal flow) and its quantile map to SVD motion buckets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from framer_ds.tasks.video_lora.svd.motion import MotionBuckets, motion_score, score_frame_indices


def moving_square(speed: float, frames: int = 9, size: int = 96, noise_seed: int | None = None) -> np.ndarray:
    """uint8 [T,H,W,3]: a soft bright square on a textured background, moving right `speed` px/frame."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    background = 40 + 20 * np.sin(xx / 7) * np.cos(yy / 5)
    out = []
    for t in range(frames):
        cx = 30 + speed * t
        edge_x, edge_y = (
            np.clip((np.abs(xx - cx) - 14) * 1.5, -50, 50),
            np.clip((np.abs(yy - 48) - 14) * 1.5, -50, 50),
        )
        square = 180 / (1 + np.exp(edge_x)) / (1 + np.exp(edge_y))
        frame = background + square
        if noise_seed is not None:
            frame = frame + np.random.default_rng(noise_seed + t).normal(0, 1.0, frame.shape)
        out.append(np.repeat(np.clip(frame, 0, 255)[..., None], 3, axis=2))
    return np.stack(out).astype(np.uint8)


def test_a_still_clip_scores_zero_and_faster_clips_score_higher():
    assert motion_score(moving_square(0.0)) == pytest.approx(0.0, abs=1e-6)
    scores = [motion_score(moving_square(speed)) for speed in (0.0, 1.0, 2.0, 4.0)]
    assert scores == sorted(scores) and scores[1] > 0.05 and scores[3] > 2 * scores[1]
    # sensor noise on a still scene scores far below real motion
    assert motion_score(moving_square(0.0, noise_seed=0)) < scores[1]


def test_the_score_does_not_depend_on_the_resolution():
    small = motion_score(moving_square(2.0, size=96))
    large = motion_score(np.repeat(np.repeat(moving_square(2.0, size=96), 2, axis=1), 2, axis=2))
    assert large == pytest.approx(small, rel=0.1)


def test_quantile_buckets_are_deterministic_and_span_0_to_255():
    scores = [0.3, 0.1, 0.9, 0.5, 0.7]
    buckets = MotionBuckets.from_scores(scores)
    assert buckets == MotionBuckets.from_scores(list(reversed(scores)))  # order of the scan does not matter
    assert [buckets.bucket(s) for s in (0.1, 0.3, 0.5, 0.7, 0.9)] == [0, 64, 128, 191, 255]
    assert buckets.bucket(-1.0) == 0 and buckets.bucket(5.0) == 255  # new clips are clamped
    assert buckets.bucket(0.2) == 32  # between two training scores: interpolated rank
    assert MotionBuckets.from_scores([0.4, 0.4]).bucket(0.4) == 128  # no spread: the middle
    assert set(buckets.summary()) == {"q00", "q10", "q25", "q50", "q75", "q90", "q100"}
    with pytest.raises(ValueError, match="there are none"):
        MotionBuckets.from_scores([])


def test_frames_read_for_a_score():
    assert score_frame_indices(100, 2) == (17, 2)
    assert score_frame_indices(9, 4) == (3, 4)
    assert score_frame_indices(3, 4) == (2, 2)


def test_indexed_videos_are_scored_once_and_cached(tmp_path, monkeypatch):
    """Real mp4s (the synthetic moving-shape clips): a score per video, the same from the cache."""
    from framer_ds.tasks.video_lora.shared.data.synthetic_video import ensure_synthetic_clips
    from framer_ds.tasks.video_lora.shared.data.video_index import build_video_index
    from framer_ds.tasks.video_lora.svd import motion as module

    root = ensure_synthetic_clips(tmp_path / "clips")
    records = build_video_index(root, None, 4, cache_dir=tmp_path / "index").records
    first = module.score_records(records, 2, tmp_path / "scores")
    assert set(first) == {r.video_id for r in records} and all(s > 0 for s in first.values())
    assert len(set(first.values())) == len(first)  # the clips move at different speeds

    def no_decoding(*args, **kwargs):
        raise AssertionError("a cached score was decoded again")

    monkeypatch.setattr(module, "read_clip", no_decoding)
    assert module.score_records(records, 2, tmp_path / "scores") == first
    # a damaged cache file (cut short outside our atomic writes) is scored again, not a crash
    monkeypatch.undo()
    (cache_file,) = (tmp_path / "scores").glob("motion_scores_*.json")
    cache_file.write_text(cache_file.read_text()[:20])
    assert module.score_records(records, 2, tmp_path / "scores") == first


@pytest.mark.parametrize("cached", [False, True], ids=["pixels", "latent_cache"])
def test_motion_bucket_from_data_conditions_each_clip_on_its_own_bucket(
    tmp_path, monkeypatch, capsys, cached
):
    """`model.motion_bucket: from_data`: items carry their video's bucket (the training set spans
    0..255), the UNet's added time ids carry it per sample, and the export records the quantiles."""
    import json

    from conftest import REPO
    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.tasks.video_lora.shared.exports import EXPORT_METADATA
    from framer_ds.tasks.video_lora.svd import conditioning as svd_conditioning
    from framer_ds.tasks.video_lora.task import VideoLoraTask
    from framer_ds.train.loop import run_training

    tiny = REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml"
    overrides = [f"output_dir={tmp_path / 'run'}", "model.motion_bucket=from_data", "model.samples.every=0"]
    overrides += ["train.length.steps=2", "train.eval.every=null", "train.checkpoint.every=null"]
    if cached:  # each cache entry stores its bucket
        overrides += ["data.cache.enabled=true", f"data.cache.dir={tmp_path / 'cache'}"]
    config = load_run_config(tiny, overrides)
    task = VideoLoraTask(config)
    assert task.check() == []
    task.prepare_data()
    train, _ = task.build_datasets()
    train_buckets = sorted(train[i]["motion_bucket_id"] for i in range(len(train)))
    assert train_buckets[0] == 0 and train_buckets[-1] == 255 and len(set(train_buckets)) == len(train)
    assert "motion bucket" in task.data_summary()

    seen = []
    original = svd_conditioning.added_time_ids

    def spy(fps, motion_bucket_id, *args, **kwargs):
        seen.append(motion_bucket_id)
        return original(fps, motion_bucket_id, *args, **kwargs)

    monkeypatch.setattr(svd_conditioning, "added_time_ids", spy)
    # sampling.py holds its own reference, bound when it was first imported (by an earlier test, or later)
    from framer_ds.tasks.video_lora.svd import sampling

    monkeypatch.setattr(sampling, "added_time_ids", spy)
    run_training(config)
    per_sample = [m for m in seen if isinstance(m, torch.Tensor) and m.numel() == 2]  # batches of 2
    assert per_sample and len({tuple(m.tolist()) for m in per_sample}) > 1
    if cached:
        from safetensors.torch import load_file

        entries = [load_file(f) for f in (tmp_path / "cache").rglob("*.safetensors")]
        assert entries and all("motion_bucket" in e for e in entries)
        assert {float(e["motion_bucket"]) for e in entries} >= set(train_buckets)
    metadata = json.loads((tmp_path / "run" / "final" / EXPORT_METADATA).read_text())
    assert metadata["motion_bucket"] == "from_data" and metadata["motion_bucket_id"] == 127
    assert set(metadata["motion_score_quantiles"]) >= {"q00", "q50", "q100"}
    if not cached:
        sample_at_the_input_frames_motion(tmp_path, metadata, seen, capsys)


def sample_at_the_input_frames_motion(tmp_path, metadata, seen, capsys):
    """`framer-ds sample` of a from_data export: the bucket comes from the first/last frames (default
    `--motion-bucket auto`), is printed and stored in the sample's JSON; an explicit number wins.

    A black-to-white pair has no image gradient, so its normal-flow score is 0, below every training
    clip (the synthetic clips all move: q00 > 0), so its bucket is 0, not the 127 sampling used before."""
    import json

    from PIL import Image

    from framer_ds.cli.main import main

    assert metadata["motion_score_quantiles"]["q00"] > 0
    for name, value in (("black.png", 0), ("white.png", 255)):
        Image.fromarray(np.full((64, 64, 3), value, dtype=np.uint8)).save(tmp_path / name)
    out = tmp_path / "sample.mp4"
    final = tmp_path / "run" / "final"
    args = [
        "sample",
        str(final),
        "--image",
        str(tmp_path / "black.png"),
        "--last-image",
        str(tmp_path / "white.png"),
    ]
    seen.clear()
    assert main([*args, "--out", str(out), "--steps", "2", "--seed", "5"]) == 0
    assert {int(m) for m in seen} == {0}  # the UNet's added time ids carried the estimated bucket
    printed = capsys.readouterr().out
    assert "motion bucket 0 (from the input frames)" in printed and "seed=5" in printed
    record = json.loads((tmp_path / "sample.json").read_text())
    assert record["motion_bucket"] == 0 and record["motion_bucket_source"] == "the input frames"
    assert record["seed"] == 5 and record["steps"] == 2 and record["num_frames"] == 4
    assert {"fps", "noise_aug_strength", "min_guidance", "max_guidance", "mode", "base", "export"} <= set(
        record
    )
    # an explicit number wins; the renamed flag still works
    seen.clear()
    fixed = [*args, "--out", str(tmp_path / "fixed.mp4"), "--steps", "1", "--motion-bucket-id", "90"]
    assert main([*fixed, "--no-frames"]) == 0
    assert {int(m) for m in seen} == {90}
    assert (tmp_path / "sample_frames").is_dir() and not (tmp_path / "fixed_frames").exists()
    assert json.loads((tmp_path / "fixed.json").read_text())["motion_bucket_source"] == "--motion-bucket"


def test_the_old_motion_bucket_id_key_names_its_replacement(tmp_path):
    from conftest import REPO
    from framer_ds.config.errors import ConfigError
    from framer_ds.tasks.run_config import load_run_config

    tiny = REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml"
    with pytest.raises(ConfigError, match=r"model\.motion_bucket_id: was renamed to model\.motion_bucket; "):
        load_run_config(tiny, [f"output_dir={tmp_path}", "model.motion_bucket_id=100"])
    config = load_run_config(tiny, [f"output_dir={tmp_path}", "model.motion_bucket=100"])
    assert config.model.fixed_motion_bucket == 100


def test_a_clips_bucket_follows_its_stride(tmp_path):
    """A clip at stride 3 moves three times as far per frame as its video at stride 1, so it gets a
    higher bucket; the quantiles rank the training clips at every stride they can be drawn at."""
    from conftest import REPO
    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.tasks.video_lora.svd.motion import MotionBuckets, WithMotionBucket
    from framer_ds.tasks.video_lora.task import VideoLoraTask

    items = [{"video_id": "a", "fps": 30.0}, {"video_id": "a", "fps": 10.0}, {"video_id": "b", "fps": 15.0}]
    buckets = MotionBuckets.from_scores([1.0, 2.0, 3.0, 4.0, 6.0])
    dataset = WithMotionBucket(items, {"a": 1.0, "b": 2.0}, buckets, {"a": 30.0, "b": 30.0})
    assert [dataset[i]["motion_bucket_id"] for i in range(3)] == [0.0, 128.0, 191.0]  # 1x1, 1x3, 2x2

    tiny = REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml"
    overrides = [f"output_dir={tmp_path / 'run'}", "model.motion_bucket=from_data"]
    config = load_run_config(tiny, [*overrides, "data.stride=null", "data.stride_range=[1,3]"])
    task = VideoLoraTask(config)
    task.prepare_data()
    train, _ = task.build_datasets()
    by_stride: dict[str, dict[int, float]] = {}
    for draw in range(60):  # each clip's stride is drawn per (seed, epoch, index): read several epochs
        train.set_epoch(draw // len(train))
        item = train[draw % len(train)]
        by_stride.setdefault(item["video_id"], {})[item["fps"]] = item["motion_bucket_id"]
    assert any(len(seen) > 1 for seen in by_stride.values())
    for seen in by_stride.values():  # within one video: lower fps (larger stride) -> higher bucket
        ordered = [seen[fps] for fps in sorted(seen, reverse=True)]
        assert ordered == sorted(ordered) and (len(ordered) == 1 or ordered[0] < ordered[-1])


def test_the_latent_cache_key_holds_the_buckets_through_the_track_wrapper(tmp_path):
    """A Framer run with point tracks wraps the bucketed clips once more; the cache key still sees the
    buckets, and a fixed-bucket run never reuses entries that stored from_data buckets."""
    from conftest import REPO
    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.tasks.video_lora.task import VideoLoraTask

    framer_tiny = REPO / "configs" / "tasks" / "video_lora" / "framer_tiny.yaml"
    keys = {}
    for bucket in ("from_data", "127"):
        overrides = [f"output_dir={tmp_path / 'run'}", f"model.motion_bucket={bucket}"]
        overrides.append(f"data.tracks.dir={tmp_path / 'tracks'}")
        task = VideoLoraTask(load_run_config(framer_tiny, overrides))
        task.prepare_data()
        train, _ = task.build_datasets()
        keys[bucket] = task.family.cache_description(train, "train", 1, "float32")
    assert "rates" in keys["from_data"]["motion_buckets"] and "motion_buckets" not in keys["127"]
    assert keys["from_data"]["motion_from_data"] and not keys["127"]["motion_from_data"]
