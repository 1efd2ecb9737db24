"""Video data index: which videos under a root (or in a manifest) are usable, and why the others are not.

Why an index built before training: a corrupt or too-short file met at sample time would crash the
run hours in. Each file is probed once with PyAV container metadata plus ONE decoded frame (never the
whole file), rejected files are listed with the reason, and the probes are cached as JSON in
`cache_dir` so a restart or a second rank does not re-open 100k files. The cache is keyed by (root,
manifest) and, per file, by (size, mtime_ns): adding one video re-probes one video, not the dataset.

Frame numbers are positions in time, `round((pts - first_pts) * time_base * fps)` with `first_pts`
the first decoded frame's; for a constant-frame-rate video that is the n-th frame a full decode
returns, which is what `clip_reader.read_clip` reads.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from framer_ds.compat import LazyModule, MissingDependencyError
from framer_ds.config.errors import ConfigError, ConfigProblem, did_you_mean
from framer_ds.storage.atomic import atomic_write_text

av = LazyModule("av", "indexing videos (video_lora data)")

VIDEO_EXTENSIONS: frozenset[str] = frozenset({".mp4", ".avi", ".mov", ".mkv", ".webm"})
MANIFEST_COLUMNS: tuple[str, ...] = ("path", "start_frame", "end_frame", "fps", "caption")
CACHE_VERSION = 1
REENCODE_HINT = "re-encode it (ffmpeg -i IN -c:v libx264 -pix_fmt yuv420p OUT.mp4) or delete it"


@dataclass(frozen=True)
class VideoRecord:
    """One usable video (or manifest segment). `fps` is the container's rate, used to number frames;
    `manifest_fps` overrides only the rate reported to the model (for files with wrong metadata).
    `start_frame` is inclusive and `end_frame` exclusive, like a Python slice. `first_pts` is the
    timestamp of the first decoded frame (frame 0), which `stream.start_time` does not always give."""

    path: Path
    video_id: str
    num_frames: int
    fps: float
    width: int
    height: int
    duration_s: float
    start_frame: int | None = None
    end_frame: int | None = None
    caption: str | None = None
    manifest_fps: float | None = None
    first_pts: int | None = None

    @property
    def first_frame(self) -> int:
        return self.start_frame or 0

    @property
    def stop_frame(self) -> int:
        return self.num_frames if self.end_frame is None else self.end_frame

    @property
    def usable_frames(self) -> int:
        return self.stop_frame - self.first_frame

    @property
    def source_fps(self) -> float:
        return self.manifest_fps or self.fps


@dataclass
class VideoIndex:
    """Usable records (sorted, so every rank sees the same order) and rejected (path, reason) pairs."""

    root: Path
    min_frames: int
    records: list[VideoRecord] = field(default_factory=list)
    rejected: list[tuple[Path, str]] = field(default_factory=list)


@dataclass(frozen=True)
class _Entry:
    """A file to index: from the directory scan, or one manifest row (`line` > 0)."""

    path: Path
    line: int = 0
    start_frame: int | None = None
    end_frame: int | None = None
    fps: float | None = None
    caption: str | None = None


def _scan(root: Path) -> list[_Entry]:
    """Every visible video file under `root`, recursively (symlinked dirs followed), sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if not name.startswith(".") and os.path.splitext(name)[1].lower() in VIDEO_EXTENSIONS:
                found.append(_Entry(Path(dirpath) / name))
    return sorted(found, key=lambda e: e.path)


def _read_manifest_rows(manifest: Path) -> list[dict]:
    """Raw rows of a CSV (with header) or JSONL manifest; a malformed file is a ConfigError."""
    suffix = manifest.suffix.lower()
    where = str(manifest)
    if suffix == ".csv":
        with manifest.open(newline="", encoding="utf-8") as fh:
            return [dict(row) for row in csv.DictReader(fh)]
    if suffix not in (".jsonl", ".json"):
        raise ConfigError([ConfigProblem(where, "a manifest must be .csv (with a header) or .jsonl.")], where)
    rows, problems = [], []
    for n, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            row = exc
        if not isinstance(row, dict):
            problems.append(ConfigProblem(f"{where}:{n}", "not a JSON object; write one {...} per line."))
        rows.append(row)
    if problems:
        raise ConfigError(problems, where)
    return rows


