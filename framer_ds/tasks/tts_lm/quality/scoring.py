"""The arithmetic of the quality gates, free of the heavy models so it is cheap to import and test."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

ASR_RATE = 16_000  # pocketsphinx's en-us model and Resemblyzer both take 16 kHz mono
_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}]")


def normalise_text(text: str) -> str:
    """Lowercase, ASCII punctuation replaced by spaces, whitespace collapsed: what an ASR hypothesis and a
    transcript are compared in (pocketsphinx writes lowercase words without punctuation; "o'clock" in
    its dictionary loses its apostrophe on both sides alike)."""
    return " ".join(_PUNCTUATION.sub(" ", text.lower()).split())


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus WER (jiwer): word substitutions + deletions + insertions over all the reference words,
    after `normalise_text` on both sides. An empty hypothesis is all deletions (1.0 for that text);
    insertions can take it above 1."""
    import jiwer

    pairs = [(normalise_text(r), normalise_text(h)) for r, h in zip(references, hypotheses, strict=True)]
    pairs = [(r, h) for r, h in pairs if r]  # a text with no words has nothing to recognise
    if not pairs:
        raise ValueError("no reference text has words to score")
    output = jiwer.process_words([r for r, _ in pairs], [h for _, h in pairs])
    errors = output.substitutions + output.deletions + output.insertions
    return errors / (output.substitutions + output.deletions + output.hits)


def ends_speech(generated: Sequence[int], end_of_speech: int) -> bool:
    """Whether a generation (every token after the prompt, `speech.generate_tokens`) ended its speech with
    end_of_speech within its token budget: a generation cut off by max_new_tokens, or stopped by an
    end_of_ai that skipped end_of_speech, did not."""
    return end_of_speech in generated


def eos_rate(generations: Sequence[Sequence[int]], end_of_speech: int) -> float:
    """The fraction of generations that `ends_speech` (the "rambling" failure is a low rate)."""
    if not generations:
        raise ValueError("no generations to count")
    return sum(ends_speech(g, end_of_speech) for g in generations) / len(generations)


def resample_to(audio: np.ndarray, rate: int, target: int = ASR_RATE) -> np.ndarray:
    """Mono float32 at `target` Hz (scipy's polyphase filter, as snac_codec.read_audio; librosa's default
    resampler compiles with numba for a minute on first use)."""
    from scipy.signal import resample_poly

    audio = np.asarray(audio, dtype=np.float32)
    if rate == target:
        return audio
    ratio = Fraction(target, rate)
    return resample_poly(audio, ratio.numerator, ratio.denominator).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.dot(a, b) / norms) if norms > 0 else 0.0
