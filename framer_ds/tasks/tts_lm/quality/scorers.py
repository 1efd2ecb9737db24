"""The offline models behind the gates, each loaded once per process on first use: pocketsphinx 5's
en-us acoustic model, dictionary and language model (in its wheel) and Resemblyzer's speaker encoder
(weights in its wheel). Both are imported here only, when a gate runs: Resemblyzer pulls in librosa and
numba, seconds of import that `framer-ds --help` or a run without gates must not pay."""

from __future__ import annotations

import importlib.metadata
import sys
import types
from functools import cache

import numpy as np

from framer_ds.compat import require
from framer_ds.tasks.tts_lm.quality.scoring import ASR_RATE, resample_to


class SpeechRecognizer:
    """pocketsphinx's default en-us decoder: a weak ASR (a 2010s GMM model with a generic trigram
    language model) whose WER tracks regressions, not absolute intelligibility (docs/tts_lm.md)."""

    def __init__(self) -> None:
        pocketsphinx = require("pocketsphinx", "the tts_lm quality gate eval/wer")
        self.decoder = pocketsphinx.Decoder(samprate=ASR_RATE, logfn="/dev/null")
        self.initial_cmn = self.decoder.get_cmn()

    def transcribe(self, audio: np.ndarray, rate: int) -> str:
        """The words heard in `audio` (mono float at `rate` Hz), lowercase; "" when none. Every utterance
        starts from the decoder's initial state: pocketsphinx carries its cepstral mean over from the
        utterance before, and the same audio decoded twice in a row was heard differently ("hello world"
        then "though world"), which would make the metric depend on the order of the texts."""
        pcm = np.clip(resample_to(audio, rate), -1.0, 1.0)
        self.decoder.set_cmn(self.initial_cmn)
        self.decoder.start_stream()
        self.decoder.start_utt()
        # full_utt: the whole utterance at once, so cepstral normalisation sees all of it
        self.decoder.process_raw((pcm * 32767).astype(np.int16).tobytes(), full_utt=True)
        self.decoder.end_utt()
        hypothesis = self.decoder.hyp()
        return hypothesis.hypstr if hypothesis is not None else ""


class SpeakerEncoder:
    """Resemblyzer's VoiceEncoder (GE2E, 256-d unit-norm utterance embeddings) on the CPU."""

    def __init__(self) -> None:
        _import_webrtcvad()
        resemblyzer = require("resemblyzer", "the tts_lm quality gate eval/speaker_similarity")
        self._preprocess = resemblyzer.preprocess_wav
        self.encoder = resemblyzer.VoiceEncoder("cpu", verbose=False)

    def embed(self, audio: np.ndarray, rate: int) -> np.ndarray | None:
        """The utterance embedding of `audio`, or None for silence. Resemblyzer's preprocessing normalises
        the volume and cuts long silences with its voice detector; where that finds no voice at all (the
        noise of an untrained model) the whole waveform is embedded, so the metric still says how far it
        is from the voice. Resampled here, not by Resemblyzer (librosa's resampler compiles with numba
        for about a minute on first use)."""
        wav = resample_to(audio, rate)
        if not np.any(wav):
            return None
        voiced = self._preprocess(wav)
        return self.encoder.embed_utterance(voiced if voiced.size else wav)


def _import_webrtcvad() -> None:
    """webrtcvad 2.0.10 (Resemblyzer's voice detector) reads its own version with `pkg_resources`, which
    setuptools >= 81 no longer ships (nor does a fresh venv on Python >= 3.12): the import fails with
    "No module named 'pkg_resources'". A stand-in answering that one call is present only for the import."""
    if "webrtcvad" in sys.modules:
        return
    try:
        import pkg_resources  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("pkg_resources")
        stand_in.get_distribution = lambda name: types.SimpleNamespace(  # type: ignore[attr-defined]
            version=importlib.metadata.version(name)
        )
        sys.modules["pkg_resources"] = stand_in
        try:
            require("webrtcvad", "the tts_lm quality gate eval/speaker_similarity")
        finally:
            del sys.modules["pkg_resources"]


@cache
def speech_recognizer() -> SpeechRecognizer:
    return SpeechRecognizer()


@cache
def speaker_encoder() -> SpeakerEncoder:
    return SpeakerEncoder()