def _parse_manifest(manifest: Path, root: Path) -> list[_Entry]:
    """Validate every row (all problems at once) and resolve paths relative to `root`."""
    where = str(manifest)
    if not manifest.is_file():
        raise ConfigError([ConfigProblem("data.manifest", f"{manifest} does not exist.")], where)
    rows = _read_manifest_rows(manifest)
    if rows and all("path" not in row for row in rows):
        raise ConfigError([ConfigProblem(where, "no 'path' column; name the video column 'path'.")], where)
    problems = []
    if any(None in row for row in rows):  # csv.DictReader files extra cells under the key None
        problems.append(ConfigProblem(where, "a row has more cells than the header; quote commas."))
    for col in sorted({k for row in rows for k in row if k is not None} - set(MANIFEST_COLUMNS)):
        problems.append(
            ConfigProblem(
                where,
                f"unknown column '{col}'.{did_you_mean(col, MANIFEST_COLUMNS)} Known columns: "
                f"{', '.join(MANIFEST_COLUMNS)}; rename or remove it.",
            )
        )
    entries = []
    for n, row in enumerate(rows, 1 if manifest.suffix.lower() != ".csv" else 2):
        values: dict = {}
        for key, kind in (("start_frame", int), ("end_frame", int), ("fps", float)):
            raw = row.get(key)
            if raw in (None, ""):
                continue
            try:
                values[key] = kind(raw)
                bad = values[key] < 0 if kind is int else not values[key] > 0
            except (TypeError, ValueError):
                bad = True
            if bad:
                need = "an integer >= 0" if kind is int else "a number > 0"
                problems.append(ConfigProblem(f"{where}:{n}", f"{key}={raw!r} must be {need}."))
        path = str(row.get("path") or "").strip()
        if not path:
            problems.append(ConfigProblem(f"{where}:{n}", "empty 'path'; give the video path per row."))
            continue
        caption = row.get("caption")
        entries.append(
            _Entry(root / path, n, caption=None if caption in (None, "") else str(caption), **values)
        )
    if problems:
        raise ConfigError(problems, where)
    return entries


def _frames_from_end(
    container: av.container.InputContainer, stream: av.VideoStream, rate: float, start: int
) -> int:
    """Frame count for containers without one (mkv, webm): seek to the last keyframe and demux (not
    decode) the remaining packets; the largest pts gives the count. Durations are the last resort
    (matroska's can include the start offset, so they may overcount)."""
    try:
        if container.duration:
            container.seek(container.duration + (container.start_time or 0), backward=True)
    except av.error.FFmpegError:
        pass  # unseekable: demux the rest from here, which still decodes nothing
    last = max((p.pts for p in container.demux(stream) if p.pts is not None), default=None)
    if last is not None:
        return round((last - start) * stream.time_base * rate) + 1
    if stream.duration:
        return int(stream.duration * stream.time_base * rate)
    return int((container.duration or 0) / av.time_base * rate)


def probe_video(path: Path) -> dict:
    """Container metadata plus one decoded frame (proof the codec works), or {"error": reason}."""
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                return {"error": f"no video stream (audio-only or not a video); {REENCODE_HINT}"}
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or 0)
            if rate <= 0:
                return {"error": f"frame rate unknown in the container metadata; {REENCODE_HINT}"}
            first = next(container.decode(stream), None)
            if first is None:
                return {"error": f"no frame decodes; {REENCODE_HINT}"}
            if first.pts is None:
                return {"error": f"decoded frames carry no timestamps; {REENCODE_HINT}"}
            frames = stream.frames or _frames_from_end(container, stream, rate, first.pts)
    except MissingDependencyError:
        raise  # the environment's fault, not the file's: never cached as a rejection of a good video
    except Exception as exc:  # PyAV raises InvalidDataError, OSError, ValueError, ... per format
        return {"error": f"PyAV cannot read it ({type(exc).__name__}: {exc}); {REENCODE_HINT}"}
    if frames <= 0:
        return {"error": f"frame count unknown (no count, no timestamps); {REENCODE_HINT}"}
    return {
        "num_frames": frames, "fps": rate, "width": first.width, "height": first.height,
        "first_pts": first.pts,
    }  # fmt: skip


