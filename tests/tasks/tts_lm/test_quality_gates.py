"""Issue 37 section 3: the offline quality gates' metric pipeline on real speech made here with espeak-ng
(Debian's `espeak-ng`, installed by `.ci/run`), the end-of-speech rate on token sequences, the held-out
utterances taken apart, and a failing metric that is one line and left out.

The ASR (pocketsphinx) and the speaker encoder (Resemblyzer) load once per module. The figures the
bounds come from were measured here (espeak-ng 1.51, pocketsphinx 5.1.1, Resemblyzer 0.1.4); both
programs are deterministic, so the margins only absorb another espeak-ng or model release.
"""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import pytest
from test_tts_lm import TINY, load_task

from framer_ds.compat import MissingDependencyError
from framer_ds.tasks.tts_lm.quality import gates, scoring
from framer_ds.tasks.tts_lm.quality.scorers import speaker_encoder, speech_recognizer

ESPEAK = shutil.which("espeak-ng")
needs_espeak = pytest.mark.skipif(
    ESPEAK is None,
    reason="espeak-ng is not installed: `apt-get install -y espeak-ng` (.ci/run installs it on CI)",
)
KNOWN = "Hello world, this is a test of the speech model."
OTHER = "Please call me when you get home tonight."


def espeak(text: str, voice: str) -> tuple[np.ndarray, int]:
    """espeak-ng's speech for `text` in `voice`: mono float32 at its own rate (22,050 Hz)."""
    import soundfile

    wav = subprocess.run(
        [ESPEAK, "-v", voice, "--stdout", text], capture_output=True, check=True, timeout=120
    ).stdout
    audio, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    return audio, rate


@pytest.fixture(scope="module")
def recognizer():
    return speech_recognizer()


@pytest.fixture(scope="module")
def encoder():
    return speaker_encoder()


@needs_espeak
def test_the_wer_of_a_known_sentence_is_low(recognizer):
    """Measured: pocketsphinx hears "hello world this is a test of us the model" in espeak-ng's
    en-us+klatt voice (the formant voices en-us, en+m3, en+f3 score 0.6-1.0 with it): 2 substitutions
    in 10 words = 0.2. The bound 0.4 allows two more errors; the same audio scored against another
    sentence is above 1 (measured 1.25), so the bound separates. Case and punctuation (the capital H and
    the comma) cost nothing after normalisation. The same audio is heard the same after other audio
    (pocketsphinx carried its cepstral mean over: "though world ..." the second time)."""
    audio, rate = espeak(KNOWN, "en-us+klatt")
    heard = recognizer.transcribe(audio, rate)
    wer = gates.word_error_rate([KNOWN], [audio], rate)  # decoded again, after `heard`
    assert wer <= 0.4, (wer, heard)
    assert wer == scoring.word_error_rate([KNOWN], [heard])  # the second decoding heard the same
    assert scoring.word_error_rate([OTHER], [heard]) >= 0.8


def test_wer_normalises_case_and_punctuation_and_counts_silence_as_deletions():
    assert scoring.normalise_text("Hello,  World! It's 9 o'clock.") == "hello world it s 9 o clock"
    assert scoring.word_error_rate(["Hello, world!"], ["hello world"]) == 0.0
    assert scoring.word_error_rate(["a b c d", "e f"], ["a x c d", ""]) == pytest.approx(3 / 6)
    assert scoring.word_error_rate(["a b"], ["a b c d"]) == pytest.approx(1.0)  # insertions count


@needs_espeak
def test_the_same_voice_scores_higher_speaker_similarity_than_another(encoder):
    """Measured: en+m3 saying two different sentences 0.890; en+m3 against en+f3 0.580. The same voice
    must beat the other by at least 0.15 of that 0.31 gap, and silence scores 0."""
    first, rate = espeak(KNOWN, "en+m3")
    again, _ = espeak(OTHER, "en+m3")
    other, _ = espeak(OTHER, "en+f3")
    same = gates.speaker_similarity([first], [again], rate)
    different = gates.speaker_similarity([first], [other], rate)
    assert same > 0.75 and same > different + 0.15, (same, different)
    assert gates.speaker_similarity([first], [np.zeros(rate, np.float32)], rate) == 0.0


def test_eos_rate_counts_generations_ending_their_speech_within_the_budget():
    end_of_speech, end_of_ai = 5, 6
    generations = [
        [10, 11, end_of_speech, end_of_ai],  # ended
        [10, 11, 12, 13],  # cut off by max_new_tokens
        [10, end_of_ai],  # stopped, but skipped end_of_speech: not a proper end
        [end_of_speech],  # ended at once
    ]
    assert [scoring.ends_speech(g, end_of_speech) for g in generations] == [True, False, False, True]
    assert scoring.eos_rate(generations, end_of_speech) == 0.5
    with pytest.raises(ValueError):
        scoring.eos_rate([], end_of_speech)


def tiny_task(tiny_tts):
    task = load_task(TINY, "model.samples.every=0")
    task.build_datasets()
    return task


