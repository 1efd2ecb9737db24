"""Clips/s of the seeking clip reader (`read_clip`) vs the seed's decode-every-frame approach.

Why: the seed decoded (and RGB-converted) every frame of a video to use 10-14 of them, so on real
10-second videos the loader, not the GPU, set the step time. This measures both on real H.264 mp4s
generated here with PyAV (libx264, scrolling photographic-like noise texture so the bitrate is not
trivially low), same clips for both: 10 frames, stride 1..3, random starts, then resize + crop to
576x576. Keyframe spacing decides how much a seek saves, so it is varied and written in the table
(x264's own default, 250, is one keyframe per 10-second video). Then clips/s through a DataLoader of
`VideoClipDataset` with 0, 1 and 2 workers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch
from report import write_section
from torch.utils.data import DataLoader

from framer_ds.storage.atomic import atomic_file
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.shared.data.clip_reader import read_clip
from framer_ds.tasks.video_lora.shared.data.video_clips import VideoClipDataset, resize_and_crop
from framer_ds.tasks.video_lora.shared.data.video_index import build_video_index

SECTION = "## video_loader"
TARGET_SPEEDUP = 5.0
NUM_FRAMES, SIZE, STRIDES = 10, 576, (1, 3)
HEADLINE_GOP = 48  # 2 s at 24 fps: the keyframe interval of typical camera and streaming encodes


def make_video(path: Path, seconds: float, fps: int, width: int, height: int, gop: int) -> None:
    """Written atomically, so an interrupted run never leaves a half video in the cache."""
    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (height // 8, width // 8 + 64, 3), dtype=np.uint8)
    texture = np.repeat(np.repeat(small, 8, axis=0), 8, axis=1)  # 8-px blocks: detail, not white noise
    with atomic_file(path) as tmp, av.open(str(tmp), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"g": str(gop), "bf": "3", "crf": "23", "preset": "faster", "sc_threshold": "0"}
        for i in range(round(seconds * fps)):
            shift = (i * 3) % 512
            array = np.ascontiguousarray(texture[:, shift : shift + width])
            y, x = (i * 5) % (height - 64), (i * 11) % (width - 64)
            array[y : y + 64, x : x + 64] = 255
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def ensure_videos(root: Path, count: int, seconds: float, fps: int, width: int, gop: int) -> Path:
    folder = root / f"{width}x{SIZE}_{fps}fps_{seconds:g}s_gop{gop}"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        path = folder / f"video_{i}.mp4"
        if not path.exists():
            print(f"encoding {path} ...", flush=True)
            make_video(path, seconds, fps, width, SIZE, gop)
    return folder


def seed_clip(path: Path, start: int, stride: int) -> torch.Tensor:
    """The seed's approach: decode every frame of the video into a list, then pick the clip."""
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    clip = np.stack(frames[start : start + NUM_FRAMES * stride : stride])
    return resize_and_crop(clip, SIZE, SIZE, random_crop=False)


def our_clip(path: Path, start: int, stride: int) -> torch.Tensor:
    return resize_and_crop(read_clip(path, start, NUM_FRAMES, stride), SIZE, SIZE, random_crop=False)


def clip_plan(paths: list[Path], frames: int, count: int, seed: int) -> list[tuple[Path, int, int]]:
    rng = np.random.default_rng(seed)
    plan = []
    for _ in range(count):
        stride = int(rng.integers(STRIDES[0], STRIDES[1] + 1))
        start = int(rng.integers(0, frames - (NUM_FRAMES - 1) * stride))
        plan.append((paths[int(rng.integers(len(paths)))], start, stride))
    return plan


def clips_per_s(fn, plan: list[tuple[Path, int, int]]) -> float:
    begin = time.perf_counter()
    for path, start, stride in plan:
        out = fn(path, start, stride)
        assert out.shape == (NUM_FRAMES, 3, SIZE, SIZE)
    return len(plan) / (time.perf_counter() - begin)


@dataclass
class GopResult:
    gop: int
    seed: list[float]
    ours: list[float]

    @property
    def speedup(self) -> float:
        return statistics.median(self.ours) / statistics.median(self.seed)


def bench_gop(folder: Path, frames: int, args: argparse.Namespace, gop: int) -> GopResult:
    paths = sorted(folder.glob("video_*.mp4"))
    our_clip(*clip_plan(paths, frames, 1, 99)[0])  # warm-up: imports, codec init, page cache
    seed_clip(*clip_plan(paths, frames, 1, 99)[0])
    result = GopResult(gop, [], [])
    for r in range(args.repeats):  # alternate, so machine noise hits both sides
        plan = clip_plan(paths, frames, args.clips, seed=r)
        result.seed.append(clips_per_s(seed_clip, plan))
        result.ours.append(clips_per_s(our_clip, plan))
        print(f"gop {gop} repeat {r + 1}: seed {result.seed[-1]:.2f}, ours {result.ours[-1]:.2f} clips/s")
    return result


def bench_workers(folder: Path, workers: int, clips: int) -> float:
    """clips/s through a DataLoader (batch 1); the first batch per worker (start-up) is not timed."""
    index = build_video_index(folder, None, (NUM_FRAMES - 1) * STRIDES[1] + 1, cache_dir=None)
    ds = VideoClipDataset(index, NUM_FRAMES, SIZE, SIZE, stride_range=STRIDES, hflip=True, random_crop=True)
    sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=clips + max(workers, 1))
    loader = DataLoader(ds, batch_size=1, sampler=sampler, num_workers=workers)
    it = iter(loader)
    for _ in range(max(workers, 1)):
        next(it)
    begin = time.perf_counter()
    n = sum(1 for _ in it)
    return n / (time.perf_counter() - begin)