def _cache_file(cache_dir: Path, root: Path, manifest: Path | None) -> Path:
    key = json.dumps([str(root.resolve()), str(manifest.resolve()) if manifest else None])
    return cache_dir / f"video_index-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _load_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # absent or half-written by a killed process: probe again
    return data.get("files", {}) if data.get("version") == CACHE_VERSION else {}


def _write_cache(path: Path, files: dict) -> None:
    """Atomic: ranks may write at once, and a reader never sees half a file."""
    atomic_write_text(path, json.dumps({"version": CACHE_VERSION, "files": files}))


def _video_id(entry: _Entry, root: Path) -> str:
    try:
        name = entry.path.relative_to(root).as_posix()
    except ValueError:
        name = entry.path.as_posix()
    if entry.start_frame is None and entry.end_frame is None:
        return name
    return f"{name}@{entry.start_frame or 0}-{'' if entry.end_frame is None else entry.end_frame}"


def _check(entry: _Entry, probe: dict, min_frames: int, root: Path) -> VideoRecord | str:
    """A record, or the reason this file/segment cannot give a clip of `min_frames` frames."""
    if "error" in probe:
        return probe["error"]
    n, fps = probe["num_frames"], probe["fps"]
    record = VideoRecord(
        entry.path, _video_id(entry, root), n, fps, probe["width"], probe["height"], n / fps,
        entry.start_frame, entry.end_frame, entry.caption, entry.fps, probe["first_pts"],
    )  # fmt: skip
    fix = f"; fix manifest line {entry.line}" if entry.line else ""
    if record.first_frame >= record.stop_frame:
        return f"start_frame {record.first_frame} is not before end_frame {record.stop_frame}{fix}"
    if record.stop_frame > n:
        return f"end_frame {record.stop_frame} is past the end of the video ({n} frames){fix}"
    if record.usable_frames < min_frames:
        span = f" (frames {record.first_frame}..{record.stop_frame} of {n})" if entry.line else ""
        return (
            f"too short: {record.usable_frames} frames{span}, need {min_frames} "
            f"((num_frames - 1) x max stride + 1){fix or '; use a longer video or fewer/closer frames'}"
        )
    return record


def build_video_index(
    root: Path, manifest: Path | None, min_frames: int, cache_dir: Path | None
) -> VideoIndex:
    """Probe every video under `root` (or every manifest row), reusing cached probes of files whose
    size and mtime are unchanged; unusable files go to `rejected`, they never raise. A missing or broken
    PyAV raises MissingDependencyError before any probe is cached."""
    if min_frames < 1:
        raise ValueError(f"min_frames must be >= 1, got {min_frames}; use the clip's num_frames.")
    root = Path(root).expanduser()
    if not root.is_dir():
        what = "is a file, not a directory" if root.exists() else "does not exist"
        raise ConfigError(
            [ConfigProblem("data.source.path", f"{root} {what}; point it at the videos.")], str(root)
        )
    entries = _scan(root) if manifest is None else _parse_manifest(Path(manifest).expanduser(), root)
    cache_path = _cache_file(Path(cache_dir), root, manifest) if cache_dir is not None else None
    cached = _load_cache(cache_path) if cache_path else {}
    files: dict[str, dict] = {}
    index = VideoIndex(root=root, min_frames=min_frames)
    for entry in entries:
        try:
            st = entry.path.stat()
        except OSError as exc:
            listed = f" (listed on manifest line {entry.line})" if entry.line else ""
            index.rejected.append((entry.path, f"file not found{listed}: {exc.strerror}"))
            continue
        key = str(entry.path)
        hit = cached.get(key) or files.get(key)
        if not hit or (hit["size"], hit["mtime_ns"]) != (st.st_size, st.st_mtime_ns):
            hit = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "probe": probe_video(entry.path)}
        files[key] = hit
        result = _check(entry, hit["probe"], min_frames, root)
        if isinstance(result, str):
            index.rejected.append((entry.path, result))
        else:
            index.records.append(result)
    if cache_path is not None and files != cached:
        _write_cache(cache_path, files)
    return index


