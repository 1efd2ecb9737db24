"""video_lora resumes onto its own trajectory: a run resumed from a mid-epoch checkpoint repeats the
uninterrupted run's per-step losses exactly, for both bases (SVD and Framer), here on 2 processes. On 1
process (with 2 loader workers in the resumed run) both bases are cases of the task contract suite
(tests/tasks/test_task_contract.py), and the SVD base is also a fault matrix case (below).

Why exact equality: both runs are fp32 on the CPU and do the same operations in the same order, so a
resumed run that restores every random draw (clip offsets, flips, sigma, noise, conditioning dropout,
the noise-augmentation strength) gives the same floats; a draw that is not restored moves a loss by
~0.1-0.5 (issue 29 §2: 0.141 against 0.338 at the first resumed step).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader, Dataset

from conftest import launch_ddp_train
from framer_ds.data.item_draws import DrawsPerItem, ItemDraws, drawn_at_epoch
from framer_ds.train.step import set_loader_epoch
from video_resume_runs import BASES, COMMON, assert_same_trajectory, resumable_copy


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_two_process_resume_repeats_the_uninterrupted_losses_for_both_bases(tmp_path):
    """DDP on 2 CPU processes: the ranks build the same model (LoRA init included) but draw their own
    sigmas and noise; each rank restores its own draws (random_states_<rank>.pkl) and reads its own share
    of the clips with the same per-item augmentation. `draw_probe` records what each rank drew."""
    two = [*COMMON, "train.micro_batch_size=1", "imports=[draw_probe]"]
    for base, config in BASES.items():
        full, resumed = tmp_path / base / "full", tmp_path / base / "resumed"
        draws = {run: tmp_path / base / f"draws_{run}" for run in ("full", "resumed")}
        launch_ddp_train(config, [f"output_dir={full}", *two], 280, FRAMER_TEST_DRAWS_DIR=str(draws["full"]))
        launch_ddp_train(
            config,
            [f"output_dir={resumable_copy(full, resumed)}", *two, "train.resume=latest"],
            280,
            FRAMER_TEST_DRAWS_DIR=str(draws["resumed"]),
        )
        assert_same_trajectory(full, resumed)
        straight, again = _draws_per_rank(draws["full"]), _draws_per_rank(draws["resumed"])
        assert straight["init"][0] == straight["init"][1], f"{base}: the ranks built different models"
        first = [straight["steps"][rank][0] for rank in (0, 1)]
        # Distinct streams give unrelated normal draws; the same stream gave equal sigmas and noise up to
        # the rounding of (x_noisy - x0) / sigma (ranks train different clips): 1e-3 separates the two.
        assert not torch.allclose(*(torch.tensor(draw["sigmas"]) for draw in first), rtol=1e-3), base
        assert not torch.allclose(*(torch.tensor(draw["noise"]) for draw in first), atol=1e-3), base
        for rank in (0, 1):  # steps 3..5 of the resumed run draw exactly what the straight run drew
            assert again["steps"][rank] == straight["steps"][rank][2:], f"{base}: rank {rank}'s draws"


def _draws_per_rank(folder: Path) -> dict[str, dict[int, list]]:
    """`draw_probe`'s records: {"init": {rank: digest}, "steps": {rank: [draw per micro-batch]}}."""
    result: dict[str, dict[int, list]] = {"init": {}, "steps": {}}
    for rank in (0, 1):
        lines = [json.loads(line) for line in (folder / f"rank{rank}.jsonl").read_text().splitlines()]
        result["init"][rank] = [line["init"] for line in lines if "init" in line]
        result["steps"][rank] = [line for line in lines if "sigmas" in line]
    return result


class EpochProbe(DrawsPerItem, Dataset):
    """Items report the epoch their draws are keyed by, and one draw."""

    def __init__(self, size: int = 4):
        self.size, self.draws = size, ItemDraws(seed=5)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        return {"epoch": self.draws.epoch, "draw": torch.rand(1, generator=self.item_generator(index))}


def _epochs_seen(loader) -> set[int]:
    return {int(e) for batch in loader for e in batch["epoch"]}


def test_the_epoch_reaches_the_dataset_under_a_sharded_loader():
    """accelerate forwards `set_epoch` to the dataset only when no sampler inside its batch sampler
    has one; under DDP its seedable sampler does, and the dataset stayed at epoch 0 (every epoch drew
    the first epoch's augmentation)."""
    dataset = EpochProbe()
    loader = DataLoader(dataset, batch_size=1, shuffle=True, generator=torch.Generator().manual_seed(0))
    sharded = prepare_data_loader(
        loader, num_processes=2, process_index=0, put_on_device=False, use_seedable_sampler=True
    )
    set_loader_epoch(sharded, 3)
    assert _epochs_seen(sharded) == {3}


def test_persistent_workers_draw_by_the_current_epoch_and_pins_stay_local():
    dataset = EpochProbe()
    loader = DataLoader(dataset, batch_size=2, num_workers=2, persistent_workers=True)
    draws = {}
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        assert _epochs_seen(loader) == {epoch}  # the workers started at epoch 0 see epoch 1 too
        draws[epoch] = torch.cat([batch["draw"] for batch in loader]).flatten()
    assert not torch.equal(draws[0], draws[1])  # each epoch its own augmentation
    with drawn_at_epoch(dataset, 0):  # e.g. sampling inputs: this process only
        assert torch.equal(torch.cat([dataset[i]["draw"] for i in range(4)]), draws[0])
        assert _epochs_seen(loader) == {1}
    assert dataset.draws.epoch == 1
