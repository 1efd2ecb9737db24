"""Reading a clip from a video file: seek and decode only the frames a clip needs.

Why seeking: the seed decoded every frame of every video per sample, so a 14-frame clip from a
10-second video paid for ~240 decodes and RGB conversions. `read_clip` seeks to the keyframe before
the first wanted frame (PyAV/FFmpeg do the seeking and decoding) and stops after the last one, and
only the wanted frames are converted to RGB. Why its own module: the training datasets
(video_clips.py), the motion scores and the point trackers all read clips this one way, numbered as
the index (video_index.py) counts frames.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np

from framer_ds.compat import LazyModule

av = LazyModule("av", "decoding video clips (video_lora data)")

SEEK_BACKOFF_S: tuple[float | None, ...] = (0.0, 1.0, 4.0, None)
"""Seek this many seconds before the first wanted frame, retrying earlier when the decoder's first
frame is already past it (a B-frame GOP whose keyframe is shown late); None = from the start."""


class VideoReadError(RuntimeError):
    """A clip could not be read from a file the index accepted (deleted, truncated, replaced)."""


def clip_indices(start: int, num_frames: int, stride: int) -> list[int]:
    return [start + i * stride for i in range(num_frames)]


def _collect(frames: Iterable[av.VideoFrame], wanted: list[int], index_of) -> list | None:
    """The decoded frames at `wanted` positions, or None when the first frame is already too late.
    A position with no frame of its own (variable frame rate, a dropped frame) gets the frame shown
    at that time, the previous one; for constant-rate video every position has its own frame."""
    out: list[av.VideoFrame] = []
    prev = None
    for frame in frames:
        if frame.pts is None:
            raise VideoReadError("a decoded frame has no timestamp; re-encode the video")
        idx = index_of(frame)
        if prev is None and idx > wanted[0]:
            return None
        while len(out) < len(wanted) and wanted[len(out)] < idx:
            out.append(prev)
        if len(out) < len(wanted) and wanted[len(out)] == idx:
            out.append(frame)
        if len(out) == len(wanted):
            return out
        prev = frame
    last = index_of(prev) if prev is not None else -1
    raise VideoReadError(f"the video ends at frame {last}, the clip needs frame {wanted[-1]}")


def _decode(container: av.container.InputContainer, stream: av.VideoStream, wanted_pts: int) -> Iterator:
    """Decode from the current position; frames whose packets lie before `wanted_pts` and that no
    other frame references (most B-frames) are skipped by the decoder, not decoded and dropped."""
    ctx = stream.codec_context
    for packet in container.demux(stream):
        before = packet.pts is not None and packet.pts < wanted_pts
        ctx.skip_frame = "NONREF" if before else "DEFAULT"
        yield from ctx.decode(packet)


def read_clip(
    path: Path, start: int, num_frames: int, stride: int, first_pts: int | None = None
) -> np.ndarray:
    """uint8 [T,H,W,3] RGB frames `start, start+stride, ...`, numbered by timestamp from the first
    frame (as `video_index` counts them): the same frames a full decode returns at those indices.
    `first_pts` (the index's `VideoRecord.first_pts`) saves decoding frame 0 to learn its timestamp;
    `stream.start_time` is not used for that because some files (AVI with B-frames) misstate it."""
    if start < 0 or num_frames < 1 or stride < 1:
        raise ValueError(
            f"need start >= 0, num_frames >= 1, stride >= 1; got {start}, {num_frames}, {stride}"
        )
    wanted = clip_indices(start, num_frames, stride)
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoReadError("no video stream")
            stream = container.streams.video[0]
            rate, tb = stream.average_rate or stream.guessed_rate, stream.time_base
            if not rate or tb is None:
                raise VideoReadError("frame rate or time base unknown")
            if first_pts is None:
                first = next(container.decode(stream), None)
                if first is None or first.pts is None:
                    raise VideoReadError("no decodable, timestamped first frame")
                first_pts = first.pts
            origin = first_pts
            # Never seek before the stream start: some demuxers (AVI) refuse negative timestamps.
            floor = origin if stream.start_time is None else min(origin, stream.start_time)

            def index_of(frame: av.VideoFrame) -> int:
                return round((frame.pts - origin) * tb * rate)

            target = origin + int(start / rate / tb)  # Fractions: exact pts of frame `start`
            # Frames before this (1.5 frames before `start`, so rounding never reaches `start` or the
            # frame before it, which fills a gap at `start`) need not be decoded unless referenced.
            skip_before = origin + int((start - Fraction(3, 2)) / rate / tb)
            for back in SEEK_BACKOFF_S:
                seek_pts = floor if back is None else max(floor, target - int(back / tb))
                container.seek(seek_pts, stream=stream, backward=True, any_frame=False)
                frames = _collect(_decode(container, stream, skip_before), wanted, index_of)
                if frames is not None:
                    return np.stack([f.to_ndarray(format="rgb24") for f in frames])
            raise VideoReadError(f"no frame at or before frame {start} after seeking to the start")
    except VideoReadError as exc:
        raise VideoReadError(f"cannot read frames {wanted[0]}..{wanted[-1]} of {path}: {exc}") from exc
    except (av.error.FFmpegError, OSError) as exc:
        raise VideoReadError(f"cannot read {path} ({type(exc).__name__}: {exc})") from exc
