"""The `model:` and `data:` sections of a tts_lm run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from framer_ds.config.lora import LoraBase
from framer_ds.config.schema import StrictModel
from framer_ds.config.source import Source

LLM_ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
LLM_MLP = ["gate_proj", "up_proj", "down_proj"]


class TtsLoraOptions(LoraBase):
    target_modules: list[str] = Field(
        default_factory=lambda: LLM_ATTENTION + LLM_MLP,
        description="Module name suffixes (Llama/Granite/Qwen names; LFM2 uses others: check "
        "`model.named_modules()`).",
    )
    export: Literal["merged", "adapter"] = Field(
        "merged",
        description="final/: 'merged' = a plain model (AutoModelForCausalLM.from_pretrained loads it); "
        "'adapter' = the peft adapter with the trained embeddings and head (load the base, resize it to "
        "the tokenizer, then PeftModel.from_pretrained).",
    )


class SpecialTokenOptions(StrictModel):
    """Where the layout's ids sit. The recipe appends its markers and the 7 x 4096 audio codes right
    after the base vocabulary (`tokenizer_length`); presets pin the values of known bases and are checked
    against the tokenizer before training."""

    preset: Literal["auto", "llama3", "lfm2", "granite", "custom"] = Field(
        "auto",
        description="'auto': from the tokenizer (its length, BOS and EOS); 'llama3' (Orpheus), 'lfm2', "
        "'granite': the recipe's values for those bases; 'custom': the three fields below.",
    )
    tokenizer_length: int | None = Field(None, ge=1, description="'custom': the base vocabulary size.")
    start_of_text: int | None = Field(None, ge=0, description="'custom': the text BOS id (null: none).")
    end_of_text: int | None = Field(None, ge=0, description="'custom': the id ending the text.")

    @model_validator(mode="after")
    def _custom_needs_values(self) -> SpecialTokenOptions:
        given = [self.tokenizer_length, self.end_of_text]
        if self.preset == "custom" and None in given:
            raise ValueError("preset 'custom' needs tokenizer_length and end_of_text")
        if self.preset != "custom" and any(v is not None for v in [*given, self.start_of_text]):
            raise ValueError("tokenizer_length/start_of_text/end_of_text are read only with preset 'custom'")
        return self


class CodecOptions(StrictModel):
    """The SNAC 24 kHz codec: `data encode-audio` encodes with it, samples decode with it."""

    path: Path | None = Field(
        None,
        description="Local SNAC directory (config.json + pytorch_model.bin, e.g. `huggingface-cli "
        "download hubertsiuzdak/snac_24khz --local-dir DIR`). null with model.source.builtin: the tiny "
        "codec.",
    )
    device: str = Field("auto", description="Where encoding runs: 'auto', 'cpu', 'cuda'.")


class GenerationOptions(StrictModel):
    """How speech is generated, for the samples while training and `framer-ds sample`."""

    max_new_tokens: int = Field(700, ge=7, description="Generated tokens at most (~82 per second).")
    min_new_tokens: int = Field(
        28, ge=0, description="No end of speech before this many tokens (28 = 4 frames, ~0.3 s)."
    )
    temperature: float = Field(0.6, ge=0, description="0 = greedy.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling.")
    repetition_penalty: float = Field(1.1, ge=1, description="The recipe's 1.1 stops looping frames.")
    seed: int = Field(0, description="Generation seed: the same draws every time.")
    constrain_slots: bool = Field(
        True,
        description="Allow only the codes of each frame slot (and a stop at a frame boundary), so even an "
        "early model yields decodable audio; false shows the raw generations (malformed ones reported).",
    )

    def generation_settings(self) -> dict[str, Any]:
        """These options as `speech.generate_tokens` takes them: the one mapping that sampling, the
        samples during training and the quality gates share (a subclass's own keys left out)."""
        return {name: getattr(self, name) for name in GenerationOptions.model_fields}


class TtsSampleOptions(GenerationOptions):
    """Speech generated for fixed prompts while training, decoded with SNAC to samples/step_N/*.wav and
    logged to W&B as audio."""

    every: int = Field(0, ge=0, description="Sample every N optimizer steps (and at the end); 0 = never.")
    prompts: list[str] = Field(
        default_factory=lambda: ["Hello, this is a test of the speech model."],
        description="Texts spoken in every round (the same ones each time).",
    )


class QualityEvalOptions(GenerationOptions):
    """Offline quality gates (docs/tts_lm.md "Quality gates"): held-out texts spoken by the model, scored
    with an offline ASR (eval/wer), a speaker encoder against the held-out recording
    (eval/speaker_similarity), how often speech ends on its own (eval/eos_rate) and its duration per text
    token (eval/seconds_per_text_token)."""

    enabled: bool = Field(
        True, description="Score in `framer-ds eval` (and, with `every`, while training); false: never."
    )
    count: int = Field(
        8, ge=1, description="Held-out utterances spoken (the first ones of the eval split with speech)."
    )
    every: int = Field(
        0,
        ge=0,
        description="While training: at every N-th evaluation of the process (a resumed run counts anew); "
        "0 = only `framer-ds eval`. Costs `count` generations of up to max_new_tokens tokens each, plus "
        "a few seconds of CPU scoring per utterance.",
    )
    max_new_tokens: int = Field(
        1200, ge=7, description="Generated tokens at most (~82 per second); eos_rate counts ends before it."
    )


class TtsModelSource(Source):
    """Where the language model comes from: a saved model, a fresh init from AutoConfig fields, or the
    tiny built-in one."""

    path: Path | None = Field(
        None, description="Local directory with the base model and its tokenizer (save_pretrained)."
    )
    config: dict[str, Any] | None = Field(
        None,
        description="A fresh model instead: AutoConfig fields with `model_type` (e.g. llama); needs "
        "model.tokenizer. vocab_size defaults to the extended tokenizer's length; a larger one pads the "
        "embeddings (as Llama-3-based TTS checkpoints ship), a smaller one is refused.",
    )
    builtin: Literal["tiny_llama"] | None = Field(
        None,
        description="'tiny_llama': a tiny random Llama, its tokenizer and a tiny SNAC codec, built in the "
        "cache on first use (demo, tests).",
    )

    @model_validator(mode="after")
    def _config_names_its_type(self) -> TtsModelSource:
        if self.config is not None and "model_type" not in self.config:
            raise ValueError("config needs `model_type` (e.g. llama, granite, qwen3)")
        return self

    @property
    def fresh_config(self) -> dict[str, Any] | None:
        """The AutoConfig fields when this source builds a fresh model, else None."""
        return None if self.config is None else dict(self.config)


class TtsModelConfig(StrictModel):
    renamed_keys: ClassVar[dict[str, str]] = {
        "pretrained_model_name_or_path": "source.path",
        "config": "source.config",
        "builtin": "source.builtin",
    }

    source: TtsModelSource = Field(
        description="Where the model comes from: path (a saved model), config (a fresh init) or builtin."
    )
    tokenizer: Path | None = Field(None, description="Tokenizer directory; default the model's.")
    special_tokens: SpecialTokenOptions = Field(
        default_factory=SpecialTokenOptions, description="The ids of the layout's markers."
    )
    lora: TtsLoraOptions | None = Field(None, description="null = full fine-tune; else LoRA with peft.")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa", description="transformers attention kernel (packing works with sdpa and eager)."
    )
    codec: CodecOptions = Field(default_factory=CodecOptions, description="The SNAC codec.")
    samples: TtsSampleOptions = Field(
        default_factory=TtsSampleOptions, description="Audio generated while training."
    )
    quality_eval: QualityEvalOptions = Field(
        default_factory=QualityEvalOptions, description="Offline quality gates on generated speech."
    )

    @model_validator(mode="after")
    def _fresh_model_needs_tokenizer(self) -> TtsModelConfig:
        if self.source.fresh_config is not None and self.tokenizer is None:
            raise ValueError("model.source.config builds a fresh model: set model.tokenizer too")
        return self


