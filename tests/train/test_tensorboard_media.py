"""TensorBoard gets what W&B gets: the scalars of every log line and the samples a task writes (images,
videos as animated GIFs, audio), read back from the event file; and the GPU memory figures."""

from __future__ import annotations

import io
import warnings

import pytest
import yaml
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import train_in_process
from framer_ds.compat import MissingDependencyError
from framer_ds.engine import metrics, tracker_media


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> EventAccumulator:
    """Two steps of the scripted test task with TensorBoard on and samples at step 2."""
    tmp_path = tmp_path_factory.mktemp("tb")
    config = {
        "imports": ["framer_test_tasks"],
        "task": "test_scripted_eval",
        "output_dir": str(tmp_path / "run"),
        "model": {"width": 16, "depth": 2},
        "data": {"num_samples": 64, "eval_samples": 8, "dim": 4, "sample_every": 2, "eval_script": [0.7]},
        "train": {
            "length": {"steps": 2},
            "micro_batch_size": 8,
            "eval": {"best_metric": "eval/score", "best_mode": "max"},
        },
        "log": {"tensorboard": True},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    train_in_process(path)
    # accelerate's tracker writes into tensorboard/<project>/ (the project is the run directory's name);
    # add_hparams puts the config into a sub-run of its own.
    logdir = tmp_path / "run" / "tensorboard" / "run"
    assert list(logdir.glob("events.out.tfevents.*"))
    accumulator = EventAccumulator(str(logdir), size_guidance={"images": 0, "audio": 0})
    accumulator.Reload()
    return accumulator


def test_scalars_reach_tensorboard(events):
    scalars = set(events.Tags()["scalars"])
    assert {"loss", "lr", "samples_per_s", "memory/rss_gb", "eval/loss", "eval/score"} <= scalars
    assert "best/eval/score" in scalars
    assert [e.step for e in events.Scalars("loss")] == [1, 2]
    assert [e.value for e in events.Scalars("eval/score")] == [pytest.approx(0.7)]


def test_an_image_sample(events):
    (image,) = events.Images("samples/image")
    assert image.step == 2 and (image.width, image.height) == (24, 16)
    pixels = Image.open(io.BytesIO(image.encoded_image_string))
    assert pixels.format == "PNG" and pixels.convert("RGB").getpixel((0, 0)) == (80, 80, 80)


@pytest.mark.parametrize("tag", ["samples/clip_gif", "samples/clip_mp4"])
def test_a_video_sample_is_an_animated_gif(events, tag):
    (video,) = events.Images(tag)
    assert video.step == 2 and (video.width, video.height) == (24, 16)
    gif = Image.open(io.BytesIO(video.encoded_image_string))
    assert gif.format == "GIF" and gif.n_frames == 5  # every frame of the sample, not an empty entry


def test_an_audio_sample(events):
    (audio,) = events.Audio("samples/tone")
    assert audio.step == 2 and audio.sample_rate == 16000
    assert audio.length_frames == 8000 and audio.content_type == "audio/wav"


class RecordingWriter:
    def __init__(self):
        self.calls: list[tuple] = []

    def add_image(self, tag, *args, **kwargs):
        self.calls.append(("image", tag))

    def add_audio(self, tag, *args, **kwargs):
        self.calls.append(("audio", tag))

    def flush(self):
        pass


def test_unknown_unreadable_or_unsupported_files_warn_once_and_the_rest_is_logged(tmp_path, monkeypatch):
    image = tmp_path / "a.png"
    Image.new("RGB", (4, 4)).save(image)
    video = tmp_path / "b.mp4"
    video.write_bytes(b"not read: av is missing")
    (tmp_path / "c.xyz").write_text("?")
    broken = tmp_path / "d.wav"
    broken.write_bytes(b"RIFF, but cut off")
    real_require = tracker_media.require

    def require(module, purpose):
        if module == "av":
            raise MissingDependencyError("package av is required for video samples; install it")
        return real_require(module, purpose)

    monkeypatch.setattr(tracker_media, "require", require)
    writer = RecordingWriter()
    media = tracker_media.TensorBoardMedia(writer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (1, 2):
            media.log("samples", [video, broken, image, tmp_path / "c.xyz"], step)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 3, messages
    assert any("no video samples" in m and "install" in m for m in messages)
    assert any("c.xyz" in m and ".xyz" in m for m in messages)
    assert any("d.wav" in m and "does not decode as audio" in m for m in messages)
    assert writer.calls == [("image", "samples/a"), ("image", "samples/a")]


def test_gpu_memory_now_and_at_peak(monkeypatch):
    cuda = metrics.torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    for name, gib in [
        ("memory_allocated", 1),
        ("memory_reserved", 2),
        ("max_memory_allocated", 3),
        ("max_memory_reserved", 4),
    ]:
        monkeypatch.setattr(cuda, name, lambda gib=gib: gib * 2**30)
    assert metrics.memory_stats() == {
        "memory/allocated_gb": 1.0,
        "memory/reserved_gb": 2.0,
        "memory/max_allocated_gb": 3.0,
        "memory/max_reserved_gb": 4.0,
    }
