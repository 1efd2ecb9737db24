"""`framer-ds smoke CONFIG [key=value ...]`: a shipped recipe end to end on this CPU machine, before a job
queues for GPUs.

It keeps everything of the recipe that can break - the task, each base's architecture, the data layout
and shapes, sequence length, vocabulary, LoRA targets, precision, cadences' code paths, and the strategy
its header launches (lab/smoke_launch.py: ZeRO/FSDP2/DDP recipes on 2 CPU processes over gloo) - and swaps
only what cannot run here, each change said in one line: base weights become a tiny random model of the
same architecture and a data folder that is not on disk becomes synthetic data in the recipe's layout
(the task's hooks, tasks/smoke.py); a shape this machine cannot run in minutes at any width shrinks, named.
W&B runs offline (no server is reachable from a laptop or a CI runner).

Phases, each the command a user types (lab/smoke_phases.py): `train` 2 optimizer steps with a checkpoint
at step 2, `resume` from it for 1 more, `export` (final/, and `framer-ds export` in the task's main format
where it has formats), `eval`, and `sample` at the recipe's sampling settings (tasks that sample: video).
The smoke ends with one line per phase and exits 0 only when every phase is ok.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from framer_ds.lab.smoke_launch import RecipeLaunch, recipe_launch, repo_root
from framer_ds.lab.smoke_phases import PhaseResult, run_checked, run_in_process, run_launched
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.smoke import SmokeStandIns, smoke_hooks

TRAIN_STEPS, RESUME_STEPS = 2, 3
PHASES = ("train", "resume", "export", "eval", "sample")


def smoke_root() -> Path:
    """Where stand-in bases and synthetic data are built once and reused: $FRAMER_DS_CACHE/smoke."""
    return default_cache_dir() / "smoke"


@dataclass
class SmokePlan:
    config_path: Path
    overrides: list[str]
    """The user's overrides, then the stand-ins' and the smoke's own."""
    launch: RecipeLaunch
    repo: Path
    out: Path
    stand_ins: SmokeStandIns = field(default_factory=SmokeStandIns)
    samples: bool = False
    """Whether the task has a `sample` phase (`SmokeHooks.smoke_samples`)."""
    command: Callable[[list[str]], int] | None = None
    """`framer-ds ARGV` in this process: the CLI's `main`, which `run_smoke` is given (lab sits below
    cli and does not import it)."""

    @property
    def run_dir(self) -> Path:
        return self.out / "run"

    def lines(self) -> list[str]:
        """What the smoke runs, what it kept and what it changed, before it starts."""
        found = [
            f"smoke {self.config_path}: {self.launch.describe(self.repo)}",
            *(f"  swapped: {line}" for line in self.stand_ins.swapped),
            *(f"  shrunk:  {line}" for line in self.stand_ins.shrunk),
        ]
        if not self.stand_ins.swapped and not self.stand_ins.shrunk:
            found.append("  nothing swapped or shrunk: the recipe's own models and data")
        return found


def plan_smoke(config_path: Path, overrides: list[str], out: Path) -> SmokePlan:
    """Read the recipe and build its stand-ins (the task's hooks); ConfigError when it cannot be smoked."""
    config = load_run_config(config_path, overrides)
    hooks = smoke_hooks(get_task_class(config.task)(config))
    stand_ins = hooks.smoke_stand_ins(smoke_root())
    if config.log.wandb is not None and not config.log.wandb.offline:
        stand_ins.overrides.append("log.wandb.offline=true")
        stand_ins.swapped.append("log.wandb: offline, into the run's wandb/ (no W&B server is reached)")
    launch = recipe_launch(config_path)
    everything = [*overrides, *stand_ins.overrides]
    root = repo_root(config_path)
    # absolute: a launched phase runs in this working directory too, but reads them from its arguments
    config, out = Path(config_path).resolve(), Path(out).resolve()
    return SmokePlan(config, everything, launch, root, out, stand_ins, hooks.smoke_samples)


def run_smoke(
    plan: SmokePlan, command: Callable[[list[str]], int], say: Callable[[str], None] = print
) -> list[PhaseResult]:
    """Every phase in order (`sample` only for a task that samples), each announced and its line said
    when it ends; a phase after a failed `train` or `resume` is not run, and its line says so. Returns
    one result per phase."""
    shutil.rmtree(plan.run_dir, ignore_errors=True)  # a smoke starts clean: train is not a resume
    plan.command = command
    results: list[PhaseResult] = []
    for name in [p for p in PHASES if p != "sample" or plan.samples]:
        failed = [r.name for r in results if not r.ok and r.name in ("train", "resume")]
        if failed:
            results.append(PhaseResult(name, False, f"not run: {failed[0]} failed"))
            continue
        say(f"--- smoke phase: {name} ---")
        results.append(_PHASE_RUNNERS[name](plan))
        say(results[-1].render())
    return results


