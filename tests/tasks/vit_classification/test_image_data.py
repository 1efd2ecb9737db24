"""Image data layer: ImageFolder scan errors, dataset items, transforms and the digits folder."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from framer_ds.config.errors import ConfigError
from framer_ds.data.item_draws import ItemDraws
from framer_ds.tasks.vit_classification import digits as digits_mod
from framer_ds.tasks.vit_classification.digits import ensure_digits_imagefolder
from framer_ds.tasks.vit_classification.image_folder import (
    IMAGE_EXTENSIONS,
    ImageFolderDataset,
    ImageFolderIndex,
    scan_image_folder,
)
from framer_ds.tasks.vit_classification.image_transform import ImageTransform


def write_png(path: Path, size: int = 6, value: int | None = None, mode: str = "RGB") -> Path:
    """A tiny image; `value` fills it uniformly, otherwise it is a gradient (so flips/crops show)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if value is None:
        grad = ((np.arange(size * size).reshape(size, size) * 7) % 256).astype(np.uint8)
        array = grad if mode == "L" else np.stack([grad, 255 - grad, grad // 2], axis=-1)
    else:
        array = np.full((size, size) if mode == "L" else (size, size, 3), value, dtype=np.uint8)
    Image.fromarray(array).save(path)
    return path


def make_folder(root: Path, layout: dict[str, dict[str, int]]) -> Path:
    """layout = {"train": {"cat": 2, ...}, "val": {...}}; counts of PNGs per class (0 = empty dir)."""
    for split, classes in layout.items():
        for name, count in classes.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                write_png(root / split / name / f"{i:03d}.png")
    return root


def problems_text(err: pytest.ExceptionInfo[ConfigError]) -> str:
    return str(err.value)


# --- scan ------------------------------------------------------------------------------------------


def test_scan_good_folder(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ds", {"train": {"dog": 3, "cat": 2}, "val": {"cat": 1, "dog": 1}})
    (root / "train" / "cat" / "notes.txt").write_text("not an image")
    (root / "train" / "cat" / ".DS_Store").write_text("")
    write_png(root / "train" / "cat" / "UPPER.PNG")  # extensions are case-insensitive

    index = scan_image_folder(root)

    assert isinstance(index, ImageFolderIndex)
    assert index.root == root
    assert index.classes == ["cat", "dog"]  # sorted, so labels are stable
    assert len(index.train) == 6 and len(index.val) == 2
    assert [p.name for p, _ in index.train] == [
        "000.png",
        "001.png",
        "UPPER.PNG",
        "000.png",
        "001.png",
        "002.png",
    ]
    assert [label for _, label in index.train] == [0, 0, 0, 1, 1, 1]
    assert all(p.parent.name == index.classes[label] for p, label in index.train + index.val)
    assert ".png" in IMAGE_EXTENSIONS and ".tiff" in IMAGE_EXTENSIONS


def test_scan_root_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        scan_image_folder(tmp_path / "nope")
    assert len(err.value.problems) == 1
    problem = err.value.problems[0]
    assert problem.where == "data.source.path"
    assert str(tmp_path / "nope") in problem.message and "does not exist" in problem.message
    assert "ROOT/train/CLASS/*.png" in problem.message and "ROOT/val/CLASS/*.png" in problem.message


def test_scan_split_missing_and_no_classes(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_png(root / "train" / "loose.png")  # images directly in train/, no class dirs
    (root / "valid").mkdir()
    with pytest.raises(ConfigError) as err:
        scan_image_folder(root)
    text = problems_text(err)
    assert "no val/ or validation/ directory" in text and "Did you mean 'valid'?" in text
    assert "data.val_fraction: 0.1" in text
    assert "train/ has no class directories" in text
    assert "move each into a per-class sub-directory" in text


def test_scan_class_without_images(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ds", {"train": {"cat": 1, "dog": 0}, "val": {"cat": 1, "dog": 1}})
    with pytest.raises(ConfigError) as err:
        scan_image_folder(root)
    assert len(err.value.problems) == 1
    problem = err.value.problems[0]
    assert problem.where == str(root / "train" / "dog")
    assert "class directory has no images" in problem.message
    assert "Add images or delete the directory" in problem.message


def test_scan_class_missing_from_val(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ds", {"train": {"cat": 1, "dog": 1}, "val": {"cat": 1}})
    with pytest.raises(ConfigError) as err:
        scan_image_folder(root)
    assert len(err.value.problems) == 1
    problem = err.value.problems[0]
    assert problem.where == str(root / "val" / "dog")
    assert "class 'dog' has a train/ directory but no val/ directory" in problem.message
    assert f"Create {root / 'val' / 'dog'}/" in problem.message


def test_scan_class_missing_from_train_suggests_typo(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ds", {"train": {"cats": 1}, "val": {"cat": 1}})
    with pytest.raises(ConfigError) as err:
        scan_image_folder(root)
    text = problems_text(err)
    assert "class 'cats' has a train/ directory but no val/ directory" in text
    assert "val/ has 'cat': if that is the same class, rename one of the two directories" in text
    assert "class 'cat' has a val/ directory but no train/ directory" in text


def test_scan_corrupt_image_only_with_verify(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ds", {"train": {"cat": 2}, "val": {"cat": 1}})
    bad = root / "train" / "cat" / "bad.png"
    bad.write_bytes(b"definitely not a png" * 10)

    assert len(scan_image_folder(root).train) == 3  # the cheap scan never opens files
    with pytest.raises(ConfigError) as err:
        scan_image_folder(root, verify_files=True)
    assert len(err.value.problems) == 1
    problem = err.value.problems[0]
    assert problem.where == str(bad)
    assert "PIL cannot read this image" in problem.message
    assert "UnidentifiedImageError" in problem.message
    assert "Delete the file or replace it" in problem.message


def test_scan_reports_all_problems_at_once(tmp_path: Path) -> None:
    root = make_folder(
        tmp_path / "ds", {"train": {"cat": 1, "dog": 0, "owl": 1}, "val": {"cat": 1, "dog": 1}}
    )
    (root / "val" / "cat" / "000.png").write_bytes(b"\x89PNG garbage")
    with pytest.raises(ConfigError) as err:
        scan_image_folder(root, verify_files=True)
    wheres = sorted(p.where for p in err.value.problems)
    assert wheres == sorted(
        [str(root / "val" / "owl"), str(root / "train" / "dog"), str(root / "val" / "cat" / "000.png")]
    )
    assert str(err.value).startswith("3 problem(s) in")


# --- dataset -----------------------------------------------------------------------------------------


def test_dataset_item_shape_dtype_and_normalisation(tmp_path: Path) -> None:
    path = write_png(tmp_path / "a.png", size=4, value=255)
    transform = ImageTransform(image_size=4, num_channels=3, mean=[0.5] * 3, std=[0.5] * 3, train=False)
    ds = ImageFolderDataset([(path, 7)], transform)
    assert len(ds) == 1
    item = ds[0]
    assert item["pixel_values"].shape == (3, 4, 4) and item["pixel_values"].dtype == torch.float32
    assert torch.allclose(item["pixel_values"], torch.ones(3, 4, 4))  # (1 - 0.5) / 0.5
    assert item["labels"].dtype == torch.int64 and item["labels"].item() == 7


def test_dataset_grayscale_and_resize(tmp_path: Path) -> None:
    path = write_png(tmp_path / "a.png", size=8, value=0)  # RGB on disk, converted to L
    transform = ImageTransform(image_size=5, num_channels=1, mean=[0.0], std=[1.0], train=False)
    item = ImageFolderDataset([(path, 0)], transform)[0]
    assert item["pixel_values"].shape == (1, 5, 5)
    assert torch.allclose(item["pixel_values"], torch.zeros(1, 5, 5))


def test_dataset_corrupt_file_raises_runtime_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"garbage")
    transform = ImageTransform(image_size=4, num_channels=3, mean=[0.5] * 3, std=[0.5] * 3, train=False)
    with pytest.raises(RuntimeError, match="cannot decode image") as err:
        ImageFolderDataset([(bad, 0)], transform)[0]
    assert str(bad) in str(err.value) and "verify_files=True" in str(err.value)


def test_dataset_truncated_png_raises_runtime_error(tmp_path: Path) -> None:
    path = write_png(tmp_path / "t.png", size=32)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    transform = ImageTransform(image_size=32, num_channels=3, mean=[0.5] * 3, std=[0.5] * 3, train=False)
    with pytest.raises(RuntimeError, match="Delete or replace the file"):
        ImageFolderDataset([(path, 0)], transform)[0]


# --- transform ---------------------------------------------------------------------------------------


def gradient_image(size: int = 8) -> Image.Image:
    grad = ((np.arange(size * size).reshape(size, size) * 3) % 256).astype(np.uint8)
    return Image.fromarray(np.stack([grad, 255 - grad, grad], axis=-1))


def train_transform(**kwargs: object) -> ImageTransform:
    args: dict = dict(image_size=8, num_channels=3, mean=[0.5] * 3, std=[0.25] * 3, train=True)
    args.update(random_crop_padding=2, hflip=True)
    args.update(kwargs)
    return ImageTransform(**args)


def test_transform_deterministic_under_torch_seed() -> None:
    transform, image = train_transform(), gradient_image()
    torch.manual_seed(123)
    first = [transform(image) for _ in range(10)]
    torch.manual_seed(123)
    second = [transform(image) for _ in range(10)]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    # ...and restoring a saved RNG state mid-stream replays the rest (ad-hoc use, without an image's
    # own generator; training passes one: see the next test but two).
    torch.manual_seed(5)
    transform(image)
    state = torch.get_rng_state()
    after = [transform(image) for _ in range(5)]
    torch.set_rng_state(state)
    assert all(torch.equal(a, transform(image)) for a in after)


def test_train_augments_eval_does_not() -> None:
    image = gradient_image()
    eval_t = ImageTransform(image_size=8, num_channels=3, mean=[0.5] * 3, std=[0.25] * 3, train=False)
    reference = eval_t(image)
    state = torch.get_rng_state()
    assert all(torch.equal(eval_t(image), reference) for _ in range(5))
    assert torch.equal(torch.get_rng_state(), state)  # eval consumes no randomness

    train_t = train_transform()
    torch.manual_seed(0)
    outputs = [train_t(image) for _ in range(20)]
    assert any(not torch.equal(out, reference) for out in outputs)
    assert len({out.numpy().tobytes() for out in outputs}) > 1


@pytest.mark.parametrize("padding_mode", ["constant", "edge"])
def test_hflip_and_crop_keep_size(padding_mode: str) -> None:
    image = gradient_image(8)
    torch.manual_seed(0)
    for kwargs in ({"random_crop_padding": 0, "hflip": True}, {"random_crop_padding": 3, "hflip": False}):
        out = train_transform(padding_mode=padding_mode, **kwargs)(image)
        assert out.shape == (3, 8, 8) and out.dtype == torch.float32


def test_hflip_only_is_identity_or_mirror() -> None:
    image = gradient_image(8)
    reference = ImageTransform(image_size=8, num_channels=3, mean=[0.5] * 3, std=[0.25] * 3, train=False)(
        image
    )
    flip = train_transform(random_crop_padding=0, hflip=True)
    torch.manual_seed(0)
    seen = set()
    for _ in range(20):
        out = flip(image)
        if torch.equal(out, reference):
            seen.add("same")
        else:
            assert torch.equal(out, reference.flip(-1))
            seen.add("flipped")
    assert seen == {"same", "flipped"}


def test_constant_padding_is_black_before_normalisation() -> None:
    white = Image.new("RGB", (4, 4), (255, 255, 255))
    t = train_transform(image_size=4, random_crop_padding=4, hflip=False, mean=[0.0] * 3, std=[1.0] * 3)
    torch.manual_seed(0)
    outs = [t(white) for _ in range(30)]
    assert all(out.min() >= 0.0 and out.max() <= 1.0 for out in outs)
    assert any(out.min() == 0.0 for out in outs)  # a shifted crop shows zero fill


def test_transform_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="one value per channel"):
        ImageTransform(image_size=8, num_channels=3, mean=[0.5], std=[0.5], train=False)
    with pytest.raises(ValueError, match="num_channels must be 1"):
        ImageTransform(image_size=8, num_channels=2, mean=[0.5] * 2, std=[0.5] * 2, train=False)


# --- digits ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_digits_imagefolder(tmp_path_factory.mktemp("cache"))


def test_digits_folder_complete_and_stratified(digits_root: Path) -> None:
    assert digits_root.name == "digits_imagefolder"
    index = scan_image_folder(digits_root)
    assert index.classes == [str(d) for d in range(10)]
    assert len(index.train) + len(index.val) == 1797
    assert {label for _, label in index.train} == set(range(10))
    assert {label for _, label in index.val} == set(range(10))
    assert len(index.val) == pytest.approx(0.2 * 1797, abs=1)
    names = [p.name for p, _ in index.train + index.val]
    assert len(set(names)) == 1797  # each source index lands in exactly one split
    marker = json.loads((digits_root / ".complete").read_text())
    assert marker == {"count": 1797, "val_fraction": 0.2, "seed": 0}
    assert not [p for p in digits_root.parent.iterdir() if p.name.startswith(".digits_imagefolder.tmp-")]


def test_digits_second_call_is_noop(digits_root: Path) -> None:
    marker = digits_root / ".complete"
    some_png = next((digits_root / "train" / "3").iterdir())
    before = (marker.stat().st_mtime_ns, some_png.stat().st_mtime_ns)
    assert ensure_digits_imagefolder(digits_root.parent) == digits_root
    assert (marker.stat().st_mtime_ns, some_png.stat().st_mtime_ns) == before


def test_digits_round_trip_matches_sklearn(digits_root: Path) -> None:
    from sklearn.datasets import load_digits

    data = load_digits()
    path = next((digits_root / "val" / "7").iterdir())
    index = int(path.stem)
    assert data.target[index] == 7
    with Image.open(path) as img:
        assert img.mode == "L" and img.size == (8, 8)
        loaded = np.asarray(img)
    expected = np.rint(data.images[index] * 255 / 16).astype(np.uint8)
    np.testing.assert_array_equal(loaded, expected)


def test_digits_other_split_params_are_refused(digits_root: Path) -> None:
    with pytest.raises(ValueError, match=r"Delete .* to rebuild it, or pass a different cache_dir"):
        ensure_digits_imagefolder(digits_root.parent, val_fraction=0.3)


def test_digits_race_loser_keeps_winner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two builders (e.g. 2 ranks) both miss the marker and both render; whoever renames second
    must neither crash nor clobber the winner, and must leave no temp directory behind."""
    real_publish = digits_mod.publish_dir
    barrier = threading.Barrier(2, timeout=60)
    renders: list[Path] = []

    def fake_render(target: Path, val_fraction: float, seed: int) -> int:
        """Stands in for the 1,797-PNG render (covered above) so the race test stays fast."""
        renders.append(target)
        (target / "train").mkdir()
        (target / "train" / "who.txt").write_text(target.name)
        marker = {"count": 1797, "val_fraction": val_fraction, "seed": seed}
        (target / ".complete").write_text(json.dumps(marker))
        return 1797

    monkeypatch.setattr(digits_mod, "_render", fake_render)

    def publish_together(staging: Path, root: Path, *, replace: bool) -> bool:
        barrier.wait()  # both have fully rendered before either renames
        return real_publish(staging, root, replace=replace)

    monkeypatch.setattr(digits_mod, "publish_dir", publish_together)
    results: list[Path] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(ensure_digits_imagefolder(tmp_path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [tmp_path / "digits_imagefolder"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits_imagefolder"]
    assert len(renders) == 2  # both really built, so one rename really lost
    winner = (tmp_path / "digits_imagefolder" / "train" / "who.txt").read_text()
    assert winner in {r.name for r in renders}


def test_digits_incomplete_existing_folder_is_reported(tmp_path: Path) -> None:
    (tmp_path / "digits_imagefolder" / "junk").mkdir(parents=True)
    with pytest.raises(RuntimeError, match=r"Delete .* and run again"):
        ensure_digits_imagefolder(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits_imagefolder"]


def test_dataset_and_transform_pickle_for_dataloader_workers(tmp_path: Path) -> None:
    path = write_png(tmp_path / "a.png")
    ds = ImageFolderDataset([(path, 1)], train_transform(image_size=6))
    clone = pickle.loads(pickle.dumps(ds))
    torch.manual_seed(3)
    a = ds[0]["pixel_values"]
    torch.manual_seed(3)
    assert torch.equal(clone[0]["pixel_values"], a)


def test_a_training_image_draws_its_augmentation_from_seed_epoch_and_index(tmp_path: Path) -> None:
    """What a resumed run relies on: image i's crop and flip in epoch e are the same whatever torch's
    global RNG holds (the loader reads ahead of a checkpoint) and in any worker (a pickled copy); the
    next epoch draws anew."""
    paths = [write_png(tmp_path / f"{i}.png") for i in range(8)]
    dataset = ImageFolderDataset([(p, 0) for p in paths], train_transform(image_size=6), ItemDraws(seed=3))

    def one_epoch(ds: ImageFolderDataset) -> list[torch.Tensor]:
        return [ds[i]["pixel_values"] for i in range(len(paths))]

    torch.manual_seed(1)
    first = one_epoch(dataset)
    torch.manual_seed(2)
    again = one_epoch(pickle.loads(pickle.dumps(dataset)))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    dataset.set_epoch(1)
    assert not all(torch.equal(a, b) for a, b in zip(first, one_epoch(dataset), strict=True))


def test_a_validation_directory_is_found_like_val(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ds", {"train": {"cat": 2, "dog": 2}, "validation": {"cat": 1, "dog": 1}})
    index = scan_image_folder(root)
    assert len(index.val) == 2 and index.validation_source == "validation/"
    make_folder(root, {"val": {"cat": 1, "dog": 1}})
    with pytest.raises(ConfigError, match="has both val/ and validation/"):
        scan_image_folder(root)


def test_val_fraction_is_stratified_seeded_and_the_same_everywhere(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ds", {"train": {"cat": 20, "dog": 10, "emu": 2}})
    index = scan_image_folder(root, val_fraction=0.2, split_seed=5)
    held = {(label, path.name) for path, label in index.val}
    per_class = [sum(1 for _, label in index.val if label == c) for c in range(3)]
    assert per_class == [4, 2, 1]  # 20% of each class, at least one, never the whole class
    assert not held & {(label, path.name) for path, label in index.train}
    assert len(index.train) + len(index.val) == 32
    again = scan_image_folder(root, val_fraction=0.2, split_seed=5)  # another rank, another run
    assert again.val == index.val and again.train == index.train
    other = scan_image_folder(root, val_fraction=0.2, split_seed=6)
    assert other.val != index.val
    assert index.validation_source == "20% of train/ held out (stratified by class, seed 5)"


def test_val_fraction_next_to_a_val_directory_is_a_problem(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ds", {"train": {"cat": 2}, "val": {"cat": 1}})
    with pytest.raises(ConfigError, match=r"data\.val_fraction: is set but"):
        scan_image_folder(root, val_fraction=0.1)
