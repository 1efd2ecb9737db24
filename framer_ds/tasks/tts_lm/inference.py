"""Speech from a tts_lm model: the samples written while training and `framer-ds sample`.

`tts_lm.json` in every export records the token layout and the codec, so an export is spoken exactly
as it was trained, without the training config's files being where they were."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import Field, model_validator

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.export import read_export_json
from framer_ds.tasks.base import SampleCommandOptions
from framer_ds.tasks.tts_lm.config import GenerationOptions, TtsSampleOptions
from framer_ds.tasks.tts_lm.model_setup import TtsAssets
from framer_ds.tasks.tts_lm.sequences import SequenceBuilder
from framer_ds.tasks.tts_lm.speech import Speech, generate_audio_tokens, speech_to_wav
from framer_ds.tasks.tts_lm.token_sequences import SpecialTokens, build_sequence, generation_prompt
from framer_ds.tasks.tts_lm.vocabulary import audio_layout

LAYOUT_RECORD = "tts_lm.json"


class TtsSampleCommandOptions(SampleCommandOptions, GenerationOptions):
    """`framer-ds sample RUN/final --text "Hello there." --out speech.wav`: speech as a .wav per text."""

    text: list[str] = Field(min_length=1, description="Texts to speak (one .wav each).")
    out: Path = Field(
        Path("speech.wav"), description="Output .wav; with several texts, NAME_0.wav, NAME_1.wav, ..."
    )
    speaker: str | None = Field(
        None,
        description="Speak as this speaker: the '{speaker}: ' prompt prefix the model was trained with "
        "(data.speaker_prefix); an unknown name is refused with the known ones listed.",
    )
    reference_audio: Path | None = Field(
        None,
        description="Zero-shot voice prompt: a clip (wav/flac) of the voice, with --reference-text; the "
        "pair (its text + its SNAC codes) comes before the text, as Orpheus' pretrained model is prompted.",
    )
    reference_text: str | None = Field(None, description="What --reference-audio says.")
    max_new_tokens: int = Field(1200, ge=7, description="Generated tokens at most (~82 per second).")
    codec: Path | None = Field(
        None, description="SNAC directory; default the one the model was trained with."
    )

    @model_validator(mode="after")
    def _reference_is_a_pair(self) -> TtsSampleCommandOptions:
        if (self.reference_audio is None) != (self.reference_text is None):
            raise ValueError("--reference-audio and --reference-text go together: the clip and what it says")
        return self


def write_layout_record(out_dir: Path, assets: TtsAssets, speakers: list[str] | None = None) -> None:
    """`speakers`: the names the model learned a prompt prefix for ([] = none; None = not known)."""
    record = {
        "special_tokens": vars(assets.special),
        "codebook_size": assets.layout.codebook_size,
        "codec": str(assets.codec_dir) if assets.codec_dir is not None else None,
    }
    if speakers is not None:
        record["speakers"] = list(speakers)
    (Path(out_dir) / LAYOUT_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def check_speaker(record: dict, speaker: str | None) -> None:
    """`--speaker NAME` must be a voice the export learned (recorded in tts_lm.json); an export older
    than the record's `speakers` list is trusted."""
    known = record.get("speakers")
    if speaker is None or known is None or speaker in known:
        return
    fix = f"known speakers: {', '.join(known)}" if known else "it was trained without data.speaker_prefix"
    raise ConfigError([ConfigProblem("--speaker", f"{speaker!r} is not a speaker of this model; {fix}")])


def reference_prompt(builder: SequenceBuilder, codec, audio: Path, text: str) -> list[int]:
    """A zero-shot voice prompt: the reference clip as a finished pair, text + its SNAC codes, exactly
    as a training sequence; the text to speak follows it (Orpheus' README: the pretrained model
    "generate[s] speech conditioned on one or more existing text-speech pairs in the prompt")."""
    from framer_ds.tasks.tts_lm.audio_tokens import interleave
    from framer_ds.tasks.tts_lm.snac_codec import AudioReadError, encode_batch, read_audio

    try:
        wave = read_audio(Path(audio), codec.sampling_rate)
    except AudioReadError as exc:
        raise ConfigError([ConfigProblem("--reference-audio", str(exc))]) from None
    codes = encode_batch(codec, [wave])[0]
    tokens = interleave(codes, builder.layout, str(audio))
    return build_sequence(builder.text_ids(text), tokens, builder.special).input_ids


