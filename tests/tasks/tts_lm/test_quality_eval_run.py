"""Issue 37 section 3 end to end: a tiny tts_lm run (the tiny random Llama and tiny SNAC the tests build)
logs the quality gates at the evaluations `model.quality_eval.every` picks, and `framer-ds eval` writes
them into eval.json. A random model's values are garbage; what is checked is that the metrics are
there, in their ranges, and that the export scores what the trained model scored.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from test_tts_lm import TINY

from conftest import REPO, accelerate_launch_cmd, launch_env, read_metrics
from framer_ds.cli.main import main
from framer_ds.tasks.run_config import load_run_config
from framer_ds.train.loop import run_training

GATES = ("eval/wer", "eval/speaker_similarity", "eval/eos_rate", "eval/seconds_per_text_token")
COUNT, MAX_NEW_TOKENS = 2, 35  # 5 frames at most: ~0.4 s of speech per text


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> Path:
    """2 steps, an evaluation after each, the gates at every 2nd: only the step-2 evaluation has them."""
    run_dir = tmp_path_factory.mktemp("quality") / "run"
    overrides = [
        f"output_dir={run_dir}",
        "train.length.steps=2",
        "train.eval.every.steps=1",
        "train.checkpoint.every=null",
        "model.samples.every=0",
        "model.quality_eval.every=2",
        f"model.quality_eval.count={COUNT}",
        f"model.quality_eval.max_new_tokens={MAX_NEW_TOKENS}",
    ]
    run_training(load_run_config(TINY, overrides))
    return run_dir


def check_ranges(metrics: dict) -> None:
    assert 0.0 <= metrics["eval/eos_rate"] <= 1.0
    assert (metrics["eval/eos_rate"] * COUNT).is_integer()  # a fraction of COUNT generations
    assert metrics["eval/wer"] >= 0.0  # insertions can take it above 1
    assert -1.0 <= metrics["eval/speaker_similarity"] <= 1.0
    seconds = metrics["eval/seconds_per_text_token"]
    assert 0.0 < seconds <= MAX_NEW_TOKENS / 7 * 2048 / 24000  # at most 5 frames per text, >= 1 token each
    assert all(math.isfinite(metrics[name]) for name in GATES)


@pytest.mark.slow  # the module fixture builds the tiny set and trains: ~75 s on 2 busy cores
@pytest.mark.timeout(900)
def test_training_logs_the_gates_at_every_nth_evaluation(run):
    _, evaluations = read_metrics(run)
    assert [line["step"] for line in evaluations] == [1, 2]
    assert not set(GATES) & set(evaluations[0])  # the 1st evaluation: quality_eval.every=2 skips it
    check_ranges(evaluations[1])


@pytest.mark.slow  # the module fixture builds the tiny set and trains: ~75 s on 2 busy cores
@pytest.mark.timeout(900)
def test_framer_ds_eval_writes_the_gates_the_trained_model_scored(run, capsys):
    """The export is the trained fp32 weights and generation is seeded, so `framer-ds eval` speaks the
    same tokens and scores the same numbers as the run's last evaluation."""
    assert main(["eval", str(run)]) == 0, capsys.readouterr().err[-3000:]
    assert f"quality: {COUNT} held-out texts spoken" in capsys.readouterr().out
    metrics = json.loads((run / "eval.json").read_text())["metrics"]
    check_ranges(metrics)
    logged = read_metrics(run)[1][-1]
    for name in GATES:
        assert metrics[name] == pytest.approx(logged[name], rel=1e-6), name


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_processes_score_the_gates_as_one(run):
    """`accelerate launch --num_processes 2` (DDP on CPU): both ranks speak the same texts, rank 0 scores
    and hands the metrics over, so eval.json holds the numbers one process logged, exactly."""
    cmd = accelerate_launch_cmd("--multi_gpu", "--num_processes", "2", "-m", "framer_ds", "eval", str(run))
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads((run / "eval.json").read_text())
    logged = read_metrics(run)[1][-1]
    assert report["processes"] == 2
    assert {name: report["metrics"][name] for name in GATES} == {name: logged[name] for name in GATES}
