"""The tts_lm task as a user meets it: the tiny config trains (loss falls), samples and exports a model
transformers loads; the three ways data comes in give the same sequences; bad rows, bad presets and
unreadable audio are named with the fix; the text:speech mix follows its ratio under accelerate's
sharding."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from faults.harness import cli

from conftest import REPO, read_metrics

TINY = REPO / "configs" / "tasks" / "tts_lm" / "tiny.yaml"


def framer_ds(*argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "framer_ds", *map(str, argv)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_config(
    path: Path, run_dir: Path, model: dict | None = None, source: dict | None = None, **data
) -> Path:
    """A tts_lm config: `source` is data.source ({"path": ...} or {"builtin": ...})."""
    config = {
        "task": "tts_lm",
        "output_dir": str(run_dir),
        "model": model or {"source": {"builtin": "tiny_llama"}},
        "data": {"max_seq_length": 512, "source": source, **data},
        "train": {"length": {"steps": 2}, "micro_batch_size": 2},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def load_task(config_path: Path, *overrides: str):
    from framer_ds.tasks.registry import get_task_class
    from framer_ds.tasks.run_config import load_run_config

    config = load_run_config(config_path, list(overrides))
    return get_task_class(config.task)(config)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def tiny_rows(tiny_tts: Path, count: int = 12) -> list[dict]:
    lines = (tiny_tts / "data" / "train.jsonl").read_text().splitlines()[:count]
    return [json.loads(line) for line in lines]


# --- the user's path: train the tiny config, listen, load the export ----------------------------------


@pytest.mark.timeout(900)
def test_tiny_config_trains_samples_and_exports_a_loadable_model(tmp_path, tiny_tts):
    run_dir = tmp_path / "run"
    trained = cli("train", str(TINY), f"output_dir={run_dir}")
    assert trained.rc == 0, trained.err[-4000:]
    train_lines, eval_lines = read_metrics(run_dir)
    first, last = train_lines[0], train_lines[-1]
    assert last["loss"] < first["loss"] - 3.0, (first["loss"], last["loss"])  # visibly falls
    assert {"loss_text", "loss_audio", "tokens_per_s"} <= set(last)
    assert eval_lines[-1]["eval/loss"] < eval_lines[0]["eval/loss"]
    assert 0.0 <= eval_lines[-1]["eval/audio_top1"] <= 1.0
    summary = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["run_summary"]
    assert summary["length statistics"]["kept"] == 160 and "padding" in summary["sequence lengths"]

    import soundfile

    samples = sorted((run_dir / "samples").glob("step_*/sample_*.wav"))
    assert [p.relative_to(run_dir).as_posix() for p in samples] == [
        "samples/step_24/sample_0.wav",  # two prompts, every 24 steps; the last step's round is that one
        "samples/step_24/sample_1.wav",
    ]
    audio, rate = soundfile.read(samples[0])
    assert rate == 24000 and len(audio) > 2048

    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = run_dir / "final"
    model = AutoModelForCausalLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert model.get_input_embeddings().num_embeddings >= len(tokenizer) == 320 + 7 * 4096 + 10

    out = tmp_path / "speech.wav"
    assert json.loads((final / "tts_lm.json").read_text())["speakers"] == ["ana", "ben"]
    speak = ["sample", str(final), "--text", "hello world", "--speaker", "ana", "--out", str(out)]
    spoken = cli(*speak, "--device", "cpu")
    assert spoken.rc == 0, spoken.err[-3000:]
    assert "frames" in spoken.out and soundfile.read(out)[1] == 24000


# --- data: three ways in, one sequence builder -------------------------------------------------------


def test_jsonl_parquet_save_to_disk_and_pretokenized_rows_give_the_same_sequences(tmp_path, tiny_tts):
    import datasets

    rows = tiny_rows(tiny_tts)
    jsonl = write_jsonl(tmp_path / "rows.jsonl", rows)
    table = datasets.Dataset.from_list(rows)
    table.to_parquet(str(tmp_path / "rows.parquet"))
    table.save_to_disk(str(tmp_path / "rows_dir"))

    def sequences(path: Path, **data):
        task = load_task(
            write_config(tmp_path / "c.yaml", tmp_path / "run", source={"path": str(path)}, **data)
        )
        return task.data.build_sequences().train

    reference = sequences(jsonl, eval=str(jsonl))
    assert len(reference) == len(rows)
    for other in (tmp_path / "rows.parquet", tmp_path / "rows_dir"):
        assert [s.input_ids for s in sequences(other, eval=str(jsonl))] == [s.input_ids for s in reference]

    tokens = write_jsonl(tmp_path / "tokens.jsonl", [{"input_ids": s.input_ids} for s in reference])
    from_tokens = sequences(tokens, format="tokens", eval=str(tokens), loss_on="audio")
    assert [s.input_ids for s in from_tokens] == [s.input_ids for s in reference]
    # loss_on audio masks everything up to start_of_speech, as the codes path does.
    from_codes = sequences(jsonl, eval=str(jsonl), loss_on="audio")
    assert [s.labels for s in from_tokens] == [s.labels for s in from_codes]


def test_codes_to_tokens_to_codes_is_lossless_through_the_task(tmp_path, tiny_tts):
    from framer_ds.tasks.tts_lm.audio_tokens import deinterleave

    rows = tiny_rows(tiny_tts, 4)
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    task = load_task(
        write_config(tmp_path / "c.yaml", tmp_path / "run", source={"path": str(path)}, eval=str(path))
    )
    special = task.assets.special
    for row, sequence in zip(rows, task.data.build_sequences().train, strict=True):
        ids = sequence.input_ids
        audio = ids[ids.index(special.start_of_speech) + 1 : ids.index(special.end_of_speech)]
        unpacked = deinterleave(audio, task.assets.layout)
        assert unpacked.problems == [] and unpacked.codes == row["codes"]


def test_bad_rows_are_all_named_or_counted_when_skipped(tmp_path, tiny_tts):
    from framer_ds.config.errors import ConfigError

    good = tiny_rows(tiny_tts, 3)
    bad = [
        {"text": "uneven", "codes": [[1, 2], [1, 2, 3], [1] * 8]},
        {"text": "out of range", "codes": [[5000], [1, 2], [1, 2, 3, 4]]},
        {"text": "", "codes": good[0]["codes"]},
        {"text": "no audio", "codes": [[], [], []]},
    ]
    path = write_jsonl(tmp_path / "rows.jsonl", good + bad)
    config = write_config(tmp_path / "c.yaml", tmp_path / "run", source={"path": str(path)}, eval=str(path))
    with pytest.raises(ConfigError) as failed:
        load_task(config).data.build_sequences()
    message = str(failed.value)
    for row, words in ((3, "unequal length"), (4, "outside 0..4095"), (5, "no text"), (6, "no audio")):
        assert f"rows.jsonl row {row}" in message and words in message, message
    assert "data.bad_samples" in message

    built = load_task(config, "data.bad_samples=skip").data.build_sequences()
    assert len(built.train) == 3 and built.notes["skipped rows"] == 8  # 4 in train + 4 in eval

    tokens = write_jsonl(tmp_path / "tokens.jsonl", [{"input_ids": [1, 2, 10**9]}, {"input_ids": [1, 2, 3]}])
    config = write_config(
        tmp_path / "t.yaml", tmp_path / "run", source={"path": str(tokens)}, format="tokens"
    )
    with pytest.raises(ConfigError) as failed:
        load_task(config).data.build_sequences()
    assert "token id 1000000000 is outside the vocabulary" in str(failed.value)
    assert "tokens.jsonl row 1: no audio" in str(failed.value)


def test_every_sample_too_long_fails_at_start_with_the_statistics(tmp_path, tiny_tts):
    config = write_config(
        tmp_path / "c.yaml", tmp_path / "run", source={"builtin": "tiny_speech"}, max_seq_length=32
    )
    proc = cli("train", str(config))
    assert proc.rc != 0
    assert "every sample is longer than max_seq_length=32" in proc.err and "median" in proc.err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_preset_that_does_not_match_the_tokenizer_is_refused_by_validate(tmp_path, tiny_tts):
    model = {"source": {"path": str(tiny_tts / "model")}, "special_tokens": {"preset": "llama3"}}
    config = write_config(
        tmp_path / "c.yaml", tmp_path / "run", model=model, source={"builtin": "tiny_speech"}
    )
    proc = cli("validate", str(config))
    assert proc.rc != 0
    assert "preset 'llama3' puts the new tokens after 128256 base ids" in proc.err
    assert "base vocabulary has 320" in proc.err and "start_of_text 128000" in proc.err


def test_tokenizer_extension_is_one_checked_block_and_idempotent(tmp_path, tiny_tts):
    from transformers import AutoTokenizer

    from framer_ds.config.schema import StrictModel  # noqa: F401  (schema import order)
    from framer_ds.tasks.tts_lm import vocabulary
    from framer_ds.tasks.tts_lm.config import SpecialTokenOptions

    tokenizer = AutoTokenizer.from_pretrained(tiny_tts / "model")
    special = vocabulary.special_tokens(SpecialTokenOptions(), tokenizer)
    assert vocabulary.extend_tokenizer(tokenizer) == vocabulary.ADDED_TOKENS
    assert special.start_of_speech == 321 and special.audio_start == 330 and special.pad == 327
    assert tokenizer.convert_tokens_to_ids("<custom_token_10>") == special.audio_start
    tokenizer.save_pretrained(tmp_path / "extended")
    again = AutoTokenizer.from_pretrained(tmp_path / "extended")
    assert vocabulary.extend_tokenizer(again) == 0  # an extended tokenizer (Orpheus-style) is kept
    assert vocabulary.special_tokens(SpecialTokenOptions(), again) == special
    custom = SpecialTokenOptions(preset="custom", tokenizer_length=320, end_of_text=1)
    assert vocabulary.layout_problems(custom, again) == []


# --- audio files -> codes ----------------------------------------------------------------------------


def test_encode_audio_writes_a_resumable_cache_and_names_unreadable_files(tmp_path, tiny_tts):
    import soundfile

    from framer_ds.tasks.tts_lm.tiny import spoken

    clips = tmp_path / "clips"
    clips.mkdir()
    rows = []
    for index, text in enumerate(["hello world", "quick brown fox", "lazy dog"]):
        # 16 kHz stereo: the encoder resamples to the codec's 24 kHz and mixes down.
        wave = spoken(text, 16000)
        soundfile.write(clips / f"{index}.flac", np.stack([wave, wave], axis=1), 16000)
        rows.append({"text": text, "audio": f"clips/{index}.flac"})
    (clips / "broken.wav").write_bytes(b"RIFF not really a wav")
    rows.append({"text": "broken", "audio": "clips/broken.wav"})
    manifest = write_jsonl(tmp_path / "manifest.jsonl", rows)
    config = write_config(
        tmp_path / "c.yaml",
        tmp_path / "run",
        source={"path": str(manifest)},
        eval=str(manifest),
        format="audio",
        bad_samples="skip",
        encoded_dir=str(tmp_path / "codes"),
    )
    proc = cli("data", "encode-audio", str(config))
    assert proc.rc == 0, proc.err[-3000:]
    assert "3 encoded (3 this run), 1 failed" in proc.out and "broken.wav: cannot read audio" in proc.out
    shards = sorted((tmp_path / "codes").glob("*/shard_*.jsonl"))
    stamps = [s.stat().st_mtime_ns for s in shards]
    again = cli("data", "encode-audio", str(config))
    assert again.rc == 0 and [s.stat().st_mtime_ns for s in shards] == stamps  # reused

    task = load_task(config)
    built = task.data.build_sequences()
    assert len(built.train) == 3 and built.notes["skipped rows"] == 2
    entry = json.loads(shards[0].read_text().splitlines()[0])
    frames = len(entry["codes"][0])
    assert frames == int(np.ceil(len(spoken("hello world", 24000)) / 2048))
    assert [len(c) for c in entry["codes"]] == [frames, 2 * frames, 4 * frames]


# --- the mix of text and speech ----------------------------------------------------------------------


def test_text_speech_mix_follows_the_ramp_and_is_split_once_between_ranks():
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    from framer_ds.tasks.tts_lm.samplers import RatioMixSampler

    sampler = RatioMixSampler(60, 30, ratio_start=2.0, ratio_end=1.0, ramp_epochs=2.0, seed=3)
    order = list(sampler)
    assert len(order) == 90 and order == list(sampler)  # a pure function of (seed, epoch)
    text = [i >= 60 for i in order]
    assert sum(text[:30]) == pytest.approx(30 * 0.65, abs=1.5)  # ~2:1 at the start
    sampler.set_epoch(2)
    late = [i >= 60 for i in sampler]
    assert sum(late) == 45  # 1:1 once the ramp is over
    batches = BatchSampler(sampler, batch_size=3, drop_last=True)
    shards = [list(BatchSamplerShard(batches, 2, rank)) for rank in (0, 1)]
    interleaved = [i for pair in zip(*shards, strict=True) for batch in pair for i in batch]
    assert interleaved == list(sampler)  # every position once, on one rank


def test_loss_is_a_token_sum_whose_parts_add_up(tmp_path, tiny_tts):
    from framer_ds.tasks.tts_lm.token_sequences import IGNORE_INDEX

    task = load_task(write_config(tmp_path / "c.yaml", tmp_path / "run", source={"builtin": "tiny_speech"}))
    train, _ = task.build_datasets()
    batch = task.collate_fn()([train[0], train[1]])
    model = task.build_model()
    result = task.training_loss(model, batch)
    labels = batch["labels"][:, 1:]
    assert task.count_loss_items(batch) == (labels != IGNORE_INDEX).sum()
    text_sum, text_n = result.parts["loss_text"]
    audio_sum, audio_n = result.parts["loss_audio"]
    assert text_n + audio_n == task.count_loss_items(batch) and audio_n > text_n > 0
    torch.testing.assert_close(text_sum + audio_sum, result.loss)


# --- ZeRO-3 on 2 CPU processes ----------------------------------------------------------------------


def launch_tiny(strategy: str, root: Path, *overrides: str) -> Path:
    from conftest import abort_lines, accelerate_launch_cmd, launch_env, strategy_launch_args

    run_dir = root / "run"
    cmd = accelerate_launch_cmd(
        *strategy_launch_args(strategy, root), "-m", "framer_ds", "train", str(TINY), f"output_dir={run_dir}",
        "train.length.steps=6", "train.eval.every.steps=3", "train.checkpoint.every.steps=3",
        "model.samples.every=6",
        *overrides,
    )  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert not abort_lines(proc.stderr), proc.stderr[-4000:]
    return run_dir


@pytest.mark.distributed
@pytest.mark.timeout(900)
def test_tiny_config_under_zero3_offload_on_two_processes(tmp_path, tiny_tts):
    """Full fine-tune: embeddings resized inside ZeRO-3 init, samples generated with every rank in step
    (synced_gpus), and a complete model gathered into final/."""
    from safetensors.torch import load_file

    run_dir = launch_tiny("zero3_offload", tmp_path)
    train_lines, eval_lines = read_metrics(run_dir)
    assert train_lines[-1]["loss"] < train_lines[0]["loss"] and len(eval_lines) == 2
    assert len(list((run_dir / "samples" / "step_6").glob("*.wav"))) == 2
    weights = load_file(run_dir / "final" / "model.safetensors")
    assert weights["model.embed_tokens.weight"].shape[0] >= 320 + 7 * 4096 + 10
    assert min(t.numel() for t in weights.values()) > 0


@pytest.mark.distributed
@pytest.mark.timeout(900)
def test_lora_under_zero3_saves_trained_embeddings_and_head(tmp_path, tiny_tts):
    """The new token rows start untrained, so a LoRA adapter without its embeddings and head would be
    useless: both are trained (peft modules_to_save), gathered and saved non-empty."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run_dir = launch_tiny(
        "zero3",
        tmp_path,
        "model.lora.rank=4",
        "model.lora.export=adapter",
        "train.optimizer.learning_rate=1e-2",
    )
    final = run_dir / "final"
    adapter = load_file(final / "adapter_model.safetensors")
    assert min(t.numel() for t in adapter.values()) > 0
    embed = next(t for name, t in adapter.items() if "embed_tokens" in name)
    head = next(t for name, t in adapter.items() if "lm_head" in name)
    assert embed.shape == head.shape and embed.shape[0] >= 320 + 7 * 4096 + 10
    base = AutoModelForCausalLM.from_pretrained(tiny_tts / "model")
    base.resize_token_embeddings(embed.shape[0])
    assert not torch.equal(head[:320], base.get_output_embeddings().weight[:320])  # trained
    model = PeftModel.from_pretrained(base, final)
    assert model.get_input_embeddings().weight.shape == embed.shape


