"""What a family of video bases supplies to the video_lora task (finetrainers' per-model
"specification", `finetrainers/models/wan/base_specification.py`, is the pattern).

Why one object per family: SVD/Framer (EDM on a UNet) and Wan (rectified flow on a DiT) differ in what
they load, how they encode a clip, their objective, LoRA targets, export layout and sampler, but share
the task's data, buckets, latent cache, strategies and loop. `VideoLoraTask` keeps what every base
shares and asks its family (chosen from `model.base.name`, `families.family_for`) for the rest, so a
new base is one more family, not one more `if` in the task.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.precision import compute_dtype
from framer_ds.tasks.video_lora.shared.data.buckets import AUTO_FRAME_STEP


@dataclass
class ClipToSample:
    """One clip to sample from its given frames during training (a validation sample, an interp_eval
    clip): what any family may condition on; each reads the fields it has a use for."""

    video_id: str  # the clip's id: its caption (Wan) is looked up by it
    first: torch.Tensor  # [3, H, W] in [-1, 1], on the device
    last: torch.Tensor | None  # interpolation mode
    num_frames: int
    fps: float | None  # the rate training conditioned on: SVD's fps, LTX-2's (a cached Wan clip: none)
    motion_bucket: int | None  # SVD's motion conditioning (None: the run's fixed bucket)
    controlnet_cond: torch.Tensor | None = None  # [1, F, 3, H, W] Framer's point heatmaps
    prompt_emb: torch.Tensor | None = None  # [L, D] the clip's cached UMT5 states (Wan, latent cache)


class CachedBatch:
    """An encoded batch (a dataclass of tensors, None where a base has no such input) as the latent cache
    stores it: entry = one clip's tensors, a cached batch = the entries collated. Mixed into each
    family's encoded batch (SVD's `EncodedClip`, Wan's `WanEncodedClip`)."""

    def cache_entry(self, index: int) -> dict[str, torch.Tensor]:
        """Clip `index` of the batch, as the tensors one cache entry stores."""
        present = [f.name for f in fields(self) if getattr(self, f.name) is not None]
        return {name: getattr(self, name)[index] for name in present}

    @classmethod
    def from_cached_batch(cls, batch: dict[str, Any]) -> Any:
        """A batch of cache entries (with the loader's other keys, which are left out)."""
        return cls(**{f.name: batch[f.name] for f in fields(cls) if f.name in batch})


class FrozenHelpers(ABC):
    """The holder of a base's frozen encoders: loaded outside ZeRO-3 init, never prepared (only one model
    may be, under DeepSpeed), on the device only while they encode or sample when the latent cache is on.
    `lent`: on the device for interp_eval under the cache, until the next training step."""

    vae: torch.nn.Module | None = None
    lent: bool = False

    @abstractmethod
    def load(self) -> tuple[torch.nn.Module, ...]:
        """Fresh modules (`framer-ds plan` counts them on meta, the VAE first)."""

    @abstractmethod
    def on_device(self, accelerator) -> tuple[torch.nn.Module | None, ...]:
        """Loaded once (frozen, eval), then on the accelerator's device in their dtypes."""

    @abstractmethod
    def release(self) -> None:
        """Off the device: the cache holds what they encode; a sampling round brings them back."""

    def _move_to_device(self, accelerator, modules: list[torch.nn.Module]) -> None:
        """`modules` onto the accelerator's device: the VAE in float32 (its decode is the output's
        precision), every other encoder in the run's compute dtype."""
        dtype = compute_dtype(accelerator)
        for module in modules:
            wanted = torch.float32 if module is self.vae else dtype
            module.to(accelerator.device)
            if module.dtype != wanted:
                module.to(dtype=wanted)

    def release_if_lent(self) -> None:
        """After interp_eval under the latent cache: off the device before training goes on."""
        if self.lent:
            self.lent = False
            self.release()


