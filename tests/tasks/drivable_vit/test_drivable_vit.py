"""The drivable_vit task as a user meets it: every stage has the documented shapes and every configured
block is built (the original model silently built one cross-view and one temporal block); IoU is summed
intersections over summed unions; bad manifests are named sample by sample; the generated road set is
deterministic; the tiny config learns (IoU above the all-road and all-background baselines), writes
overlays and an export `framer-ds sample` reads; and it runs under ZeRO-3 on two processes with gathered
metrics equal to a single-process evaluation of the exported model."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from faults.harness import cli
from PIL import Image
from pydantic import ValidationError

from conftest import REPO, read_metrics
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.drivable_vit.config import DrivableDataConfig, DrivableModelConfig
from framer_ds.tasks.drivable_vit.losses import auxiliary_losses, eval_counts, summarize_counts
from framer_ds.tasks.drivable_vit.model import Block, DrivableViT
from framer_ds.tasks.drivable_vit.multiview_manifest import EgoStatistics, MultiViewSample
from framer_ds.tasks.drivable_vit.overlays import write_overlays
from framer_ds.tasks.drivable_vit.synthetic_roads import RoadSetOptions, ensure_road_set, write_road_set

TINY = REPO / "configs" / "tasks" / "drivable_vit" / "tiny.yaml"
ORIGINAL = REPO / "configs" / "tasks" / "drivable_vit" / "zero3_16gpu.yaml"
SMALL = {"image_size": 32, "patch_size": 8, "embed_dim": 32, "num_heads": 4, "decoder_channels": [16, 8]}


@pytest.fixture(scope="session")
def road_set(data_cache: Path) -> Path:
    """The tiny config's generated set (its default options), built once per session in the test cache."""
    return ensure_road_set(data_cache, RoadSetOptions())


def load_task(config_path: Path, *overrides: str):
    from framer_ds.tasks.registry import get_task_class
    from framer_ds.tasks.run_config import load_run_config

    config = load_run_config(config_path, list(overrides))
    return get_task_class(config.task)(config)


# --- model ----------------------------------------------------------------------------------------


def test_shapes_through_each_stage_and_the_auxiliary_heads():
    config = DrivableModelConfig(
        **SMALL, spatial_layers=1, cross_view_layers=1, temporal_layers=1, ego_motion=True,
        aux={"masked_patch_weight": 1.0, "next_frame_weight": 1.0, "cross_view_weight": 1.0},
    )  # fmt: skip
    model = DrivableViT(config, views=3, frames=4)
    pixels, ego = torch.randn(2, 4, 3, 3, 32, 32), torch.randn(2, 4, 9)
    tokens = model.spatial(pixels.flatten(0, 2))
    assert tokens.shape == (2 * 4 * 3, 1 + 16, 32)  # CLS + a 4 x 4 patch grid per image
    crossed = model.cross_view(tokens.view(8, 3, 17, 32))
    assert crossed.shape == (8, 3, 17, 32)
    assert model.temporal(crossed.view(2, 4, 3, 17, 32), ego).shape == (2, 4, 3, 17, 32)
    out = model(pixels, ego, with_aux=True)
    assert out["logits"].shape == (2, 1, 3, 32, 32)  # last frame, per view, at input resolution
    assert out["reconstruction"].shape == (24, 16, 3 * 8 * 8) and out["token_mask"].shape == (24, 16)
    assert out["next_frame_prediction"].shape == out["next_frame_target"].shape == (2, 3, 3, 32)
    assert out["view_embeddings"].shape == (2, 4, 3, 32)
    losses = auxiliary_losses(out, pixels, config)
    assert set(losses) == {"masked_patch", "next_frame", "cross_view"}
    sum(losses.values()).backward()
    assert model.reconstruct.weight.grad is not None and model.spatial.mask_token.grad is not None

    every = DrivableViT(DrivableModelConfig(**SMALL, segment_frames="all"), views=2, frames=3)
    assert every(torch.randn(1, 3, 2, 3, 32, 32))["logits"].shape == (1, 3, 2, 32, 32)
    # The temporal stage is causal: the first frame's output ignores later frames.
    frames = torch.randn(1, 3, 2, 3, 32, 32)
    changed = frames.clone()
    changed[:, 2] += 1
    every.eval()
    torch.testing.assert_close(every(frames)["logits"][:, 0], every(changed)["logits"][:, 0])


