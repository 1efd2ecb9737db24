"""The instrument the planner's probe, strategy_memory and bench share (framer_ds/lab/measure.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, launch_env, mlp_config

pytestmark = pytest.mark.timeout(300)


def test_measured_launch_reads_every_step_above_the_imports(tmp_path, data_cache, alloc_counter):
    """One process under `accelerate launch` with the allocation counter preloaded: one record per
    optimizer step, the peak above the imports holds at least the MLP's weights, gradients and Adam
    states (4 x 4 bytes per parameter), and a broken config fails with the launch command and its error."""
    from framer_ds.lab.alloc_counter import COUNTER_ENV
    from framer_ds.lab.measure import measure_launch, measurement_env

    width, depth, dim = 256, 4, 32
    parameters = dim * width + width + (depth - 1) * (width * width + width) + width + 1
    config = mlp_config(tmp_path / "c.yaml", tmp_path / "run", train={"length.steps": 4})
    # launch_env: the test tasks on PYTHONPATH; the counter named for measurement_env to preload
    env = measurement_env(data_cache, env={**launch_env(), COUNTER_ENV: str(alloc_counter)})
    found = measure_launch(config, [], ["--num_processes", "1"], tmp_path / "m", env, REPO, 29731)
    assert (found.steps, found.processes) == (4, 1)
    assert 16 * parameters <= found.run_bytes < found.peak_bytes
    assert found.steady_bytes <= found.run_bytes and found.s_per_step > 0
    # tensors only: still every weight, gradient and Adam state, and less than the whole process
    assert 16 * parameters <= found.tensor_run_bytes < found.run_bytes
    assert 0 < found.tensor_steady_bytes <= found.tensor_run_bytes

    failed = r"measured run failed \(.*accelerate.commands.launch.*train\.nope"
    with pytest.raises(RuntimeError, match=failed):
        measure_launch(config, ["train.nope=1"], ["--num_processes", "1"], tmp_path / "bad", env, REPO, 29732)


@pytest.fixture(scope="module")
def alloc_counter(tmp_path_factory) -> Path:
    from counter_tool import build_counter

    return build_counter(tmp_path_factory.mktemp("alloc_counter"))


TENSOR_COUNT_SCRIPT = """
import ctypes, sys, threading
import torch
from safetensors.torch import save_file, load_file
from framer_ds.engine.metrics import memory_stats
from framer_ds.lab.alloc_counter import log_counter_peaks

assert log_counter_peaks()
lib = ctypes.CDLL(None)
for name in ("tensor_live_bytes", "live_bytes", "tensor_peak_bytes"):
    getattr(lib, "framer_alloc_" + name).restype = ctypes.c_int64
tensors, process = lib.framer_alloc_tensor_live_bytes, lib.framer_alloc_live_bytes
lib.malloc.restype, lib.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
lib.free.argtypes = [ctypes.c_void_p]
found = {}

def delta(name, action):
    before = tensors(), process()
    action()
    found[name] = (tensors() - before[0], process() - before[1])

box = []
def on_thread(action):
    thread = threading.Thread(target=action)
    thread.start()
    thread.join()

delta("alloc main", lambda: box.append(torch.empty(1_000_003, dtype=torch.uint8)))
delta("free main", box.clear)
delta("alloc thread", lambda: on_thread(lambda: box.append(torch.zeros(250_000, dtype=torch.float32))))
delta("free thread", lambda: on_thread(box.clear))
delta("bytearray", lambda: box.append(bytearray(3 * 2**20)))
box.clear()
pointer = []
delta("malloc", lambda: pointer.append(lib.malloc(2 * 2**20)))
lib.free(pointer[0])
save_file({"w": torch.ones(2**18)}, sys.argv[1])
delta("safetensors", lambda: box.append(load_file(sys.argv[1])))
size = __import__("os").path.getsize(sys.argv[1])
box.clear()
logged = memory_stats()["memory/max_tensor_allocated_gb"] * 2**30
print(found, size, logged, lib.framer_alloc_tensor_peak_bytes())
"""


def test_tensor_counter_counts_tensor_storage_exactly(alloc_counter, tmp_path):
    """The counter's tensor pair (what a GPU's max_memory_allocated means): a tensor's storage counts its
    exact bytes when allocated and freed on the main thread or another one; a bytearray and a plain
    malloc count in the whole-process figure only; a mapped safetensors file counts in both; the
    metrics line reads the tensor peak (memory/max_tensor_allocated_gb)."""
    import ast
    import subprocess
    import sys

    from framer_ds.lab.alloc_counter import preload_env

    done = subprocess.run(
        [sys.executable, "-c", TENSOR_COUNT_SCRIPT, str(tmp_path / "w.safetensors")],
        env=preload_env(alloc_counter, launch_env()),
        capture_output=True,
        text=True,
        check=True,
    )
    found, size, logged_peak, peak = done.stdout.rsplit(" ", 3)
    deltas = ast.literal_eval(found)
    assert deltas["alloc main"][0] == 1_000_003 and deltas["free main"][0] == -1_000_003
    assert deltas["alloc thread"][0] == 1_000_000 and deltas["free thread"][0] == -1_000_000
    assert deltas["bytearray"][0] == 0 and deltas["bytearray"][1] >= 3 * 2**20
    assert deltas["malloc"][0] == 0 and deltas["malloc"][1] >= 2 * 2**20
    assert deltas["safetensors"][0] == int(size) and deltas["safetensors"][1] >= int(size)
    assert float(logged_peak) == pytest.approx(int(peak), abs=1) and int(peak) >= 1_000_003
