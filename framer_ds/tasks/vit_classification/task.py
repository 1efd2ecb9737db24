"""`vit_classification`: fine-tune (or train from a config) an HF ViTForImageClassification on an
ImageFolder (`train/CLASS/*.png`, `val/CLASS/*.png`, as ImageNet / Food-101 are laid out)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from framer_ds.compat import image_processor_class
from framer_ds.config.errors import ConfigError, ConfigProblem, did_you_mean
from framer_ds.config.schema import StrictModel
from framer_ds.config.source import Source
from framer_ds.data.item_draws import ItemDraws
from framer_ds.engine.export import save_pretrained_gathered
from framer_ds.engine.export_load import load_full_export
from framer_ds.engine.pretrained import build_fresh, building_empty, load_pretrained
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.base import SampleCommandOptions, Task
from framer_ds.tasks.planning import PlanningHooks
from framer_ds.tasks.registry import register_task
from framer_ds.tasks.vit_classification.digits import DIGITS_DIRNAME, ensure_digits_imagefolder
from framer_ds.tasks.vit_classification.image_folder import (
    ImageFolderDataset,
    ImageFolderIndex,
    scan_image_folder,
)
from framer_ds.tasks.vit_classification.image_transform import ImageTransform

if TYPE_CHECKING:
    from transformers import ViTConfig


class VitModelSource(Source):
    """Where the ViT comes from: a pretrained directory, or a fresh init from ViTConfig fields."""

    path: Path | None = Field(
        None, description="Local directory saved with save_pretrained (e.g. google/vit-large-patch16-224)."
    )
    config: dict[str, Any] | None = Field(
        None, description="ViTConfig fields for a freshly initialised model ({} = ViTConfig's defaults)."
    )


class VitModelConfig(StrictModel):
    renamed_keys: ClassVar[dict[str, str]] = {
        "pretrained_model_name_or_path": "source.path",
        "config": "source.config",
    }

    source: VitModelSource = Field(
        default_factory=lambda: VitModelSource(config={}),
        description="Where the model comes from: path (a pretrained directory) or config (a fresh init).",
    )


class VitDataSource(Source):
    """Where the images come from."""

    path: Path | None = Field(None, description="ImageFolder root holding train/ and val/.")
    builtin: Literal["digits"] | None = Field(
        None, description="'digits': scikit-learn's 1,797 8x8 digits rendered as an ImageFolder in the cache."
    )


class VitDataConfig(StrictModel):
    renamed_keys: ClassVar[dict[str, str]] = {
        "root": "source.path",
        "builtin": "source.builtin",
        "verify_images": "verify_files",
        "validation_split": "val_fraction",
    }

    source: VitDataSource = Field(
        description="Where the images come from: path (an ImageFolder root) or builtin."
    )
    image_size: int | None = Field(None, ge=1, description="Defaults to the model's image_size.")
    mean: list[float] | None = Field(None, description="Per-channel normalisation; default 0.5 each.")
    std: list[float] | None = Field(None, description="Per-channel normalisation; default 0.5 each.")
    random_crop_padding: int = Field(0, ge=0, description="Train augmentation: pad then random crop.")
    hflip: bool = Field(False, description="Train augmentation: random horizontal flip.")
    verify_files: bool = Field(False, description="Open every image at start and report corrupt files.")
    val_fraction: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Without a val/ or validation/ directory: hold out this share of train/, stratified by "
        "class and seeded with train.seed (the same images on every rank and every run).",
    )


class VitSampleCommandOptions(SampleCommandOptions):
    """`framer-ds sample RUN/final --image a.png b.png [--top-k 5]`: predicted labels per image."""

    image: list[Path] = Field(min_length=1, description="Image files to classify.")
    top_k: int = Field(5, ge=1, description="Labels printed per image, most probable first.")


@register_task
class VitClassificationTask(PlanningHooks, Task):
    name = "vit_classification"
    summary = "Image classification with a HF ViT (pretrained dir or fresh config) on an ImageFolder."
    ModelConfig = VitModelConfig
    DataConfig = VitDataConfig
    sample_options = VitSampleCommandOptions

    def __init__(self, config):
        super().__init__(config)
        self.index: ImageFolderIndex | None = None

    def data_root(self) -> Path:
        source = self.config.data.source
        if source.builtin == "digits":
            return default_cache_dir() / DIGITS_DIRNAME
        return Path(source.path)

    def vit_config(self) -> ViTConfig:
        """The architecture, read from the pretrained dir's config.json (no weights) or built fresh.
        transformers is imported where it is used: `framer-ds validate` and a cached `plan` import the
        task without building a model (its ViT modelling code is seconds of CPU)."""
        from transformers import ViTConfig

        source = self.config.model.source
        if source.path is not None:
            return ViTConfig.from_pretrained(source.path)
        return ViTConfig(**(source.config or {}))

    def check(self) -> list[ConfigProblem]:
        problems = []
        source, data = self.config.model.source, self.config.data
        pretrained = source.path
        if pretrained is not None and not (Path(pretrained) / "config.json").is_file():
            problems.append(
                ConfigProblem(
                    "model.source.path",
                    f"{pretrained} is not a saved model directory (no config.json). Download the model "
                    "once (e.g. `huggingface-cli download google/vit-large-patch16-224 --local-dir DIR`) "
                    "and point this key at DIR.",
                )
            )
            return problems
        from transformers import ViTConfig

        known = set(ViTConfig().to_dict())
        for key in source.config or {}:
            if key not in known:
                problems.append(
                    ConfigProblem(
                        f"model.source.config.{key}", f"not a ViTConfig field.{did_you_mean(key, known)}"
                    )
                )
        if problems:
            return problems
        arch = self.vit_config()
        if data.image_size is not None and data.image_size != arch.image_size:
            problems.append(
                ConfigProblem(
                    "data.image_size",
                    f"{data.image_size} differs from the model's image_size {arch.image_size}; "
                    "drop data.image_size or make them equal",
                )
            )
        for key in ("mean", "std"):
            values = getattr(data, key)
            if values is not None and len(values) != arch.num_channels:
                problems.append(
                    ConfigProblem(f"data.{key}", f"needs {arch.num_channels} values (one per channel)")
                )
        if data.source.path is not None:
            # Scanning needs no images opened (unless verify_files): cheap enough for a pre-flight,
            # and a layout error then fails before the run directory is touched.
            try:
                self._scan()
            except ConfigError as exc:
                problems += exc.problems
        return problems

    def data_report(self) -> str:
        """Every image is opened (verify_files), so corrupt files are listed before a job queues."""
        index = self._scan(verify_files=True)
        counts = {split: len(items) for split, items in (("train", index.train), ("val", index.val))}
        per_class = [sum(1 for _, label in index.train if label == i) for i in range(index.num_classes)]
        return (
            f"{self.data_root()}: {index.num_classes} classes; train {counts['train']} images, "
            f"val {counts['val']} images ({index.validation_source}); train images per class min "
            f"{min(per_class)}, max {max(per_class)}; "
            "all images decode"
        )

    def prepare_data(self) -> None:
        if self.config.data.source.builtin == "digits":
            ensure_digits_imagefolder(default_cache_dir())

    def _scan(self, verify_files: bool | None = None) -> ImageFolderIndex:
        data = self.config.data
        if self.index is None or verify_files:
            self.index = scan_image_folder(
                self.data_root(),
                verify_files=data.verify_files if verify_files is None else verify_files,
                val_fraction=data.val_fraction,
                split_seed=self.config.train.seed,
            )
        return self.index

    def data_summary(self) -> dict[str, str]:
        return {"validation": self._scan().validation_source}

    def normalisation(self, num_channels: int) -> tuple[list[float], list[float]]:
        """(mean, std) per channel: the configured ones, else 0.5 each."""
        data = self.config.data
        return data.mean or [0.5] * num_channels, data.std or [0.5] * num_channels

    def image_transform(self, arch: ViTConfig, train: bool) -> ImageTransform:
        """What training, evaluation and `framer-ds sample` apply to an image (training augments)."""
        data = self.config.data
        mean, std = self.normalisation(arch.num_channels)
        return ImageTransform(
            image_size=arch.image_size,
            num_channels=arch.num_channels,
            mean=mean,
            std=std,
            train=train,
            random_crop_padding=data.random_crop_padding,
            hflip=data.hflip,
        )

    def build_datasets(self):
        index = self._scan()
        arch = self.vit_config()
        return (
            ImageFolderDataset(
                index.train, self.image_transform(arch, train=True), ItemDraws(self.config.train.seed)
            ),
            ImageFolderDataset(index.val, self.image_transform(arch, train=False)),
        )

    def _data_absent(self) -> bool:
        """No image folder yet: `framer-ds plan` sizes the job from the checkpoint's own head instead."""
        return self.config.data.source.builtin is None and not self.data_root().exists()

    def train_example_count(self) -> int | None:
        return None if self._data_absent() else len(self._scan().train)

    def plan_assumptions(self) -> list[str]:
        if not self._data_absent():
            return []
        classes = self.vit_config().num_labels
        return [
            f"data not on disk ({self.data_root()}): assuming the checkpoint's {classes} classes, and no "
            "cap on the micro-batch from the training set's size"
        ]

    def build_model(self) -> torch.nn.Module:
        from transformers import ViTConfig, ViTForImageClassification

        pretrained = self.config.model.source.path
        labels = {}
        if not (pretrained is not None and building_empty() and self._data_absent()):
            index = self._scan()
            labels = {
                "num_labels": index.num_classes,
                "id2label": dict(enumerate(index.classes)),
                "label2id": {name: i for i, name in enumerate(index.classes)},
            }
        if pretrained is not None:
            # A new classifier head when the label count differs (ImageNet-1k -> Food-101).
            model = load_pretrained(
                ViTForImageClassification, pretrained, config_overrides=labels, ignore_mismatched_sizes=True
            )
        else:
            arch = ViTConfig(**{**(self.config.model.source.config or {}), **labels})
            model = build_fresh(lambda: ViTForImageClassification(arch))
        if self.config.train.gradient_checkpointing:
            enable = (
                getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            )
            enable()
        return model

    def example_batch(self, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """Every image is resized to the model's size, so the shapes come from its config alone."""
        arch = self.vit_config()
        size = (micro_batch_size, arch.num_channels, arch.image_size, arch.image_size)
        return {"pixel_values": torch.zeros(size), "labels": torch.zeros(micro_batch_size, dtype=torch.long)}

    def training_loss(self, model, batch) -> torch.Tensor:
        return model(pixel_values=batch["pixel_values"], labels=batch["labels"]).loss

    def eval_step(self, model, batch) -> dict[str, torch.Tensor]:
        """Per sample: its loss, and one-hot rows of its class and of its class when predicted right.
        Summed over the eval set (and ranks) these are per-class example and hit counts, so every
        accuracy is a ratio of exact integer totals, the same at any number of processes."""
        logits = model(pixel_values=batch["pixel_values"]).logits.float()
        labels = batch["labels"]
        examples = F.one_hot(labels, logits.shape[-1]).float()
        correct = (logits.argmax(-1) == labels).float()
        return {
            "loss": F.cross_entropy(logits, labels, reduction="none"),
            "class_examples": examples,
            "class_correct": examples * correct[:, None],
        }

    def summarize_eval(self, sums, num_samples: int) -> dict[str, float]:
        """`eval/loss`, `eval/accuracy` and `eval/mean_class_accuracy` (the mean over the classes the
        eval set holds of each class's accuracy: what plain accuracy hides on imbalanced classes)."""
        examples, correct = sums["class_examples"], sums["class_correct"]
        seen = examples > 0
        return {
            "eval/loss": float(sums["loss"]) / max(num_samples, 1),
            "eval/accuracy": float(correct.sum()) / max(num_samples, 1),
            "eval/mean_class_accuracy": float((correct[seen] / examples[seen]).mean())
            if bool(seen.any())
            else float("nan"),
        }

    def eval_details(self, sums, num_samples: int) -> dict[str, Any]:
        """eval.json's `per_class`: each class's name, held-out examples and accuracy (null: none held
        out)."""
        examples, correct = sums["class_examples"], sums["class_correct"]
        table = {}
        for index, name in enumerate(self._scan().classes):
            count = int(examples[index])
            accuracy = float(correct[index]) / count if count else None
            table[name] = {"examples": count, "accuracy": accuracy}
        return {"per_class": table}

    def load_export(self, model, export_dir: Path) -> torch.nn.Module:
        """final/'s `save_pretrained` weights into the model `build_model` made: `framer-ds eval RUN`."""
        load_full_export(model, export_dir)
        return model

    def export(self, accelerator, model, out_dir: Path) -> None:
        """`save_pretrained` weights (id2label holds the class names) plus the image processor that
        preprocesses as evaluation did (size, bicubic resize, normalisation), so
        `transformers.pipeline("image-classification", model=RUN/final)` works as it is."""
        save_pretrained_gathered(accelerator, model, out_dir)
        if accelerator.is_main_process:
            from transformers.image_utils import PILImageResampling

            ViTImageProcessor = image_processor_class("ViTImageProcessor")
            arch = self.vit_config()
            mean, std = self.normalisation(arch.num_channels)
            ViTImageProcessor(
                size={"height": arch.image_size, "width": arch.image_size},
                resample=PILImageResampling.BICUBIC,  # ImageTransform's resize
                image_mean=mean,
                image_std=std,
            ).save_pretrained(out_dir)
            if arch.num_channels != 3:
                accelerator.print(
                    f"note: final/ holds a {arch.num_channels}-channel model; it loads with "
                    "AutoModelForImageClassification and `framer-ds sample`, but transformers' image "
                    "pipelines feed RGB images: train with model.source.config.num_channels: 3 for "
                    "pipeline use"
                )

    @torch.no_grad()
    def sample(self, export_dir: Path, options: VitSampleCommandOptions) -> str:
        """The top-k labels of each `--image`, preprocessed exactly as evaluation did."""
        from transformers import AutoModelForImageClassification

        device = options.resolved_device()
        model = AutoModelForImageClassification.from_pretrained(export_dir).to(device).eval()
        images = ImageFolderDataset(
            [(path, 0) for path in options.image], self.image_transform(model.config, False)
        )
        lines = []
        for index, path in enumerate(options.image):
            pixels = images[index]["pixel_values"].unsqueeze(0).to(device)
            probabilities = model(pixel_values=pixels).logits.float().softmax(-1)[0]
            top = probabilities.topk(min(options.top_k, probabilities.numel()))
            labels = [
                f"{model.config.id2label[int(i)]} {float(p):.3f}"
                for p, i in zip(top.values, top.indices, strict=True)
            ]
            lines.append(f"{path}: " + ", ".join(labels))
        return "\n".join(lines)
