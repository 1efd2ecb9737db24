"""Held-out sequences -> generated speech -> `eval/*` quality metrics (docs/tts_lm.md "Quality gates").

Every rank generates (under ZeRO-3 each forward is a collective); rank 0 decodes and scores, then hands
the metrics to the others, so every rank logs and compares (keep-best) the same numbers. The gates are
a view on the model, never a reason to stop: each metric that fails (a codec that will not load, an ASR
that is not installed) is one line naming it and the cause, and is left out; the others are reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.rng import isolated_seed
from framer_ds.tasks.tts_lm.audio_tokens import deinterleave
from framer_ds.tasks.tts_lm.config import QualityEvalOptions
from framer_ds.tasks.tts_lm.quality import scoring
from framer_ds.tasks.tts_lm.quality.scorers import speaker_encoder, speech_recognizer
from framer_ds.tasks.tts_lm.sequences import SequenceBuilder
from framer_ds.tasks.tts_lm.snac_codec import decode
from framer_ds.tasks.tts_lm.speech import generate_tokens, until_stop
from framer_ds.tasks.tts_lm.token_sequences import TokenSequence

Report = Callable[[str], None]
DECODE_SEED = 0
GATE_METRICS = ("eval/wer", "eval/speaker_similarity", "eval/eos_rate", "eval/seconds_per_text_token")


@dataclass(frozen=True)
class HeldOutUtterance:
    """One held-out sequence taken apart: what the model is prompted with, what it should say and how
    the recording sounded."""

    prompt: list[int]  # up to and including start_of_speech (the speaker prefix, if any, included)
    reference_audio: list[int]  # the recording's audio tokens
    text: str  # the transcript, without the speaker prefix
    text_tokens: int  # its tokens, for the duration per text token


def held_out_utterances(
    sequences: Sequence[TokenSequence], builder: SequenceBuilder, count: int
) -> list[HeldOutUtterance]:
    """The first `count` sequences with a text and a complete speech part (format 'tokens' rows may lack
    one), from the layout `token_sequences.build_sequence` writes, whatever format the rows came in."""
    found = []
    for sequence in sequences:
        utterance = _utterance(sequence.input_ids, builder)
        if utterance is not None:
            found.append(utterance)
        if len(found) == count:
            break
    return found


def _utterance(ids: list[int], builder: SequenceBuilder) -> HeldOutUtterance | None:
    special = builder.special
    try:
        start = ids.index(special.start_of_human) + 1
        if special.start_of_text is not None and ids[start : start + 1] == [special.start_of_text]:
            start += 1  # past the text's start token, which may be its end token too (Granite: BOS == EOS)
        text_end = ids.index(special.end_of_text, start)
        speech = ids.index(special.start_of_speech, text_end)
        speech_end = ids.index(special.end_of_speech, speech + 1)
    except ValueError:
        return None
    text_ids = ids[start:text_end]
    text = builder.tokenizer.decode(text_ids, skip_special_tokens=True)
    if builder.data.speaker_prefix and ": " in text:  # `SequenceBuilder.text_ids` wrote "speaker: text"
        text = text.split(": ", 1)[1]
    text = text.strip()
    if not text or speech_end == speech + 1:
        return None
    tokens = len(builder.tokenizer.encode(text, add_special_tokens=False))
    return HeldOutUtterance(ids[: speech + 1], ids[speech + 1 : speech_end], text, tokens)


def speak(
    model, utterances: Sequence[HeldOutUtterance], builder: SequenceBuilder, options, synced_gpus: bool
):
    """Every token each prompt generates, the stop included (`scoring.ends_speech` reads it)."""
    return [
        generate_tokens(
            model,
            utterance.prompt,
            builder.special,
            **options.generation_settings(),
            synced_gpus=synced_gpus,
        )
        for utterance in utterances
    ]


def _audio(tokens: list[int], builder: SequenceBuilder, codec) -> np.ndarray:
    """The well-formed frames of `tokens` decoded; none: an empty waveform. SNAC's decoder adds noise
    (`noise: true` in snac_24khz's config): each utterance is decoded under the same seed, so its audio
    and scores do not depend on what was drawn before (training's evaluation and `framer-ds eval` of the
    same weights agree)."""
    codes = deinterleave(tokens, builder.layout).codes
    if not codes[0]:
        return np.zeros(0, dtype=np.float32)
    with isolated_seed(DECODE_SEED):
        return decode(codec, codes)


def score(
    utterances: Sequence[HeldOutUtterance],
    generations: Sequence[list[int]],
    builder: SequenceBuilder,
    codec: Callable[[], object],
    report: Report,
) -> dict[str, float]:
    """The metrics of the generations (`speak`) against their held-out utterances; each metric that
    cannot be computed is one `report` line and is left out."""
    metrics = {"eval/eos_rate": scoring.eos_rate(generations, builder.special.end_of_speech)}
    try:
        decoder = codec()
        spoken = [_audio(until_stop(g, builder.special), builder, decoder) for g in generations]
        recorded = [_audio(u.reference_audio, builder, decoder) for u in utterances]
    except Exception as exc:  # a metric pipeline failure is a line, never a crash (module docstring)
        report(f"eval/wer, eval/speaker_similarity, eval/seconds_per_text_token skipped: {_cause(exc)}")
        return metrics
    rate = int(decoder.sampling_rate)
    seconds = sum(len(audio) for audio in spoken) / rate
    metrics["eval/seconds_per_text_token"] = seconds / max(sum(u.text_tokens for u in utterances), 1)
    gates = {
        "eval/wer": lambda: word_error_rate([u.text for u in utterances], spoken, rate),
        "eval/speaker_similarity": lambda: speaker_similarity(recorded, spoken, rate),
    }
    for name, gate in gates.items():
        try:
            metrics[name] = gate()
        except Exception as exc:
            report(f"{name} skipped: {_cause(exc)}")
    return metrics


def word_error_rate(texts: Sequence[str], spoken: Sequence[np.ndarray], rate: int) -> float:
    recognizer = speech_recognizer()
    heard = [recognizer.transcribe(audio, rate) if audio.size else "" for audio in spoken]
    return scoring.word_error_rate(texts, heard)


def speaker_similarity(recorded: Sequence[np.ndarray], spoken: Sequence[np.ndarray], rate: int) -> float:
    """The mean cosine of each recording's speaker embedding and its generation's. A silent generation
    scores 0; a silent recording has nothing to compare with and is left out."""
    encoder = speaker_encoder()
    values = []
    for reference, generated in zip(recorded, spoken, strict=True):
        wanted = encoder.embed(reference, rate) if reference.size else None
        if wanted is None:
            continue
        made = encoder.embed(generated, rate) if generated.size else None
        values.append(0.0 if made is None else scoring.cosine(wanted, made))
    if not values:
        raise ValueError("every held-out recording is silent")
    return float(np.mean(values))


def _cause(exc: Exception) -> str:
    """One line: the exception's type and first line; a ConfigError's own problems (its first line is
    only their count)."""
    if isinstance(exc, ConfigError):
        return "; ".join(str(problem) for problem in exc.problems)
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")


def run_quality_gates(
    accelerator,
    model,
    sequences: Sequence[TokenSequence],
    builder: SequenceBuilder,
    codec: Callable[[], object],
    options: QualityEvalOptions,
    synced_gpus: bool,
) -> dict[str, float]:
    """`options.count` held-out utterances spoken on every rank, scored on rank 0; the same metrics on
    every rank. A failure is one line on the console and the metrics it took are left out."""
    from accelerate.utils import broadcast_object_list

    def report(line: str) -> None:
        accelerator.print(f"quality: {line}")

    metrics: dict[str, float] = {}
    utterances = held_out_utterances(sequences, builder, options.count)
    if not utterances:
        report("skipped: no held-out sequence has both a text and a speech part")
        return metrics
    unwrapped = accelerator.unwrap_model(model)
    was_training = unwrapped.training
    unwrapped.eval()
    started = time.perf_counter()
    try:
        generations = speak(unwrapped, utterances, builder, options, synced_gpus)
        spoken_s = time.perf_counter() - started
        if accelerator.is_main_process:
            metrics = score(utterances, generations, builder, codec, report)
            report(
                f"{len(utterances)} held-out texts spoken in {spoken_s:.1f} s, scored in "
                f"{time.perf_counter() - started - spoken_s:.1f} s"
            )
    except Exception as exc:  # generation itself failed: no metric, training goes on
        report(f"every metric skipped: {_cause(exc)}")
    finally:
        unwrapped.train(was_training)
    if accelerator.num_processes > 1:
        metrics = broadcast_object_list([metrics], from_process=0)[0]
    return metrics


def quality_problems(config, codec_dir) -> list[ConfigProblem]:
    """`validate`: gates while training decode speech, which needs the codec (as samples do); and they
    cannot pick the best checkpoint, being absent from every evaluation they skip or fail."""
    options = config.model.quality_eval
    problems = []
    if codec_dir is None and options.enabled and options.every:
        problems.append(
            ConfigProblem(
                "model.quality_eval.every",
                f"{options.every} scores generated speech while training, which needs the SNAC codec: set "
                "model.codec.path (`huggingface-cli download hubertsiuzdak/snac_24khz --local-dir DIR`) or "
                "model.quality_eval.every: 0",
            )
        )
    if config.train.eval.best_metric in GATE_METRICS:
        problems.append(
            ConfigProblem(
                "train.eval.best_metric",
                f"{config.train.eval.best_metric} is a quality gate, absent from the evaluations that skip "
                "it (model.quality_eval.every) or where it fails: keep the best on eval/loss",
            )
        )
    return problems
