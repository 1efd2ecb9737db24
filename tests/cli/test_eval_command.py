"""`framer-ds eval RUN` for every task: the export loaded into the model training builds, scored on the
run's held-out data, gives the numbers the run logged at its end; eval.json holds the metrics and the
per-class breakdown; 1 and 2 processes give the same numbers (every metric is a ratio of totals summed
over the ranks). video_lora's eval is tested in test_interp_eval.py."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import REPO, TINY_VIT_OVERRIDES, accelerate_launch_cmd, launch_env, read_metrics
from framer_ds.cli.main import main
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.drivable_vit.losses import eval_counts, per_class_table, summarize_counts
from framer_ds.tasks.run_config import load_run_config
from framer_ds.train.loop import run_training

QUICKSTART = REPO / "configs" / "quickstart.yaml"
DRIVABLE = REPO / "configs" / "tasks" / "drivable_vit" / "tiny.yaml"
TTS = REPO / "configs" / "tasks" / "tts_lm" / "tiny.yaml"

# The final evaluation covers the whole held-out set (as `framer-ds eval` does), after a few steps.
VIT_RUN = [*TINY_VIT_OVERRIDES, "train.length.steps=4", "train.eval.max_batches=null"]
DRIVABLE_RUN = [
    "train.length.steps=3",
    "train.eval.every=null",
    "train.checkpoint.every=null",
    "model.samples.every=0",
    "train.lr_schedule.warmup=null",
]
TTS_RUN = [
    "train.length.steps=2",
    "train.eval.every=null",
    "train.checkpoint.every=null",
    "model.samples.every=0",
    "model.quality_eval.enabled=false",  # the gates' own test: tts_lm/test_quality_eval_run.py
]


def train_run(config_path: Path, run_dir: Path, overrides: list[str]) -> Path:
    run_training(load_run_config(config_path, [f"output_dir={run_dir}", *overrides]))
    return run_dir


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory) -> Path:
    return train_run(QUICKSTART, tmp_path_factory.mktemp("vit") / "run", VIT_RUN)


@pytest.fixture(scope="module")
def drivable_run(tmp_path_factory) -> Path:
    return train_run(DRIVABLE, tmp_path_factory.mktemp("drivable") / "run", DRIVABLE_RUN)


def eval_report(run_dir: Path, *args: str) -> dict:
    assert main(["eval", str(run_dir), *args]) == 0
    return json.loads((run_dir / "eval.json").read_text())


def assert_same_metrics(report: dict, logged: dict, rel: float) -> None:
    assert report["metrics"], report
    for name, value in report["metrics"].items():
        assert value == pytest.approx(logged[name], rel=rel, abs=1e-9), name


def test_vit_eval_reproduces_the_final_evaluation_with_per_class_accuracy(vit_run, capsys):
    """Same model, data, batches and arithmetic as the run's last evaluation: equal to float64 rounding.
    The per-class table sums back to the overall accuracy; a model without the export's weights scores
    differently (the weights were loaded, not the fresh initialisation)."""
    logged = read_metrics(vit_run)[1][-1]
    report = eval_report(vit_run)
    assert "eval.json" in capsys.readouterr().out
    assert report["task"] == "vit_classification" and report["processes"] == 1
    assert report["evaluated_examples"] == report["eval_examples"] > 0
    assert_same_metrics(report, logged, rel=1e-9)
    assert {"eval/loss", "eval/accuracy", "eval/mean_class_accuracy"} <= set(report["metrics"])
    table = report["per_class"]
    assert sorted(table) == [str(digit) for digit in range(10)]
    assert sum(row["examples"] for row in table.values()) == report["eval_examples"]
    hits = sum(row["accuracy"] * row["examples"] for row in table.values())
    assert hits / report["eval_examples"] == pytest.approx(report["metrics"]["eval/accuracy"], rel=1e-12)
    balanced = sum(row["accuracy"] for row in table.values()) / 10
    assert balanced == pytest.approx(report["metrics"]["eval/mean_class_accuracy"], rel=1e-12)


def test_eval_of_a_fresh_model_differs_so_the_export_is_what_was_scored(vit_run, monkeypatch):
    from framer_ds.tasks.vit_classification.task import VitClassificationTask

    trained = eval_report(vit_run)["metrics"]["eval/loss"]
    monkeypatch.setattr(VitClassificationTask, "load_export", lambda self, model, export_dir: model)
    assert eval_report(vit_run)["metrics"]["eval/loss"] != pytest.approx(trained, rel=1e-3)


def test_an_export_that_does_not_fit_is_one_line_naming_the_fix(vit_run, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from framer_ds.engine.export_load import load_full_export
    from framer_ds.tasks.registry import get_task_class

    broken = tmp_path / "final"
    broken.mkdir()
    weights = load_file(vit_run / "final" / "model.safetensors")
    save_file({f"renamed.{k}": v for k, v in weights.items()}, broken / "model.safetensors")
    shutil.copy(vit_run / "final" / "config.json", broken)
    config = load_run_config(vit_run / "config.yaml")
    task = get_task_class(config.task)(config)
    with pytest.raises(ConfigError, match="does not fit the recorded config's model"):
        load_full_export(task.build_model(), broken)
    with pytest.raises(ConfigError, match=r"no config\.json here"):
        load_full_export(task.build_model(), tmp_path)


def test_drivable_eval_reproduces_the_final_evaluation_with_iou_per_class(drivable_run):
    logged = read_metrics(drivable_run)[1][-1]
    report = eval_report(drivable_run)
    assert report["task"] == "drivable_vit"
    assert_same_metrics(report, logged, rel=1e-9)
    metrics, table = report["metrics"], report["per_class"]
    assert table["road"]["iou"] == pytest.approx(metrics["eval/iou"], rel=1e-12)
    assert table["background"]["iou"] == pytest.approx(metrics["eval/iou_background"], rel=1e-12)
    both = (metrics["eval/iou"] + metrics["eval/iou_background"]) / 2
    assert metrics["eval/mean_iou"] == pytest.approx(both, rel=1e-12)
    road = table["road"]["pixels"] / (table["road"]["pixels"] + table["background"]["pixels"])
    assert road == pytest.approx(metrics["eval/road_fraction"], rel=1e-12)


def test_iou_per_class_is_summed_intersections_over_summed_unions():
    """Two 1 x 4-pixel samples. Background: A truth {0,1,3}, predicted {0,1,3} (I 3, U 3); B truth {3},
    predicted {1,2} (I 0, U 3): the set's background IoU is (3 + 0) / (3 + 3) = 0.5 (a mean of the
    per-sample ratios would say 0.5 too, so the road class checks the sums: (1 + 1) / (1 + 4) = 0.4,
    not 0.625). The mean IoU is over both classes; a class in no mask and no prediction is left out."""
    masks = torch.tensor([[0, 0, 1, 0], [1, 1, 1, 0]], dtype=torch.float32).view(2, 1, 1, 1, 4)
    logits = torch.tensor([[-5, -5, 5, -5], [5, -5, -5, 5]], dtype=torch.float32).view(2, 1, 1, 1, 4)
    counts = eval_counts(logits, masks)
    assert counts["background_intersection"].tolist() == [3, 0]
    assert counts["background_union"].tolist() == [3, 3]
    metrics = summarize_counts(counts, dice_weight=0.0)
    assert metrics["eval/iou_background"] == pytest.approx(0.5)
    assert metrics["eval/iou"] == pytest.approx(0.4)
    assert metrics["eval/mean_iou"] == pytest.approx(0.45)
    assert per_class_table(counts) == {
        "background": {"iou": pytest.approx(0.5), "pixels": 4},
        "road": {"iou": pytest.approx(0.4), "pixels": 4},
    }
    no_road = eval_counts(-torch.ones(1, 1, 1, 1, 4), torch.zeros(1, 1, 1, 1, 4))
    only_background = summarize_counts(no_road, 0.0)
    assert math.isnan(only_background["eval/iou"]) and only_background["eval/mean_iou"] == 1.0
    assert per_class_table(no_road)["road"] == {"iou": None, "pixels": 0}  # JSON has no NaN


class OneHotHead(torch.nn.Module):
    """An output head whose logits are 10 x one_hot of the guess carried in the hidden state."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(hidden[..., 0].long(), self.vocab).float() * 10


