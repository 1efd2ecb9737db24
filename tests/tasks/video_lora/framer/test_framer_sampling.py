"""`framer-ds sample` on a Framer export reproduces Framer's pipeline: the guidance schedules (SVD's linear
ramp and Framer's middle_max), point tracks from a JSON file (`--tracks`) drawn as Framer's heatmaps and
fed to the ControlNet at `--controlnet-scale`.

Framer's behaviour is read from aim-uofa/Framer at d0ba81f: `pipelines/pipeline_stable_video_diffusion_
interp_control.py` (guidance lines 554-560, heatmaps 474-479, ControlNet 590-636) and `app.py`
(`interpolate_trajectory` 94-111, `Framer.run` 401-507)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import REPO, train_in_process
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.video_lora.config import VideoSampleCommandOptions
from framer_ds.tasks.video_lora.framer.tracks.heatmaps import heatmap_conditioning, rasterise_tracks
from framer_ds.tasks.video_lora.framer.tracks.sample_tracks import (
    framer_interpolate,
    read_tracks_file,
    resize_mapping,
    sampling_tracks,
)
from framer_ds.tasks.video_lora.shared.exports import load_frame
from framer_ds.tasks.video_lora.svd.export import sample_to_file
from framer_ds.tasks.video_lora.svd.sampling import guidance_scales

FRAMER_TINY = REPO / "configs" / "tasks" / "video_lora" / "framer_tiny.yaml"
pytestmark = pytest.mark.timeout(300)


def framers_guidance(min_scale, max_scale, num_frames, middle_max):
    """Framer's lines 555-560, verbatim but for the batch dimension."""
    guidance_scale = torch.linspace(min_scale, max_scale, num_frames).unsqueeze(0)
    if middle_max:
        guidance_scale = torch.cat([guidance_scale, guidance_scale.flip(1)], dim=1)
        guidance_scale = torch.nn.functional.interpolate(
            guidance_scale.unsqueeze(0), size=num_frames, mode="linear", align_corners=False
        )[0]
    return guidance_scale[0]


def test_guidance_schedules_are_svds_ramp_and_framers_middle_max():
    # middle_max: h = [g, flip(g)] (2F values) resized to F (align_corners=False):
    # frame i = (h[2i] + h[2i+1]) / 2.
    # F = 5, 1 -> 3: g = 1, 1.5, 2, 2.5, 3; h = g + reversed g.
    assert guidance_scales(1.0, 3.0, 5, "middle_max").tolist() == [1.25, 2.25, 3.0, 2.25, 1.25]
    # F = 4: g = 1, 5/3, 7/3, 3: max never reached for an even F.
    torch.testing.assert_close(
        guidance_scales(1.0, 3.0, 4, "middle_max"), torch.tensor([4 / 3, 8 / 3, 8 / 3, 4 / 3])
    )
    # Framer's demo: 14 frames, 1 -> 3; the two central frames get 3 - 2 / 26, the ends 1 + 1 / 13.
    framer_default = guidance_scales(1.0, 3.0, 14, "middle_max")
    assert framer_default[6] == framer_default[7] == pytest.approx(3 - 2 / 26)
    assert framer_default[0] == framer_default[13] == pytest.approx(1 + 1 / 13)
    assert guidance_scales(1.0, 3.0, 5, "linear").tolist() == [1.0, 1.5, 2.0, 2.5, 3.0]
    for frames in range(2, 26):
        for middle_max in (False, True):
            schedule = "middle_max" if middle_max else "linear"
            expected = framers_guidance(1.0, 3.0, frames, middle_max)
            assert torch.equal(guidance_scales(1.0, 3.0, frames, schedule), expected)


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value) if not isinstance(value, str) else value)
    return path


def test_tracks_file_errors_name_the_problem(tmp_path):
    cases = [
        ("{not json", "not valid JSON"),
        ({"points": [[[1, 2]]], "colour": 1}, "unknown key(s) colour"),
        ({"size": [4, 4]}, 'no "points"'),
        ({"points": [[[1, 2, 3]]]}, "points[0][0] must be [x, y]"),
        ({"points": [[]]}, "points[0] must be a non-empty list"),
        ({"points": [[[1, 2]]], "size": [64]}, '"size" must be [width, height]'),
        ({"points": [[[1, 2], [3, 4]]], "visible": [[True]]}, '"visible" must hold, per point'),
        (7, "must be an object"),
    ]
    for index, (content, expected) in enumerate(cases):
        path = write_json(tmp_path / f"t{index}.json", content)
        with pytest.raises(ConfigError) as error:
            read_tracks_file(path)
        assert expected in str(error.value) and f"--tracks {path}" in str(error.value), str(error.value)
    with pytest.raises(ConfigError, match="cannot read it"):
        read_tracks_file(tmp_path / "absent.json")
    visible = read_tracks_file(
        write_json(tmp_path / "v.json", {"points": [[[1, 2], [3, 4]]], "visible": [[True, False]]})
    )
    with pytest.raises(ConfigError, match='"visible" gives 2 frames, the sample has 4'):
        sampling_tracks(visible, (8, 8), 4, 8, 8, "crop")


