"""Speech corpora as they are published -> one list of (audio, text, speaker) items to encode.

`data.layout` names how the files lie:
- `jsonl`: a manifest (.jsonl, .jsonl.gz or .parquet), one row per clip: an audio path relative to the
  manifest (`data.audio_column`), the text and optionally a speaker;
- `ljspeech`: LJSpeech's folder, `metadata.csv` lines `id|text|normalized` (no header, no quoting:
  transcripts hold quotes) and `wavs/<id>.wav`; the normalized text is used when there is one;
- `folder`: `a.wav` (or .flac) next to `a.txt` holding its transcript, anywhere under the folder; a clip
  in a subfolder is spoken by the speaker named like the subfolder's top level (VCTK's `p225/...`);
- `hf`: a `datasets.save_to_disk` directory with an `Audio` column; its bytes are read with soundfile
  (the column is cast to `decode=False`, so no torchcodec or ffmpeg is needed).

Why one module: every layout ends in the same items, so the encoder, its cache key and its report
cannot differ by layout; a layout that is missing or empty is one line for `framer-ds validate`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framer_ds.compat import require
from framer_ds.data.table_rows import TableReadError, read_rows, table_format

AUDIO_SUFFIXES = (".wav", ".flac")


class LayoutError(ValueError):
    """A layout that is missing or empty; the message names what is missing and the fix."""


@dataclass(frozen=True)
class AudioItem:
    """One clip to encode: a file (`path`) or bytes held in a data set (`data`), or the reason there is
    none (`error`), reported with the other unreadable files instead of stopping the encode."""

    key: str  # what a report names: the file, or "<dir> row N"
    text: str | None
    speaker: str | None = None
    path: Path | None = None
    data: bytes | None = None
    error: str | None = None

    @property
    def name(self) -> str:
        """What a report calls the clip: the row and its file (`manifest.jsonl row 3: clips/a.wav`)."""
        return self.key if self.path is None or str(self.path) == self.key else f"{self.key}: {self.path}"

    def fingerprint(self) -> list[Any]:
        """What the cache key holds for this clip: its text, speaker and the file's size and time (or
        a hash of its bytes), so an edited transcript or a replaced file is encoded anew."""
        if self.data is not None:
            audio: Any = hashlib.sha256(self.data).hexdigest()
        elif self.path is not None and self.path.is_file():
            stat = self.path.stat()
            audio = [str(self.path), stat.st_size, stat.st_mtime_ns]
        else:
            audio = str(self.path)
        return [self.key, self.text, self.speaker, audio, self.error]


def layout_items(layout: str, path: Path, columns: dict[str, str | None]) -> list[AudioItem]:
    """The clips of `path` laid out as `layout`; LayoutError when there is no such layout there or it
    holds no clip. `columns`: the data config's text / audio / speaker column names."""
    path = Path(path)
    readers = {"jsonl": _manifest, "ljspeech": _ljspeech, "folder": _folder, "hf": _hf}
    items = readers[layout](path, columns)
    if not items:
        raise LayoutError(f"{path}: no clips found in this {layout!r} layout; {_LAYOUT_HINTS[layout]}")
    return items


def layout_problem(layout: str, path: Path, columns: dict[str, str | None]) -> str | None:
    """One line when `path` is not a usable `layout` (for `framer-ds validate`), else None."""
    try:
        layout_items(layout, path, columns)
    except LayoutError as exc:
        return str(exc)
    return None


def items_digest(layout: str, items: list[AudioItem]) -> str:
    digest = hashlib.sha256(layout.encode())
    for item in items:
        digest.update(json.dumps(item.fingerprint()).encode())
    return digest.hexdigest()


_LAYOUT_HINTS = {
    "jsonl": "point data.source.path at a .jsonl(.gz) / .parquet manifest of audio paths and texts",
    "ljspeech": "point data.source.path at the folder holding metadata.csv (`id|text|normalized`) and wavs/",
    "folder": "point data.source.path at a folder of a.wav + a.txt pairs",
    "hf": "point data.source.path at a datasets.save_to_disk directory with an Audio column",
}


def _missing(path: Path, layout: str, what: str) -> LayoutError:
    return LayoutError(f"{path}: {what}; data.layout {layout!r} expects it: {_LAYOUT_HINTS[layout]}")


