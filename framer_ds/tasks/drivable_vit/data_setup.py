"""Where a drivable_vit run's samples come from (manifests or the generated road set), the split into
train and validation, every bad sample reported at once (or counted and skipped), and the ego-motion
statistics of the training set."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.data.table_rows import TableReadError, read_rows, table_format
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.drivable_vit.multiview_manifest import (
    EgoStatistics,
    ManifestLayout,
    MultiViewDataset,
    MultiViewSample,
    ParsedManifest,
    PixelTransform,
    file_problems,
    parse_rows,
)
from framer_ds.tasks.drivable_vit.synthetic_roads import RoadSetOptions, ensure_road_set, road_set_dir

SHOWN_PROBLEMS = 10


@dataclass
class SplitSamples:
    train: list[MultiViewSample]
    eval: list[MultiViewSample]
    problems: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


class DrivableData:
    def __init__(self, config):
        self.config = config
        self.data = config.data

    def layout(self) -> ManifestLayout:
        data, model = self.data, self.config.model
        return ManifestLayout(
            views=tuple(data.views),
            frames=data.frames,
            mask_frames=model.segment_frames,
            ego_motion=model.ego_motion,
            id_column=data.id_column,
            images_column=data.images_column,
            masks_column=data.masks_column,
            ego_column=data.ego_column,
        )

    def road_options(self) -> RoadSetOptions:
        synthetic = self.data.synthetic
        return RoadSetOptions(
            train_samples=synthetic.train_samples,
            eval_samples=synthetic.eval_samples,
            frames=self.data.frames,
            image_size=synthetic.image_size,
            seed=synthetic.seed,
        )

    def ensure_builtin(self) -> None:
        if self.data.source.builtin == "synthetic_roads":
            ensure_road_set(default_cache_dir(), self.road_options())

    def train_path(self) -> Path:
        if self.data.source.builtin:
            return road_set_dir(default_cache_dir(), self.road_options()) / "manifest.jsonl"
        return Path(self.data.source.path)

    def file_problems(self) -> list[ConfigProblem]:
        """Manifests that are missing or of an unknown type (cheap: no rows read)."""
        if self.data.source.builtin:
            return []
        problems = []
        for key, path in (("data.source.path", self.data.source.path), ("data.eval", self.data.eval)):
            if path is not None:
                try:
                    table_format(path)
                except TableReadError as exc:
                    problems.append(ConfigProblem(key, str(exc)))
        return problems

    def _rows(self, path: Path) -> list[dict[str, Any]]:
        try:
            return read_rows(path)
        except TableReadError as exc:
            raise ConfigError([ConfigProblem(str(path), str(exc))], "data") from None

    def _split_rows(self, path: Path) -> tuple[ParsedManifest, ParsedManifest, int]:
        """(train, validation, rows of other splits) of one manifest with a split column."""
        data = self.data
        rows = self._rows(path)
        if rows and data.split_column not in rows[0]:
            raise ConfigError(
                [
                    ConfigProblem(
                        "data.eval",
                        f"{path} has no {data.split_column!r} column (it has {sorted(rows[0])}): add one "
                        f"({data.train_split} / {data.eval_split}), set data.split_column, or give the "
                        "validation rows in data.eval",
                    )
                ],
                "data",
            )
        parsed = []
        for split in (data.train_split, data.eval_split):
            numbers = [n for n, row in enumerate(rows, start=1) if row.get(data.split_column) == split]
            parsed.append(parse_rows([rows[n - 1] for n in numbers], path, self.layout(), numbers))
        others = sum(
            1 for row in rows if row.get(data.split_column) not in (data.train_split, data.eval_split)
        )
        return parsed[0], parsed[1], others

    def load(self, files: str = "config") -> SplitSamples:
        """Both splits' samples. `files`: 'config' checks headers when data.verify_files, 'decode' reads
        every pixel (the data check), 'none' reads no image."""
        data = self.data
        train_path = self.train_path()
        notes: dict[str, Any] = {}
        if data.eval is not None:
            train = parse_rows(self._rows(train_path), train_path, self.layout())
            evaluation = parse_rows(self._rows(Path(data.eval)), Path(data.eval), self.layout())
            notes["validation"] = str(data.eval)
        else:
            train, evaluation, others = self._split_rows(train_path)
            notes["validation"] = f"rows of {train_path.name} with {data.split_column} == {data.eval_split!r}"
            if others:
                notes["rows of other splits (ignored)"] = others
        check = {"config": data.verify_files, "decode": True, "none": False}[files]
        problems = train.problems + evaluation.problems
        bad: set[str] = set()
        if check:
            for sample in train.samples + evaluation.samples:
                found = file_problems(sample, decode=files == "decode")
                if found:
                    problems += found
                    bad.add(sample.where)
        result = SplitSamples(
            [s for s in train.samples if s.where not in bad],
            [s for s in evaluation.samples if s.where not in bad],
            problems,
            notes,
        )
        self._report(result)
        return result

    def _report(self, split: SplitSamples) -> None:
        problems = split.problems
        if problems and self.data.bad_samples == "error":
            listed = [ConfigProblem("data", p) for p in problems[:SHOWN_PROBLEMS]]
            if len(problems) > SHOWN_PROBLEMS:
                listed.append(ConfigProblem("data", f"... and {len(problems) - SHOWN_PROBLEMS} more"))
            listed.append(
                ConfigProblem(
                    "data.bad_samples",
                    "fix the samples above, or set 'skip' to train without them",
                )
            )
            raise ConfigError(listed, "data")
        if problems:
            split.notes["skipped samples"] = len(problems)
            split.notes["skipped (first)"] = " | ".join(problems[:3])
        if not split.train:
            raise ConfigError(
                [ConfigProblem("data.source.path", f"no usable training samples in {self.train_path()}")],
                "data",
            )

    def transform(self) -> PixelTransform:
        return PixelTransform(self.config.model.image_size, tuple(self.data.mean), tuple(self.data.std))

    def datasets(
        self, split: SplitSamples, ego: EgoStatistics | None
    ) -> tuple[MultiViewDataset, MultiViewDataset | None]:
        layout, transform = self.layout(), self.transform()
        evaluation = MultiViewDataset(split.eval, layout, transform, ego) if split.eval else None
        return MultiViewDataset(split.train, layout, transform, ego), evaluation
