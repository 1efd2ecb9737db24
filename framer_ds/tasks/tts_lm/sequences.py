"""Rows -> training sequences, for each way TTS data comes in (finished token ids, text + SNAC codes,
text-only rows for the mix). Every row goes through `token_sequences.build_sequence`, so the layout is
the same whatever the source; a malformed row is a problem naming the file, the row and the fix."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framer_ds.tasks.tts_lm.audio_tokens import (
    AudioCodeError,
    AudioTokenLayout,
    check_codes,
    interleave,
    remove_duplicate_frames,
)
from framer_ds.tasks.tts_lm.config import TtsDataConfig
from framer_ds.tasks.tts_lm.token_sequences import IGNORE_INDEX, SpecialTokens, TokenSequence, build_sequence


class BadSample(ValueError):
    """One row that cannot become a sequence; the message names it and the fix."""


@dataclass
class SequenceBuilder:
    """What turns a row into a sequence: the tokenizer, the layout and the data options."""

    tokenizer: Any
    special: SpecialTokens
    layout: AudioTokenLayout
    data: TtsDataConfig
    vocab_size: int

    def text_ids(self, text: str, speaker: str | None = None) -> list[int]:
        """The text's ids after the BOS; a speaker becomes Orpheus' prompt prefix "{speaker}: {text}"
        (canopyai/Orpheus-TTS orpheus_tts/engine_class.py `_format_prompt`, README "finetune-prod")."""
        if speaker:
            text = f"{speaker}: {text}"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return ([self.special.start_of_text] if self.special.start_of_text is not None else []) + ids

    def _text(self, row: dict[str, Any], where: str) -> str:
        text = row.get(self.data.text_column)
        if not isinstance(text, str) or not text.strip():
            raise BadSample(f"{where}: no text in column {self.data.text_column!r}; fill it or drop the row")
        return text

    def from_codes(self, row: dict[str, Any], where: str) -> TokenSequence:
        codes = row_codes(row, self.data.codes_column)
        if not isinstance(codes, list | tuple):
            raise BadSample(
                f"{where}: column {self.data.codes_column!r} must hold three SNAC code lists, found "
                f"{type(codes).__name__}; set data.codes_column"
            )
        try:
            if self.data.remove_duplicate_frames:
                check_codes(codes, self.layout.codebook_size, where)  # before trimming
                codes = remove_duplicate_frames(codes)
            audio = interleave(codes, self.layout, where)
        except AudioCodeError as exc:
            raise BadSample(str(exc)) from None
        speaker = row.get(self.data.speaker_column) if self.data.speaker_prefix else None
        text_ids = self.text_ids(self._text(row, where), speaker)
        return build_sequence(text_ids, audio, self.special, self.data.loss_on)

    def from_tokens(self, row: dict[str, Any], where: str, speech: bool = True) -> TokenSequence:
        ids = row.get("input_ids")
        if not isinstance(ids, list | tuple) or not ids:
            raise BadSample(f"{where}: no `input_ids` list; format 'tokens' rows hold finished token ids")
        bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise BadSample(
                f"{where}: token id {bad} is outside the vocabulary 0..{self.vocab_size - 1}; were the ids "
                "made with another tokenizer or layout (model.special_tokens)?"
            )
        labels = row.get("labels")
        labels = list(labels) if labels is not None else list(ids)
        if len(labels) != len(ids):
            raise BadSample(f"{where}: {len(labels)} labels for {len(ids)} input_ids; they must match")
        if speech:
            if self.special.start_of_speech not in ids:
                raise BadSample(
                    f"{where}: no audio (no start_of_speech id {self.special.start_of_speech}); drop the "
                    "row, or put text-only rows under data.text_mix"
                )
            if self.data.loss_on == "audio" and row.get("labels") is None:
                first = list(ids).index(self.special.start_of_speech) + 1
                labels = [IGNORE_INDEX] * first + labels[first:]
        return TokenSequence(list(ids), labels)

    def text_only(self, row: dict[str, Any], where: str) -> TokenSequence:
        """A text-mix row: its own ids, or its text between start_of_text and end_of_text; all learned."""
        if "input_ids" in row:
            return self.from_tokens(row, where, speech=False)
        ids = [*self.text_ids(self._text(row, where)), self.special.end_of_text]
        return TokenSequence(ids, list(ids))


def split_code_columns(name: str) -> list[str]:
    """`codes_0`, `codes_1`, `codes_2`: the codebooks in a column each, as some corpora store them."""
    return [f"{name}_{book}" for book in range(3)]


def row_codes(row: dict[str, Any], name: str) -> Any:
    """The three code lists of a row: its `name` column, or its split `name_0/1/2` columns."""
    if name not in row and all(column in row for column in split_code_columns(name)):
        return [row[column] for column in split_code_columns(name)]
    return row.get(name)


def code_columns(first_row: dict[str, Any], name: str) -> list[str]:
    """The code columns a data set must have, judged on its first row (split ones when it has them)."""
    split = split_code_columns(name)
    return split if name not in first_row and all(c in first_row for c in split) else [name]


@dataclass
class BuiltSequences:
    sequences: list[TokenSequence]
    rows: list[int]  # the row each sequence came from
    problems: list[str] = field(default_factory=list)


def build_all(
    rows: Sequence[dict[str, Any]], build: Callable[[dict, str], TokenSequence], path: Path
) -> BuiltSequences:
    """Every row through `build`; the problems of the bad ones are collected, not raised one by one."""
    built = BuiltSequences([], [])
    for index, row in enumerate(rows):
        try:
            built.sequences.append(build(row, f"{path} row {index}"))
            built.rows.append(index)
        except BadSample as exc:
            built.problems.append(str(exc))
    return built
