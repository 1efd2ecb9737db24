"""The data side of video_lora: which layout, which videos, the held-out split, and what the summary and
the adapter record about them (capped strides, the fps values training conditions on)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.shared.data.buckets import (
    AUTO_FRAME_STEP,
    Bucket,
    BucketPlan,
    assign_buckets,
    auto_buckets,
    bucket_problems,
)
from framer_ds.tasks.video_lora.shared.data.image_pairs import scan_image_pairs
from framer_ds.tasks.video_lora.shared.data.synthetic_video import ensure_synthetic_clips
from framer_ds.tasks.video_lora.shared.data.video_clips import (
    ClipSampler,
    ImagePairDataset,
    VideoClipDataset,
    capped_records,
    conditioning_fps,
)
from framer_ds.tasks.video_lora.shared.data.video_index import (
    VideoIndex,
    VideoRecord,
    build_video_index,
    count_line,
    format_report,
    rejected_lines,
    require_usable,
)
from framer_ds.tasks.video_lora.shared.options import VideoDataConfig

REJECTED_SHOWN = 20  # rejected files named in the run summary; `data check` lists them all


def layout_problems(data: VideoDataConfig, mode: str, fps: float | None) -> list[ConfigProblem]:
    """What the image-pairs layout needs from the rest of the config, all at once."""
    if data.layout != "image_pairs":
        return []
    problems = []
    if mode != "interpolation":
        problems.append(
            ConfigProblem(
                "data.layout",
                "image_pairs give a first and a last frame: set model.base.mode: interpolation, or use "
                "videos for image_to_video.",
            )
        )
    if data.source.builtin is not None or data.manifest is not None:
        problems.append(
            ConfigProblem(
                "data.layout",
                "image_pairs read {id}_start/{id}_end images under data.source.path: set it and drop "
                "data.source.builtin / data.manifest.",
            )
        )
    if fps is None:
        problems.append(
            ConfigProblem(
                "model.fps",
                "image pairs carry no frame rate: set model.fps to the rate the interpolated clip "
                "should play at (e.g. 7).",
            )
        )
    return problems


def bucket_config_problems(data: VideoDataConfig, family: Any) -> list[ConfigProblem]:
    """data.buckets: an explicit list's shapes by the base family's rules (`VideoBaseFamily`: H and W
    multiples of `size_multiple()`, at least `min_frames()`, a length `frame_count_problem` takes), and
    only with the videos layout (image pairs have one frame size and no length)."""
    if data.buckets is None:
        return []
    problems = []
    if data.layout != "videos":
        problems.append(
            ConfigProblem("data.buckets", "applies to layout videos: set it to null for image_pairs")
        )
    if isinstance(data.buckets, list):
        found = bucket_problems(
            data.buckets, family.size_multiple(), family.min_frames(), family.frame_count_problem
        )
        problems += [ConfigProblem("data.buckets", line) for line in found]
    return problems


def held_out(ids: list[str], fraction: float) -> set[str]:
    """Every k-th item is held out: deterministic and spread over the whole folder."""
    n_val = int(len(ids) * fraction)
    return set(sorted(ids)[:: max(1, len(ids) // n_val)][:n_val]) if n_val else set()


@dataclass
class BuiltData:
    train: Dataset
    val: Dataset | None
    notes: dict[str, str] = field(default_factory=dict)  # for the run summary
    conditioning_fps: list[float] = field(default_factory=list)  # what training conditions on
    buckets: BucketPlan | None = None  # data.buckets: each training video's shape
    item_buckets: list[str] = field(default_factory=list)  # data.buckets: each training item's, by index
    records: list[VideoRecord] = field(default_factory=list)  # every indexed video (videos layout)
    train_records: list[VideoRecord] = field(default_factory=list)  # those the training set holds


@dataclass
class VideoLoraData:
    config: VideoDataConfig
    root: Path
    fixed_fps: float | None  # model.fps
    seed: int | None = None  # train.seed: training items draw their augmentation from (seed, epoch, index)
    size_multiple: int = 64  # H and W multiples of this (the family's VAE x denoiser downsampling)
    min_frames: int = 2  # data.buckets: the fewest frames the base and mode train on
    frame_grid: tuple[int, int] = (0, AUTO_FRAME_STEP)  # data.buckets auto: lengths offset + k * step
    with_placement: bool = False  # items carry their clip placement (the family's, for point tracks)

    @property
    def sampler(self) -> ClipSampler:
        return ClipSampler(self.config.num_frames, self.config.stride, self.config.stride_range)

    def index(self) -> VideoIndex:
        # Indexed at stride 1: a video too short for the largest stride still gives clips at a smaller one.
        data = self.config
        if (
            data.source.builtin == "synthetic_clips"
        ):  # idempotent; lets `data tracks` skip the rest of prepare_data
            ensure_synthetic_clips(self.root)
        # with buckets a video shorter than num_frames may still fill a shorter bucket (or is named unfit)
        shortest = data.num_frames if data.buckets is None else self.min_frames
        found = build_video_index(
            self.root, data.manifest, shortest, cache_dir=default_cache_dir() / "video_index"
        )
        require_usable(found, "data.source.path", data.max_rejected_fraction)
        return found

    def report(self) -> str:
        if self.config.layout == "image_pairs":
            pairs = scan_image_pairs(self.root)
            return f"{self.root}: {len(pairs)} image pairs ({{id}}_start + {{id}}_end)"
        found = self.index()
        note = self.stride_note(found.records)
        report = format_report(found) + (f"\n  stride: {note}" if note else "")
        plan = self.bucket_plan(found.records)
        if plan is not None:
            report += "\n  buckets (data.buckets):" + "".join(f"\n    {line}" for line in plan.lines())
        return report

    def bucket_plan(self, records: list[VideoRecord]) -> BucketPlan | None:
        """data.buckets: the shapes (auto: derived from `records`) and each video's; None when off."""
        data = self.config
        if data.buckets is None:
            return None
        if data.buckets == "auto":
            area = data.height * data.width
            args = (area, data.num_frames, self.size_multiple, data.min_stride, self.min_frames)
            shapes = auto_buckets(records, *args, self.frame_grid)
        else:
            shapes = sorted(Bucket.parse(text) for text in data.buckets)
        if not shapes:
            problem = f"auto found no video of {self.min_frames} frames or more at stride {data.min_stride}"
            raise ConfigError([ConfigProblem("data.buckets", f"{problem}: add longer videos or list shapes")])
        return assign_buckets(records, shapes, data.min_stride)

    def stride_note(self, records: list[VideoRecord]) -> str | None:
        sampler = self.sampler
        capped = capped_records(records, sampler)
        if not capped:
            return None
        return (
            f"{len(capped)} of {len(records)} videos are too short for stride {sampler.strides[1]} at "
            f"{self.config.num_frames} frames: their clips use the largest stride that fits"
        )

    def _split_note(self, held: int, total: int, what: str) -> str:
        return f"{held} of {total} {what} held out (every k-th, data.val_fraction {self.config.val_fraction})"

    def build(self) -> BuiltData:
        data = self.config
        if data.layout == "image_pairs":
            pairs = scan_image_pairs(self.root)
            val_ids = held_out([pid for pid, _, _ in pairs], data.val_fraction)
            size = {"height": data.height, "width": data.width, "num_frames": data.num_frames}
            size["size_multiple"] = self.size_multiple
            train = ImagePairDataset(
                [p for p in pairs if p[0] not in val_ids], hflip=data.hflip, seed=self.seed, **size
            )
            val = ImagePairDataset([p for p in pairs if p[0] in val_ids], **size) if val_ids else None
            notes = {"validation": self._split_note(len(val_ids), len(pairs), "image pairs")}
            return BuiltData(train, val, notes, [self.fixed_fps] if self.fixed_fps else [])
        found = self.index()
        records = sorted(found.records, key=lambda r: r.video_id)
        val_ids = held_out([r.video_id for r in records], data.val_fraction)
        train_records = [r for r in records if r.video_id not in val_ids]
        notes = {"validation": self._split_note(len(val_ids), len(records), "videos")}
        plan = self.bucket_plan(train_records)
        if plan is not None:
            train_records = [r for r in train_records if r.video_id in plan.assigned]
            listed = "".join(f"\n    {line}" for line in plan.lines(REJECTED_SHOWN))
            if not train_records:
                problem = f"no training video fits a bucket:{listed}"
                raise ConfigError([ConfigProblem("data.buckets", f"{problem}\nList shapes that fit them")])
            kind = "auto" if data.buckets == "auto" else "listed"
            notes["buckets"] = f"{len(plan.buckets)} ({kind}, data.buckets){listed}"
            val_ids = self._val_at_fixed_shape(records, val_ids, notes)
        if found.rejected:  # named at start, as `data check` names them: never dropped without a word
            listed = "".join(f"\n    {line}" for line in rejected_lines(found, REJECTED_SHOWN))
            notes["videos"] = f"{count_line(found)}{listed}"
        if (note := self.stride_note(records)) is not None:
            notes["stride"] = note
        common = {
            "num_frames": data.num_frames,
            "height": data.height,
            "width": data.width,
            "stride": data.stride,
            "stride_range": data.stride_range,
            "with_placement": self.with_placement,  # point tracks follow each clip
            "size_multiple": self.size_multiple,  # the base family's rule (the eval set has no buckets)
        }
        train = VideoClipDataset(
            replace(found, records=train_records),
            hflip=data.hflip,
            random_crop=data.random_crop,
            train=True,
            seed=self.seed,
            buckets=plan.assigned if plan is not None else None,
            **common,
        )
        val = None
        if val_ids:
            val_records = [r for r in records if r.video_id in val_ids]
            val = VideoClipDataset(replace(found, records=val_records), train=False, **common)
        built = BuiltData(train, val, notes, self._conditioning_fps(train_records, plan), buckets=plan)
        built.item_buckets = train.item_buckets() if plan is not None else []
        built.records, built.train_records = records, train_records
        return built

    def _val_at_fixed_shape(self, records: list[VideoRecord], val_ids: set[str], notes: dict) -> set[str]:
        """With buckets, evaluation stays at height x width x num_frames (its loss compares across runs
        and buckets): held-out videos shorter than num_frames leave the eval set, with a note."""
        short = {
            r.video_id for r in records if r.video_id in val_ids and r.usable_frames < self.config.num_frames
        }
        if short:
            notes["validation"] += (
                f"; {len(short)} held-out videos shorter than data.num_frames {self.config.num_frames} are "
                f"not evaluated (evaluation stays at one shape): {', '.join(sorted(short)[:REJECTED_SHOWN])}"
            )
        return val_ids - short

    def _conditioning_fps(self, records: list[VideoRecord], plan: BucketPlan | None) -> list[float]:
        """`conditioning_fps` with each video at its bucket's frame count (its strides depend on it)."""
        if plan is None:
            return conditioning_fps(records, self.sampler)
        frames = {r.video_id: plan.assigned[r.video_id].num_frames for r in records}
        return [
            fps
            for r in records
            for fps in conditioning_fps([r], replace(self.sampler, num_frames=frames[r.video_id]))
        ]