def test_lora_merged_export_loads_plainly_and_scores_as_trained(tmp_path, tiny_tts):
    """lora.export merged: final/ is a plain model whose eval loss equals the run's last eval/loss."""
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    overrides = [
        f"output_dir={run_dir}",
        "model.lora.rank=4",
        "train.length.steps=3",
        "model.samples.every=0",
    ]
    proc = cli("train", str(TINY), *overrides, "train.optimizer.learning_rate=1e-2")
    assert proc.rc == 0, proc.err[-4000:]
    final = run_dir / "final"
    assert not (final / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    task = load_task(TINY, *overrides)
    _, evaluation = task.build_datasets()
    collate = task.collate_fn()
    sums: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for start in range(0, len(evaluation), 2):
            values = task.eval_step(
                model, collate([evaluation[i] for i in range(start, min(start + 2, len(evaluation)))])
            )
            for name, value in values.items():
                sums[name] = sums.get(name, 0) + value.double().sum()
    expected = read_metrics(run_dir)[1][-1]["eval/loss"]
    assert task.summarize_eval(sums, len(evaluation))["eval/loss"] == pytest.approx(expected, rel=1e-5)


def test_a_resumed_epoch_replays_the_mix_order_after_the_skipped_batches():
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from framer_ds.tasks.tts_lm.samplers import RatioMixSampler

    def loader():
        sampler = RatioMixSampler(20, 10, 2.0, 1.0, 1.0, seed=5)
        prepared = Accelerator(cpu=True).prepare(
            DataLoader(list(range(30)), batch_size=3, sampler=sampler, drop_last=True)
        )
        prepared.set_epoch(1)
        return prepared

    full = [batch.tolist() for batch in loader()]
    resumed = Accelerator(cpu=True).skip_first_batches(loader(), 4)
    assert [batch.tolist() for batch in resumed] == full[4:]


def test_the_length_grouped_order_covers_the_training_set_it_is_given(tmp_path, tiny_tts):
    """`train_sampler(train_set)` reads the lengths from the set it is given (Task.train_sampler: every
    index of `train_set` once per epoch); it used those `build_datasets` left on the task, so a set
    `precompute` changed got an order of the wrong length, with indices outside it."""
    from framer_ds.tasks.tts_lm.samplers import LengthGroupedSampler
    from framer_ds.tasks.tts_lm.task import ItemDataset

    task = load_task(write_config(tmp_path / "c.yaml", tmp_path / "run", source={"builtin": "tiny_speech"}))
    train, _ = task.build_datasets()
    part = ItemDataset([train[i] for i in range(6)])
    sampler = task.train_sampler(part)
    assert isinstance(sampler, LengthGroupedSampler) and sorted(sampler) == list(range(6))
    assert sampler.lengths == [len(part[i]) for i in range(6)]


def test_fresh_model_from_config_with_text_mix_and_checkpointing(tmp_path, tiny_tts):
    from framer_ds.tasks.tts_lm.samplers import RatioMixSampler

    text = write_jsonl(tmp_path / "text.jsonl", [{"text": f"plain text number {i}"} for i in range(40)])
    model = {
        "source": {"config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1}},
        "tokenizer": str(tiny_tts / "model"),
    }  # fmt: skip
    config = write_config(
        tmp_path / "c.yaml",
        tmp_path / "run",
        model=model,
        source={"builtin": "tiny_speech"},
        group_by_length=False,
        text_mix={"path": str(text), "ratio_start": 2.0, "ratio_end": 1.0},
    )
    task = load_task(config, "train.gradient_checkpointing=true")
    train, _ = task.build_datasets()
    sampler = task.train_sampler(train)
    assert isinstance(sampler, RatioMixSampler) and len(sampler) == len(train) == 160 + 40
    built = task.build_model()
    assert getattr(built, "is_activation_checkpointing", None) or built.is_gradient_checkpointing
    assert built.get_input_embeddings().num_embeddings == len(task.assets.tokenizer)
    first_text = next(i for i in sampler if i >= 160)
    sequence = train[first_text]
    special = task.assets.special
    assert sequence.input_ids[0] == special.start_of_text and sequence.input_ids[-1] == special.end_of_text
    assert sequence.labels == sequence.input_ids  # text rows are learned whole, whatever loss_on says


def test_encode_audio_under_several_processes_is_refused_not_repeated():
    """`data encode-audio` took the launcher's shard and ignored it: 4 processes each encoded every file
    into the same cache. It encodes in one process; any other start is one line naming the fix."""
    from framer_ds.config.errors import ConfigError
    from framer_ds.tasks.tts_lm.commands import COMMANDS

    (encode,) = [c for c in COMMANDS if c.name == "encode-audio"]
    with pytest.raises(ConfigError, match=r"process 1 of 4: it encodes in one process.*without a launcher"):
        encode.run(None, (1, 4))  # refused before the task is touched
