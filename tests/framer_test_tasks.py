"""A small task for distributed tests, registered via the config's `imports: [framer_test_tasks]`.

An MLP regression big enough that ZeRO-3 partitions it (with stage3_param_persistence_threshold 0),
optionally wrapped in a peft LoRA, whose dataset records which sample ids each rank trained on and
can poison chosen samples with NaN. Launched subprocesses import it through PYTHONPATH=tests.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch.utils.data import Dataset

from framer_ds.config.schema import StrictModel
from framer_ds.engine.export import save_module_gathered, save_peft_adapter_gathered
from framer_ds.tasks.base import Task
from framer_ds.tasks.registry import TaskCommand, register_task


class MlpModelConfig(StrictModel):
    width: int = 256
    depth: int = 4
    lora_rank: int = Field(0, description="0 = train the full MLP; >0 = peft LoRA on the linears.")


class MlpDataConfig(StrictModel):
    num_samples: int = 512
    eval_samples: int = 64
    dim: int = 32
    poison_ids: list[int] = Field(default_factory=list, description="Samples whose input is NaN.")
    record_dir: Path | None = Field(None, description="Each rank appends the sample ids it trained on.")
    sleep_per_batch_s: float = 0.0
    sleep_flag: Path | None = Field(
        None,
        description="When set, batches sleep only while this file exists: a test holds a run at a slow "
        "pace until it has stopped it, and the resumed run trains at full speed.",
    )
    startup_sleep_s: float = Field(0.0, description="Sleep while building the datasets (a slow start-up).")
    slow_checkpoint_flag: Path | None = Field(
        None,
        description="While this file exists, rank 0's next checkpoint takes `slow_checkpoint_s` longer (and "
        "deletes it): the write of a large state, for a test to time a stop checkpoint against a kill.",
    )
    slow_checkpoint_s: float = 0.0
    bad_grad_after_batches: int = Field(
        0,
        description="From this process's N-th training micro-batch on (0 = never) the loss stays finite "
        "but its gradient is bad (`bad_grad`), as when a backward overflows.",
    )
    bad_grad_batches: list[int] = Field(
        default_factory=list,
        description="This process's N-th training micro-batches (counted from 1) whose loss is finite but "
        "whose gradient is bad (`bad_grad`): a loss scaler's overflow on chosen steps only.",
    )
    bad_grad: Literal["nan", "huge"] = Field(
        "nan",
        description="'nan': every gradient is NaN, so the step leaves the weights NaN. 'huge': gradients "
        "of ~1e20, finite, but Adam's squared-gradient moment overflows to inf (weights stay finite).",
    )


class RegressionSet(Dataset):
    def __init__(self, n: int, dim: int, seed: int, poison: set[int]):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=gen)
        self.w = torch.randn(dim, 1, generator=torch.Generator().manual_seed(1234))
        self.y = torch.tanh(self.x @ self.w) + 0.1 * torch.randn(n, 1, generator=gen)
        self.poison = poison

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.full_like(self.x[i], float("nan")) if i in self.poison else self.x[i]
        return {"x": x, "y": self.y[i], "id": torch.tensor(i)}


class Mlp(torch.nn.Module):
    def __init__(self, dim: int, width: int, depth: int):
        super().__init__()
        layers: list[torch.nn.Module] = [torch.nn.Linear(dim, width), torch.nn.GELU()]
        for _ in range(depth - 1):
            layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        layers.append(torch.nn.Linear(width, 1))
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@register_task
class MlpRegressionTask(Task):
    name = "test_mlp_regression"
    summary = "Test-only MLP regression (distributed equivalence, faults, LoRA under ZeRO-3)."
    ModelConfig = MlpModelConfig
    DataConfig = MlpDataConfig

    def __init__(self, config):
        super().__init__(config)
        self.batches_trained = 0

    def build_datasets(self):
        data = self.config.data
        if data.startup_sleep_s:
            print("building datasets (slowly)", flush=True)
            time.sleep(data.startup_sleep_s)
        train = RegressionSet(data.num_samples, data.dim, seed=0, poison=set(data.poison_ids))
        return train, RegressionSet(data.eval_samples, data.dim, seed=1, poison=set())

    def build_model(self) -> torch.nn.Module:
        torch.manual_seed(self.config.train.seed)
        model = Mlp(self.config.data.dim, self.config.model.width, self.config.model.depth)
        if self.config.model.lora_rank:
            from peft import LoraConfig, get_peft_model

            targets = [str(i) for i, m in enumerate(model.net) if isinstance(m, torch.nn.Linear)]
            lora = LoraConfig(
                r=self.config.model.lora_rank,
                lora_alpha=8,
                target_modules=targets,
                init_lora_weights="gaussian",
            )
            model = get_peft_model(model, lora)
        return model

    def training_loss(self, model, batch) -> torch.Tensor:
        data = self.config.data
        if data.record_dir is not None:
            rank = int(os.environ.get("RANK", "0"))
            with open(Path(data.record_dir) / f"rank{rank}.jsonl", "a") as f:
                f.write(json.dumps(batch["id"].tolist()) + "\n")
        if data.sleep_per_batch_s and (data.sleep_flag is None or data.sleep_flag.exists()):
            time.sleep(data.sleep_per_batch_s)
        pred = model(batch["x"]).float()
        loss = F.mse_loss(pred, batch["y"].float())
        self.batches_trained += 1
        after = data.bad_grad_after_batches and self.batches_trained >= data.bad_grad_after_batches
        if after or self.batches_trained in data.bad_grad_batches:
            if data.bad_grad == "nan":  # sqrt's derivative at 0 is inf and 0 * inf is NaN; the value adds 0
                loss = loss + 0.0 * torch.sqrt(pred.sum() * 0.0)
            else:  # adds 0, and 1e20 to d loss / d pred
                loss = loss + (pred.sum() * 1e20 - (pred.sum() * 1e20).detach())
        return loss

    def eval_step(self, model, batch) -> dict[str, torch.Tensor]:
        pred = model(batch["x"]).float()
        return {"loss": ((pred - batch["y"].float()) ** 2).mean(dim=1)}

    def checkpoint_artifacts(self, accelerator, model, checkpoint_dir: Path) -> None:
        flag = self.config.data.slow_checkpoint_flag
        if flag is not None and accelerator.is_main_process and flag.exists():
            time.sleep(self.config.data.slow_checkpoint_s)
            flag.unlink(missing_ok=True)

    def export(self, accelerator, model, out_dir: Path) -> None:
        if self.config.model.lora_rank:
            save_peft_adapter_gathered(accelerator, model, out_dir)
        else:
            save_module_gathered(accelerator, model, out_dir / "model.safetensors")


class ScriptedEvalDataConfig(MlpDataConfig):
    eval_script: list[float] = Field(
        default_factory=list,
        description="eval/score of this process's k-th evaluation (the last value once past the end); "
        "empty = no eval/score.",
    )
    no_eval_set: bool = Field(False, description="Build no eval set.")
    sample_every: int = Field(0, description="write_samples every N steps: an image, two videos, audio.")


@register_task
class ScriptedEvalTask(MlpRegressionTask):
    """The MLP task with an eval metric the test decides (`data.eval_script`, by evaluation count in
    this process) and media samples of every kind a tracker shows (PNG, GIF, mp4, WAV)."""

    name = "test_scripted_eval"
    summary = "Test-only: MLP regression with a scripted eval/score and media samples."
    DataConfig = ScriptedEvalDataConfig

    def __init__(self, config):
        super().__init__(config)
        self.evaluations = 0
        self.signalled: set[str] = set()
        self.signalled_checkpoints: list[Path] = []  # the checkpoints this process wrote
        self.exports = 0

    def build_datasets(self):
        train, evaluation = super().build_datasets()
        return train, None if self.config.data.no_eval_set else evaluation

    def summarize_eval(self, sums, num_samples):
        metrics = super().summarize_eval(sums, num_samples)
        script = self.config.data.eval_script
        if script:
            metrics["eval/score"] = float(script[min(self.evaluations, len(script) - 1)])
        self.evaluations += 1
        return metrics

    def training_loss(self, model, batch) -> torch.Tensor:
        loss = super().training_loss(model, batch)
        _signal_self_at(self, "batch", self.batches_trained)
        return loss

    def eval_step(self, model, batch) -> dict[str, torch.Tensor]:
        _signal_self_at(self, "eval", self.evaluations + 1)  # during the (evaluations + 1)-th evaluation
        return super().eval_step(model, batch)

    def checkpoint_artifacts(self, accelerator, model, checkpoint_dir: Path) -> None:
        _signal_self_at(self, "checkpoint", len(self.signalled_checkpoints) + 1)
        self.signalled_checkpoints.append(checkpoint_dir)

    def export(self, accelerator, model, out_dir: Path) -> None:
        self.exports += 1
        _signal_self_at(self, "export", self.exports)
        super().export(accelerator, model, out_dir)

    def sample_every(self) -> int:
        return self.config.data.sample_every

    def write_samples(self, accelerator, model, step: int, out_dir: Path) -> list[Path]:
        if not accelerator.is_main_process:
            return []
        import numpy as np
        import soundfile
        from PIL import Image

        from framer_ds.tasks.video_lora.shared.data.video_write import write_video

        folder = Path(out_dir) / f"step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        frames = [np.full((16, 24, 3), 40 * t, dtype=np.uint8) for t in range(5)]  # 5 frames, 24 x 16
        Image.fromarray(frames[2]).save(folder / "image.png")
        gif = [Image.fromarray(frame) for frame in frames]
        gif[0].save(folder / "clip_gif.gif", save_all=True, append_images=gif[1:], duration=100, loop=0)
        write_video(folder / "clip_mp4.mp4", frames, fps=8)
        tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000).astype(np.float32)
        soundfile.write(folder / "tone.wav", tone, 16000)
        return [folder / name for name in ("image.png", "clip_gif.gif", "clip_mp4.mp4", "tone.wav")]


def _signal_self_at(task, phase: str, count: int) -> None:
    """FRAMER_TEST_SIGNAL=PHASE:N (phase `batch`: after this process's N-th training micro-batch, before
    the loop exchanges its flags; `eval`: during its N-th evaluation; `checkpoint` / `export`: while
    writing its N-th checkpoint / export, e.g. best/): this process sends itself SIGUSR1 once, as
    Slurm's `--signal` would at that moment; only the process of rank FRAMER_TEST_SIGNAL_RANK (default
    0) does. A stop signal at an exactly chosen point of a real run."""
    wanted = os.environ.get("FRAMER_TEST_SIGNAL")
    if wanted != f"{phase}:{count}" or wanted in task.signalled:
        return
    if os.environ.get("RANK", "0") != os.environ.get("FRAMER_TEST_SIGNAL_RANK", "0"):
        return
    import signal

    task.signalled.add(wanted)
    os.kill(os.getpid(), signal.SIGUSR1)


PHASE_CALLS: list[tuple[str, float]] = []
"""What `PhaseRecordingTask` did, in order: (phase, the first draw of torch's global RNG in it)."""


@register_task
class PhaseRecordingTask(MlpRegressionTask):
    """The MLP task recording each phase that builds a run, with a draw of the global RNG in it:
    `prepare_data` draws one as generating built-in data does (only when the data is missing)."""

    name = "test_phase_recording"
    summary = "Test-only: MLP regression recording the order of its phases."

    def _record(self, phase: str) -> None:
        PHASE_CALLS.append((phase, torch.rand(()).item()))

    def prepare_data(self) -> None:
        self._record("prepare_data")

    def build_datasets(self):
        self._record("build_datasets")
        return super().build_datasets()

    def setup_frozen(self, accelerator) -> None:
        self._record("setup_frozen")

    def precompute(self, accelerator, train_set, eval_set):
        self._record("precompute")
        return train_set, eval_set

    def build_model(self) -> torch.nn.Module:
        self._record("build_model")
        return super().build_model()

    def load_export(self, model, export_dir: Path) -> torch.nn.Module:
        from framer_ds.engine.export_load import load_full_export

        load_full_export(model, export_dir)
        return model


COMMANDS = (
    TaskCommand(
        "count-samples",
        help="print how many training samples a config's data has (test-only)",
        run=lambda task, shard: f"{len(task.build_datasets()[0])} training samples",
    ),
)
"""What this module contributes to `framer-ds data` when an entry point of the group
`framer_ds.task_commands` names it (tests/tasks/test_task_registry.py)."""


class TokenModelConfig(StrictModel):
    width: int = 64
    depth: int = 2


class TokenDataConfig(StrictModel):
    num_samples: int = 256
    eval_samples: int = Field(
        45, description="Not a multiple of 2 x micro-batch: the last eval batch is padded."
    )
    seq_len: int = 12
    dim: int = 16
    record_dir: Path | None = Field(None, description="Each rank appends the sample ids it trained on.")


def valid_tokens(sample_id: int, seq_len: int) -> int:
    """Sample i has 1..seq_len valid positions, very unequal between neighbours (micro-batches)."""
    return 1 + (sample_id * 7 + sample_id // 5) % seq_len


class TokenSet(Dataset):
    """Sequences of `seq_len` positions of which only the first `valid_tokens(i)` count (padding after)."""

    def __init__(self, n: int, seq_len: int, dim: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, seq_len, dim, generator=gen)
        w = torch.randn(dim, 1, generator=torch.Generator().manual_seed(99))
        self.y = torch.tanh(self.x @ w) + 0.1 * torch.randn(n, seq_len, 1, generator=gen)
        lengths = torch.tensor([valid_tokens(i, seq_len) for i in range(n)])
        self.mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).float()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i], "mask": self.mask[i], "id": torch.tensor(i)}


