"""What framer_ds writes gets the mode a plain `open()` / `mkdir()` gives under the user's umask (issue 45
§6): files 0o666 & ~umask, directories 0o777 & ~umask, whichever library wrote them.

Before: safetensors (0.8) writes every `.safetensors` file through a private temporary file (0600) that
it renames, and `tempfile.mkstemp` / `mkdtemp` give 0600 / 0700, so checkpoints, `final/`, `best/` and
exports were readable by their owner only while the JSON beside them was 0644. Every task's run
directory and exports are checked under umask 022 by the contract suite (tests/tasks/test_task_contract.py);
here: the atomic writers themselves, and a whole run of the test task under umask 022 and 077.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from conftest import train_in_process, umask, wrong_modes
from framer_ds.storage.atomic import atomic_file, building_dir, publish_dir
from framer_ds.storage.file_modes import process_umask

MASKS = [0o022, 0o077, 0o027]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", MASKS, ids=oct)
def test_an_atomic_file_gets_the_umask_mode_whatever_wrote_it(tmp_path, mask):
    """safetensors' own writer (a private 0600 temporary file, renamed) through `atomic_file`."""
    with umask(mask):
        with atomic_file(tmp_path / "entry.safetensors") as tmp:
            save_file({"x": torch.zeros(2)}, str(tmp))
        with atomic_file(tmp_path / "private.bin") as tmp:
            fd, name = tempfile.mkstemp(dir=tmp_path)  # 0600 whatever the umask
            os.close(fd)
            os.replace(name, tmp)
    assert mode(tmp_path / "entry.safetensors") == 0o666 & ~mask
    assert mode(tmp_path / "private.bin") == 0o666 & ~mask


@pytest.mark.parametrize("mask", MASKS, ids=oct)
def test_a_published_directory_gets_the_umask_modes_inside(tmp_path, mask):
    """`publish_dir` (checkpoints, final/, best/, caches, exports): a mkdtemp directory (0700) with a
    safetensors file inside, a mkstemp file (0600), and the staging directory itself."""
    target = tmp_path / "final"
    with umask(mask):
        with building_dir(target) as staging:
            save_file({"x": torch.zeros(2)}, str(staging / "model.safetensors"))
            inner = Path(tempfile.mkdtemp(dir=staging))
            save_file({"x": torch.zeros(2)}, str(inner / "adapter_model.safetensors"))
            tempfile.mkstemp(dir=staging, suffix=".json")
            os.chmod(staging, 0o700)
        assert publish_dir(staging, target)
    assert wrong_modes(target, mask) == []


def test_the_umask_is_read_without_changing_it(tmp_path):
    """Read from /proc/self/status where Linux has it, so no other thread ever runs under a borrowed
    umask; it follows a umask set after import."""
    with umask(0o027):
        assert process_umask() == 0o027
        assert os.umask(0o027) == 0o027  # still the one set: reading did not change it


def scripted_run_config(tmp_path: Path) -> Path:
    """The scripted test task: 4 steps, a checkpoint and an evaluation every 2 steps, best/ by eval/score,
    samples of every media kind (PNG, GIF, mp4, WAV) every 2 steps, TensorBoard on."""
    config = {
        "imports": ["framer_test_tasks"],
        "task": "test_scripted_eval",
        "output_dir": str(tmp_path / "run"),
        "model": {"width": 16, "depth": 2},
        "data": {"num_samples": 64, "eval_samples": 8, "dim": 4, "sample_every": 2, "eval_script": [0.5]},
        "train": {
            "length": {"steps": 4},
            "micro_batch_size": 8,
            "eval": {"every": {"steps": 2}, "best_metric": "eval/score", "best_mode": "max"},
            "checkpoint": {"every": {"steps": 2}, "keep_last": 2},
        },
        "log": {"tensorboard": True},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=oct)
def test_every_file_of_a_run_gets_the_umask_mode(tmp_path, mask):
    """Checkpoints (accelerate's model.safetensors, the optimizer, the RNG states), final/, best/,
    samples/, tensorboard/, metrics.jsonl, config.yaml: 0644 / 0755 under umask 022, 0600 / 0700
    under umask 077 (before: every .safetensors file was 0600 under umask 022)."""
    with umask(mask):
        train_in_process(scripted_run_config(tmp_path))
    run = tmp_path / "run"
    written = {p.relative_to(run).as_posix() for p in run.rglob("*.safetensors")}
    assert {"final/model.safetensors", "best/model.safetensors", "checkpoints/step_4/model.safetensors"} <= (
        written
    )
    assert list((run / "samples").rglob("*.mp4")) and list((run / "tensorboard").rglob("events.*"))
    assert wrong_modes(run, mask) == []