class FixedLogits(torch.nn.Module):
    """A 'language model' whose next-token guess is given: the logits of `guesses` [B, L]. Its final
    hidden state carries the guess and its head turns it into logits, as tts_lm's chunked loss reads a
    causal LM (hidden states + `get_output_embeddings()`, the logits of the last position only)."""

    def __init__(self, guesses: torch.Tensor, vocab: int):
        super().__init__()
        self.hidden = guesses[..., None].float()
        self.head = OneHotHead(vocab)
        self.config = type("Config", (), {})()

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, logits_to_keep: int = 0, **inputs):
        logits = self.head(self.hidden[:, -logits_to_keep:])
        return type("Output", (), {"logits": logits, "hidden_states": (self.hidden,)})()


def test_tts_audio_accuracy_counts_only_positions_whose_label_is_an_audio_token(tmp_path):
    """Labels (after the shift): 2 text tokens, 3 audio tokens, 1 ignored. The model gets both text
    tokens and 1 of 3 audio tokens right: audio_top1 = 1/3, whatever it does on text."""
    from framer_ds.tasks.registry import get_task_class
    from framer_ds.tasks.tts_lm.tiny import ensure_tiny_tts

    ensure_tiny_tts()
    config = load_run_config(TTS, [f"output_dir={tmp_path / 'run'}"])
    task = get_task_class("tts_lm")(config)
    layout = task.assets.layout
    audio = [layout.audio_start + 1, layout.audio_start + 4096 + 2, layout.audio_start + 2 * 4096 + 3]
    labels = torch.tensor([[0, 5, 6, *audio, -100]])  # the first is the shifted-away position
    guesses = torch.tensor([[5, 6, audio[0], audio[1] + 1, audio[2] + 1, 0, 0]])
    vocab = layout.audio_start + 7 * 4096
    batch = {"input_ids": labels.clamp(min=0), "labels": labels}
    sums = {k: v.double().sum(0) for k, v in task.eval_step(FixedLogits(guesses, vocab), batch).items()}
    metrics = task.summarize_eval(sums, 1)
    assert metrics["eval/audio_top1"] == pytest.approx(1 / 3)
    assert int(sums["tokens"]) == 5 and int(sums["audio_tokens"]) == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    "form",
    [
        pytest.param(["model.lora.rank=4", "model.lora.export=adapter"], id="lora_adapter"),
        pytest.param(["model.lora.rank=4", "model.lora.export=merged"], id="lora_merged"),
    ],
)
def test_tts_eval_reproduces_the_final_evaluation_for_each_export_form(tmp_path, form):
    """An adapter (loaded into the peft model with its trained embeddings and head) and a merged adapter
    (the export is the model) score as the run's last evaluation (a full fine-tune loads as vit's
    transformers model does). The merged model computes the same function with differently rounded
    weights (W + B A summed once into float32, ~1e-7 relative per weight): equal to 1e-5."""
    from framer_ds.tasks.tts_lm.tiny import ensure_tiny_tts

    ensure_tiny_tts()
    run = train_run(TTS, tmp_path / "run", [*TTS_RUN, "train.optimizer.learning_rate=1e-2", *form])
    logged = read_metrics(run)[1][-1]
    report = eval_report(run)
    assert {"eval/loss", "eval/loss_audio", "eval/audio_top1"} <= set(report["metrics"])
    assert_same_metrics(report, logged, rel=1e-5 if "merged" in " ".join(form) else 1e-9)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("run_fixture", ["vit_run", "drivable_run"])
def test_two_processes_give_the_same_numbers_as_one(run_fixture, request):
    """`accelerate launch --num_processes 2` (DDP on CPU): the held-out set is split between the ranks
    (the padding duplicates dropped). Per-class counts, intersections and unions are sums of integers:
    equal exactly. Losses are float32 per sample from forwards over batches of other rows (a kernel may
    reduce in another order: ~1e-7 relative per sample), summed in float64: equal to 1e-5."""
    run_dir = request.getfixturevalue(run_fixture)
    single = eval_report(run_dir)
    cmd = accelerate_launch_cmd(
        "--multi_gpu", "--num_processes", "2", "-m", "framer_ds", "eval", str(run_dir)
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-5000:]
    double = json.loads((run_dir / "eval.json").read_text())
    assert double["processes"] == 2 and double["evaluated_examples"] == single["evaluated_examples"]
    assert double["per_class"] == single["per_class"]  # counts and their ratios: exactly
    for name, value in single["metrics"].items():
        exact = "loss" not in name and name != "eval/bce"
        assert double["metrics"][name] == pytest.approx(value, rel=0 if exact else 1e-5), name