def format_report(index: VideoIndex) -> str:
    """Human summary for `data check` and for the zero-usable error: counts, durations, sizes, rejects."""
    recs = index.records
    lines = [f"Video index of {index.root} (clips need >= {index.min_frames} frames):"]
    lines.append(f"  {count_line(index)}")
    if recs:
        durations = [r.usable_frames / r.fps for r in recs]
        lines.append(
            f"  duration: {sum(durations) / 60:.1f} min total, per video min {min(durations):.1f} s, "
            f"median {statistics.median(durations):.1f} s, max {max(durations):.1f} s; "
            f"{sum(r.usable_frames for r in recs)} frames"
        )
        sizes = Counter(f"{r.width}x{r.height}" for r in recs)
        lines.append("  resolutions: " + ", ".join(f"{k} ({v})" for k, v in sizes.most_common()))
        rates = Counter(f"{r.source_fps:g}" for r in recs)
        lines.append("  fps: " + ", ".join(f"{k} ({v})" for k, v in rates.most_common()))
    lines += [f"  {line}" for line in rejected_lines(index)]
    return "\n".join(lines)


def count_line(index: VideoIndex) -> str:
    """`usable: N, rejected: M`, as `data check` and the run summary print it."""
    return f"usable: {len(index.records)}, rejected: {len(index.rejected)}"


def rejected_lines(index: VideoIndex, limit: int | None = None) -> list[str]:
    """`rejected PATH: REASON` per rejected file (the first `limit`, then how many more)."""
    shown = index.rejected if limit is None else index.rejected[:limit]
    lines = [f"rejected {path}: {reason}" for path, reason in shown]
    if len(shown) < len(index.rejected):
        lines.append(
            f"... and {len(index.rejected) - len(shown)} more (`framer-ds data check` lists them all)"
        )
    return lines


def require_usable(index: VideoIndex, where: str, max_rejected_fraction: float = 1.0) -> None:
    """Fail at start, with the full report, when no video can give a clip, or when more than
    `max_rejected_fraction` of the files are unusable: a broken copy or the wrong folder would otherwise
    train on what is left without a word."""
    total = len(index.records) + len(index.rejected)
    if index.records and len(index.rejected) > max_rejected_fraction * total:
        fix = (
            "Fix or remove the rejected files (or point data.source.path at the right videos), or allow more "
            "with data.max_rejected_fraction."
        )
        problem = (
            f"{len(index.rejected)} of {total} video files ({len(index.rejected) / total:.0%}) are unusable, "
            f"more than data.max_rejected_fraction ({max_rejected_fraction:g}). {fix}\n{format_report(index)}"
        )
        raise ConfigError([ConfigProblem(where, problem)], source=str(index.root))
    if index.records:
        return
    what = (
        f"none of the {len(index.rejected)} video file(s) is usable"
        if index.rejected
        else f"no video files ({', '.join(sorted(VIDEO_EXTENSIONS))}) found"
    )
    fix = "Fix or replace the rejected files, lower num_frames/stride, or point it at other videos."
    problems = [ConfigProblem(where, f"{what}. {fix}\n{format_report(index)}")]
    problems += [ConfigProblem(str(path), reason) for path, reason in index.rejected]
    raise ConfigError(problems, source=str(index.root))
