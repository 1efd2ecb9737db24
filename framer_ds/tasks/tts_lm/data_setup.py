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
from framer_ds.tasks.tts_lm.audio_encoding import encode_items, encoded_dir_for, is_encoded, read_encoded
from framer_ds.tasks.tts_lm.audio_layouts import AudioItem, LayoutError, layout_items, layout_problem
from framer_ds.tasks.tts_lm.model_setup import TtsAssets
from framer_ds.tasks.tts_lm.sequences import BuiltSequences, SequenceBuilder, build_all, code_columns
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
        # The speakers the model learns a "{speaker}: " prefix for (none without data.speaker_prefix),
        # known once the sequences are built; the export records them for `sample --speaker`.
        self.speakers: list[str] | None = None

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
        layouts = self.data.format == "audio" and not self.data.source.builtin
        for key, path in named:
            if path is None:
                continue
            if layouts and key != "data.text_mix.path":
                problem = layout_problem(self.data.layout, path, self._columns())
                if problem:
                    problems.append(ConfigProblem(key, problem))
                continue
            try:
                table_format(path)
            except TableReadError as exc:
                problems.append(ConfigProblem(key, str(exc)))
        if layouts and self.assets.codec_dir is None:
            problems.append(
                ConfigProblem("model.codec.path", "data.format 'audio' is encoded with SNAC: set this key")
            )
        return problems or self.speaker_problems()

    # --- audio -> codes ------------------------------------------------------------------------------

    def _columns(self) -> dict[str, str | None]:
        data = self.data
        return {"text": data.text_column, "audio": data.audio_column, "speaker": data.speaker_column}

    def _items(self, path: Path, key: str) -> list[AudioItem]:
        try:
            return layout_items(self.data.layout, path, self._columns())
        except LayoutError as exc:
            raise ConfigError([ConfigProblem(key, str(exc))], "data") from None

    def _encoded_dir(self, items: list[AudioItem]) -> Path:
        codec = self.assets.require_codec("data.format 'audio'")
        root = self.data.encoded_dir or default_cache_dir() / "tts_codes"
        return encoded_dir_for(self.data.layout, items, codec, root)

    def _audio_sets(self) -> list[tuple[Path, str]]:
        return [(self.train_path(), "data.source.path")] + (
            [(self.eval_path(), "data.eval")] if self.eval_path() is not None else []
        )

    def encode_audio_if_needed(self, show_progress: bool, required: bool = False) -> str:
        """Encode the clips not yet in the cache; what was done, for the command line."""
        if self.data.format != "audio":
            if required:
                raise ConfigError(
                    [ConfigProblem("data.format", f"is {self.data.format!r}; encode-audio needs 'audio'")]
                )
            return "nothing to encode"
        lines = []
        codec = None
        for path, key in self._audio_sets():
            items = self._items(path, key)
            out = self._encoded_dir(items)
            if is_encoded(out):
                encoded = read_encoded(out)
            else:
                if codec is None:
                    codec = load_codec(self.assets.codec_dir, resolve_device(self.config.model.codec.device))
                encoded = encode_items(items, out, codec, self.data.encode_batch_size, show_progress)
            lines.append(
                f"{path}: {len(encoded.rows)} encoded ({encoded.fresh} this run), {len(encoded.failures)} "
                f"failed -> {out}"
                + "".join(f"\n  {failure}" for failure in encoded.failures[:SHOWN_PROBLEMS])
            )
        return "\n".join(lines)

    def _rows(self, path: Path) -> tuple[list[dict], list[str]]:
        """Rows of `path` in the form its format's builder reads; audio clips via their encoding."""
        if self.data.format != "audio":
            return read_rows(path), []
        key = "data.eval" if path == self.eval_path() and path != self.train_path() else "data.source.path"
        out = self._encoded_dir(self._items(path, key))
        if not is_encoded(out):
            raise ConfigError(
                [ConfigProblem(key, f"{path} is not encoded yet: run `framer-ds data encode-audio CONFIG`")]
            )
        encoded = read_encoded(out)
        return encoded.rows, encoded.failures

    # --- rows -> sequences ---------------------------------------------------------------------------

    def builder(self) -> SequenceBuilder:
        assets, data = self.assets, self.data
        if data.format == "audio":  # the encoded rows name their columns as the encoder writes them
            names = {"text_column": "text", "codes_column": "codes", "speaker_column": "speaker"}
            data = data.model_copy(update=names)
        return SequenceBuilder(assets.tokenizer, assets.special, assets.layout, data, len(assets.tokenizer))

    def _sequences(self, path: Path, text_mix: bool = False) -> tuple[BuiltSequences, list[str]]:
        try:
            rows, failures = self._rows(path)
        except TableReadError as exc:
            raise ConfigError([ConfigProblem(str(path), str(exc))], "data") from None
        builder = self.builder()
        if text_mix:
            return build_all(rows, builder.text_only, path), failures
        if self.data.format == "tokens":
            needed = ["input_ids"]
        else:  # format audio reads its encoded rows, which the encoder names like this
            needed = [
                builder.data.text_column,
                *code_columns(rows[0] if rows else {}, builder.data.codes_column),
            ]
        missing = columns_problems(rows, needed, path, "data.text_column / data.codes_column")
        if missing:
            raise ConfigError([ConfigProblem("data", m) for m in missing], "data")
        if self.data.speaker_prefix:
            column = builder.data.speaker_column
            known = {str(row[column]) for row in rows if row.get(column)}
            self.speakers = sorted(known.union(self.speakers or []))
        build = builder.from_tokens if self.data.format == "tokens" else builder.from_codes
        return build_all(rows, build, path), failures

    def build_sequences(self) -> BuiltData:
        notes: dict[str, Any] = {}
        problems: list[str] = []
        self.speakers = None if self.data.speaker_prefix else []
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

    def speaker_problems(self) -> list[ConfigProblem]:
        """data.speaker_prefix whose training rows name no speaker would do nothing (and `sample
        --speaker` would then call the model one trained without it). Refused where `check` runs
        (validate, train, data commands), not when an existing export is evaluated or sampled. Only a
        prefix the user set: the layout's default prefixes the speakers the data names, if any."""
        if not (self.data.speaker_prefix and self.data.speaker_prefix_chosen) or self.data.source.builtin:
            return []
        path, audio = self.train_path(), self.data.format == "audio"
        if audio and self.data.layout == "ljspeech":
            fix = "an 'ljspeech' layout names no speakers (one voice): set data.speaker_prefix false"
            return [ConfigProblem("data.speaker_prefix", fix)]
        try:
            if audio:
                named = any(item.speaker for item in layout_items(self.data.layout, path, self._columns()))
            else:
                named = any(row.get(self.data.speaker_column) for row in read_rows(path))
        except (LayoutError, TableReadError):  # file_problems names those
            return []
        if named:
            return []
        if audio and self.data.layout == "folder":
            fix = (
                f"no clip of {path} lies in a speaker subfolder: put each voice's clips in a subfolder "
                "named after it, or set data.speaker_prefix false"
            )
        else:
            fix = (
                f"no row of {path} names a speaker in column {self.data.speaker_column!r}: set "
                "data.speaker_column to the column that does, or set data.speaker_prefix false"
            )
        return [ConfigProblem("data.speaker_prefix", fix)]

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
