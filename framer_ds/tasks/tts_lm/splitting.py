"""`data.length_policy: split`: an utterance longer than max_seq_length becomes several training pieces
cut at SNAC frame boundaries (7 tokens), each the text prompt followed by a stretch of the audio, instead
of being dropped (44% of the tokens at 2048 in the issue 37 comparison) or cut (losing the end of speech).

Why this shape (the Orpheus data recipes' "text prompt + audio continuation"): a piece must still say
what is being spoken, so every piece repeats the prompt; a continuation piece also carries the frames just
before its own as context, so the model continues speech it hears rather than starting cold. Every audio
token is learned exactly once: the first piece learns its prompt (as `loss_on` says) and its frames; a
continuation piece learns only its new frames (its prompt and context frames are labelled IGNORE); the
last piece ends with the end-of-speech markers as the whole utterance did. So the split data holds the
same labelled tokens as the utterance: 0 dropped (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

from framer_ds.tasks.tts_lm.audio_tokens import SLOTS_PER_FRAME
from framer_ds.tasks.tts_lm.token_sequences import IGNORE_INDEX, TokenSequence

CONTEXT_SHARE = 4  # a continuation piece spends 1/4 of its frames on context from the piece before


@dataclass(frozen=True)
class SpeechParts:
    """Where an utterance's audio sits: input_ids[:audio_start] is the prompt (up to start_of_speech),
    [audio_start:audio_end] the frames, [audio_end:] the end markers."""

    audio_start: int
    audio_end: int


def speech_parts(sequence: TokenSequence, start_of_speech: int, end_of_speech: int) -> SpeechParts | None:
    """The utterance's layout, or None when it is not one (a text-mix row, a malformed audio run)."""
    ids = sequence.input_ids
    try:
        start = ids.index(start_of_speech) + 1
        end = ids.index(end_of_speech, start)
    except ValueError:
        return None
    if (end - start) % SLOTS_PER_FRAME:
        return None
    return SpeechParts(start, end)


def split_sequence(
    sequence: TokenSequence, max_len: int, start_of_speech: int, end_of_speech: int
) -> list[TokenSequence] | None:
    """`sequence` as pieces of at most max_len tokens, or None when it cannot be split (not speech, or a
    prompt too long to leave room for two frames and the end markers)."""
    parts = speech_parts(sequence, start_of_speech, end_of_speech)
    if parts is None:
        return None
    prompt_ids = sequence.input_ids[: parts.audio_start]
    tail = len(sequence) - parts.audio_end  # end_of_speech, end_of_ai
    frames_per_piece = (max_len - len(prompt_ids) - tail) // SLOTS_PER_FRAME
    context = frames_per_piece // CONTEXT_SHARE
    if frames_per_piece - context < 1:
        return None
    frames = (parts.audio_end - parts.audio_start) // SLOTS_PER_FRAME
    pieces: list[TokenSequence] = []
    first = 0  # the first frame this piece learns
    while first < frames:
        begin = 0 if first == 0 else first - context  # context frames before it, if a continuation
        last = min(begin + frames_per_piece, frames)
        span = slice(parts.audio_start + begin * SLOTS_PER_FRAME, parts.audio_start + last * SLOTS_PER_FRAME)
        ids = prompt_ids + sequence.input_ids[span]
        labels = sequence.labels[span]
        learned_from = (first - begin) * SLOTS_PER_FRAME
        labels = [IGNORE_INDEX] * learned_from + labels[learned_from:]
        head = sequence.labels[: parts.audio_start] if first == 0 else [IGNORE_INDEX] * len(prompt_ids)
        labels = head + labels
        if last == frames:
            ids = ids + sequence.input_ids[parts.audio_end :]
            labels = labels + sequence.labels[parts.audio_end :]
        pieces.append(TokenSequence(ids, labels))
        first = last
    return pieces
