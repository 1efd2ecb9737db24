"""`model.interp_eval`: held-out clips sampled from their first and last frames and scored in the eval
loop, the same on 1 and 2 processes (each clip has its own seed; totals are summed over ranks)."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from conftest import REPO, accelerate_launch_cmd, launch_env, read_metrics, strategy_launch_args
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.video_lora.task import VideoLoraTask
from framer_ds.train.loop import run_training

TINY = REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml"
METRICS = ("psnr", "psnr_mid", "ssim", "psnr_ends", "flicker_ratio", "clip_distance")
pytestmark = pytest.mark.timeout(600)

INTERP_ARGS = [
    "train.max_steps=1",
    "train.warmup_steps=5",  # the one step runs at warmup's lr 0: 1 and 2 processes evaluate the same model
    "train.eval_every=null",
    "train.checkpoint_every=null",
    "model.samples.every=0",
    "model.interp_eval.enabled=true",
    "model.interp_eval.num_inference_steps=2",
    "data.num_frames=3",
    "data.hflip=false",
]


def final_eval(run_dir) -> dict:
    _, eval_lines = read_metrics(run_dir)
    return eval_lines[-1]


def test_interp_eval_reports_every_metric_at_the_evaluation(tmp_path, capsys):
    config = load_run_config(TINY, [f"output_dir={tmp_path / 'run'}", *INTERP_ARGS])
    run_training(config)
    line = final_eval(tmp_path / "run")
    for name in METRICS:
        assert math.isfinite(line[f"eval/{name}"]), (name, line)
    assert 0 < line["eval/psnr"] < 100 and -1 <= line["eval/ssim"] <= 1
    assert "eval/loss" in line and not any("flicker_energy" in k for k in line)
    assert "eval/lpips skipped" in capsys.readouterr().out


def test_interp_eval_problems_are_named(tmp_path):
    config = load_run_config(
        TINY, [f"output_dir={tmp_path / 'run'}", *INTERP_ARGS, "data.num_frames=2", "data.cache.enabled=true"]
    )
    problems = [p.message for p in VideoLoraTask(config).check()]
    assert any("num_frames >= 3" in m for m in problems) and any("data.cache" in m for m in problems)
    with pytest.raises(ConfigError):
        load_run_config(TINY, [f"output_dir={tmp_path}", "model.interp_eval.enabeld=true"])


def test_eval_command_reproduces_the_runs_final_evaluation(tmp_path, capsys, monkeypatch):
    """`framer-ds eval RUN`: the export loaded into a fresh model, evaluated on the run's held-out clips,
    gives the metrics the run logged at its end; RUN/eval.json holds them."""
    from framer_ds.cli.main import main

    run = tmp_path / "run"
    overrides = [*INTERP_ARGS, "train.max_steps=3", "train.warmup_steps=0", "train.learning_rate=0.01"]
    overrides += ["train.best_metric=eval/psnr", "train.best_mode=max"]  # a metric of its own keeps best/
    config = load_run_config(TINY, [f"output_dir={run}", *overrides])
    run_training(config)
    logged = final_eval(run)
    assert main(["eval", str(run)]) == 0
    assert "eval.json" in capsys.readouterr().out
    report = json.loads((run / "eval.json").read_text())
    assert report["processes"] == 1 and report["eval_examples"] == 2
    for name, value in report["metrics"].items():
        assert value == pytest.approx(logged[name], rel=1e-4, abs=1e-6), name
    assert json.loads((run / "best" / "best.json").read_text())["metric"] == "eval/psnr"
    assert main(["eval", str(run), "--export", "best"]) == 0
    best = json.loads((run / "eval_best.json").read_text())["metrics"]
    assert best["eval/psnr"] == pytest.approx(
        report["metrics"]["eval/psnr"], rel=1e-4
    )  # one eval: same model
    assert main(["eval", str(tmp_path / "nowhere")]) == 1
    monkeypatch.setattr(VideoLoraTask, "load_export", lambda self, model, export_dir: None)
    assert main(["eval", str(run)]) == 0  # the base model: the export's weights did make the difference
    untrained = json.loads((run / "eval.json").read_text())["metrics"]
    assert untrained["eval/loss"] != pytest.approx(report["metrics"]["eval/loss"], rel=1e-3)


@pytest.mark.distributed
def test_interp_eval_is_the_same_on_one_and_two_processes(tmp_path):
    """ZeRO-3 on 2 CPU processes vs 1 (every sampling forward a collective, every tensor partitioned):
    the held-out clips split between ranks (an odd count, so one rank repeats a clip that
    gather_for_metrics drops) and every metric mean is the same; then `framer-ds eval` on 2 DDP
    processes gives the same numbers again."""
    results = {}
    for strategy in ("single", "zero3"):
        run = tmp_path / strategy
        cmd = accelerate_launch_cmd(
            *strategy_launch_args(strategy, tmp_path),
            "-m",
            "framer_ds",
            "train",
            str(TINY),
            f"output_dir={run}",
            *INTERP_ARGS,
            "data.val_fraction=0.375",  # 3 of the 8 clips
        )
        proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=280)
        assert proc.returncode == 0, proc.stderr[-5000:]
        results[strategy] = final_eval(run)
    for name in (*METRICS, "loss"):  # eval/loss too: its noise is drawn per clip, whatever the batching
        assert results["zero3"][f"eval/{name}"] == pytest.approx(results["single"][f"eval/{name}"], rel=1e-4)
    # `framer-ds eval` of the single-process run's export on 2 processes: the same numbers again
    cmd = accelerate_launch_cmd(
        *strategy_launch_args("ddp", tmp_path), "-m", "framer_ds", "eval", str(tmp_path / "single")
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads((tmp_path / "single" / "eval.json").read_text())
    assert report["processes"] == 2 and report["eval_examples"] == 3
    for name in METRICS:
        assert report["metrics"][f"eval/{name}"] == pytest.approx(results["single"][f"eval/{name}"], rel=1e-4)
