"""Resume under another ZeRO stage: the stage a checkpoint was written under is read (deepspeed.json, or
the files of checkpoints without it) and a change of layout is refused in one line before any load.
The real 2-process ZeRO-2 -> ZeRO-3 resume is the fault case `a_zero2_checkpoint_resumed_under_zero3`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from framer_ds.config.errors import RunSetupError
from framer_ds.engine.resume.strategy import check_same_zero_layout, checkpoint_zero_stage
from framer_ds.engine.resume.universal import DS_TAG


def zero_checkpoint(path: Path, model_states: list[str], stage_in_json: int | None = None) -> Path:
    """A checkpoint's DeepSpeed file names (empty files: only the layout is read), 2 optimizer shards."""
    (path / DS_TAG).mkdir(parents=True)
    for name in [*model_states, *(f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1))]:
        (path / DS_TAG / name).write_bytes(b"")
    if stage_in_json is not None:
        (path / "deepspeed.json").write_text(json.dumps({"zero_optimization": {"stage": stage_in_json}}))
    return path


ZERO3_FILES = [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in (0, 1)]
ZERO12_FILES = ["mp_rank_00_model_states.pt"]


def test_the_stage_is_read_from_the_record_or_the_files(tmp_path):
    assert checkpoint_zero_stage(zero_checkpoint(tmp_path / "rec1", ZERO12_FILES, 1)) == 1
    assert checkpoint_zero_stage(zero_checkpoint(tmp_path / "rec3", ZERO3_FILES, 3)) == 3
    assert checkpoint_zero_stage(zero_checkpoint(tmp_path / "old3", ZERO3_FILES)) == 3
    assert checkpoint_zero_stage(zero_checkpoint(tmp_path / "old2", ZERO12_FILES)) == 2
    ddp = tmp_path / "ddp"
    ddp.mkdir()
    (ddp / "model.safetensors").write_bytes(b"")
    assert checkpoint_zero_stage(ddp) is None


@pytest.mark.parametrize(("written", "files", "running"), [(2, ZERO12_FILES, 3), (3, ZERO3_FILES, 2)])
def test_a_change_of_zero_layout_is_one_line_naming_the_fix(tmp_path, written, files, running):
    checkpoint = zero_checkpoint(tmp_path / "step_4", files, written)
    with pytest.raises(RunSetupError) as refused:
        check_same_zero_layout(checkpoint, running)
    message = str(refused.value)
    assert "\n" not in message
    assert f"written under ZeRO-{written} but this run uses ZeRO-{running}" in message
    assert f"--deepspeed_config_file configs/deepspeed/zero{written}.json" in message
    assert "framer-ds checkpoint universal" in message and "zero_to_fp32.py" in message


def test_stages_that_share_a_layout_pass(tmp_path):
    check_same_zero_layout(zero_checkpoint(tmp_path / "z1", ZERO12_FILES, 1), 2)  # one optimizer, one layout
    check_same_zero_layout(zero_checkpoint(tmp_path / "z2", ZERO12_FILES, 2), 1)
    check_same_zero_layout(zero_checkpoint(tmp_path / "z3", ZERO3_FILES, 3), 3)


@pytest.mark.parametrize(("written", "running"), [("fsdp2", "DDP"), ("fsdp2", "DeepSpeed"), ("ddp", "FSDP2")])
def test_fsdp2_shards_load_only_under_fsdp2_and_the_refusal_names_the_fix(tmp_path, written, running):
    """DDP and DeepSpeed would fail deep in load_state on torch.distributed.checkpoint shards (and FSDP2
    on a DDP/ZeRO checkpoint); each is one line naming the launch or the conversion command."""
    from framer_ds.engine.resume.strategy import FSDP2_MODEL_DIR, check_same_sharding

    checkpoint = tmp_path / "step_4"
    (checkpoint / (FSDP2_MODEL_DIR if written == "fsdp2" else "")).mkdir(parents=True, exist_ok=True)
    with pytest.raises(RunSetupError) as refused:
        check_same_sharding(checkpoint, running)
    message = str(refused.value)
    assert "\n" not in message
    if written == "fsdp2":
        assert (
            f"written under FSDP2 (torch.distributed.checkpoint shards) but this run uses {running}"
            in message
        )
        assert "--config_file configs/accelerate_fsdp2_4gpu.yaml" in message
        assert f"format_utils dcp_to_torch {checkpoint}/{FSDP2_MODEL_DIR} model.pt" in message
    else:
        assert "written without FSDP2" in message and "final/" in message


def test_same_sharding_passes(tmp_path):
    from framer_ds.engine.resume.strategy import FSDP2_MODEL_DIR, check_same_sharding

    (tmp_path / "f" / FSDP2_MODEL_DIR).mkdir(parents=True)
    (tmp_path / "d").mkdir()
    check_same_sharding(tmp_path / "f", "FSDP2")
    check_same_sharding(tmp_path / "d", "DDP")
    check_same_sharding(tmp_path / "d", "DeepSpeed")
