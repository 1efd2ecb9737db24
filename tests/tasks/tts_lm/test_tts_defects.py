"""Issue 37 section 4, each as a user meets it: a custom special-token preset, a padded vocab_size,
samples without a codec, a sampling failure mid-run, `sample --codec` at a missing path."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tts_lm import load_task, write_config

from framer_ds.config.errors import ConfigError

FRESH = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip


def task_for(tmp_path: Path, model: dict):
    return load_task(
        write_config(tmp_path / "c.yaml", tmp_path / "run", model=model, source={"builtin": "tiny_speech"})
    )


def test_a_custom_preset_takes_its_ids_as_given(tmp_path, tiny_tts):
    """end_of_text 9 is a plain token of the tiny tokenizer (its specials are 0 and 1): a named preset
    finding it so means another base, but 'custom' was refused with "use preset 'auto' or 'custom'"."""
    special = {"preset": "custom", "tokenizer_length": 320, "start_of_text": 0, "end_of_text": 9}
    task = task_for(tmp_path, {"source": {"path": str(tiny_tts / "model")}, "special_tokens": special})
    assert task.check() == []
    assert (task.assets.special.start_of_text, task.assets.special.end_of_text) == (0, 9)


def test_a_fresh_model_vocab_size_pads_the_embeddings_or_is_refused(tmp_path, tiny_tts):
    tokenizer = str(tiny_tts / "model")
    padded = task_for(
        tmp_path, {"source": {"config": {**FRESH, "vocab_size": 29056}}, "tokenizer": tokenizer}
    )
    assert padded.check() == []
    length = len(padded.assets.tokenizer)
    assert length == 320 + 7 * 4096 + 10 < 29056
    assert padded.build_model().get_input_embeddings().num_embeddings == 29056  # crashed: vocab_size twice

    small = task_for(tmp_path, {"source": {"config": {**FRESH, "vocab_size": 1000}}, "tokenizer": tokenizer})
    (problem,) = small.check()
    assert problem.where == "model.source.config.vocab_size"
    assert f"1000 is smaller than the extended tokenizer's {length} tokens" in problem.message


def test_samples_without_a_codec_are_refused_at_validate(tmp_path, tiny_tts):
    model = {"source": {"path": str(tiny_tts / "model")}, "samples": {"every": 1}}
    (problem,) = task_for(tmp_path, model).check()
    assert problem.where == "model.samples.every" and "model.codec.path" in problem.message


def test_a_sampling_failure_mid_run_is_one_line_and_training_goes_on(tmp_path, tiny_tts, capsys):
    from accelerate import Accelerator

    model = {
        "source": {"builtin": "tiny_llama"},
        "samples": {"every": 1, "max_new_tokens": 7, "min_new_tokens": 0},
    }
    task = task_for(tmp_path, model)
    built = task.build_model()

    def broken_codec(device):
        raise OSError("SNAC weights unreadable")

    task.assets.codec = broken_codec
    built.train()
    written = task.write_samples(Accelerator(cpu=True), built, 3, tmp_path / "samples")
    assert written == [] and built.training
    assert (
        "sample: step 3 failed, training goes on: OSError: SNAC weights unreadable" in capsys.readouterr().out
    )


def test_sample_with_a_missing_codec_path_is_one_line(tmp_path, tiny_tts):
    from framer_ds.tasks.tts_lm.inference import TtsSampleCommandOptions, sample_command, write_layout_record

    task = task_for(tmp_path, {"source": {"builtin": "tiny_llama"}})
    export = tmp_path / "final"
    export.mkdir()
    write_layout_record(export, task.assets)
    options = TtsSampleCommandOptions(text=["hi"], codec=tmp_path / "no_such_snac")
    with pytest.raises(ConfigError, match="no_such_snac is not a SNAC directory"):
        sample_command(task.config, export, options)