def test_held_out_utterances_are_the_eval_rows_without_their_speaker_prefix(tiny_tts):
    """The tiny config prefixes "ana: " / "ben: " (data.speaker_prefix); the transcript is the row's text
    and the prompt still carries the prefix, as training saw it."""
    import json

    task = tiny_task(tiny_tts)
    builder = task.data.builder()
    utterances = gates.held_out_utterances(task._held_out, builder, 3)
    rows = [json.loads(line) for line in (tiny_tts / "data" / "eval.jsonl").read_text().splitlines()[:3]]
    assert [u.text for u in utterances] == [row["text"] for row in rows]
    special = builder.special
    for utterance, row in zip(utterances, rows, strict=True):
        assert utterance.prompt[-1] == special.start_of_speech
        assert builder.tokenizer.decode(utterance.prompt).count(f"{row['speaker']}: ") == 1
        assert len(utterance.reference_audio) == 7 * len(row["codes"][0])
        assert utterance.text_tokens == len(builder.tokenizer.encode(row["text"], add_special_tokens=False))


def test_a_failing_metric_is_one_line_and_left_out(tiny_tts, monkeypatch):
    """The ASR missing: eval/wer is one line naming it; the other metrics are still there. The codec
    missing: only eos_rate, which needs no audio, and one line naming the three it took."""
    task = tiny_task(tiny_tts)
    builder = task.data.builder()
    utterances = gates.held_out_utterances(task._held_out, builder, 2)
    special = builder.special
    generations = [[*u.reference_audio, special.end_of_speech] for u in utterances[:1]] + [
        utterances[1].reference_audio[:14]
    ]

    def no_asr():
        raise MissingDependencyError("package pocketsphinx is required for eval/wer")

    class SameVoice:
        def embed(self, audio, rate):
            return np.ones(4)

    monkeypatch.setattr(gates, "speech_recognizer", no_asr)
    monkeypatch.setattr(gates, "speaker_encoder", SameVoice)
    lines: list[str] = []
    metrics = gates.score(utterances, generations, builder, lambda: task.assets.codec("cpu"), lines.append)
    assert set(metrics) == {"eval/eos_rate", "eval/seconds_per_text_token", "eval/speaker_similarity"}
    assert lines == [
        "eval/wer skipped: MissingDependencyError: package pocketsphinx is required for eval/wer"
    ]
    assert metrics["eval/eos_rate"] == 0.5 and metrics["eval/speaker_similarity"] == 1.0
    frames = len(utterances[0].reference_audio) // 7 + 2  # 2048 samples a frame at 24 kHz
    seconds = frames * 2048 / 24000
    tokens = utterances[0].text_tokens + utterances[1].text_tokens
    assert metrics["eval/seconds_per_text_token"] == pytest.approx(seconds / tokens)

    def no_codec():
        raise OSError("codec gone")

    lines.clear()
    assert set(gates.score(utterances, generations, builder, no_codec, lines.append)) == {"eval/eos_rate"}
    assert lines == [
        "eval/wer, eval/speaker_similarity, eval/seconds_per_text_token skipped: OSError: codec gone"
    ]


def test_the_gates_libraries_load_only_when_a_gate_runs():
    """Resemblyzer brings librosa and numba (seconds of import): `framer-ds --help` and a run without
    gates never import them, nor the ASR or jiwer."""
    import sys

    from conftest import REPO

    heavy = ["resemblyzer", "pocketsphinx", "jiwer", "librosa", "numba", "webrtcvad"]
    code = (
        "import sys, contextlib, io\n"
        "from framer_ds.cli.main import main\n"
        "import framer_ds.tasks.tts_lm.task\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_generation_failure_during_training_is_one_line_and_no_metric(tiny_tts, monkeypatch, capsys):
    """The gates never stop training: generation raising (an out-of-memory on a long text, say) leaves
    the evaluation without gate metrics, says so once, and the model is back in training mode."""
    from accelerate import Accelerator

    task = load_task(TINY, "model.samples.every=0", "model.quality_eval.every=1")
    task.build_datasets()
    model = task.build_model().train()

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    monkeypatch.setattr(gates, "generate_tokens", out_of_memory)
    assert task.generation_metrics(Accelerator(cpu=True), model, in_training=True) == {}
    assert model.training
    out = capsys.readouterr().out
    assert (
        out == "quality: every metric skipped: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )


def test_gates_while_training_without_a_codec_are_refused_at_validate(tmp_path, tiny_tts):
    from test_tts_lm import write_config

    model = {"source": {"path": str(tiny_tts / "model")}, "quality_eval": {"every": 2}}
    config = write_config(
        tmp_path / "c.yaml", tmp_path / "run", model=model, source={"builtin": "tiny_speech"}
    )
    (problem,) = load_task(config).check()
    assert problem.where == "model.quality_eval.every" and "model.codec.path" in problem.message
    model["quality_eval"] = {"every": 0}  # `framer-ds eval` alone: the audio metrics are a skipped line
    config = write_config(
        tmp_path / "c.yaml", tmp_path / "run", model=model, source={"builtin": "tiny_speech"}
    )
    assert load_task(config).check() == []
    best = ["train.eval.best_metric=eval/wer", "train.eval.best_mode=min"]
    (problem,) = load_task(config, *best).check()  # keep-best would stop the run where a gate is absent
    assert problem.where == "train.eval.best_metric" and "keep the best on eval/loss" in problem.message