def _manifest(path: Path, columns: dict[str, str | None]) -> list[AudioItem]:
    try:
        kind = table_format(path)
        if kind == "save_to_disk":
            raise LayoutError(f"{path} is a datasets.save_to_disk directory: set data.layout 'hf'")
        rows = read_rows(path)
    except TableReadError as exc:
        raise LayoutError(f"{exc}; {_LAYOUT_HINTS['jsonl']}") from None
    items = []
    for index, row in enumerate(rows):
        key, relative = f"{path} row {index}", row.get(columns["audio"])
        speaker = row.get(columns["speaker"]) if columns["speaker"] else None
        if not isinstance(relative, str):
            error = f"{key}: no audio path in column {columns['audio']!r}; set data.audio_column"
            items.append(AudioItem(key, row.get(columns["text"]), speaker, error=error))
            continue
        audio = Path(relative) if Path(relative).is_absolute() else path.parent / relative
        items.append(AudioItem(key, row.get(columns["text"]), speaker, path=audio))
    return items


def _ljspeech(path: Path, columns: dict[str, str | None]) -> list[AudioItem]:
    metadata = path / "metadata.csv"
    if not metadata.is_file():
        raise _missing(path, "ljspeech", "no metadata.csv")
    if not (path / "wavs").is_dir():
        raise _missing(path, "ljspeech", "no wavs/ folder")
    items = []
    for number, line in enumerate(metadata.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("|")
        key = f"{metadata}:{number}"
        if len(parts) < 2 or not parts[0].strip():
            items.append(AudioItem(key, None, error=f"{key}: expected `id|text|normalized`, found {line!r}"))
            continue
        text = parts[2] if len(parts) > 2 and parts[2].strip() else parts[1]
        audio = path / "wavs" / f"{parts[0].strip()}.wav"
        items.append(AudioItem(str(audio), text.strip(), path=audio))
    return items


def _folder(path: Path, columns: dict[str, str | None]) -> list[AudioItem]:
    if not path.is_dir():
        raise _missing(path, "folder", "not a folder")
    items = []
    for audio in sorted(p for p in path.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file()):
        relative = audio.relative_to(path)
        speaker = relative.parts[0] if len(relative.parts) > 1 else None
        transcript = audio.with_suffix(".txt")
        if not transcript.is_file():
            error = f"{audio}: no transcript {transcript.name} next to it; add it or remove the clip"
            items.append(AudioItem(str(audio), None, speaker, error=error))
            continue
        items.append(
            AudioItem(str(audio), transcript.read_text(encoding="utf-8").strip(), speaker, path=audio)
        )
    return items


def _hf(path: Path, columns: dict[str, str | None]) -> list[AudioItem]:
    datasets = require("datasets", "reading a save_to_disk directory (data.layout hf)")
    try:
        if table_format(path) != "save_to_disk":
            raise _missing(path, "hf", "not a datasets.save_to_disk directory")
        dataset = datasets.load_from_disk(str(path))
    except (TableReadError, FileNotFoundError, ValueError) as exc:
        raise LayoutError(f"{exc}; {_LAYOUT_HINTS['hf']}") from None
    if isinstance(dataset, datasets.DatasetDict):
        if "train" not in dataset:
            raise LayoutError(f"{path} holds splits {list(dataset)}; point at one split's directory")
        dataset = dataset["train"]
    column = columns["audio"]
    if not isinstance(dataset.features.get(column), datasets.Audio):
        audio_columns = [name for name, f in dataset.features.items() if isinstance(f, datasets.Audio)]
        raise LayoutError(
            f"{path}: column {column!r} is not an Audio column (Audio columns: {audio_columns or 'none'}); "
            "set data.audio_column"
        )
    dataset = dataset.cast_column(column, datasets.Audio(decode=False))  # bytes, read with soundfile
    items = []
    for index, row in enumerate(dataset):
        audio, key = row[column] or {}, f"{path} row {index}"
        speaker = row.get(columns["speaker"]) if columns["speaker"] else None
        text = row.get(columns["text"])
        if audio.get("bytes"):
            items.append(AudioItem(key, text, speaker, data=audio["bytes"]))
        elif audio.get("path"):
            items.append(AudioItem(key, text, speaker, path=Path(audio["path"])))
        else:
            items.append(AudioItem(key, text, speaker, error=f"{key}: the Audio column holds no audio"))
    return items
