"""Where a tts_lm run's rows come from (a file, the encoded-audio cache, the built-in set), the split
into train and eval, and the rows -> sequences step with every bad row reported at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.data.table_rows import TableReadError, columns_problems, read_rows, table_format
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.base import resolve_device
from framer_ds.tasks.tts_lm.audio_encoding import encode_rows, encoded_dir_for, is_encoded, read_encoded
from framer_ds.tasks.tts_lm.model_setup import TtsAssets
from framer_ds.tasks.tts_lm.sequences import BuiltSequences, SequenceBuilder, build_all
from framer_ds.tasks.tts_lm.snac_codec import load_codec
from framer_ds.tasks.tts_lm.tiny import tiny_root
from framer_ds.tasks.tts_lm.token_sequences import TokenSequence

SHOWN_PROBLEMS = 10


@dataclass
class BuiltData:
    train: list[TokenSequence]
    eval: list[TokenSequence]
    text_mix: list[TokenSequence]
    notes: dict[str, Any] = field(default_factory=dict)


class TtsData:
    def __init__(self, config, assets: TtsAssets):
        self.config = config
        self.data = config.data
        self.assets = assets

    # --- files ---------------------------------------------------------------------------------------

    def train_path(self) -> Path:
        source = self.data.source
        return tiny_root() / "data" / "train.jsonl" if source.builtin else Path(source.path)

    def eval_path(self) -> Path | None:
        return tiny_root() / "data" / "eval.jsonl" if self.data.source.builtin else self.data.eval

    def file_problems(self) -> list[ConfigProblem]:
        problems = []
        named = [("data.source.path", self.data.source.path), ("data.eval", self.data.eval)]
        if self.data.text_mix is not None:
            named.append(("data.text_mix.path", self.data.text_mix.path))
        for key, path in named:
            if path is None:
                continue
            try:
                table_format(path)
            except TableReadError as exc:
                problems.append(ConfigProblem(key, str(exc)))
        if self.data.format == "audio" and not self.data.source.builtin:
            if self.assets.codec_dir is None:
                problems.append(
                    ConfigProblem(
                        "model.codec.path", "data.format 'audio' is encoded with SNAC: set this key"
                    )
                )
            train = self.data.source.path
            if train is not None and table_format_or_none(train) == "save_to_disk":
                problems.append(
                    ConfigProblem(
                        "data.source.path", "format 'audio' reads a .jsonl/.parquet manifest of paths"
                    )
                )
        return problems

    # --- audio -> codes ------------------------------------------------------------------------------

    def _encoded_dir(self, manifest: Path) -> Path:
        codec = self.assets.require_codec("data.format 'audio'")
        root = self.data.encoded_dir or default_cache_dir() / "tts_codes"
        return encoded_dir_for(manifest, codec, root)

    def encode_audio_if_needed(self, show_progress: bool, required: bool = False) -> str:
        """Encode the audio manifests not yet in the cache; what was done, for the command line."""
        if self.data.format != "audio":
            if required:
                raise ConfigError(
                    [ConfigProblem("data.format", f"is {self.data.format!r}; encode-audio needs 'audio'")]
                )
            return "nothing to encode"
        lines = []
        codec = None
        for manifest in filter(None, [self.train_path(), self.eval_path()]):
            out = self._encoded_dir(manifest)
            if not is_encoded(out):
                if codec is None:
                    codec = load_codec(self.assets.codec_dir, resolve_device(self.config.model.codec.device))
                rows = read_rows(manifest)
                encode_rows(
                    rows,
                    manifest.parent,
                    out,
                    codec,
                    {
                        "text": self.data.text_column,
                        "audio": self.data.audio_column,
                        "speaker": self.data.speaker_column,
                    },
                    self.data.encode_batch_size,
                    show_progress,
                )
            encoded = read_encoded(out)
            lines.append(
                f"{manifest}: {len(encoded.rows)} encoded, {len(encoded.failures)} failed -> {out}"
                + "".join(f"\n  {failure}" for failure in encoded.failures[:SHOWN_PROBLEMS])
            )
        return "\n".join(lines)

    def _rows(self, path: Path) -> tuple[list[dict], list[str]]:
        """Rows of `path` in the form its format's builder reads; audio manifests via their encoding."""
        if self.data.format != "audio":
            return read_rows(path), []
        out = self._encoded_dir(path)
        if not is_encoded(out):
            raise ConfigError(
                [
                    ConfigProblem(
                        "data.source.path",
                        f"{path} is not encoded yet: run `framer-ds data encode-audio CONFIG`",
                    )
                ]
            )
        encoded = read_encoded(out)
        return encoded.rows, encoded.failures

    # --- rows -> sequences ---------------------------------------------------------------------------

    def builder(self) -> SequenceBuilder:
        assets = self.assets
        return SequenceBuilder(
            assets.tokenizer, assets.special, assets.layout, self.data, len(assets.tokenizer)
        )

    def _sequences(self, path: Path, text_mix: bool = False) -> tuple[BuiltSequences, list[str]]:
        try:
            rows, failures = self._rows(path)
        except TableReadError as exc:
            raise ConfigError([ConfigProblem(str(path), str(exc))], "data") from None
        builder = self.builder()
        if text_mix:
            return build_all(rows, builder.text_only, path), failures
        needed = {
            "tokens": ["input_ids"],
            "codes": [self.data.text_column, self.data.codes_column],
            "audio": ["text", "codes"],
        }[self.data.format]
        missing = columns_problems(rows, needed, path, "data.text_column / data.codes_column")
        if missing:
            raise ConfigError([ConfigProblem("data", m) for m in missing], "data")
        build = builder.from_tokens if self.data.format == "tokens" else builder.from_codes
        return build_all(rows, build, path), failures

    def build_sequences(self) -> BuiltData:
        notes: dict[str, Any] = {}
        problems: list[str] = []
        train, failures = self._sequences(self.train_path())
        problems += train.problems + failures
        eval_path = self.eval_path()
        if eval_path is not None:
            evaluation, eval_failures = self._sequences(eval_path)
            problems += evaluation.problems + eval_failures
            eval_sequences = evaluation.sequences
            notes["validation"] = str(eval_path)
        else:
            train.sequences, eval_sequences = self._split(train.sequences)
            notes["validation"] = (
                f"{self.data.val_fraction:.0%} of data.source.path (seed {self.config.train.seed})"
            )
        mix: list[TokenSequence] = []
        if self.data.text_mix is not None:
            built, _ = self._sequences(self.data.text_mix.path, text_mix=True)
            problems += built.problems
            mix = built.sequences
        if problems:
            self._report_bad_rows(problems, notes)
        if not train.sequences:
            raise ConfigError(
                [ConfigProblem("data.source.path", "no usable rows left: see the problems above")], "data"
            )
        return BuiltData(train.sequences, eval_sequences, mix, notes)

    def _report_bad_rows(self, problems: list[str], notes: dict[str, Any]) -> None:
        shown = problems[:SHOWN_PROBLEMS]
        more = len(problems) - len(shown)
        if self.data.bad_samples == "error":
            listed = [ConfigProblem("data", p) for p in shown]
            if more:
                listed.append(ConfigProblem("data", f"... and {more} more bad rows"))
            listed.append(
                ConfigProblem("data.bad_samples", "fix the rows above, or set 'skip' to train without them")
            )
            raise ConfigError(listed, "data")
        notes["skipped rows"] = len(problems)
        notes["skipped (first)"] = " | ".join(shown[:3])

    def _split(self, sequences: list[TokenSequence]) -> tuple[list[TokenSequence], list[TokenSequence]]:
        count = round(len(sequences) * self.data.val_fraction)
        if count == 0:
            return sequences, []
        order = np.random.default_rng(self.config.train.seed).permutation(len(sequences))
        held = set(order[:count].tolist())
        return (
            [s for i, s in enumerate(sequences) if i not in held],
            [s for i, s in enumerate(sequences) if i in held],
        )


def table_format_or_none(path: Path) -> str | None:
    try:
        return table_format(path)
    except TableReadError:
        return None
