"""Clips/s of the video_lora training loader with `data.buckets: auto` vs one cropped shape, same clips.

Why: buckets change what the loader does per clip (each video's own resize target, a shorter clip for
a shorter bucket, a sampler that groups by bucket); this measures whether that costs throughput. The
clips are the project's synthetic moving-shape videos in three aspect ratios (square, 3:2, 2:3) and
two lengths, written here with PyAV (H.264); both loaders read the same index, micro-batch 2, the
buckets' area equal to the one shape's. Each setting reads `--epochs` epochs through a DataLoader
(0 workers: the per-clip cost, not the worker count), after one warm-up epoch.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from report import write_section
from torch.utils.data import DataLoader, Sampler

from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.shared.data.bucket_sampler import BucketBlockSampler
from framer_ds.tasks.video_lora.shared.data.buckets import assign_buckets, auto_buckets
from framer_ds.tasks.video_lora.shared.data.synthetic_video import write_moving_shape_clip
from framer_ds.tasks.video_lora.shared.data.video_clips import VideoClipDataset
from framer_ds.tasks.video_lora.shared.data.video_index import VideoIndex, build_video_index

SECTION = "## video_buckets"
SHAPES = ((256, 256), (256, 384), (384, 256))  # (height, width) of the source videos
LENGTHS = (16, 24)  # frames per source video
TARGET, NUM_FRAMES, MULTIPLE = 256, 14, 64  # one shape 256x256x14; buckets of area 256^2, SVD's multiple


def ensure_clips(folder: Path, per_shape: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(per_shape):
        for height, width in SHAPES:
            frames = LENGTHS[i % len(LENGTHS)]
            path = folder / f"clip_{height}x{width}_{i}.mp4"
            if not path.is_file():
                write_moving_shape_clip(path, frames, width, height, 24, seed=i)
    return folder


def clips_per_second(dataset: VideoClipDataset, sampler: Sampler | None, epochs: int) -> float:
    loader = DataLoader(dataset, batch_size=2, sampler=sampler, shuffle=sampler is None, drop_last=True)
    for _ in loader:  # warm-up: file handles, allocator
        pass
    start, clips = time.perf_counter(), 0
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch in loader:
            clips += batch["pixel_values"].shape[0]
    return clips / (time.perf_counter() - start)


def bench(index: VideoIndex, epochs: int) -> dict[str, tuple[float, str]]:
    fixed = VideoClipDataset(index, NUM_FRAMES, TARGET, TARGET, train=True, seed=0)
    records = index.records
    shapes = auto_buckets(records, TARGET * TARGET, NUM_FRAMES, MULTIPLE, 1, 2)
    plan = assign_buckets(records, shapes, 1)
    bucketed = VideoClipDataset(index, NUM_FRAMES, TARGET, TARGET, train=True, seed=0, buckets=plan.assigned)
    sampler = BucketBlockSampler(bucketed.item_buckets(), 2, 1, seed=0)
    counts = ", ".join(plan.lines())
    return {
        f"one shape {TARGET}x{TARGET}x{NUM_FRAMES} (data.buckets null)": (
            clips_per_second(fixed, None, epochs),
            "",
        ),
        "data.buckets auto": (clips_per_second(bucketed, sampler, epochs), counts),
    }


def report(results: dict[str, tuple[float, str]], videos: int, command: str) -> str:
    rows = "\n".join(f"| {name} | {rate:.1f} | {note} |" for name, (rate, note) in results.items())
    return f"""{SECTION}
`{command}` ({os.cpu_count()} cores, CPU, DataLoader with 0 workers, micro-batch 2): {videos} synthetic
H.264 videos, {len(SHAPES)} aspect ratios ({", ".join(f"{h}x{w}" for h, w in SHAPES)}) of
{" or ".join(map(str, LENGTHS))} frames, read as clips of at most {NUM_FRAMES} frames. Both rows come from one
run, one after the other: compare them with each other, not across machines or busy runs.

| loader | clips/s | buckets |
|---|---|---|
{rows}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-shape", type=int, default=4, help="videos per aspect ratio")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--video-dir", type=Path, help="where generated videos are cached")
    parser.add_argument("--write", type=Path, help="markdown file whose video_buckets section to replace")
    args = parser.parse_args(argv)
    folder = ensure_clips(args.video_dir or default_cache_dir() / "bench_bucket_videos", args.per_shape)
    index = build_video_index(folder, None, 2, cache_dir=None)
    results = bench(index, args.epochs)
    command = "python benchmarks/video_buckets.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    section = report(results, len(index.records), command.strip())
    print(section)
    if args.write is not None:
        write_section(args.write, SECTION, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