def masked_squared_error(model, batch) -> torch.Tensor:
    """[B] sums of squared errors over each sample's valid positions."""
    error = (model(batch["x"]).float() - batch["y"].float()).squeeze(-1) ** 2
    return (error * batch["mask"].float()).sum(dim=1)


@register_task
class TokenRegressionTask(Task):
    """A token-style task: the loss is a sum over valid positions, normalised by the loop."""

    name = "test_token_regression"
    summary = "Test-only masked sequence regression reporting a summed loss and its token count."
    ModelConfig = TokenModelConfig
    DataConfig = TokenDataConfig
    loss_reduction = "sum"

    def build_datasets(self):
        data = self.config.data
        train = TokenSet(data.num_samples, data.seq_len, data.dim, seed=0)
        return train, TokenSet(data.eval_samples, data.seq_len, data.dim, seed=1)

    def build_model(self) -> torch.nn.Module:
        torch.manual_seed(self.config.train.seed)
        return Mlp(self.config.data.dim, self.config.model.width, self.config.model.depth)

    def count_loss_items(self, batch) -> torch.Tensor:
        return batch["mask"].sum()

    def training_loss(self, model, batch) -> torch.Tensor:
        if self.config.data.record_dir is not None:
            rank = int(os.environ.get("RANK", "0"))
            with open(Path(self.config.data.record_dir) / f"rank{rank}.jsonl", "a") as f:
                f.write(json.dumps(batch["id"].tolist()) + "\n")
        return masked_squared_error(model, batch).sum()

    def eval_step(self, model, batch) -> dict[str, torch.Tensor]:
        return {
            "squared_error": masked_squared_error(model, batch),
            "tokens": batch["mask"].float().sum(dim=1),
        }

    def summarize_eval(self, sums, num_samples):
        return {
            "eval/loss": (sums["squared_error"] / sums["tokens"]).item(),
            "eval/samples": float(num_samples),
        }

    def export(self, accelerator, model, out_dir: Path) -> None:
        save_module_gathered(accelerator, model, out_dir / "model.safetensors")