def test_keyframes_are_interpolated_as_framers_demo_does(tmp_path):
    # Two keyframes: PCHIP through two points is the straight line, evenly spaced over the frames.
    line = framer_interpolate(np.array([[0.0, 10.0], [30.0, 40.0]]), 4)
    np.testing.assert_allclose(line, [[0, 10], [10, 20], [20, 30], [30, 40]])
    # One keyframe: Framer's demo adds (x + 1, y + 1) as the second keyframe (app.py lines 463-465).
    np.testing.assert_allclose(framer_interpolate(np.array([[5.0, 6.0]]), 3), [[5, 6], [5.5, 6.5], [6, 7]])
    # Three keyframes: scipy's PCHIP (monotone: no overshoot past the middle keyframe).
    curve = framer_interpolate(np.array([[0.0, 0.0], [10.0, 10.0], [10.0, 30.0]]), 9)
    assert curve[:, 0].max() == 10.0 and curve[4].tolist() == [10.0, 10.0]
    # Framer's bare drag list: coordinates on its 512 x 320 demo image; a 512 x 320 image stays put.
    tracks = read_tracks_file(write_json(tmp_path / "a.json", {"points": [[[100, 50], [200, 60]]]}))
    assert tracks.size is None
    drags = read_tracks_file(write_json(tmp_path / "b.json", [[[100, 50], [200, 60]]]))
    assert drags.size == (512, 320)
    xy, visible = sampling_tracks(drags, (512, 320), 3, 320, 512, "stretch")
    np.testing.assert_allclose(xy[:, 0], [[100, 50], [150, 55], [200, 60]])
    assert visible is None
    xy, _ = sampling_tracks(drags, (1024, 640), 2, 320, 512, "crop")  # any image size: coordinates scale
    np.testing.assert_allclose(xy[:, 0], [[100, 50], [200, 60]])


def test_tracks_are_drawn_with_the_rounding_of_framers_fp16_tensors():
    """Framer's demo hands the pipeline fp16 tracks, and `draw_heatmap` computes the box `c + 20` on that
    fp16 tensor: 500.75 + 20 rounds to 521 (ties to even at spacing 0.5), so the box ends at column 521,
    not 520 as exact arithmetic gives."""
    c = torch.tensor(500.75, dtype=torch.float16)
    assert int(min(c + 20, 599)) == 521  # Framer's draw_heatmap line 37, on its fp16 tensor
    xy = np.array([[[500.75, 30.0]]])
    exact = rasterise_tracks(xy, None, 64, 600)
    as_framer = rasterise_tracks(xy, None, 64, 600, dtype=torch.float16)
    assert exact[0, 30, 520] == 0 and as_framer[0, 30, 520] > 0  # one column wider
    assert np.array_equal(rasterise_tracks(xy, None, 64, 600, dtype=torch.float64), exact)


@pytest.mark.parametrize("resize", ["crop", "stretch", "pad"])
def test_tracks_follow_the_image_through_resize(tmp_path, resize):
    """A bright pixel of the --image lands where its track coordinate is mapped: tracks and frames are
    framed by the same --resize geometry."""
    width, height = 96, 48
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    x, y = 70, 20
    pixels[y - 2 : y + 3, x - 2 : x + 3] = 255  # a 5 x 5 square: its centre survives antialiasing
    Image.fromarray(pixels).save(tmp_path / "dot.png")
    frame = load_frame(tmp_path / "dot.png", 32, 32, "cpu", resize)
    bright = frame.mean(0)
    peak_y, peak_x = divmod(int(bright.argmax()), 32)
    mapped = resize_mapping(width, height, 32, 32, resize).apply(np.array([[x, y]], dtype=np.float64))[0]
    assert abs(mapped[0] - peak_x) <= 1 and abs(mapped[1] - peak_y) <= 1, (mapped, peak_x, peak_y)