class TextMixOptions(StrictModel):
    """Text-only samples mixed into the speech data (the recipe keeps the LM's language ability by
    ramping text:speech from 2:1 to 1:1). An epoch holds as many samples as both sets together; each
    position takes text or speech so that every prefix follows the ratio of its place in the ramp."""

    path: Path = Field(description="JSONL / Parquet / save_to_disk rows with `text` or `input_ids`.")
    ratio_start: float = Field(2.0, ge=0, description="text:speech at the start of training.")
    ratio_end: float = Field(1.0, ge=0, description="text:speech once the ramp is over.")
    ramp_epochs: float = Field(1.0, gt=0, description="Epochs over which the ratio moves linearly.")


class TtsDataSource(Source):
    """Where the training rows come from."""

    path: Path | None = Field(
        None,
        description="Training rows: a .jsonl / .jsonl.gz / .parquet file or a datasets.save_to_disk "
        "directory; with format 'audio', the folder or manifest of data.layout.",
    )
    builtin: Literal["tiny_speech"] | None = Field(
        None, description="'tiny_speech': short synthetic utterances encoded with the tiny codec (cache)."
    )


class TtsDataConfig(StrictModel):
    renamed_keys: ClassVar[dict[str, str]] = {"train": "source.path", "builtin": "source.builtin"}

    source: TtsDataSource = Field(description="Where the training rows come from: path (rows) or builtin.")
    eval: Path | None = Field(None, description="Held-out rows in the same format; else val_fraction.")
    val_fraction: float = Field(0.05, ge=0, lt=1, description="Without data.eval: rows held out (seeded).")
    format: Literal["tokens", "codes", "audio"] = Field(
        "codes",
        description="What a row holds: 'tokens' = finished `input_ids` (optional `labels`); 'codes' = text "
        "+ three SNAC code lists; 'audio' = text + an audio file path (encoded once by `framer-ds data "
        "encode-audio`, or at the start of training).",
    )
    layout: Literal["jsonl", "ljspeech", "folder", "hf"] = Field(
        "jsonl",
        description="format 'audio': how the files lie. 'jsonl' = a .jsonl(.gz) / .parquet manifest of "
        "audio paths (relative to it) + text [+ speaker]; 'ljspeech' = a folder with metadata.csv "
        "(`id|text|normalized`) and wavs/<id>.wav; 'folder' = a.wav (or .flac) + a.txt pairs under a "
        "folder; 'hf' = a datasets.save_to_disk directory with an Audio column (data.audio_column).",
    )
    text_column: str = Field("text", description="Column of the transcript.")
    codes_column: str = Field(
        "codes",
        description="Column of the three SNAC code lists; rows with `<name>_0`, `<name>_1`, `<name>_2` "
        "instead (one column per codebook) are read too.",
    )
    audio_column: str = Field("audio", description="Column of the audio path (relative to the file).")
    speaker_column: str | None = Field(None, description="Column of a speaker name, for the prefix.")
    speaker_prefix: bool | None = Field(
        None,
        description="Prefix the text with '{speaker}: ' (Orpheus' multi-speaker prompt), from "
        "speaker_column (layout 'folder': the top subfolder's name); `framer-ds sample --speaker NAME` then "
        "speaks as NAME. null follows the data's layout: on where it names speakers (a speaker_column set, "
        "or layout 'folder'), off where it does not (layout 'ljspeech'); config.yaml records the outcome. "
        "true refuses data that names no speaker.",
    )
    remove_duplicate_frames: bool = Field(
        False, description="Drop frames repeating the previous coarse code (the recipe's trimming)."
    )
    loss_on: Literal["all", "audio"] = Field(
        "all", description="'audio': learn only the speech part; the text is context."
    )
    max_seq_length: int = Field(8192, ge=16, description="Longest sequence in tokens (~100 s at 8192).")
    length_policy: Literal["filter", "truncate", "pack", "split"] = Field(
        "filter",
        description="Longer samples: 'filter' drops them (counted), 'truncate' cuts them; 'pack' drops "
        "them and concatenates the rest into max_seq_length blocks, samples kept apart; 'split' cuts them "
        "at SNAC frame boundaries into pieces (the text prompt + the audio continuing, the frames before "
        "as unlearned context), so no token is dropped.",
    )
    group_by_length: bool = Field(
        True, description="filter/truncate/split: batch samples of similar length (less padding)."
    )
    shuffle: bool = Field(
        True,
        description="false: train in the file order (the rows left after the validation split; with "
        "pack, the blocks in the order packing fills them), the same every epoch; no length grouping.",
    )
    bad_samples: Literal["error", "skip"] = Field(
        "error", description="A malformed row: 'error' stops at start naming it; 'skip' drops and counts it."
    )
    text_mix: TextMixOptions | None = Field(None, description="Text-only samples mixed in, with a ratio.")
    encoded_dir: Path | None = Field(
        None,
        description="format 'audio': where `framer-ds data encode-audio` writes the SNAC codes (one "
        "subfolder per data set and codec, <encoded_dir>/<hash>/) and training reads them; default "
        "<cache>/tts_codes.",
    )
    encode_batch_size: int = Field(8, ge=1, description="format 'audio': files per codec call.")

    @model_validator(mode="after")
    def _speaker_prefix_follows_the_layout(self) -> TtsDataConfig:
        """null becomes the layout's own choice, so that `data.layout=ljspeech` on a config whose speakers
        come from a column (the tiny one) just trains one voice, instead of being refused until the user
        also flips the prefix off. The value is set as resolved (config.yaml says what ran), while
        `model_fields_set` keeps saying whether the user chose it: `speaker_prefix_chosen`."""
        if self.speaker_prefix is None:
            object.__setattr__(self, "speaker_prefix", self.layout_names_speakers)  # no re-validation
            self.model_fields_set.discard("speaker_prefix")
        return self

    @property
    def layout_names_speakers(self) -> bool:
        """Whether each sample can say who speaks: an ljspeech folder is one voice, a folder layout's
        subfolders are its speakers, any other rows name theirs in `speaker_column` when one is set."""
        if self.format == "audio" and self.layout in ("ljspeech", "folder"):
            return self.layout == "folder"
        return self.speaker_column is not None

    @property
    def speaker_prefix_chosen(self) -> bool:
        """Whether speaker_prefix is the user's own value rather than the layout's default: only a prefix
        the user asked for is refused on data that names no speaker."""
        return "speaker_prefix" in self.model_fields_set

    @model_validator(mode="after")
    def _speaker_and_mix(self) -> TtsDataConfig:
        if self.layout != "jsonl" and self.format != "audio":
            raise ValueError(f"data.layout {self.layout!r} lays out audio files: set data.format 'audio'")
        speakers_from_folders = self.format == "audio" and self.layout == "folder"  # the subfolder names
        if self.speaker_prefix and self.speaker_column is None and not speakers_from_folders:
            raise ValueError("data.speaker_prefix needs data.speaker_column")
        if not self.shuffle and self.text_mix is not None:
            raise ValueError("data.text_mix draws its text:speech order at random: set data.shuffle true")
        if not self.shuffle and "group_by_length" in self.model_fields_set and self.group_by_length:
            raise ValueError("data.shuffle false keeps the file order: set data.group_by_length false")
        if self.text_mix is not None and self.length_policy != "pack" and self.group_by_length:
            raise ValueError(
                "data.text_mix orders samples by the mix ratio, not by length: set data.group_by_length "
                "false (or use length_policy pack)"
            )
        return self