def machine() -> str:
    info = Path("/proc/cpuinfo")
    names = [x for x in info.read_text().splitlines() if x.startswith("model name")] if info.exists() else []
    cpu = names[0].split(":", 1)[1].strip() if names else "unknown CPU"
    ffmpeg = av.library_versions.get("libavcodec", ("?",))
    return (
        f"{cpu}, {os.cpu_count()} cores; av {av.__version__} (libavcodec {'.'.join(map(str, ffmpeg))}), "
        f"torch {torch.__version__}, Python {sys.version.split()[0]}; "
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; 1-minute load average at the end: "
        f"{os.getloadavg()[0]:.1f} (this benchmark keeps about 1-2 cores busy; more means others ran)"
    )


def report(
    results: list[GopResult], workers: dict[int, float], args: argparse.Namespace, command: str
) -> str:
    rows = "\n".join(
        f"| {r.gop} ({r.gop / args.fps:.3g} s) | {statistics.median(r.seed):.2f} "
        f"({min(r.seed):.2f}-{max(r.seed):.2f}) | {statistics.median(r.ours):.2f} "
        f"({min(r.ours):.2f}-{max(r.ours):.2f}) | {r.speedup:.1f}x |"
        for r in results
    )
    worker_rows = "\n".join(
        f"| {w} | {cps:.2f} | {cps / max(w, 1):.2f} |" for w, cps in sorted(workers.items())
    )
    head = next((r for r in results if r.gop == HEADLINE_GOP), results[0])
    verdict = "PASS" if head.speedup >= TARGET_SPEEDUP else "FAIL"
    n_frames = round(args.seconds * args.fps)
    clip_mb = NUM_FRAMES * 3 * SIZE * SIZE * 4 / 1e6
    return f"""{SECTION}

Written by `benchmarks/video_loader.py`. Command: `{command}`

Machine: {machine()}; torch threads: {torch.get_num_threads()}.

Videos: {args.videos} generated H.264 mp4s per keyframe interval, {args.width}x{SIZE},
{args.seconds:g} s at {args.fps} fps ({n_frames} frames), libx264 crf 23, 3 B-frames, fixed GOP.
Clip: {NUM_FRAMES} frames, random stride in {STRIDES[0]}..{STRIDES[1]}, random start, resized (cover)
and centre-cropped to {SIZE}x{SIZE}. Seed: decode and RGB-convert every frame of the video, then
pick the {NUM_FRAMES}. Ours: `read_clip` (seek to the keyframe before the clip, let the decoder skip
unreferenced frames before it, stop after the last wanted frame, RGB-convert only the wanted ones).
Same clips for both; {args.clips} clips per repeat, {args.repeats} alternating repeats, one process.
Cells are medians (range over repeats).

| keyframe interval | seed clips/s | ours clips/s | speedup |
|---|---|---|---|
{rows}

Speedup at a {HEADLINE_GOP}-frame keyframe interval: **{head.speedup:.1f}x**, target >= {TARGET_SPEEDUP:g}x:
**{verdict}**. With one keyframe per video (x264's default interval, 250, exceeds the
{n_frames} frames) the seek skips nothing; the gain there comes from stopping after the clip,
skipping unreferenced frames before it and converting only the wanted frames to RGB.

`VideoClipDataset` through a DataLoader (batch 1, GOP {HEADLINE_GOP} videos, random crop + flip,
{args.loader_clips} clips timed after each worker's first). Per worker = clips/s / workers (0 workers =
the main process). Each clip is a {clip_mb:.0f} MB float32 tensor that workers hand over through shared
memory, and on {os.cpu_count()} cores the workers share the CPU with each other and the main process.

| num_workers | clips/s | clips/s per worker |
|---|---|---|
{worker_rows}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=4, help="videos per keyframe interval")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--fps", type=int, default=24)
    parser.add_argument("--width", type=int, default=1024, help="video width; height is 576")
    parser.add_argument("--gops", default="24,48,250", help="keyframe intervals to test, in frames")
    parser.add_argument("--clips", type=int, default=8, help="clips per repeat and method")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loader-clips", type=int, default=24, help="clips timed per DataLoader setting")
    parser.add_argument("--video-dir", type=Path, help="where generated videos are cached")
    parser.add_argument("--write", type=Path, help="markdown file whose video_loader section to replace")
    args = parser.parse_args(argv)
    video_dir = args.video_dir or default_cache_dir() / "bench_videos"
    gops = [int(g) for g in args.gops.split(",")]
    if HEADLINE_GOP not in gops:
        gops.append(HEADLINE_GOP)
    frames = round(args.seconds * args.fps)
    folders = {g: ensure_videos(video_dir, args.videos, args.seconds, args.fps, args.width, g) for g in gops}
    results = [bench_gop(folders[g], frames, args, g) for g in gops]
    workers = {}
    for w in (0, 1, 2):
        workers[w] = bench_workers(folders[HEADLINE_GOP], w, args.loader_clips)
        print(f"DataLoader num_workers={w}: {workers[w]:.2f} clips/s", flush=True)
    command = "python benchmarks/video_loader.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    section = report(results, workers, args, command.strip())
    print(section)
    if args.write is not None:
        write_section(args.write, SECTION, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