@register_task
class TokenRegressionMeanTask(TokenRegressionTask):
    """The same data and model trained on per-micro-batch token means: what the loop would do without
    count normalisation (unequal micro-batches weigh their tokens unequally)."""

    name = "test_token_regression_mean"
    summary = "Test-only: test_token_regression with a per-micro-batch mean loss."
    loss_reduction = "mean"

    def training_loss(self, model, batch) -> torch.Tensor:
        return masked_squared_error(model, batch).sum() / batch["mask"].sum()


def _install_kill_during_save() -> None:
    """FRAMER_TEST_KILL_DURING_SAVE=N: rank 0 SIGKILLs itself right after writing its part of the step-N
    checkpoint, before the rename that publishes it: a job killed in the middle of a save."""
    step = os.environ.get("FRAMER_TEST_KILL_DURING_SAVE")
    if not step:
        return
    import signal

    from accelerate import Accelerator

    original = Accelerator.save_state

    def save_state_then_die(self, output_dir=None, **kwargs):
        result = original(self, output_dir, **kwargs)
        if Path(str(output_dir)).name == f".tmp_step_{step}" and self.is_main_process:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    Accelerator.save_state = save_state_then_die


def _install_blind_rank() -> None:
    """FRAMER_TEST_BLIND_RANK=R: rank R cannot read what rank 0 writes into the run directory, as on a
    node whose output_dir is a local disk instead of the shared file system."""
    blind = os.environ.get("FRAMER_TEST_BLIND_RANK")
    if blind is None or os.environ.get("RANK") != blind:
        return
    from framer_ds.engine import run_dir

    original = Path.read_text

    def read_text(self, *args, **kwargs):
        if self.name == run_dir.SHARED_MARKER:
            raise FileNotFoundError(self)
        return original(self, *args, **kwargs)

    Path.read_text = read_text


_install_kill_during_save()
_install_blind_rank()