def _blocks_by_stage(model: torch.nn.Module) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, module in model.named_modules():
        if isinstance(module, Block):
            stage = name.split(".")[0]
            counts[stage] = counts.get(stage, 0) + 1
    return counts


@pytest.mark.parametrize("layers", [(4, 4, 4), (1, 2, 3), (3, 1, 0), (2, 0, 5)])
def test_every_configured_block_is_built(layers):
    spatial, cross_view, temporal = layers
    config = DrivableModelConfig(
        **SMALL, spatial_layers=spatial, cross_view_layers=cross_view, temporal_layers=temporal
    )
    model = DrivableViT(config, views=3, frames=3)
    expected = {"spatial": spatial, "cross_view": cross_view, "temporal": temporal}
    assert model.block_counts() == expected
    assert _blocks_by_stage(model) == {k: v for k, v in expected.items() if v}
    assert model(torch.randn(1, 3, 3, 3, 32, 32))["logits"].shape == (1, 1, 3, 32, 32)


def test_the_original_config_builds_four_blocks_per_stage_and_plans_without_data():
    task = load_task(ORIGINAL)
    with torch.device("meta"):
        model = task.build_model()
    assert model.block_counts() == {"spatial": 4, "cross_view": 4, "temporal": 4}
    assert _blocks_by_stage(model) == {"spatial": 4, "cross_view": 4, "temporal": 4}
    train = task.config.train
    assert (train.micro_batch_size, train.gradient_accumulation_steps, train.mixed_precision) == (
        2,
        8,
        "fp16",
    )
    assert train.checkpoint.every.epochs == 5 and task.config.log.tensorboard
    header = ORIGINAL.read_text().split("\ntask:")[0]  # DDP, the plan's pick; the original's ZeRO-3 the swap
    assert "--num_processes 16" in header.splitlines()[0] and "configs/deepspeed/zero3_fp16.json" in header
    batch = task.example_batch(2)  # reads no data: /data/drivable does not exist here
    assert batch["pixel_values"].shape == (2, 3, 3, 3, 256, 256) and batch["ego_motion"].shape == (2, 3, 9)
    fp16 = json.loads((REPO / "configs/deepspeed/zero3_fp16.json").read_text())
    assert fp16["fp16"]["enabled"] == "auto" and fp16["fp16"]["loss_scale"] == 0
    assert fp16["train_micro_batch_size_per_gpu"] == fp16["gradient_accumulation_steps"] == "auto"


def test_config_errors_name_the_fix():
    cases = [
        ({"image_size": 250}, "multiple of model.patch_size"),
        ({"embed_dim": 100, "num_heads": 12}, "not divisible by model.num_heads"),
        ({"patch_size": 8, "image_size": 32, "decoder_channels": [8, 8, 8, 8]}, "at most 3 stages"),
        ({"temporal_causal": False, "aux": {"next_frame_weight": 1.0}}, "temporal_causal true"),
        ({"spatial_layer": 2}, "Extra inputs are not permitted"),
    ]
    for fields, message in cases:
        with pytest.raises(ValidationError, match=message):
            DrivableModelConfig(**fields)
    with pytest.raises(
        ValidationError, match=r"set exactly one of path or builtin \(synthetic_roads\); got none"
    ):
        DrivableDataConfig(source={})
    with pytest.raises(ValidationError, match="names a view twice"):
        DrivableDataConfig(source={"path": Path("m.jsonl")}, views=["left", "left"])


# --- metrics --------------------------------------------------------------------------------------


