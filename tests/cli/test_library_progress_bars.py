"""Issue 47: `framer-ds sample` on a Wan run printed transformers' "Loading weights" bar twice (the UMT5
text encoder, the CLIP image encoder) before its own output; `eval` did the same. The libraries' own
loading bars are off in the commands that load models (framer_ds/third_party_noise.py,
`quiet_loading_bars`); framer_ds's own progress (training steps, sampling steps on a terminal) stays."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import REPO, train_in_process

CONFIG = REPO / "configs" / "tasks" / "video_lora" / "wan_tiny.yaml"
LIBRARY_BARS = ("Loading weights", "Writing model shards", "Loading checkpoint shards", "it/s]")


@pytest.fixture(scope="module")
def wan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """wan_tiny.yaml for 2 steps (its held-out clips evaluated at the end)."""
    root = tmp_path_factory.mktemp("bars")
    overrides = [f"output_dir={root / 'run'}", f"data.cache.dir={root / 'cache'}", "train.num_workers=0"]
    overrides += ["train.length.steps=2", "train.checkpoint.every=null", "train.eval.every=null"]
    train_in_process(CONFIG, overrides)
    return root / "run"


def _image(path: Path, seed: int) -> Path:
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
    return path


def test_wan_sample_and_eval_print_no_library_progress_bar(
    wan_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from framer_ds.cli.main import main

    args = ["sample", str(wan_run / "final"), "--image", str(_image(tmp_path / "a.png", 1))]
    args += ["--last-image", str(_image(tmp_path / "b.png", 2)), "--prompt", "a red ball rolls"]
    args += ["--num-frames", "5", "--steps", "2", "--out", str(tmp_path / "w.mp4")]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert (tmp_path / "w.mp4").is_file() and "wrote" in out
    assert [bar for bar in LIBRARY_BARS if bar in err] == [], err
    assert main(["eval", str(wan_run)]) == 0
    out, err = capsys.readouterr()
    assert "eval/loss" in out and [bar for bar in LIBRARY_BARS if bar in err] == [], err


def test_switching_the_bars_off_imports_neither_library_and_holds_once_they_are_imported() -> None:
    """`framer-ds train` switches the bars off before its task is known: importing diffusers (with
    torch._dynamo) and transformers for it cost every rank of every run ~2.5 s of CPU, for tasks that use
    neither. A fresh interpreter, as a launched rank is."""
    script = """
import sys
from framer_ds.third_party_noise import quiet_loading_bars
quiet_loading_bars()
quiet_loading_bars()  # called again (smoke runs several commands): still one switch per library
print(sorted(name for name in ("diffusers", "transformers") if name in sys.modules))
from diffusers.utils import logging as diffusers_logging
from transformers.utils import logging as transformers_logging
print(diffusers_logging.is_progress_bar_enabled(), transformers_logging._tqdm_hook.__name__)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["[]", "False _disabled_bar"], done.stdout + done.stderr[-2000:]
