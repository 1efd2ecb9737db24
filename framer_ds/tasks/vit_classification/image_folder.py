"""ImageFolder data for `vit_classification`: `ROOT/train/CLASS/*.png` and `ROOT/val/CLASS/*.png`
(or `validation/`, as Hugging Face datasets name it; or a seeded, stratified share of train/).

This replaces torchvision's ImageFolder + transforms (torchvision is deliberately not a dependency:
its wheels are pinned to one exact torch build and would fight the CPU/CUDA torch the user has).

Why a scan step that collects problems instead of failing on first use: a misnamed class directory
or a corrupt JPEG should be reported before a multi-GPU job queues, all at once, not one per restart
three hours in. The scan only lists directories (os.scandir, no image decoding) so it stays fast on
ImageNet-sized trees; decoding every file is opt-in (`verify_files=True`, used by the data check).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigError, ConfigProblem, InputDataError, did_you_mean
from framer_ds.data.item_draws import DrawsPerItem, ItemDraws

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff"}
)
"""Lower-case suffixes counted as images; matching is case-insensitive (`IMG_001.JPG` counts)."""

VALIDATION_DIRS: tuple[str, str] = ("val", "validation")
LAYOUT_HINT = (
    "the expected layout is ROOT/train/CLASS/*.png and ROOT/val/CLASS/*.png (or validation/), "
    "or set data.val_fraction to hold out part of train/"
)


@dataclass
class ImageFolderIndex:
    """The result of a scan: class names (sorted, so labels are stable across machines and runs)
    and (path, label) pairs per split, sorted by path so every rank sees the same order."""

    root: Path
    classes: list[str]
    train: list[tuple[Path, int]] = field(default_factory=list)
    val: list[tuple[Path, int]] = field(default_factory=list)
    validation_source: str = "val/"  # where `val` came from, for the run summary

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def is_image_file(name: str) -> bool:
    """True for a visible file name with an image suffix; hidden files (`.DS_Store`, `._x.png` from
    macOS archives) are skipped because they are never real images."""
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _list_class_dirs(split_dir: Path) -> list[str]:
    """Sorted names of the visible sub-directories of `split_dir` (symlinked directories count)."""
    with os.scandir(split_dir) as entries:
        return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir())


def _list_images(class_dir: Path) -> list[Path]:
    """Image files directly inside `class_dir`, sorted by name. Not recursive: the layout is flat."""
    with os.scandir(class_dir) as entries:
        names = sorted(e.name for e in entries if is_image_file(e.name) and e.is_file())
    return [class_dir / n for n in names]


def verify_image(path: Path) -> str | None:
    """None when PIL can open and verify `path`, otherwise the reason it cannot."""
    try:
        with Image.open(path) as img:
            img.verify()
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, struct.error, ...
        return f"{type(exc).__name__}: {exc}"
    return None


def _missing_class_problems(
    classes_here: list[str], classes_there: list[str], here: str, there: str, root: Path
) -> list[ConfigProblem]:
    """One problem per class that has a `here/` directory but no `there/` directory."""
    problems = []
    for name in sorted(set(classes_here) - set(classes_there)):
        close = difflib.get_close_matches(name, sorted(set(classes_there) - set(classes_here)), n=1)
        hint = (
            f" {there}/ has '{close[0]}': if that is the same class, rename one of the two directories "
            "so the names match."
            if close
            else ""
        )
        problems.append(
            ConfigProblem(
                str(root / there / name),
                f"class '{name}' has a {here}/ directory but no {there}/ directory, so its labels would "
                f"not line up between splits.{hint} Create {root / there / name}/ with {there} images "
                f"for it, or remove {root / here / name}/ if the class is not wanted.",
            )
        )
    return problems


def _validation_dir(root: Path, val_fraction: float | None) -> tuple[str | None, list[ConfigProblem]]:
    """The split directory holding validation images, or None when train/ is to be split."""
    present = [name for name in VALIDATION_DIRS if (root / name).is_dir()]
    if len(present) == 2:
        return None, [
            ConfigProblem(
                str(root),
                "has both val/ and validation/; keep one (they would be two different validation sets)",
            )
        ]
    if present and val_fraction is not None:
        return present[0], [
            ConfigProblem(
                "data.val_fraction",
                f"is set but {root / present[0]}/ exists; drop data.val_fraction to use that directory, "
                "or move it away to hold out part of train/ instead",
            )
        ]
    if present:
        return present[0], []
    if val_fraction is not None:
        return None, []
    found = sorted(p.name for p in root.iterdir() if p.is_dir())
    return None, [
        ConfigProblem(
            str(root / "val"),
            f"no val/ or validation/ directory (found: {found or 'nothing'}).{did_you_mean('val', found)} "
            f"Create one, or set data.val_fraction: 0.1 to hold out 10% of train/.",
        )
    ]


def hold_out(
    items: list[tuple[Path, int]], fraction: float, seed: int
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]]]:
    """(train, validation): `fraction` of each class, drawn with `seed` from the path-sorted items, so
    every rank and every run with the same seed holds out the same images. At least one image of a
    class with two or more stays on each side."""
    rng = np.random.default_rng(seed)
    by_class: dict[int, list[tuple[Path, int]]] = {}
    for item in items:
        by_class.setdefault(item[1], []).append(item)
    train, val = [], []
    for label in sorted(by_class):
        members = by_class[label]
        order = rng.permutation(len(members))
        count = min(max(round(len(members) * fraction), 1), len(members) - 1) if len(members) > 1 else 0
        held = set(order[:count].tolist())
        for index, item in enumerate(members):
            (val if index in held else train).append(item)
    return train, val


def _class_dirs_by_split(root: Path, splits: list[str]) -> tuple[dict[str, list[str]], list[ConfigProblem]]:
    """The class directories of each split present, and a problem for each split that is missing or
    holds no class directory (images put directly in it are counted in the message)."""
    classes_by_split: dict[str, list[str]] = {}
    problems: list[ConfigProblem] = []
    for split in splits:
        split_dir = root / split
        if not split_dir.is_dir():
            present = sorted(p.name for p in root.iterdir() if p.is_dir())
            hint = did_you_mean(split, present)
            problems.append(
                ConfigProblem(
                    str(split_dir),
                    f"the {split}/ directory is missing (found: {present or 'nothing'}).{hint} "
                    f"Create it; {LAYOUT_HINT}.",
                )
            )
            continue
        class_names = _list_class_dirs(split_dir)
        if not class_names:
            loose = _list_images(split_dir)
            extra = (
                f" It holds {len(loose)} image(s) directly; move each into a per-class sub-directory."
                if loose
                else ""
            )
            problems.append(
                ConfigProblem(
                    str(split_dir),
                    f"{split}/ has no class directories.{extra} Add one sub-directory per class; "
                    f"{LAYOUT_HINT}.",
                )
            )
        classes_by_split[split] = class_names
    return classes_by_split, problems


def _unreadable_image_problems(paths: list[Path]) -> list[ConfigProblem]:
    """A problem for each file PIL cannot read (`verify_files`)."""
    problems = []
    for path in paths:
        reason = verify_image(path)
        if reason is not None:
            problems.append(
                ConfigProblem(
                    str(path),
                    f"PIL cannot read this image ({reason}). Delete the file or replace it "
                    "with a valid image.",
                )
            )
    return problems


def scan_image_folder(
    root: Path, verify_files: bool = False, val_fraction: float | None = None, split_seed: int = 0
) -> ImageFolderIndex:
    """Index `root` (train/ and val/ or validation/ splits of class directories, or train/ alone with a
    `val_fraction`) and raise one `ConfigError` listing every layout problem found; with
    `verify_files`, also every file PIL cannot read."""
    root = Path(root).expanduser()
    if not root.is_dir():
        what = "is a file, not a directory" if root.exists() else "does not exist"
        raise ConfigError(
            [
                ConfigProblem(
                    "data.source.path",
                    f"{root} {what}; {LAYOUT_HINT}. Point data.source.path at the directory that holds "
                    "train/ and val/.",
                )
            ],
            source=str(root),
        )

    val_dir, problems = _validation_dir(root, val_fraction)
    splits = ["train"] + ([val_dir] if val_dir else [])
    classes_by_split, missing = _class_dirs_by_split(root, splits)
    problems += missing

    train_classes = classes_by_split.get("train", [])
    val_classes = classes_by_split.get(val_dir, []) if val_dir else []
    if val_dir and train_classes and val_classes:
        problems += _missing_class_problems(train_classes, val_classes, "train", val_dir, root)
        problems += _missing_class_problems(val_classes, train_classes, val_dir, "train", root)

    # The union, so labels exist even while a train/val mismatch is being reported above.
    classes = sorted(set(train_classes) | set(val_classes))
    label_of = {name: i for i, name in enumerate(classes)}
    items: dict[str, list[tuple[Path, int]]] = {split: [] for split in splits}
    for split, class_names in classes_by_split.items():
        for name in class_names:
            images = _list_images(root / split / name)
            if not images:
                problems.append(
                    ConfigProblem(
                        str(root / split / name),
                        f"class directory has no images (looked for {', '.join(sorted(IMAGE_EXTENSIONS))}, "
                        "directly inside it, not in sub-directories). Add images or delete the directory.",
                    )
                )
            items[split] += [(path, label_of[name]) for path in images]

    if verify_files:
        problems += _unreadable_image_problems([path for split in splits for path, _ in items[split]])

    if problems:
        raise ConfigError(problems, source=str(root))
    if val_dir:
        return ImageFolderIndex(root, classes, items["train"], items[val_dir], f"{val_dir}/")
    train, val = hold_out(items["train"], val_fraction, split_seed)
    source = f"{val_fraction:.0%} of train/ held out (stratified by class, seed {split_seed})"
    return ImageFolderIndex(root, classes, train, val, source)


class ImageFolderDataset(DrawsPerItem, Dataset):
    """(path, label) pairs -> {"pixel_values": float32 [C,H,W], "labels": int64 scalar}.

    Images are decoded lazily in `__getitem__` so DataLoader workers share the decoding cost and
    the dataset object stays small enough to pickle into every worker. With `draws` (the training
    set) each image's augmentation comes from its own generator, keyed by (seed, epoch, index): the
    transform is called with `generator=` (framer_ds/data/item_draws.py says why a resume needs it).
    """

    def __init__(
        self,
        items: list[tuple[Path, int]],
        transform: Callable[..., torch.Tensor],
        draws: ItemDraws | None = None,
    ) -> None:
        self.items = items
        self.transform = transform
        self.draws = draws

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        path, label = self.items[index]
        image: Image.Image | None = None
        try:
            image = Image.open(path)
            image.load()  # decode now, inside the try, so truncated files fail here with a clear error
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            if image is not None:
                image.close()
            raise InputDataError(
                f"cannot decode image {path} ({type(exc).__name__}: {exc}). Delete or replace the file; "
                "to list every unreadable file before training, run the data check, i.e. "
                "framer_ds.tasks.vit_classification.image_folder.scan_image_folder(root, verify_files=True)."
            ) from exc
        try:  # outside the decode try: a transform bug must not be blamed on the file
            pixel_values = self.transform(image, generator=self.item_generator(index))
        finally:
            image.close()
        return {"pixel_values": pixel_values, "labels": torch.tensor(label, dtype=torch.int64)}