def test_iou_is_summed_intersections_over_summed_unions_also_across_ranks():
    """Two 1 x 4-pixel samples: A has 1 road pixel, found (IoU 1); B has 3, the model finds 1 and adds a
    false one (IoU 1/4). Mean of ratios = 0.625; the set's IoU = (1 + 1) / (1 + 4) = 0.4."""
    masks = torch.tensor([[0, 0, 1, 0], [1, 1, 1, 0]], dtype=torch.float32).view(2, 1, 1, 1, 4)
    logits = torch.tensor([[-5, -5, 5, -5], [5, -5, -5, 5]], dtype=torch.float32).view(2, 1, 1, 1, 4)
    counts = eval_counts(logits, masks)
    assert counts["intersection"].tolist() == [1, 1] and counts["union"].tolist() == [1, 4]
    metrics = summarize_counts(counts, dice_weight=0.0)
    assert metrics["eval/iou"] == pytest.approx(0.4)
    assert metrics["eval/pixel_accuracy"] == pytest.approx(5 / 8)
    assert metrics["eval/road_fraction"] == pytest.approx(4 / 8)  # = the IoU of predicting all road
    all_road = summarize_counts(eval_counts(torch.ones_like(logits), masks), 0.0)
    assert all_road["eval/iou"] == pytest.approx(metrics["eval/road_fraction"])
    assert summarize_counts(eval_counts(-torch.ones_like(logits), masks), 0.0)["eval/iou"] == 0.0
    # What the loop does with two ranks: gather the per-sample values, sum them (here: one sample each).
    gathered = {k: torch.cat([v[:1], v[1:]]) for k, v in counts.items()}
    assert summarize_counts(gathered, 0.0) == metrics
    dice = summarize_counts(counts, dice_weight=1.0)
    assert dice["eval/loss"] > dice["eval/bce"] == metrics["eval/loss"]


# --- data -----------------------------------------------------------------------------------------


def test_generated_set_is_deterministic_from_its_seed(tmp_path):
    options = RoadSetOptions(train_samples=2, eval_samples=1, image_size=32, seed=3)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_road_set(tmp_path / name, options)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) == 1 + 3 * (3 * 3 * 2)  # manifest + 3 samples x 3 views x 3 frames x (image, mask)
    for path in files:
        assert (tmp_path / "a" / path).read_bytes() == (tmp_path / "b" / path).read_bytes(), path
    (tmp_path / "c").mkdir()
    write_road_set(tmp_path / "c", RoadSetOptions(train_samples=2, eval_samples=1, image_size=32, seed=4))
    assert (tmp_path / "c/manifest.jsonl").read_bytes() != (tmp_path / "a/manifest.jsonl").read_bytes()
    rows = [json.loads(line) for line in (tmp_path / "a/manifest.jsonl").read_text().splitlines()]
    assert [r["split"] for r in rows] == ["train", "train", "val"]
    assert np.asarray(rows[0]["ego_motion"]).shape == (3, 9)


def test_ego_statistics_are_per_dimension_and_keep_constant_dimensions():
    rows = [[float(t), 0.0, 2.0 * t, 0, 0, 0, 0, 0, 5.0] for t in range(3)]
    samples = [MultiViewSample(f"s{i}", "m:1", {}, {}, tuple(map(tuple, rows))) for i in range(2)]
    stats = EgoStatistics.of(samples)
    assert stats.mean[0] == pytest.approx(1.0) and stats.mean[2] == pytest.approx(2.0)
    assert stats.std[0] == pytest.approx(np.std([0, 1, 2])) and stats.std[1] == stats.std[8] == 1.0
    normalised = stats.normalise(rows)
    assert normalised.dtype == torch.float32 and normalised[:, 0].mean().abs() < 1e-6
    assert EgoStatistics.of(list(reversed(samples))) == stats  # the same on every rank


def _bad_manifest(road_set: Path, tmp_path: Path) -> Path:
    """Six samples of the generated set, five of them broken in one way each; paths made absolute."""
    rows = [json.loads(line) for line in road_set.read_text().splitlines()][:6]
    for row in rows:
        row["split"] = "train"
        for column in ("images", "masks"):
            row[column] = {v: [str(road_set.parent / p) for p in ps] for v, ps in row[column].items()}
    del rows[1]["images"]["right"]  # a missing view
    rows[2]["images"]["left"] = rows[2]["images"]["left"][:2]  # unequal frame counts
    small = tmp_path / "small_mask.png"
    Image.new("L", (10, 10)).save(small)
    rows[3]["masks"]["center"][-1] = str(small)  # a mask of the wrong size
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"not a png")
    rows[4]["images"]["center"][0] = str(garbage)  # an unreadable file
    rows[5]["ego_motion"] = rows[5]["ego_motion"][:2]  # too few ego-motion rows
    rows.append({**rows[0], "id": "extra_val", "split": "val"})
    manifest = tmp_path / "bad.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return manifest