def _train_argv(plan: SmokePlan, steps: int, *extra: str) -> list[str]:
    cadence = [f"train.length.steps={steps}", f"train.checkpoint.every.steps={TRAIN_STEPS}"]
    return ["train", str(plan.config_path), *plan.overrides, *cadence, f"output_dir={plan.run_dir}", *extra]


def _training(plan: SmokePlan, name: str, argv: list[str], check: Callable[[], str]) -> PhaseResult:
    log = plan.out / "logs" / f"{name}.log"
    if plan.launch.distributed:
        launch = plan.launch.cpu_launch_args(plan.repo)
        return run_launched(name, launch, argv, log, Path.cwd(), check)  # relative paths as in process
    return run_in_process(name, plan.command, argv, log, check)


def _in_process(plan: SmokePlan, name: str, argv: list[str], check: Callable[[], str]) -> PhaseResult:
    return run_in_process(name, plan.command, argv, plan.out / "logs" / f"{name}.log", check)


def _summaries(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["run_summary"] for line in lines if '"run_summary"' in line]


def _last_step(run_dir: Path) -> int:
    steps = [json.loads(line).get("step", 0) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return max(steps, default=0)


def _phase_train(plan: SmokePlan) -> PhaseResult:
    def check() -> str:
        run = plan.run_dir
        assert (run / "checkpoints" / f"step_{TRAIN_STEPS}").is_dir(), f"no checkpoints/step_{TRAIN_STEPS}"
        assert _last_step(run) == TRAIN_STEPS, f"metrics.jsonl ends at step {_last_step(run)}"
        summary = _summaries(run)[-1]
        return f"{TRAIN_STEPS} optimizer steps, checkpoint step_{TRAIN_STEPS}; {summary['strategy']}"

    return _training(plan, "train", _train_argv(plan, TRAIN_STEPS, "--overwrite"), check)


def _phase_resume(plan: SmokePlan) -> PhaseResult:
    def check() -> str:
        start = _summaries(plan.run_dir)[-1]["start"]
        assert start.startswith(f"step {TRAIN_STEPS} from"), f"the second run started at {start}"
        assert _last_step(plan.run_dir) == RESUME_STEPS, f"metrics.jsonl ends at {_last_step(plan.run_dir)}"
        return f"{start}, on to step {RESUME_STEPS}"

    return _training(plan, "resume", _train_argv(plan, RESUME_STEPS, "train.resume=latest"), check)


def _run_task(plan: SmokePlan):
    """The task of the config the smoke trained (its hooks build the export and sample arguments)."""
    config = load_run_config(plan.run_dir / "config.yaml")
    return smoke_hooks(get_task_class(config.task)(config))


def _phase_export(plan: SmokePlan) -> PhaseResult:
    """final/ as the resumed run exported it, loadable as its task's export; then `framer-ds export` in
    the task's main format where it has formats."""
    from framer_ds.tasks.run_config import load_exported_task

    final, work = plan.run_dir / "final", plan.out / "export"
    shutil.rmtree(work, ignore_errors=True)
    extra = _run_task(plan).smoke_export_args(final, work)

    def check() -> str:
        assert (final / "framer_ds_export.json").is_file(), f"{final} holds no framer_ds_export.json"
        task = load_exported_task(final)
        made = f"; framer-ds export {' '.join(extra[:2])} -> {work}" if extra else ""
        return f"{final}: a {task.name} export ({len(list(final.iterdir()))} entries){made}"

    if not extra:  # the task has no export formats: final/ is what users load
        return run_checked("export", plan.out / "logs" / "export.log", check)
    return _in_process(plan, "export", ["export", str(final), *extra], check)


def _phase_eval(plan: SmokePlan) -> PhaseResult:
    def check() -> str:
        from framer_ds.train.evaluate_export import eval_output_path

        path = eval_output_path(plan.run_dir, "final")
        metrics = json.loads(path.read_text())["metrics"]
        return f"{path}: " + ", ".join(f"{k}={v:.4g}" for k, v in list(metrics.items())[:3])

    return run_in_process(
        "eval", plan.command, ["eval", str(plan.run_dir)], plan.out / "logs" / "eval.log", check
    )


def _phase_sample(plan: SmokePlan) -> PhaseResult:
    final, work = plan.run_dir / "final", plan.out / "sample"
    shutil.rmtree(work, ignore_errors=True)
    args = _run_task(plan).smoke_sample_args(final, work) or []

    def check() -> str:
        written = sorted(p.name for p in work.iterdir() if p.name not in ("first.png", "last.png"))
        assert written, f"nothing written to {work}"
        return f"{work}: {', '.join(written)}"

    return run_in_process(
        "sample", plan.command, ["sample", str(final), *args], plan.out / "logs" / "sample.log", check
    )


_PHASE_RUNNERS: dict[str, Callable[[SmokePlan], PhaseResult]] = {
    "train": _phase_train,
    "resume": _phase_resume,
    "export": _phase_export,
    "eval": _phase_eval,
    "sample": _phase_sample,
}
