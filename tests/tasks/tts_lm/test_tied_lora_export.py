"""A LoRA on a base whose head is tied to its input embedding (Granite 4.0, the lora_sft recipe's base)
exports its adapter. Found by `framer-ds smoke configs/tasks/tts_lm/lora_sft.yaml` (issue 47): with
tie_word_embeddings peft wraps the embedding and the head in one tied copy, `named_parameters()` lists
that weight once, and peft's save looked up the head's name in the gathered state dict: KeyError
'modules_to_save.default.weight' while writing final/, after the whole training."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, train_in_process

TINY = REPO / "configs" / "tasks" / "tts_lm" / "tiny.yaml"


@pytest.mark.parametrize("export", ["adapter", "merged"])
def test_lora_on_a_tied_base_exports_final(tmp_path: Path, tiny_tts: Path, export: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tmp_path / "tied"
    model = AutoModelForCausalLM.from_pretrained(tiny_tts / "model")
    model.config.tie_word_embeddings = True
    model.get_output_embeddings().weight = model.get_input_embeddings().weight
    model.save_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    AutoTokenizer.from_pretrained(tiny_tts / "model").save_pretrained(base)
    run = tmp_path / "run"
    overrides = [f"output_dir={run}", f"model.source.path={base}", f"model.codec.path={tiny_tts / 'codec'}"]
    overrides += ["model.lora.rank=4", f"model.lora.export={export}", "train.length.steps=1"]
    overrides += ["model.samples.every=0", "train.eval.every=null", "train.checkpoint.every=null"]
    train_in_process(TINY, overrides)
    final = run / "final"
    if export == "adapter":
        from peft import PeftModel
        from safetensors.torch import load_file

        adapter = load_file(str(final / "adapter_model.safetensors"))
        rows = next(t for name, t in adapter.items() if "embed_tokens" in name).shape[0]
        assert rows > model.get_input_embeddings().weight.shape[0]  # the recipe's tokens were added
        model.resize_token_embeddings(rows)
        loaded = PeftModel.from_pretrained(model, final)
        assert loaded.get_input_embeddings().weight.shape[0] == rows
    else:
        merged = AutoModelForCausalLM.from_pretrained(final)
        assert merged.get_output_embeddings().weight.shape == merged.get_input_embeddings().weight.shape
