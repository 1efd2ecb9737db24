"""What `framer-ds sample` conditions on (sample_record.py): the motion bucket's choice and its flag."""

from __future__ import annotations

import pytest
import torch

from framer_ds.cli.options import build_options_parser, parse_options
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.video_lora.config import VideoSampleCommandOptions
from framer_ds.tasks.video_lora.svd.motion import MotionBuckets, bucket_from_quantiles, motion_bucket_choice

QUANTILES = {"q00": 0.1, "q10": 0.2, "q25": 0.3, "q50": 0.5, "q75": 0.7, "q90": 0.8, "q100": 1.0}


def parse(*argv: str) -> VideoSampleCommandOptions:
    parser = build_options_parser(VideoSampleCommandOptions, prog="sample", description="")
    return parse_options(VideoSampleCommandOptions, parser, ["--image", "a.png", "--out", "v.mp4", *argv])


def test_the_motion_bucket_flag_takes_a_number_or_auto_and_its_old_name():
    assert parse().motion_bucket is None and parse().frames is True
    assert parse("--motion-bucket", "auto").motion_bucket == "auto"
    assert parse("--motion-bucket", "90").motion_bucket == 90
    assert parse("--motion-bucket-id", "60").motion_bucket == 60  # the flag's old name
    assert parse("--no-frames").frames is False
    with pytest.raises(ConfigError, match=r"--motion-bucket: .*0\.\.255 \(or auto\), got 300"):
        parse("--motion-bucket", "300")
    with pytest.raises(SystemExit):  # argparse: "invalid int or auto value: 'fast'"
        parse("--motion-bucket", "fast")


def test_recorded_quantiles_map_a_score_like_the_training_map_at_those_points():
    """At the recorded quantiles the map gives their percentile (q50 -> 0.5 * 255); below the lowest
    training score 0 and above the highest 255, as MotionBuckets clamps; no spread: the middle."""
    assert [bucket_from_quantiles(QUANTILES[k], QUANTILES) for k in ("q00", "q25", "q50", "q100")] == [
        0,
        64,
        128,
        255,
    ]
    assert bucket_from_quantiles(0.0, QUANTILES) == 0 and bucket_from_quantiles(9.0, QUANTILES) == 255
    scores = [0.1, 0.3, 0.5, 0.7, 1.0]  # 5 scores: their own summary reproduces their buckets
    exact = MotionBuckets.from_scores(scores)
    assert [bucket_from_quantiles(s, exact.summary()) for s in scores] == [exact.bucket(s) for s in scores]
    flat = dict.fromkeys(QUANTILES, 0.4)
    assert bucket_from_quantiles(0.4, flat) == MotionBuckets.from_scores([0.4, 0.4]).bucket(0.4)


def test_the_bucket_comes_from_the_flag_the_frames_or_the_export():
    first, last = torch.full((3, 16, 16), -1.0), torch.full((3, 16, 16), 1.0)  # black, white
    from_data = {"motion_bucket_id": 127, "motion_score_quantiles": QUANTILES}
    fixed = {"motion_bucket_id": 100}
    assert motion_bucket_choice(42, from_data, first, last, 4)["motion_bucket"] == 42
    auto = motion_bucket_choice(None, from_data, first, last, 4)
    assert auto["motion_bucket"] == 0 and auto["motion_bucket_source"] == "the input frames"
    assert motion_bucket_choice(None, fixed, first, last, 4) == {
        "motion_bucket": 100,
        "motion_bucket_source": "the export",
    }
    with pytest.raises(ConfigError, match=r"--motion-bucket: auto .* fixed bucket 100: pass a number"):
        motion_bucket_choice("auto", fixed, first, last, 4)