def test_bad_manifest_names_each_sample_or_counts_the_skipped(road_set, tmp_path, capsys):
    from framer_ds.cli.main import main

    manifest = _bad_manifest(road_set, tmp_path)
    config = yaml.safe_load(TINY.read_text())
    config["data"] = {"source": {"path": str(manifest)}}
    config["output_dir"] = str(tmp_path / "run")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as caught:
        load_task(path).build_datasets()
    text = str(caught.value)
    for sample_id, message in [
        ("train_0001", "images lacks view(s) ['right']"),
        ("train_0002", "unequal frame counts {'left': 2, 'center': 3, 'right': 3}"),
        ("train_0003", "is 10x10 but its image"),
        ("train_0004", "garbage.png cannot be read"),
        ("train_0005", "ego_motion must be 3 rows of 9"),
    ]:
        assert f"sample '{sample_id}' (bad.jsonl:" in text and message in text, (sample_id, text)
    assert "train_0000" not in text and "data.bad_samples" in text

    task = load_task(path, "data.bad_samples=skip")
    train, evaluation = task.build_datasets()
    assert len(train) == 1 and len(evaluation) == 1 and task.data_summary()["skipped samples"] == 5
    assert train[0]["pixel_values"].shape == (3, 3, 3, 32, 32) and train[0]["masks"].shape == (1, 3, 32, 32)

    assert main(["data", "check", str(path)]) == 1
    assert "train_0004" in capsys.readouterr().err
    assert main(["data", "check", str(path), "data.bad_samples=skip"]) == 0
    report = capsys.readouterr().out
    assert "train: 1 samples; validation: 1 samples" in report and "skipped samples: 5" in report
    assert "all-road baseline: IoU" in report


def test_split_column_and_separate_eval_file(road_set, tmp_path):
    rows = [json.loads(line) for line in road_set.read_text().splitlines()][:4]
    for row in rows:
        row.pop("split")
        for column in ("images", "masks"):
            row[column] = {v: [str(road_set.parent / p) for p in ps] for v, ps in row[column].items()}
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows[3:]), tmp_path / "b.parquet")
    config = yaml.safe_load(TINY.read_text())
    config["data"] = {"source": {"path": str(tmp_path / "a.jsonl")}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**config, "output_dir": str(tmp_path / "run")}))
    with pytest.raises(ConfigError, match="no 'split' column"):
        load_task(path).build_datasets()
    train, evaluation = load_task(path, f"data.eval={tmp_path / 'b.parquet'}").build_datasets()
    assert (len(train), len(evaluation)) == (3, 1)


def test_overlays_are_written_per_sample(tmp_path):
    items = [
        {"pixel_values": torch.zeros(3, 2, 3, 16, 16), "masks": torch.ones(1, 2, 16, 16)} for _ in range(2)
    ]
    logits = torch.full((2, 1, 2, 16, 16), -1.0)
    written = write_overlays(items, logits, ["a", "b"], tmp_path / "step_3", (0.5,) * 3, (0.5,) * 3)
    assert [p.name for p in written] == ["a.png", "b.png"]
    with Image.open(written[0]) as image:
        assert image.size == (2 * 16 * 8, 2 * 16 * 8)  # 2 views wide, truth over prediction, x8 to 128 px