class FamilySampler(ABC):
    """The model being trained, with the frozen encoders on the device, as one family samples it
    (`VideoBaseFamily.training_sampler`). Every rank calls `sample` the same number of times: under
    ZeRO-3 / FSDP2 each denoiser forward is a collective."""

    @abstractmethod
    def sample(
        self,
        clip: ClipToSample,
        settings: Any,
        generator: torch.Generator,
        on_step: Callable[[], Any] | None = None,
    ) -> torch.Tensor:
        """Frames [T, 3, H, W] in [-1, 1]. `settings`: the run's `SamplingSettings` (samples or
        interp_eval); `on_step`: called after each denoising step (a progress bar)."""

    @abstractmethod
    def steps(self, settings: Any) -> int:
        """Denoising steps one `sample` takes (the progress bar's unit)."""

    @abstractmethod
    def embed(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames [N, 3, H, W] in [-1, 1] -> image embeddings [N, D] (eval/clip_distance), with the
        run's own CLIP image encoder."""

    @abstractmethod
    def record(self, clip: ClipToSample, settings: Any) -> dict[str, Any]:
        """What this sample conditioned on beyond its input, seed and frame count (the `<name>.json`
        written beside a validation video, as `framer-ds sample` writes one)."""


class VideoBaseFamily(ABC):
    """One base family of a video_lora run; built from the run's config, bound to the accelerator in
    `setup_frozen`."""

    frozen_helper_names = "VAE + image encoder"
    """The frozen encoders, as the run summary names them (`VideoLoraTask.frozen_helpers_placement`)."""

    def __init__(self, config: Any):
        self.config = config
        self.accelerator = None  # from setup_frozen: the device per-batch hooks draw on

    # --- paths, pre-flight, data shape ---------------------------------------------------------------

    @abstractmethod
    def base_path(self) -> Path:
        """The base model's diffusers folder (a builtin base's in the cache)."""

    @abstractmethod
    def prepare(self) -> None:
        """Build a builtin base once (before any rank loads it)."""

    @abstractmethod
    def check(self, data_root: Path) -> list[ConfigProblem]:
        """Every problem of the config for this base (files on disk, keys that do not apply)."""

    @abstractmethod
    def size_multiple(self) -> int:
        """What frame height and width must be multiples of (the VAE's and the denoiser's downsampling)."""

    @abstractmethod
    def min_frames(self) -> int:
        """Fewest frames a training clip may have."""

    def prepare_data(self, data: Any) -> None:
        """Once per node before the other ranks read the data (`VideoLoraData`): what this base derives
        from the clips and caches (SVD's motion scores)."""
        return None

    @property
    def clip_placement(self) -> bool:
        """Whether each clip carries its placement (start, stride, crop, flip; Framer's point tracks
        follow it)."""
        return False

    def datasets(self, built: Any, data: Any) -> tuple[Dataset, Dataset | None]:
        """The training and held-out datasets `data.build()` made (`built`), as this base trains on them
        (SVD adds each clip's motion bucket, Framer its point heatmaps)."""
        return built.train, built.val

    def cached_datasets(
        self, train: Dataset, val: Dataset | None, records: list[Any]
    ) -> tuple[Dataset, Dataset | None]:
        """The latent cache's datasets as this base trains on them (`records`: the videos of both)."""
        return train, val

    def compute_tracks(self, data: Any, shard: tuple[int, int]) -> str:
        """`framer-ds data tracks`: a base without a trajectory ControlNet has no use for point tracks."""
        problem = ConfigProblem(
            "data.tracks",
            f"model.base.name {self.config.model.base.name!r} reads no point tracks (only Framer's "
            "ControlNet does): set model.base.name framer or drop data.tracks",
        )
        raise ConfigError([problem], "data tracks")

    def record_problems(self, records: Callable[[], list[Any]]) -> list[ConfigProblem]:
        """Problems of the indexed videos (`records()` indexes them) this base alone has (a missing
        caption); a base without per-clip files never indexes."""
        return []

    def note_records(self, records: list[Any]) -> None:
        """The videos the run trains and evaluates on (a base that reads per-clip files keeps them)."""
        return None

    def frame_count_problem(self, num_frames: int) -> str | None:
        """Why `num_frames` cannot train on this base (None: it can)."""
        return None

    def frame_grid(self) -> tuple[int, int]:
        """(offset, step): `data.buckets: auto` gives a clip shorter than data.num_frames the longest
        length offset + k * step it holds. SVD's UNet takes any length, so the step only keeps auto's
        shapes few (multiples of 4); a base whose VAE compresses time needs its own grid (Wan: 1 + 4k)."""
        return 0, AUTO_FRAME_STEP

    # --- models --------------------------------------------------------------------------------------

    @abstractmethod
    def build_model(self, gradient_checkpointing: bool) -> torch.nn.Module:
        """The trainable denoiser with its LoRA (the one model that goes through `prepare`)."""

    def optimizer_groups(self, model: torch.nn.Module) -> list[dict] | None:
        """Parameter groups with their own settings; None: one group."""
        return None

    @abstractmethod
    def fsdp_block_classes(self, model: torch.nn.Module) -> list[str]:
        """Class names of the denoiser's repeated blocks (one FSDP2 unit each)."""

    @property
    @abstractmethod
    def frozen(self) -> Any:
        """The holder of the frozen encoders (`vae` None until loaded, `on_device`, `load`, `release`,
        `release_if_lent`)."""

    # --- objective -----------------------------------------------------------------------------------

    @abstractmethod
    def encode(self, batch: dict, eval_generator: list[torch.Generator] | None = None) -> Any:
        """A batch as the loss reads it (the latent cache stores its `cache_entry(0)`): read back from
        the cache, or encoded now by the frozen encoders. `eval_generator`: eval's per-clip generators,
        every draw deterministic."""

    @abstractmethod
    def training_loss(self, model: torch.nn.Module, batch: dict) -> torch.Tensor:
        """The training objective on one batch (a mean)."""

    @abstractmethod
    def eval_losses(
        self, model: torch.nn.Module, batch: dict, generators: list[torch.Generator]
    ) -> dict[str, torch.Tensor]:
        """Per-clip held-out losses at fixed noise levels (`loss` their mean), seeded per clip."""

    def cache_entry(self, encoded: Any, batch: dict) -> dict[str, torch.Tensor]:
        """What one latent-cache entry stores of `encoded`, the encoding of `batch` (one item)."""
        return encoded.cache_entry(0)

    @abstractmethod
    def cache_description(self, dataset: Dataset, split: str, copies: int, dtype: str) -> dict[str, Any]:
        """Everything that decides a split's cached tensors (its hash is the cache key)."""

    @abstractmethod
    def example_batch(self, config: Any, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """`framer-ds plan`'s batch, shaped as the cache stores it, from configs only (no weights)."""

    # --- sampling the model being trained -------------------------------------------------------------

    @abstractmethod
    def training_sampler(self, model: torch.nn.Module) -> FamilySampler:
        """`model` (the prepared model: ZeRO-3 gathers its shards) with the frozen encoders on the
        device and the base's own sampler (validation samples, interp_eval); the caller releases the
        encoders after (`frozen.release`, or `frozen.lent` for interp_eval)."""

    def helper_dtypes(self, helpers: list[torch.nn.Module], compute: torch.dtype) -> list[torch.dtype]:
        """The dtype `frozen.on_device` gives each of `helpers` (`frozen.load()`'s modules, in order), for
        `framer-ds plan`."""
        return [compute] * len(helpers)

    @abstractmethod
    def decode_transient(self, vae: torch.nn.Module, chunk: int) -> None:
        """`framer-ds plan`'s probe of a sampling round's decode: `vae` decoding zeros shaped as the
        sampler decodes (`chunk`: the most frames one SVD decode call takes)."""

    # --- `framer-ds smoke` (smoke.py asks; a family answers for its own folders and flags) -------------

    def smoke_bases(self) -> list[tuple[str, Any, Callable[[Path, Path], Path], str]]:
        """(key, folder, builder(out, architecture) -> out, what) of each base folder the config names by
        path: the smoke swaps each for a tiny random one of the same architecture."""
        return []

    @property
    def reads_captions(self) -> bool:
        """Whether each clip's prompt comes from a caption file beside it (the smoke writes one)."""
        return False

    def smoke_export_format(self) -> str:
        """The `framer-ds export --format` users of this base export to (the smoke runs it)."""
        return "peft"

    def smoke_sample_flags(self, samples: Any, caption: str) -> list[str]:
        """This base's own `framer-ds sample` flags at the recipe's samples settings (`caption`: the
        prompt of the smoke's synthetic clips)."""
        return []

    # --- export and sampling -------------------------------------------------------------------------

    @abstractmethod
    def export(self, accelerator, model: torch.nn.Module, out_dir: Path, run_facts: dict[str, Any]) -> None:
        """Write the adapter and its metadata to `out_dir` (every rank calls; ZeRO-3 gathers).
        `run_facts`: what the task learnt from the data (trained fps, shapes)."""

    def export_record_fields(self) -> dict[str, Any]:
        """Facts framer_ds_export.json records beside `base_model` (a Wan 2.2 run: its expert)."""
        return {}

    @abstractmethod
    def load_export(self, model: torch.nn.Module, export_dir: Path) -> torch.nn.Module:
        """An export's adapter into the model `build_model` made."""

    @abstractmethod
    def sample(self, export_dir: Path, options: Any) -> str:
        """`framer-ds sample`: a video file from an export; returns a one-line summary."""

    @abstractmethod
    def export_command(self, export_dir: Path, options: Any) -> str:
        """`framer-ds export --format ...`; returns a one-line summary."""


def per_clip_noise(target: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """Float32 noise shaped like `target`, each clip's from its own generator (the same for a clip
    whichever clips share its batch)."""
    return torch.stack(
        [
            torch.randn(target.shape[1:], generator=g, device=target.device, dtype=torch.float32)
            for g in generators
        ]
    )
