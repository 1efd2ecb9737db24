"""A missing or broken optional package is named with what needs it and how to install it, at the point
of use, and a run that does not need it never fails for it. Each case puts a fake package first on
PYTHONPATH of a real `python -m framer_ds` process (a missing one raises ImportError on import, a
broken one fails the way torchvision built for another torch does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, TINY_VIT_OVERRIDES


def fake_package(root: Path, name: str, error: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"raise {error}\n")
    return root


def framer_ds(fakes: Path, *argv: str, **extra_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fakes), str(REPO / "tests")]), **extra_env}
    return subprocess.run(
        [sys.executable, "-m", "framer_ds", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def quickstart(tmp_path: Path, *overrides: str) -> list[str]:
    return [
        "train",
        "configs/quickstart.yaml",
        f"output_dir={tmp_path / 'run'}",
        *TINY_VIT_OVERRIDES,
        "train.length.steps=2",
        *overrides,
    ]


def test_without_av_the_image_task_runs_and_the_video_task_names_it(tmp_path):
    fakes = fake_package(tmp_path / "fakes", "av", 'ImportError("No module named av")')
    listed = framer_ds(fakes, "tasks")
    assert listed.returncode == 0 and "video_lora" in listed.stdout
    assert framer_ds(fakes, *quickstart(tmp_path)).returncode == 0
    # A cache of its own: with the session's, the clips and their metadata already exist and reading the
    # index needs no decoder (a report from cached metadata is fine); here the clips must be made.
    cache = str(tmp_path / "cache")
    video = framer_ds(fakes, "data", "check", "configs/tasks/video_lora/tiny.yaml", FRAMER_DS_CACHE=cache)
    assert video.returncode == 1
    assert "package av is required for" in video.stderr and "pip install 'av>=12'" in video.stderr
    assert "Traceback" not in video.stderr


def test_without_wandb_a_wandb_run_stops_before_training(tmp_path):
    fakes = fake_package(tmp_path / "fakes", "wandb", 'ImportError("No module named wandb")')
    proc = framer_ds(fakes, *quickstart(tmp_path, "log.wandb.offline=true"))
    assert proc.returncode == 1
    assert "package wandb is required for W&B logging (log.wandb)" in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_torchvision_built_for_another_torch_is_named_up_front(tmp_path):
    """transformers imports torchvision whenever it is installed; PyPI's torchvision beside another torch
    build fails with this error, which would break every command."""
    error = 'RuntimeError("operator torchvision::nms does not exist")'
    fakes = fake_package(tmp_path / "fakes", "torchvision", error)
    proc = framer_ds(fakes, *quickstart(tmp_path))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "torchvision is installed but does not load" in proc.stderr
    assert "pip uninstall torchvision" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