@pytest.fixture(scope="module")
def framer_final(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("framer") / "run"
    overrides = [
        f"output_dir={run_dir}",
        "train.length.steps=1",
        "train.eval.every=null",
        "train.checkpoint.every=null",
    ]
    train_in_process(FRAMER_TINY, overrides)
    return run_dir / "final"


def test_tracks_drive_the_controlnet_and_scale_0_is_no_tracks(framer_final, tmp_path, monkeypatch, capsys):
    import framer_ds.tasks.video_lora.shared.data.video_write as video_write
    import framer_ds.tasks.video_lora.svd.sampling as sampling
    from framer_ds.cli.main import main

    written, framers = [], []
    monkeypatch.setattr(video_write, "write_video", lambda path, pixels, fps: written.append(pixels))
    original = sampling.sample_video

    def recording(*args, **kwargs):
        framers.append((kwargs["conditioning"], kwargs["guidance_schedule"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(sampling, "sample_video", recording)
    rng = np.random.default_rng(0)
    for name in ("first.png", "last.png"):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(tmp_path / name)
    tracks = write_json(tmp_path / "tracks.json", {"points": [[[20, 24], [44, 36]], [[32, 32]]]})
    base = ["sample", str(framer_final), "--image", str(tmp_path / "first.png")]
    base += ["--last-image", str(tmp_path / "last.png"), "--out", str(tmp_path / "v.mp4"), "--steps", "2"]

    assert main(base) == 0
    assert main([*base, "--tracks", str(tracks)]) == 0
    assert main([*base, "--tracks", str(tracks), "--controlnet-scale", "0"]) == 0
    assert main([*base, "--guidance-schedule", "middle_max"]) == 0
    assert main([*base, "--tracks", str(tracks), "--controlnet-step-range", "0.6", "1"]) == 0  # steps 0, 0.5
    # what only a Framer sample records (FramerFamily.sample_record_fields, FramerSampling.record)
    record = json.loads((tmp_path / "v.json").read_text())
    assert record["base"] == "framer" and record["tracks"] == str(tracks)
    assert record["controlnet_scale"] == 1.0 and record["controlnet_step_range"] == [0.6, 1.0]
    assert Path(record["framer_path"]) == Path(
        json.loads((framer_final / "framer_ds_video_lora.json").read_text())["framer_path"]
    )
    capsys.readouterr()
    bad = write_json(tmp_path / "bad.json", {"points": [[[1, 2, 3]]]})
    assert main([*base, "--tracks", str(bad)]) == 1  # refused before any model loads
    assert "points[0][0] must be [x, y]" in capsys.readouterr().err and len(framers) == 5
    assert main([*base, "--controlnet-step-range", "0.5", "0.2"]) == 1
    assert "--controlnet-step-range: need [lo, hi] with 0 <= lo <= hi <= 1" in capsys.readouterr().err
    plain, with_tracks, scale_0, middle_max, out_of_range = written
    assert framers[4][0].step_range == (0.6, 1.0)
    assert np.array_equal(plain, out_of_range)  # no step in the range: the ControlNet never ran
    assert framers[0][0].controlnet_cond is None  # no tracks: no ControlNet, as Framer without points
    heatmaps = framers[1][0].controlnet_cond
    assert heatmaps.shape == (1, 4, 3, 64, 64) and framers[1][0].conditioning_scale == 1.0
    # Point 0: two keyframes, evenly over the 4 frames; point 1 stays (Framer's +1 px second keyframe).
    third = 1 / 3
    xy = [
        [[20, 24], [32, 32]],
        [[28, 28], [32 + third] * 2],
        [[36, 32], [32 + 2 * third] * 2],
        [[44, 36], [33, 33]],
    ]
    expected = heatmap_conditioning(np.array(xy), None, 64, 64)  # Framer's generate_gassian_heatmap
    assert torch.equal(heatmaps[0], expected) and not torch.equal(expected[0], expected[3])
    assert framers[2][0].conditioning_scale == 0.0 and framers[3][1] == "middle_max"
    assert not np.array_equal(plain, with_tracks)  # the ControlNet ran
    assert np.array_equal(plain, scale_0)  # zero-scaled residuals add nothing
    assert not np.array_equal(plain, middle_max)


def test_tracks_are_refused_on_a_svd_export(tmp_path):
    export = tmp_path / "svd_export"
    export.mkdir()
    metadata = {"base_model": "x", "mode": "interpolation", "num_frames": 4, "height": 64, "width": 64}
    (export / "framer_ds_video_lora.json").write_text(json.dumps(metadata))
    tracks = write_json(tmp_path / "tracks.json", {"points": [[[1, 2]]]})
    for flags in ({"tracks": tracks}, {"controlnet_scale": 0.5}):
        options = VideoSampleCommandOptions(
            image=tmp_path / "a.png", last_image=tmp_path / "b.png", out=tmp_path / "v.mp4", **flags
        )
        with pytest.raises(ConfigError) as error:
            sample_to_file(export, options)
        message = str(error.value)
        assert "no trajectory ControlNet" in message and "model.base.name: framer" in message
        assert ("--tracks" if "tracks" in flags else "--controlnet-scale") in message
