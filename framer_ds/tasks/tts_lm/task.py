"""The `tts_lm` task: a causal LM (Llama, Granite, Qwen, LFM2 ...) trained on text followed by SNAC
audio tokens, the VyvoTTS / Orpheus recipe (docs/tts_lm.md).

The loss is a token-count sum (`loss_reduction = "sum"`), so accumulated micro-batches of unequal
length weigh every token the same; text and audio parts are logged apart. Packed blocks keep samples
apart with a block-diagonal mask (sdpa, eager) or per-sample position ids (flash-attention 2).
"""

from __future__ import annotations

from functools import cached_property, partial
from pathlib import Path

import torch
from torch.utils.data import ConcatDataset, Dataset, SequentialSampler

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.accelerator import frozen_model_init, uses_zero3
from framer_ds.engine.export import save_peft_adapter_gathered, save_pretrained_gathered
from framer_ds.engine.export_load import ADAPTER_WEIGHTS, load_full_export, load_peft_adapter
from framer_ds.engine.pretrained import load_pretrained
from framer_ds.storage.disk_space import is_disk_full
from framer_ds.tasks.base import Task, TrainingLoss
from framer_ds.tasks.planning import PlanningHooks
from framer_ds.tasks.registry import register_task
from framer_ds.tasks.tts_lm import model_setup
from framer_ds.tasks.tts_lm.chunked_loss import ChunkedHeadLoss
from framer_ds.tasks.tts_lm.config import TtsDataConfig, TtsModelConfig
from framer_ds.tasks.tts_lm.data_setup import TtsData
from framer_ds.tasks.tts_lm.inference import TtsSampleCommandOptions, sample_to_files, write_layout_record
from framer_ds.tasks.tts_lm.quality.gates import quality_problems, run_quality_gates
from framer_ds.tasks.tts_lm.samplers import LengthGroupedSampler, RatioMixSampler
from framer_ds.tasks.tts_lm.smoke import TtsSmoke
from framer_ds.tasks.tts_lm.splitting import split_sequence
from framer_ds.tasks.tts_lm.token_batches import collate_packed, collate_padded
from framer_ds.tasks.tts_lm.token_sequences import (
    IGNORE_INDEX,
    AllSamplesTooLong,
    LengthStats,
    PackedBlock,
    TokenSequence,
    apply_length_policy,
)
from framer_ds.tasks.tts_lm.vocabulary import audio_layout


class ItemDataset(Dataset):
    """Sequences or packed blocks, built once at start."""

    def __init__(self, items: list):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