def _speak(
    model,
    builder: SequenceBuilder,
    text: str,
    speaker,
    options,
    synced_gpus: bool = False,
    show_progress: bool = True,
    prefix: Sequence[int] = (),
) -> list[int]:
    prompt = [*prefix, *generation_prompt(builder.text_ids(text, speaker), builder.special)]
    return generate_audio_tokens(
        model,
        prompt,
        builder.special,
        **options.generation_settings(),
        synced_gpus=synced_gpus,
        show_progress=show_progress,
    )


def sample_to_files(
    model,
    builder: SequenceBuilder,
    codec: Callable[[], object],
    options: TtsSampleOptions,
    out_dir: Path,
    write: bool,
    synced_gpus: bool = False,
) -> tuple[list[Path], list[str]]:
    """Every prompt of `options` spoken: the .wav files written (when `write`, i.e. on rank 0) and a
    report line per prompt. Every rank generates (under ZeRO-3 each forward is a collective) before rank 0
    loads the codec (`codec()`) and decodes, so a decoding failure on rank 0 leaves no rank waiting."""
    spoken = [
        (text, _speak(model, builder, text, None, options, synced_gpus, show_progress=write))
        for text in options.prompts
    ]
    written, report = [], []
    if not write:
        return written, report
    decoder = codec()
    for index, (text, tokens) in enumerate(spoken):
        speech = speech_to_wav(tokens, builder.layout, decoder, Path(out_dir) / f"sample_{index}.wav")
        report.append(f"{text!r} -> {speech.describe()}")
        if speech.path is not None:
            written.append(speech.path)
    return written, report


def require_codec_dir(codec_dir: Path | None, key: str) -> Path:
    """A SNAC directory, or one line naming `key` and the download that fills it."""
    if codec_dir is None:
        raise ConfigError([ConfigProblem(key, "the export names no codec: pass --codec SNAC_DIR")])
    if not (Path(codec_dir) / "config.json").is_file():
        raise ConfigError(
            [
                ConfigProblem(
                    key,
                    f"{codec_dir} is not a SNAC directory (no config.json); `huggingface-cli download "
                    "hubertsiuzdak/snac_24khz --local-dir DIR` and pass --codec DIR",
                )
            ]
        )
    return Path(codec_dir)


def read_layout_record(export_dir: Path) -> dict:
    path = Path(export_dir) / LAYOUT_RECORD
    if not path.is_file():
        raise ConfigError([ConfigProblem(str(export_dir), f"no {LAYOUT_RECORD}: not a tts_lm export")])
    return read_export_json(path)


def load_exported_model(config, export_dir: Path, device: str):
    """A merged or full export loads as it is; an adapter export onto its resized base."""
    from transformers import AutoModelForCausalLM

    if (Path(export_dir) / "config.json").is_file():
        return AutoModelForCausalLM.from_pretrained(export_dir).to(device).eval()
    from peft import PeftModel

    from framer_ds.tasks.tts_lm.model_setup import resized_base

    base = resized_base(config, TtsAssets.from_config(config))
    return PeftModel.from_pretrained(base, export_dir).to(device).eval()


def sample_command(config, export_dir: Path, options: TtsSampleCommandOptions) -> str:
    """One .wav per --text from the export in `export_dir`; a line per file (and any layout problem)."""
    from transformers import AutoTokenizer

    from framer_ds.tasks.tts_lm.snac_codec import load_codec

    record = read_layout_record(export_dir)
    check_speaker(record, options.speaker)
    if options.reference_audio is not None and not options.reference_audio.is_file():
        raise ConfigError([ConfigProblem("--reference-audio", f"{options.reference_audio} does not exist")])
    special = SpecialTokens(**record["special_tokens"])
    codec_dir = options.codec or (Path(record["codec"]) if record.get("codec") else None)
    codec_dir = require_codec_dir(codec_dir, "--codec" if options.codec else f"{LAYOUT_RECORD} codec")
    device = options.resolved_device()
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    builder = SequenceBuilder(tokenizer, special, audio_layout(special), config.data, len(tokenizer))
    model = load_exported_model(config, export_dir, device)
    codec = load_codec(codec_dir, device)
    prefix: list[int] = []
    if options.reference_audio is not None:
        prefix = reference_prompt(builder, codec, options.reference_audio, options.reference_text)
    lines = []
    for index, text in enumerate(options.text):
        out = (
            options.out
            if len(options.text) == 1
            else options.out.with_name(f"{options.out.stem}_{index}.wav")
        )
        speech: Speech = speech_to_wav(
            _speak(model, builder, text, options.speaker, options, prefix=prefix), builder.layout, codec, out
        )
        lines.append(f"{text!r} -> {speech.describe()}")
    return "\n".join(lines)
