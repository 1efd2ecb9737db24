"""`framer-ds smoke` for video_lora recipes (tasks/smoke.py says what a smoke keeps and swaps).

Bases: each family's folder (SVD's, Framer's `unet/` + `controlnet/` beside its SVD-XT, Wan's) becomes
a tiny random one of the same architecture (svd/, framer/, wan/ `smoke_base.py`). Data: a video folder
that is not on disk becomes three moving-shape clips at the recipe's height and width, long enough for
its frames at its largest stride, with a caption file beside each when a Wan recipe reads captions. The
frame count shrinks when a clip is more than this CPU runs in minutes at any width (`SMOKE_PIXELS`):
to the most frames under the budget that the base takes (Wan: 1 + 4k), never below its fewest; height
and width (what the size rules are about) always stay.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.tasks.smoke import (
    SmokeHooks,
    SmokeStandIns,
    architecture_source,
    stand_in_dir,
    tiny_note,
)
from framer_ds.tasks.video_lora.shared.captions import SMOKE_CAPTION
from framer_ds.tasks.video_lora.shared.data.synthetic_video import MovingShape, write_moving_shape_clip

SMOKE_PIXELS = 1_000_000
"""Pixels of one training clip (frames x height x width) the smoke runs without shrinking its frames:
the narrowest VAE diffusers builds (32 channels per block for SVD's) encodes about 0.2 Mpx a second and
decodes several times slower on one core of this class of machine, and a recipe encodes a clip per
micro-batch unless its latent cache is on."""
SMOKE_CLIPS = 3  # two training clips (one per rank of a 2-process launch) and one held out
CLIP_FPS = 12


def _architecture_key(folder: Path) -> dict[str, str]:
    """The architecture's config files by content: a changed config.json builds a new stand-in."""
    files = sorted(p for p in folder.rglob("*.json") if p.is_file())
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in files}