# --- training -------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_tiny_config_learns_writes_overlays_and_exports(road_set, tmp_path):
    """IoU rises and ends clearly above both baselines (all road = the road fraction; all background =
    0), and pixel accuracy above the majority class; `framer-ds sample` reads the export."""
    from framer_ds.tasks.drivable_vit.inference import load_drivable_vit

    run_dir = tmp_path / "run"
    trained = cli("train", str(TINY), f"output_dir={run_dir}")  # in this process: no start-up to pay
    assert trained.rc == 0, trained.err[-4000:]
    train_lines, eval_lines = read_metrics(run_dir)
    assert train_lines[-1]["loss"] < train_lines[0]["loss"] / 2
    ious = [line["eval/iou"] for line in eval_lines]
    last = eval_lines[-1]
    road = last["eval/road_fraction"]
    assert ious[-1] > ious[0] and ious[-1] > road + 0.3 and ious[-1] > 0.75, (ious, road)
    assert last["eval/pixel_accuracy"] > max(road, 1 - road) + 0.1
    overlays = sorted(p.relative_to(run_dir).as_posix() for p in (run_dir / "samples").rglob("*.png"))
    assert overlays[-2:] == ["samples/step_80/val_0000.png", "samples/step_80/val_0001.png"]
    assert "samples/step_120/val_0000.png" in overlays

    loaded = load_drivable_vit(run_dir / "final")
    assert loaded.views == ["left", "center", "right"] and loaded.ego is not None
    # an export written before model.img_size was renamed model.image_size still loads (and samples below)
    record_file = run_dir / "final" / "drivable_vit.json"
    record = json.loads(record_file.read_text())
    record["model"]["img_size"] = record["model"].pop("image_size")
    record_file.write_text(json.dumps(record))
    assert load_drivable_vit(run_dir / "final").transform == loaded.transform
    row = json.loads(road_set.read_text().splitlines()[-1])
    images = [road_set.parent / row["images"][v][t] for t in range(3) for v in loaded.views]
    ego_file = tmp_path / "ego.json"
    ego_file.write_text(json.dumps(row["ego_motion"]))
    out = tmp_path / "masks"
    sampled = cli(
        "sample", str(run_dir / "final"), "--images", *map(str, images), "--ego-motion", str(ego_file),
        "--out", str(out),
    )  # fmt: skip
    assert sampled.rc == 0, sampled.err[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["center.png", "left.png", "overlay.png", "right.png"]
    with Image.open(out / "center.png") as mask:
        predicted = np.asarray(mask) > 0
    with Image.open(road_set.parent / row["masks"]["center"][-1]) as truth:
        expected = np.asarray(truth.resize((32, 32), Image.NEAREST)) > 0
    assert (predicted & expected).sum() / max((predicted | expected).sum(), 1) > 0.6


# --- ZeRO-3 on 2 CPU processes --------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_tiny_config_under_zero3_on_two_processes_gathers_exact_metrics(road_set, tmp_path):
    """Tiny tensors partitioned too (persistence threshold 0) and activation checkpointing on. The eval
    set (20 samples, 8 per rank per batch) is split unevenly; the logged eval/iou equals a single-process
    evaluation of the gathered export, so the counts were gathered, not averaged per rank."""
    from torch.utils.data import DataLoader

    from conftest import abort_lines, accelerate_launch_cmd, launch_env, strategy_launch_args
    from framer_ds.tasks.drivable_vit.inference import load_drivable_vit

    run_dir = tmp_path / "run"
    cmd = accelerate_launch_cmd(
        *strategy_launch_args("zero3", tmp_path), "-m", "framer_ds", "train", str(TINY),
        f"output_dir={run_dir}", "train.length.steps=24", "train.eval.every.steps=12",
        "train.checkpoint.every.steps=24",
        "train.gradient_checkpointing=true",
    )  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert not abort_lines(proc.stderr), proc.stderr[-4000:]
    train_lines, eval_lines = read_metrics(run_dir)
    assert train_lines[-1]["loss"] < train_lines[0]["loss"] and len(eval_lines) == 2
    assert sorted(p.name for p in (run_dir / "samples" / "step_24").iterdir()) == [
        "val_0000.png",
        "val_0001.png",
    ]

    task = load_task(run_dir / "config.yaml")
    _, evaluation = task.build_datasets()
    model = load_drivable_vit(run_dir / "final").model
    sums: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for batch in DataLoader(evaluation, batch_size=5):
            counts = eval_counts(model(batch["pixel_values"], batch["ego_motion"])["logits"], batch["masks"])
            for name, value in counts.items():
                sums[name] = sums.get(name, 0) + value.double().sum()
    single = summarize_counts(sums, task.config.model.dice_weight)
    logged = eval_lines[-1]
    assert logged["eval/road_fraction"] == pytest.approx(single["eval/road_fraction"], abs=1e-9)
    for name in ("eval/iou", "eval/pixel_accuracy", "eval/loss"):
        assert logged[name] == pytest.approx(single[name], abs=1e-4), name
    shutil.rmtree(run_dir / "checkpoints")
