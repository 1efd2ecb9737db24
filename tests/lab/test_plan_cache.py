"""`framer-ds plan` measures a config's census and activations once and reads them from
`$FRAMER_DS_CACHE/plan` after (lab/plan_inputs.py): the same figures, no probe; anything that can change
them - a config key, a file the config names, `--remeasure` - measures again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO, TINY_VIT_OVERRIDES
from framer_ds.cli.main import main
from framer_ds.lab import activations

pytestmark = pytest.mark.timeout(600)
CONFIG = str(REPO / "configs/quickstart.yaml")


def plan_json(capsys, *extra: str) -> dict:
    argv = ["plan", CONFIG, *TINY_VIT_OVERRIDES, *extra, "--gpus", "2", "--gpu-memory", "16GB", "--json"]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def measured_part(plan: dict) -> tuple:
    return plan["census"], plan["activations"], plan["strategies"], plan["recommendation"]


def forbid_probe(monkeypatch) -> None:
    def probe(*_, **__):
        raise AssertionError("the probe ran although the plan's inputs were cached")

    monkeypatch.setattr(activations, "probe_activations", probe)


def test_a_second_plan_reads_the_cache_and_prints_the_same_figures(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("FRAMER_DS_CACHE", str(tmp_path / "cache"))
    first = plan_json(capsys)
    assert first["inputs_cache"]["hit"] is False
    entry = Path(first["inputs_cache"]["path"])
    assert entry.is_file() and entry.parent == tmp_path / "cache" / "plan"

    with monkeypatch.context() as patch:
        forbid_probe(patch)
        second = plan_json(capsys)
        assert main(["plan", CONFIG, *TINY_VIT_OVERRIDES, "--gpus", "2", "--gpu-memory", "16GB"]) == 0
        assert f"census and activations read from {entry}" in capsys.readouterr().out
    assert second["inputs_cache"] == {"path": str(entry), "hit": True}
    assert measured_part(second) == measured_part(first)

    # other hardware, same inputs: still the cache
    with monkeypatch.context() as patch:
        forbid_probe(patch)
        hardware = ["--gpus", "8", "--gpu-memory", "80GB", "--json"]
        assert main(["plan", CONFIG, *TINY_VIT_OVERRIDES, *hardware]) == 0
        assert json.loads(capsys.readouterr().out)["inputs_cache"]["hit"] is True

    # a key that changes the activations is another entry, measured
    switched = plan_json(capsys, "train.gradient_checkpointing=true")
    assert switched["inputs_cache"]["hit"] is False and switched["inputs_cache"]["path"] != str(entry)
    assert switched["activations"]["configured"] != first["activations"]["configured"]

    # --remeasure measures and replaces the entry; an unreadable entry is measured again
    again = plan_json(capsys, "--remeasure")
    assert again["inputs_cache"]["hit"] is False and measured_part(again) == measured_part(first)
    entry.write_text('{"format": 1, "inputs": {"cen')
    repaired = plan_json(capsys)
    assert repaired["inputs_cache"]["hit"] is False and measured_part(repaired) == measured_part(first)
    assert json.loads(entry.read_text())["format"] == 1


def test_an_edited_file_the_config_names_is_measured_again(monkeypatch, tmp_path, capsys, tiny_tts):
    """The tiny Llama's config.json gains a layer: the census and the probe change with it."""
    monkeypatch.setenv("FRAMER_DS_CACHE", str(tmp_path / "cache"))
    model = shutil.copytree(tiny_tts / "model", tmp_path / "llama")
    config = str(REPO / "configs/tasks/tts_lm/tiny.yaml")
    overrides = [f"output_dir={tmp_path / 'run'}", "model.source.builtin=null", f"model.source.path={model}"]
    argv = ["plan", config, *overrides, "--gpus", "1", "--gpu-memory", "16GB", "--json"]

    assert main(argv) == 0
    before = json.loads(capsys.readouterr().out)
    with monkeypatch.context() as patch:
        forbid_probe(patch)
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out)["inputs_cache"]["hit"] is True
    architecture = json.loads((model / "config.json").read_text())
    architecture["num_hidden_layers"] += 1
    (model / "config.json").write_text(json.dumps(architecture))
    assert main(argv) == 0
    after = json.loads(capsys.readouterr().out)
    assert after["inputs_cache"]["hit"] is False
    assert after["census"]["trainable"] > before["census"]["trainable"]
    assert (
        after["activations"]["configured"]["per_sample_bytes"]
        > before["activations"]["configured"]["per_sample_bytes"]
    )
