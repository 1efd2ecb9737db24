"""Writes `examples/`: the inputs the README's example commands point at, one per task.

Why shipped files: every command a newcomer copies from the README must run on a fresh clone, so its
inputs cannot be "some_digit.png". They are made by the same generators the tasks' built-in data
uses, so they look like what the quickstart and the tiny configs train on:
- `digit_7.png`: a held-out scikit-learn digit as the quickstart's ImageFolder renders it (8x8);
- `video/first.png`, `video/last.png`: frames 0 and 6 of a moving-shape clip (64x64, the tiny video
  configs' size; frame 6 is the last frame of a 4-frame clip at stride 2);
- `drivable/{left,center,right}_{0,1,2}.png` and `drivable/ego_motion.json`: one synthetic road
  sample, 3 views x 3 frames, as `configs/tasks/drivable_vit/tiny.yaml` trains on.

Run `python scripts/dev/make_examples.py` from the repository root; the output is deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from framer_ds.tasks.drivable_vit.synthetic_roads import VIEWS, RoadSetOptions, write_sample
from framer_ds.tasks.video_lora.shared.data.synthetic_video import MovingShape

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VIDEO_SIZE = 64
VIDEO_LAST_FRAME = 6
DIGIT = 7


def write_digit(out: Path) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    index = int(np.flatnonzero(digits.target == DIGIT)[-1])
    pixels = np.rint(digits.images[index] * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(out / f"digit_{DIGIT}.png")


def write_video_frames(out: Path) -> None:
    shape = MovingShape.from_seed(VIDEO_SIZE, VIDEO_SIZE, seed=1000)
    (out / "video").mkdir(exist_ok=True)
    Image.fromarray(shape.render(0)).save(out / "video" / "first.png")
    Image.fromarray(shape.render(VIDEO_LAST_FRAME)).save(out / "video" / "last.png")


def write_drivable_sample(out: Path) -> None:
    options = RoadSetOptions(frames=3, image_size=64, seed=1000)
    staging = out / ".drivable_staging"
    row = write_sample(staging, "example", options, np.random.default_rng(options.seed))
    target = out / "drivable"
    target.mkdir(exist_ok=True)
    for view in VIEWS:
        for t, path in enumerate(row["images"][view]):
            (staging / path).replace(target / f"{view}_{t}.png")
    (target / "ego_motion.json").write_text(json.dumps(row["ego_motion"]) + "\n")
    for path in sorted(staging.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    staging.rmdir()


def main() -> None:
    EXAMPLES.mkdir(exist_ok=True)
    write_digit(EXAMPLES)
    write_video_frames(EXAMPLES)
    write_drivable_sample(EXAMPLES)
    print(f"wrote {sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob('*') if p.is_file())}")


if __name__ == "__main__":
    main()