class VideoLoraSmoke(SmokeHooks):
    """The video_lora task's smoke hooks (a mixin of `VideoLoraTask`, which supplies `config`, `family`)."""

    config: Any
    family: Any
    smoke_samples = True

    def smoke_stand_ins(self, root: Path) -> SmokeStandIns:
        found = SmokeStandIns()
        for key, value, builder, what in self.family.smoke_bases():
            source = architecture_source(self.config, value)
            if source is None:
                problem = (
                    f"{value} is not on disk and framer_ds ships no architecture for it: map it to a repo "
                    "id of framer_ds/config/architectures under `architectures:` in the config"
                )
                raise ConfigError([ConfigProblem(key, problem)], "smoke")
            folder, name = source
            out = builder(stand_in_dir(root, "bases", {"what": what, **_architecture_key(folder)}), folder)
            found.overrides.append(f"{key}={out}")
            found.swapped.append(tiny_note(key, value, name, out, what))
        frames = self._smoke_frames(found)
        self._smoke_data(root, frames, found)
        return found

    def _smoke_frames(self, found: SmokeStandIns) -> int:
        """data.num_frames, or the most frames under SMOKE_PIXELS this base takes (named in `found`)."""
        data = self.config.data
        frames, area = data.num_frames, data.height * data.width
        if data.buckets is not None or frames * area <= SMOKE_PIXELS:
            return frames
        takes = [
            n
            for n in range(frames, self.family.min_frames() - 1, -1)
            if self.family.frame_count_problem(n) is None
        ]
        under = [n for n in takes if n * area <= SMOKE_PIXELS]
        chosen = under[0] if under else takes[-1]
        why = (
            f"data.num_frames {frames} -> {chosen}: {frames} frames of {data.height}x{data.width} are "
            f"{frames * area / 1e6:.1f} Mpx per clip through the VAE{self._token_note(frames)}, more than "
            f"this CPU runs in minutes at any width (the smoke's budget: {SMOKE_PIXELS / 1e6:.1f} Mpx per "
            "clip); height and width stay"
        )
        if not under:
            why += f"; {chosen} is the fewest this base takes, still over the budget (a slower smoke)"
        found.overrides.append(f"data.num_frames={chosen}")
        found.shrunk.append(why)
        return chosen

    def _token_note(self, frames: int) -> str:
        """A Wan clip's full-attention sequence (latent frames x latent patches)."""
        factor = getattr(self.family, "temporal_factor", None)
        if factor is None:
            return ""
        data, multiple = self.config.data, self.family.size_multiple()
        tokens = (1 + (frames - 1) // factor()) * (data.height // multiple) * (data.width // multiple)
        return f" and {tokens:,} tokens of full attention in every transformer block"

    def _smoke_data(self, root: Path, frames: int, found: SmokeStandIns) -> None:
        """Synthetic clips for a video folder that is not on disk (the module docstring)."""
        data = self.config.data
        if data.source.builtin is not None or Path(data.source.path).exists():
            return
        if data.layout != "videos":
            problem = f"{data.source.path} is not on disk; the smoke generates only the videos layout"
            raise ConfigError([ConfigProblem("data.source.path", problem)], "smoke")
        length = (frames - 1) * (data.max_stride or 1) + 1
        captions = self.family.reads_captions
        shape = {"frames": length, "height": data.height, "width": data.width, "captions": captions}
        folder = stand_in_dir(root, "videos", {**shape, "clips": SMOKE_CLIPS})
        _write_clips(folder, shape)
        found.overrides.append(f"data.source.path={folder}")
        beside = ", each with its caption .txt" if captions else ""
        found.swapped.append(
            f"data.source.path: {data.source.path} is not on disk -> {folder} ({SMOKE_CLIPS} synthetic "
            f"{data.width}x{data.height} clips of {length} frames{beside})"
        )
        if int(SMOKE_CLIPS * data.val_fraction) < 1:
            found.overrides.append(f"data.val_fraction={1 / SMOKE_CLIPS + 0.01:.2f}")
            found.swapped.append(
                f"data.val_fraction {data.val_fraction} -> {1 / SMOKE_CLIPS + 0.01:.2f}: "
                f"{SMOKE_CLIPS} synthetic clips hold out one"
            )

    def smoke_export_args(self, export_dir: Path, work: Path) -> list[str]:
        """The format users of the family export to (`family.smoke_export_format`)."""
        return ["--format", self.family.smoke_export_format(), "--out", str(work)]

    def smoke_sample_args(self, export_dir: Path, work: Path) -> list[str]:
        """`framer-ds sample` at the recipe's samples settings, from a synthetic first (and last) frame,
        with the family's own flags (`family.smoke_sample_flags`)."""
        from PIL import Image

        data, model = self.config.data, self.config.model
        shape = MovingShape.from_seed(data.width, data.height, seed=0)
        work.mkdir(parents=True, exist_ok=True)
        first, last = work / "first.png", work / "last.png"
        Image.fromarray(shape.render(0)).save(first)
        args = ["--image", str(first), "--out", str(work / "sample.mp4")]
        if model.base.mode == "interpolation":
            Image.fromarray(shape.render(data.num_frames - 1)).save(last)
            args += ["--last-image", str(last)]
        samples = model.samples
        args += ["--steps", str(samples.num_inference_steps), "--seed", str(samples.seed)]
        return [*args, *self.family.smoke_sample_flags(samples, SMOKE_CAPTION)]


def _write_clips(folder: Path, shape: dict[str, Any]) -> None:
    """SMOKE_CLIPS moving-shape mp4s (and captions), once, atomically."""
    from framer_ds.storage.atomic import build_once

    def build(staging: Path) -> None:
        for i in range(SMOKE_CLIPS):
            video = staging / f"clip_{i:03d}.mp4"
            write_moving_shape_clip(video, shape["frames"], shape["width"], shape["height"], CLIP_FPS, seed=i)
            if shape["captions"]:
                video.with_suffix(".txt").write_text(SMOKE_CAPTION + "\n")

    build_once(folder, ".framer_smoke_clips_complete", build, "synthetic smoke clips")
