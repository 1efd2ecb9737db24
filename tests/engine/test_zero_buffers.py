"""DeepSpeed buffers sized from what is trained: "auto" resolved before prepare, explicit numbers kept
and warned about when they dwarf the model, and the allocation counter that measures the difference."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from framer_ds.config.zero_fields import (
    ALLGATHER,
    AUTO_BUCKET_CAP,
    MAX_LIVE,
    PERSISTENCE,
    PREFETCH,
    REDUCE,
    REUSE,
    bucket_bytes,
)
from framer_ds.engine.zero_buffers import (
    BUCKET_FLOOR,
    ParameterSizes,
    auto_values,
    bucket_for,
    persistence_threshold,
    size_zero_buffers,
)

REPO = Path(__file__).resolve().parents[2]


def sizes(trainable: int, frozen: int = 0, numels: tuple[int, ...] | None = None) -> ParameterSizes:
    numels = numels or (trainable, frozen)
    return ParameterSizes(trainable, trainable + frozen, max(numels), numels)


def test_parameter_sizes_count_trainable_and_frozen():
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 3))
    model[0].requires_grad_(False)
    found = ParameterSizes.of(model)
    assert (found.trainable, found.total, found.largest) == (63, 283, 200)


@pytest.mark.parametrize(
    ("trainable", "expected"),
    [
        (20_000, 20_480),  # fewer than the floor: one bucket holds them all (rounded to 4096)
        (4_500_000, BUCKET_FLOOR),  # a LoRA: an eighth is below the floor
        (85_800_000, 10_727_424),  # ViT-B: an eighth, rounded up
        (7_000_000_000, AUTO_BUCKET_CAP),  # a 7B full fine-tune: capped
    ],
)
def test_bucket_is_an_eighth_within_floor_and_cap(trainable, expected):
    assert bucket_for(trainable) == expected


def test_bucket_is_never_larger_than_the_shipped_default_nor_the_model():
    for trainable in (1, 1000, 10**6, 10**8, 10**10):
        assert bucket_for(trainable) <= max(trainable + 4095, 4096)
        assert bucket_for(trainable) <= 5 * 10**8


def test_persistence_keeps_at_most_one_percent_of_the_model_whole():
    # 100 biases of 768 (76,800) and 10 matrices of 589,824: 1% of the model is ~66k elements
    numels = (768,) * 100 + (589_824,) * 10
    assert persistence_threshold(numels, sum(numels)) == 0  # all 100 biases would be 1.3%: none
    numels = (64,) * 100 + (768,) * 50 + (589_824,) * 10
    threshold = persistence_threshold(numels, sum(numels))
    assert threshold == 768
    assert sum(n for n in numels if n <= threshold) <= 0.01 * sum(numels)
    assert persistence_threshold((10**6,), 10**6) == 0  # nothing small enough: partition everything
    capped = (50_000,) * 10 + (200_000,) * 10  # within 1% of a 1e9 model, but above DeepSpeed's 1e5
    assert persistence_threshold(capped, 10**9) == 50_000


def test_zero3_live_and_reuse_release_the_model_between_forward_and_backward():
    model = sizes(85_800_000, numels=(2_359_296,) * 24 + (500_000,) * 58)
    values = auto_values(model)
    assert values[PREFETCH] == bucket_for(model.total)
    assert values[MAX_LIVE] == values[REUSE] >= 2 * model.largest
    assert values[REUSE] < model.total  # forward-to-backward reuse distance is the whole model


def test_auto_is_resolved_in_place_and_explicit_values_kept():
    config = {
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": True,
            REDUCE: "auto",
            PREFETCH: 12345,
            PERSISTENCE: "auto",
            MAX_LIVE: "auto",
            REUSE: 0,
        }
    }
    found = size_zero_buffers(config, sizes(4_500_000, 108_000_000), "no")
    zero = config["zero_optimization"]
    assert zero[REDUCE] == BUCKET_FLOOR and zero[PREFETCH] == 12345 and zero[REUSE] == 0
    assert isinstance(zero[PERSISTENCE], int) and isinstance(zero[MAX_LIVE], int)
    assert set(found.auto) == {REDUCE, PERSISTENCE, MAX_LIVE}
    assert found.warnings == []
    described = found.describe()
    assert f"{REDUCE} {BUCKET_FLOOR:,} (auto)" in described and f"{PREFETCH} 12,345," in described
    assert ALLGATHER not in described


def test_oversized_explicit_bucket_is_named_with_its_cost_and_the_fix():
    """The issue's own numbers: 5e8 double-buffered fp32 buckets for a 4.5M-parameter LoRA."""
    config = {"zero_optimization": {"stage": 2, "overlap_comm": True, REDUCE: 500_000_000}}
    found = size_zero_buffers(config, sizes(4_500_000, 108_000_000), "no")
    assert len(found.warnings) == 1
    warning = found.warnings[0]
    assert "reduce_bucket_size 5e+08 allocates 3.7 GiB per rank for 4.5M trainable" in warning
    assert 'use "auto"' in warning
    bf16 = size_zero_buffers(json.loads(json.dumps(config)), sizes(4_500_000), "bf16").warnings[0]
    assert "1.9 GiB" in bf16
    assert size_zero_buffers(config, sizes(100_000_000), "no").warnings == []  # 5x: fine