@register_task
class TtsLmTask(TtsSmoke, PlanningHooks, Task):
    name = "tts_lm"
    summary = "Text-to-speech causal LM on text + SNAC audio tokens (VyvoTTS / Orpheus recipe)."
    ModelConfig = TtsModelConfig
    DataConfig = TtsDataConfig
    loss_reduction = "sum"
    loss_items_name = "tokens"
    loss_parts = ("loss_text", "loss_audio")
    sample_options = TtsSampleCommandOptions

    def __init__(self, config):
        super().__init__(config)
        self._notes: dict = {}  # what build_datasets found, for the run summary and `data check`
        self._held_out: list[TokenSequence] = []  # whole held-out utterances, for the quality gates
        self._evaluations = 0  # in this process, for model.quality_eval.every

    # --- pre-flight ----------------------------------------------------------------------------------

    @cached_property
    def assets(self) -> model_setup.TtsAssets:
        return model_setup.TtsAssets.from_config(self.config)

    @cached_property
    def data(self) -> TtsData:
        return TtsData(self.config, self.assets)

    def check(self) -> list[ConfigProblem]:
        problems = self.assets.problems() + quality_problems(self.config, self.assets.codec_dir)
        problems += self.data.file_problems()
        if not problems and not self.assets.builtin:
            problems += self.assets.layout_problems()
            problems += [] if problems else self.assets.vocab_problems()
        return problems

    def prepare_data(self) -> None:
        self.assets.ensure_builtin()
        self.data.encode_audio_if_needed(show_progress=True)

    def prepare_model_assets(self) -> None:
        """The tiny model and tokenizer when built in; never the codec or the speech set it encodes (most
        of the built-in set's build, and a plan reads neither)."""
        self.assets.ensure_builtin_model()

    def encode_data(self) -> str:
        """`framer-ds data encode-audio` (declared in tts_lm/commands.py): encode the audio into the cache
        training reads, ahead of a run (e.g. on a CPU node); returns what was done."""
        self.assets.ensure_builtin()
        return self.data.encode_audio_if_needed(show_progress=True, required=True)

    def plan_assumptions(self) -> list[str]:
        return self.assets.plan_assumptions()

    def data_report(self) -> str:
        train, evaluation = self.build_datasets()
        lines = [f"{key}: {value}" for key, value in self._notes.items() if not isinstance(value, dict)]
        return "\n".join([*lines, f"train items: {len(train)}; eval items: {len(evaluation or [])}"])

    def data_summary(self) -> dict:
        return self._notes

    # --- data ----------------------------------------------------------------------------------------

    def build_datasets(self):
        data = self.config.data
        built = self.data.build_sequences()
        self._notes = dict(built.notes)
        self._held_out = built.eval
        batch = self.config.train.micro_batch_size
        special = self.assets.special
        splitter = partial(
            split_sequence,
            max_len=data.max_seq_length,
            start_of_speech=special.start_of_speech,
            end_of_speech=special.end_of_speech,
        )
        policy = partial(
            apply_length_policy,
            max_len=data.max_seq_length,
            policy=data.length_policy,
            batch_size=batch,
            splitter=splitter,
        )
        grouped = data.group_by_length and data.shuffle  # padding as the batches will come
        try:
            speech, stats = policy(built.train, group_by_length=grouped)
            eval_items = None
            if built.eval:
                eval_items, _ = policy(built.eval, group_by_length=grouped)
        except AllSamplesTooLong as exc:
            raise ConfigError([ConfigProblem("data.max_seq_length", str(exc))], "data") from None
        self._notes.update(_length_notes(stats))
        if built.text_mix:
            text_items, text_stats = policy(built.text_mix, group_by_length=False)
            self._notes["text mix"] = text_stats.describe()
            train: Dataset = ConcatDataset([ItemDataset(list(speech)), ItemDataset(list(text_items))])
        else:
            train = ItemDataset(list(speech))
        return train, ItemDataset(eval_items) if eval_items else None

    def train_sampler(self, train_set):
        """From the training set it is given (no state left by `build_datasets`): a text mix is the
        concatenation of the speech and the text items, and every item knows its length."""
        data, seed = self.config.data, self.config.train.seed
        if not data.shuffle:  # the file order (config.py refuses it with a text mix or length grouping)
            return SequentialSampler(train_set)
        if isinstance(train_set, ConcatDataset):
            (speech, text), mix = train_set.datasets, data.text_mix
            return RatioMixSampler(
                len(speech), len(text), mix.ratio_start, mix.ratio_end, mix.ramp_epochs, seed
            )
        if data.length_policy != "pack" and data.group_by_length:
            lengths = [len(train_set[i]) for i in range(len(train_set))]
            return LengthGroupedSampler(lengths, self.config.train.micro_batch_size, seed)
        return None

    def collate_fn(self):
        pad = self.assets.special.pad
        if self.config.data.length_policy != "pack":
            return lambda sequences: collate_padded(sequences, pad)
        attention = self.config.model.attn_implementation
        block = self.config.data.max_seq_length

        def packed(blocks):
            batch = collate_packed(blocks, block, pad, None if attention == "sdpa" else torch.float32)
            if attention == "flash_attention_2":  # varlen kernels find the samples from the position ids
                del batch["attention_mask"]
            return batch

        return packed

    def example_batch(self, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """Samples vary in length; the peak comes from the longest batch training allows: every row a
        full `max_seq_length` sequence (a block full of samples when packing), every label counted."""
        length, pad = self.config.data.max_seq_length, self.assets.special.pad
        full = TokenSequence([pad] * length, [pad] * length)
        if self.config.data.length_policy != "pack":
            batch = self.collate_fn()([full] * micro_batch_size)
            # Full rows have no padding: transformers drops an all-ones mask before attention (no mask is
            # materialised), so leaving it out is the same graph, without the data-dependent "all ones?"
            # check a fake tensor cannot answer (Granite 4's recurrent-layer mask asks it unguarded).
            del batch["attention_mask"]
            return batch
        block = PackedBlock()
        block.add(full)
        return self.collate_fn()([block] * micro_batch_size)

    # --- model and objective -------------------------------------------------------------------------

    def build_model(self) -> torch.nn.Module:
        return model_setup.build_model(self.config, self.assets)

    def count_loss_items(self, batch) -> torch.Tensor:
        return (batch["labels"][:, 1:] != IGNORE_INDEX).sum()

    @cached_property
    def _head_loss(self) -> ChunkedHeadLoss:
        return ChunkedHeadLoss()

    def _token_losses(
        self, model, batch, top1: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(per-token loss, next-token labels, argmax predictions when `top1`), the shift done once for
        training and eval; the logits are made a chunk at a time (chunked_loss.py), never [B, T, V]."""
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
        losses, predictions = self._head_loss(model, inputs, batch["labels"], top1=top1)
        return losses, batch["labels"][:, 1:], predictions

    def _is_audio(self, labels: torch.Tensor) -> torch.Tensor:
        layout = audio_layout(self.assets.special)
        return (labels >= layout.audio_start) & (labels < layout.audio_end)

    def training_loss(self, model, batch) -> TrainingLoss:
        losses, labels, _ = self._token_losses(model, batch)
        audio = self._is_audio(labels)
        text = (labels != IGNORE_INDEX) & ~audio
        return TrainingLoss(
            losses.sum(),
            {
                # where(), not losses[mask]: no device sync, and the shapes do not depend on the data
                # (the planner's activation probe runs this on tensors without values)
                "loss_text": (losses.where(text, 0).sum(), text.sum()),
                "loss_audio": (losses.where(audio, 0).sum(), audio.sum()),
            },
        )

    def eval_step(self, model, batch) -> dict[str, torch.Tensor]:
        losses, labels, predictions = self._token_losses(model, batch, top1=True)
        audio = self._is_audio(labels)
        counted = labels != IGNORE_INDEX
        correct = (predictions == labels) & audio
        return {
            "loss_sum": losses.sum(1),
            "tokens": counted.sum(1),
            "audio_loss_sum": (losses * audio).sum(1),
            "audio_tokens": audio.sum(1),
            "audio_correct": correct.sum(1),
        }

    def summarize_eval(self, sums, num_samples: int) -> dict[str, float]:
        def ratio(a: str, b: str) -> float:
            return float(sums[a] / sums[b]) if float(sums[b]) > 0 else float("nan")

        return {
            "eval/loss": ratio("loss_sum", "tokens"),
            "eval/loss_audio": ratio("audio_loss_sum", "audio_tokens"),
            "eval/audio_top1": ratio("audio_correct", "audio_tokens"),
        }

    def generation_metrics(self, accelerator, model, in_training: bool) -> dict[str, float]:
        """model.quality_eval: held-out texts spoken and scored (quality/gates.py), in `framer-ds eval`
        and, with `every`, at every N-th evaluation while training."""
        options = self.config.model.quality_eval
        if in_training:
            self._evaluations += 1
        if not options.enabled or (in_training and (not options.every or self._evaluations % options.every)):
            return {}
        assets = self.assets

        def codec():
            assets.require_codec("scoring the quality gates' speech")
            return assets.codec(str(accelerator.device))

        builder = self.data.builder()
        zero3 = uses_zero3(accelerator)
        return run_quality_gates(accelerator, model, self._held_out, builder, codec, options, zero3)

    # --- samples and export --------------------------------------------------------------------------

    def sample_every(self) -> int:
        return self.config.model.samples.every

    def write_samples(self, accelerator, model, step: int, out_dir: Path) -> list[Path]:
        """Every prompt of model.samples spoken by the model being trained: samples/step_N/*.wav. Every
        rank generates (a ZeRO-3 forward is a collective); rank 0 decodes and writes. Samples are a view
        on training, not part of it: a failure (a codec that will not load, a decode error) is one line
        in the log and training goes on; a full disk is not, it stops the run with one line."""
        unwrapped = accelerator.unwrap_model(model)
        was_training = unwrapped.training
        unwrapped.eval()
        try:
            written, report = sample_to_files(
                unwrapped,
                self.data.builder(),
                lambda: self.assets.codec(str(accelerator.device)),
                self.config.model.samples,
                Path(out_dir) / f"step_{step}",
                write=accelerator.is_main_process,
                synced_gpus=uses_zero3(accelerator),
            )
        except Exception as exc:  # reported in one line: training must outlive its samples
            if is_disk_full(exc, Path(out_dir), 0):
                raise  # but not a full disk: the loop reports it and stops before the checkpoints fail too
            accelerator.print(f"sample: step {step} failed, training goes on: {type(exc).__name__}: {exc}")
            return []
        finally:
            unwrapped.train(was_training)
        for line in report:
            accelerator.print(f"sample: {line}")
        return written

    def export(self, accelerator, model, out_dir: Path) -> None:
        """A model `AutoModelForCausalLM.from_pretrained` loads, with its extended tokenizer: the full
        model, the LoRA merged into its base, or (lora.export: adapter) the adapter with the trained
        embeddings and head. `tts_lm.json` records the layout and the codec for `framer-ds sample`."""
        lora = self.config.model.lora
        if lora is None:
            save_pretrained_gathered(accelerator, model, out_dir)
        else:
            save_peft_adapter_gathered(accelerator, model, out_dir)
            if accelerator.is_main_process and lora.export == "merged":
                with frozen_model_init(accelerator):
                    model_setup.merge_adapter_in_place(self.config, self.assets, out_dir)
            accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            self.assets.tokenizer.save_pretrained(out_dir)
            write_layout_record(out_dir, self.assets, self.data.speakers)

    def load_export(self, model, export_dir: Path) -> torch.nn.Module:
        """The model `framer-ds eval` scores: an adapter export (with its trained embeddings and head)
        into the peft model `build_model` made, a full fine-tune's weights into the model; a merged
        export has no adapter to load, so it is itself the model (loaded as `framer-ds sample` does)."""
        export_dir = Path(export_dir)
        if (export_dir / ADAPTER_WEIGHTS).is_file():
            load_peft_adapter(model, export_dir)
            return model
        if self.config.model.lora is None:
            load_full_export(model, export_dir)
            return model
        from transformers import AutoModelForCausalLM

        del model  # the peft model is not what was exported; free it before loading the merged one
        attention = self.config.model.attn_implementation
        return load_pretrained(AutoModelForCausalLM, export_dir, attn_implementation=attention)

    def sample(self, export_dir: Path, options: TtsSampleCommandOptions) -> str:
        from framer_ds.tasks.tts_lm.inference import sample_command

        return sample_command(self.config, export_dir, options)


def _length_notes(stats: LengthStats) -> dict:
    return {"sequence lengths": stats.describe(), "length statistics": stats.as_metrics(prefix="")}
