"""SNAC codes <-> language-model tokens, the VyvoTTS / Orpheus layout (docs/architecture.md, "TTS
tokens").

SNAC (24 kHz) has three codebooks at 1x, 2x and 4x the frame rate. One frame of the LM sequence is 7
tokens, interleaved as c0[i], c1[2i], c2[4i], c2[4i+1], c1[2i+1], c2[4i+2], c2[4i+3], and slot k is
shifted by `audio_start + k * codebook_size` so each slot has its own id range. The round trip is
lossless; a generation that breaks the layout (a token outside its slot's range, a partial frame, a
non-audio token inside the speech) is reported with its position, never silently decoded into noise;
`deinterleave` handles each case as Orpheus's own decoder does or says why not
(tests/tasks/tts_lm/test_orpheus_parity.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SLOTS_PER_FRAME = 7
# (codebook, index within the frame's run of that codebook) for each of the 7 slots.
SLOT_SOURCES: tuple[tuple[int, int], ...] = ((0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (2, 2), (2, 3))
CODES_PER_FRAME = (1, 2, 4)  # codebook 0, 1, 2


class AudioCodeError(ValueError):
    """Codes or tokens that do not fit the layout; the message names the sample and the fix."""


@dataclass(frozen=True)
class AudioTokenLayout:
    audio_start: int
    codebook_size: int = 4096

    @property
    def audio_end(self) -> int:
        """One past the last audio token id: the block is [audio_start, audio_end)."""
        return self.audio_start + SLOTS_PER_FRAME * self.codebook_size

    def slot_range(self, slot: int) -> range:
        first = self.audio_start + slot * self.codebook_size
        return range(first, first + self.codebook_size)

    def is_audio(self, token: int) -> bool:
        return self.audio_start <= token < self.audio_end


def check_codes(codes: Sequence[Sequence[int]], codebook_size: int, sample: str = "sample") -> int:
    """The number of frames of three SNAC code lists, or AudioCodeError naming what is wrong."""
    if len(codes) != 3:
        raise AudioCodeError(f"{sample}: {len(codes)} code lists; SNAC 24 kHz gives 3 (one per codebook)")
    frames = len(codes[0])
    if frames == 0:
        raise AudioCodeError(f"{sample}: no audio (empty code lists); drop the sample or re-encode its audio")
    for book, per_frame in enumerate(CODES_PER_FRAME):
        if len(codes[book]) != frames * per_frame:
            raise AudioCodeError(
                f"{sample}: code lists of unequal length ({[len(c) for c in codes]}); codebook {book} must "
                f"hold {per_frame} x {frames} codes for {frames} frames. Re-encode the audio with SNAC 24 kHz"
            )
        bad = next((c for c in codes[book] if not 0 <= c < codebook_size), None)
        if bad is not None:
            raise AudioCodeError(
                f"{sample}: codebook {book} holds code {bad}, outside 0..{codebook_size - 1}; is it a SNAC "
                f"24 kHz encoding (codebook size {codebook_size})?"
            )
    return frames


def remove_duplicate_frames(codes: Sequence[Sequence[int]]) -> list[list[int]]:
    """Drops a frame whose coarsest code repeats the previous frame's (the recipe's silence trimming):
    long stretches of the same coarse code are silence or hum that the LM would learn to loop on."""
    keep = [i for i in range(len(codes[0])) if i == 0 or codes[0][i] != codes[0][i - 1]]
    return [
        [codes[book][i * n + j] for i in keep for j in range(n)] for book, n in enumerate(CODES_PER_FRAME)
    ]


def interleave(codes: Sequence[Sequence[int]], layout: AudioTokenLayout, sample: str = "sample") -> list[int]:
    """Three SNAC code lists -> 7 LM tokens per frame, each slot in its own id range."""
    frames = check_codes(codes, layout.codebook_size, sample)
    tokens: list[int] = []
    for frame in range(frames):
        for slot, (book, offset) in enumerate(SLOT_SOURCES):
            code = codes[book][frame * CODES_PER_FRAME[book] + offset]
            tokens.append(layout.audio_start + slot * layout.codebook_size + code)
    return tokens


@dataclass
class Deinterleaved:
    codes: list[list[int]]  # the three code lists of the frames that were complete and well-formed
    problems: list[str]  # what was wrong with the rest (empty for a clean sequence)


def deinterleave(tokens: Sequence[int], layout: AudioTokenLayout) -> Deinterleaved:
    """LM tokens -> three SNAC code lists, each fault reported with its position so a malformed
    generation is decoded up to it, never crashed on or decoded into noise.

    A token that is not audio (a text token or a marker inside the speech) is skipped and the next audio
    token takes its slot, as Orpheus's decoder does: a stray inserted between codes costs nothing, and a
    stray that replaced a code is still caught, since the codes after it then land in the wrong slot's
    range. Decoding stops at the first frame holding a token of another slot's range (Orpheus refuses
    every window holding it), and a trailing partial frame is dropped (as Orpheus does)."""
    codes: list[list[int]] = [[], [], []]
    problems: list[str] = []
    audio = [i for i, token in enumerate(tokens) if layout.is_audio(token)]
    if len(audio) != len(tokens):
        first = next(i for i, token in enumerate(tokens) if not layout.is_audio(token))
        problems.append(
            f"{len(tokens) - len(audio)} token(s) that are not audio skipped (the first, {tokens[first]}, at "
            f"token {first}); the next audio token took each one's slot"
        )
    usable = len(audio) - len(audio) % SLOTS_PER_FRAME
    for start in range(0, usable, SLOTS_PER_FRAME):
        frame = [tokens[i] for i in audio[start : start + SLOTS_PER_FRAME]]
        wrong = next(
            (slot for slot, token in enumerate(frame) if token not in layout.slot_range(slot)),
            None,
        )
        if wrong is not None:
            token, kept = frame[wrong], start // SLOTS_PER_FRAME
            in_slot = (token - layout.audio_start) // layout.codebook_size
            problems.append(
                f"token {audio[start + wrong]} (frame {kept}, slot {wrong}) is {token}: in slot {in_slot}'s "
                f"range; kept the {kept} frames before it"
            )
            return Deinterleaved(codes, problems)
        for slot, (book, _) in enumerate(SLOT_SOURCES):
            codes[book].append(frame[slot] - layout.audio_start - slot * layout.codebook_size)
    if usable != len(audio):
        problems.append(
            f"{len(audio) % SLOTS_PER_FRAME} trailing token(s) do not fill a frame of "
            f"{SLOTS_PER_FRAME}; dropped"
        )
    return Deinterleaved(codes, problems)