def test_zero3_whole_model_reuse_distance_is_warned():
    config = {"zero_optimization": {"stage": 3, REUSE: 1_000_000_000, REDUCE: "auto"}}
    (warning,) = size_zero_buffers(config, sizes(4_500_000, 108_000_000), "no").warnings
    assert "stage3_max_reuse_distance 1e+09" in warning and "whole model" in warning


def test_bucket_bytes_double_buffers_only_below_stage3():
    zero2 = {"stage": 2, "overlap_comm": True}
    assert bucket_bytes(zero2, 10, 4) == 80
    assert bucket_bytes({**zero2, "stage": 3}, 10, 4) == 40
    assert bucket_bytes({**zero2, "overlap_comm": False}, 10, 2) == 20


def validate_with(deepspeed_json: Path, check: bool) -> subprocess.CompletedProcess:
    """`framer-ds validate configs/quickstart.yaml --deepspeed-config JSON`, as a user runs it."""
    command = [sys.executable, "-m", "framer_ds", "validate", str(REPO / "configs/quickstart.yaml")]
    command += ["--deepspeed-config", str(deepspeed_json)]
    return subprocess.run(command, capture_output=True, text=True, check=check, cwd=REPO)


def test_validate_warns_about_a_fixed_bucket_before_any_model_exists(tmp_path):
    """`framer-ds validate` has no model: it names what a bucket above any "auto" choice allocates."""
    old = json.loads((REPO / "configs/deepspeed/zero2.json").read_text())
    old["zero_optimization"][REDUCE] = 500_000_000
    path = tmp_path / "zero2_fixed.json"
    path.write_text(json.dumps(old))
    done = validate_with(path, check=False)
    assert done.returncode == 0, done.stderr
    assert (
        f"warning: {path}: zero_optimization.reduce_bucket_size 5e+08 allocates 3.7 GiB per rank"
        in done.stderr
    )
    assert 'whatever is trained; "auto" sizes it' in done.stderr
    shipped = validate_with(REPO / "configs/deepspeed/zero2.json", check=True)
    assert "warning" not in shipped.stderr


def test_shipped_jsons_leave_every_buffer_to_auto():
    for path in sorted((REPO / "configs" / "deepspeed").glob("*.json")):
        zero = json.loads(path.read_text())["zero_optimization"]
        buffers = {key: value for key, value in zero.items() if "bucket" in key or "stage3_max" in key}
        assert buffers and set(buffers.values()) == {"auto"}, path.name


@pytest.fixture(scope="module")
def alloc_counter(tmp_path_factory) -> Path:
    from counter_tool import build_counter

    return build_counter(tmp_path_factory.mktemp("alloc_counter"))


