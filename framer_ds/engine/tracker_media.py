"""Media files a task wrote (samples), turned into what each tracker shows: W&B objects, TensorBoard
images, animated GIFs and audio.

Why a GIF encoder of our own: `SummaryWriter.add_video` encodes with `moviepy.editor`, which is not a
framer_ds dependency and no longer exists in moviepy 2; without it torch prints a line and writes an
EMPTY entry. TensorBoard shows a video as an animated GIF in an image summary, which Pillow (a
dependency) writes; PyAV decodes the mp4 a task wrote. A package that is missing or broken anyway, or a
file that does not decode, costs its tracker entries, with one warning naming the cause, never the run.
"""

from __future__ import annotations

import io
import sys
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from framer_ds.compat import MissingDependencyError, require

MediaKind = Literal["image", "video", "audio"]
_KINDS: dict[str, MediaKind] = {
    **dict.fromkeys((".png", ".jpg", ".jpeg", ".bmp", ".webp"), "image"),
    **dict.fromkeys((".mp4", ".gif", ".webm", ".mov", ".mkv", ".avi"), "video"),
    **dict.fromkeys((".wav", ".flac", ".mp3", ".ogg"), "audio"),
}
# Packages each kind needs besides Pillow (all are framer_ds dependencies; `require` names a broken one).
_NEEDS: dict[MediaKind, tuple[str, ...]] = {"image": (), "video": ("av",), "audio": ("soundfile",)}


def media_kind(path: Path) -> MediaKind | None:
    return _KINDS.get(Path(path).suffix.lower())


def wandb_media(wandb: Any, path: Path) -> Any:
    """A W&B Video, Audio or Image for `path` by its suffix (an unknown suffix is tried as an image)."""
    kind = media_kind(path)
    if kind == "video":
        return wandb.Video(str(path), caption=path.stem)
    if kind == "audio":
        return wandb.Audio(str(path), caption=path.stem)
    return wandb.Image(str(path), caption=path.stem)


class TensorBoardMedia:
    """Writes media files into a `SummaryWriter`, one tag per file (`<name>/<file stem>`), so the same
    sample written at every sampling step becomes one slider in TensorBoard. Warns once per cause."""

    def __init__(self, writer: Any):
        self.writer = writer
        self._warned: set[str] = set()

    def log(self, name: str, paths: list[Path], step: int) -> None:
        for path in map(Path, paths):
            kind = media_kind(path)
            if kind is None:
                self._warn_once(
                    path.suffix,
                    f"TensorBoard: {path.name} is not logged: {path.suffix or 'no suffix'} is not a known "
                    f"image, video or audio suffix ({', '.join(sorted(_KINDS))}); the file stays in the run "
                    "directory",
                )
                continue
            try:
                for module in _NEEDS[kind]:
                    require(module, f"{kind} samples in TensorBoard")
            except MissingDependencyError as exc:
                self._warn_once(kind, f"TensorBoard gets no {kind} samples: {exc}")
                continue
            try:
                self._write(kind, f"{name}/{path.stem}", path, step)
            except _unreadable() as exc:
                self._warn_once(
                    f"unreadable {path.suffix}",
                    f"TensorBoard: {path} is not logged, it does not decode as {kind} "
                    f"({type(exc).__name__}: {exc}); the file stays in the run directory (this warning "
                    f"is not repeated for other {path.suffix} files)",
                )
        self.writer.flush()  # a killed job keeps what it logged, as metrics.jsonl does

    def _write(self, kind: MediaKind, tag: str, path: Path, step: int) -> None:
        if kind == "image":
            self.writer.add_image(tag, read_image(path), step, dataformats="HWC")
        elif kind == "video":
            frames, fps = read_video(path)
            self.writer._get_file_writer().add_summary(gif_summary(tag, frames, fps), step)
        else:
            samples, sample_rate = read_audio(path)
            self.writer.add_audio(tag, torch.from_numpy(samples), step, sample_rate=sample_rate)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def _unreadable() -> tuple[type[BaseException], ...]:
    """What a file that does not decode raises: Pillow OSError, soundfile RuntimeError, PyAV FFmpegError
    (ValueError for data it rejects). A sample is a side product: it costs its tracker entry, not the run."""
    errors: tuple[type[BaseException], ...] = (OSError, ValueError, RuntimeError)
    av = sys.modules.get("av")
    return (*errors, av.error.FFmpegError) if av is not None else errors


def read_image(path: Path) -> np.ndarray:
    """uint8 [H, W, 3]."""
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def read_video(path: Path) -> tuple[np.ndarray, float]:
    """uint8 frames [T, H, W, 3] and frames per second, decoded with PyAV (mp4, GIF, webm, ...)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate) if stream.average_rate else 4.0
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    if not frames:
        raise ValueError(f"{path} holds no video frames")
    return np.stack(frames), fps


def read_audio(path: Path) -> tuple[np.ndarray, int]:
    """float32 mono samples in [-1, 1] (channels averaged: TensorBoard plays one) and the sample rate."""
    import soundfile

    samples, sample_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    return samples.mean(axis=1), int(sample_rate)


def gif_summary(tag: str, frames: np.ndarray, fps: float) -> Any:
    """What `SummaryWriter.add_video` writes (an image summary holding an animated GIF), encoded with
    Pillow. `frames`: uint8 [T, H, W, 3]."""
    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary

    images = [Image.fromarray(frame) for frame in frames]
    buffer = io.BytesIO()
    images[0].save(
        buffer,
        format="GIF",
        save_all=True,
        append_images=images[1:],
        duration=max(20, round(1000 / max(fps, 1e-3))),  # GIF delays are in 10 ms units, >= 20 ms plays
        loop=0,
    )
    _, height, width, channels = frames.shape
    image = Summary.Image(
        height=height, width=width, colorspace=channels, encoded_image_string=buffer.getvalue()
    )
    return Summary(value=[Summary.Value(tag=tag, image=image)])