def stdout_with_counter(alloc_counter: Path, script: str) -> str:
    """What `script` prints when run in a fresh Python with the allocation counter preloaded."""
    from framer_ds.lab.alloc_counter import preload_env

    done = subprocess.run(
        [sys.executable, "-c", script],
        env=preload_env(alloc_counter),
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_alloc_counter_counts_memory_that_rss_does_not_see(alloc_counter):
    """A 512 MiB tensor that is never touched: RSS barely moves, allocated bytes show all of it; the
    metrics line reads the same counter (memory/max_allocated_gb) once the lab hands it to the engine."""
    script = (
        "import torch, psutil\n"
        "from framer_ds.engine.metrics import memory_stats\n"
        "from framer_ds.lab.alloc_counter import log_counter_peaks\n"
        "assert log_counter_peaks()\n"
        "before = memory_stats()\n"
        "x = torch.empty(512 * 2**20, dtype=torch.uint8)\n"
        "after = memory_stats()\n"
        "del x\n"
        "print(before['memory/max_allocated_gb'], after['memory/max_allocated_gb'],"
        " before['memory/rss_gb'], after['memory/rss_gb'], memory_stats()['memory/max_allocated_gb'])\n"
    )
    stdout = stdout_with_counter(alloc_counter, script)
    peak_before, peak_after, rss_before, rss_after, peak_end = map(float, stdout.split())
    assert peak_after - peak_before == pytest.approx(0.5, abs=0.01)
    assert rss_after - rss_before < 0.05
    assert peak_end == peak_after  # freeing keeps the peak


def test_alloc_counter_keeps_shared_memory_apart(alloc_counter):
    """A /dev/shm segment (DeepSpeed's CPU allreduce workspace is one per rank) is transport mapped by
    every rank that uses it: counted apart, while an anonymous mapping of the same size is counted."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this machine")
    script = (
        "import ctypes, mmap\n"
        "from multiprocessing import shared_memory\n"
        "lib = ctypes.CDLL(None)\n"
        "lib.framer_alloc_live_bytes.restype = lib.framer_alloc_shared_bytes.restype = ctypes.c_int64\n"
        "def now(): return lib.framer_alloc_live_bytes(), lib.framer_alloc_shared_bytes()\n"
        "start = now()\n"
        "segment = shared_memory.SharedMemory(create=True, size=64 * 2**20)\n"
        "with_segment = now()\n"
        "anonymous = mmap.mmap(-1, 64 * 2**20)\n"
        "with_both = now()\n"
        "anonymous.close(); segment.close(); segment.unlink()\n"
        "print(*start, *with_segment, *with_both, *now())\n"
    )
    stdout = stdout_with_counter(alloc_counter, script)
    mib = [int(v) / 2**20 for v in stdout.split()]
    (live0, shared0), (live1, shared1), (live2, shared2), (live3, shared3) = zip(
        mib[::2], mib[1::2], strict=True
    )
    assert shared1 - shared0 == pytest.approx(64, abs=0.1) and live1 - live0 < 1
    assert live2 - live1 == pytest.approx(64, abs=0.1) and shared2 == shared1
    assert shared3 == shared0 and live3 - live0 < 1


def test_without_the_counter_no_allocated_figure_is_made_up():
    from framer_ds.engine.metrics import memory_stats
    from framer_ds.lab.alloc_counter import log_counter_peaks

    with pytest.raises(AttributeError):
        ctypes.CDLL(None).framer_alloc_peak_bytes  # noqa: B018
    assert not log_counter_peaks()
    if not torch.cuda.is_available():
        assert set(memory_stats()) == {"memory/rss_gb"}


def test_adamw_runs_fused_where_torch_has_the_kernel():
    """Unfused AdamW allocates temporaries the size of the parameter it updates; under ZeRO that is one
    flat partition of the whole model (+2 x trainable / N x 4 bytes per step)."""
    from framer_ds.train.run import fused_adam_supported

    weights = [torch.nn.Parameter(torch.zeros(4))]
    assert fused_adam_supported(torch.device("cpu"), weights)
    assert not fused_adam_supported(torch.device("meta"), weights)
    assert not fused_adam_supported(
        torch.device("cpu"), [torch.nn.Parameter(torch.zeros(4, dtype=torch.int64), requires_grad=False)]
    )


def test_shipped_zeropp_json_keeps_hierarchical_partitions_inside_a_node():
    """hpZ "auto" becomes the processes of one node (LOCAL_WORLD_SIZE at run time): a fixed 8 would span
    two 4-GPU nodes and put the backward gathers back on the network."""
    config = json.loads((REPO / "configs/deepspeed/zeropp.json").read_text())
    zero = config["zero_optimization"]
    assert zero["zero_quantized_weights"] and zero["zero_quantized_gradients"] and zero["stage"] == 3
    found = size_zero_buffers(config, sizes(4_500_000, 108_000_000), "bf16", processes_per_node=4)
    assert zero["zero_hpz_partition_size"] == 4 and "zero_hpz_partition_size" in found.auto
    assert "zero_hpz_partition_size 4 (auto)" in found.describe()
