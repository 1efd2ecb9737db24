"""The instrument the planner's probe, strategy_memory and bench share (framer_ds/lab/measure.py)."""

from __future__ import annotations

import pytest

from conftest import REPO, launch_env, mlp_config

pytestmark = pytest.mark.timeout(300)


def test_measured_launch_reads_every_step_above_the_imports(tmp_path, data_cache):
    """One process under `accelerate launch` with the allocation counter preloaded: one record per
    optimizer step, the peak above the imports holds at least the MLP's weights, gradients and Adam
    states (4 x 4 bytes per parameter), and a broken config fails with the launch command and its error."""
    from framer_ds.lab.measure import measure_launch, measurement_env

    width, depth, dim = 256, 4, 32
    parameters = dim * width + width + (depth - 1) * (width * width + width) + width + 1
    config = mlp_config(tmp_path / "c.yaml", tmp_path / "run", train={"max_steps": 4})
    env = measurement_env(data_cache, env=launch_env())  # launch_env: the test tasks on PYTHONPATH
    found = measure_launch(config, [], ["--num_processes", "1"], tmp_path / "m", env, REPO, 29731)
    assert (found.steps, found.processes) == (4, 1)
    assert 16 * parameters <= found.run_bytes < found.peak_bytes
    assert found.steady_bytes <= found.run_bytes and found.s_per_step > 0

    failed = r"measured run failed \(.*accelerate.commands.launch.*train\.nope"
    with pytest.raises(RuntimeError, match=failed):
        measure_launch(config, ["train.nope=1"], ["--num_processes", "1"], tmp_path / "bad", env, REPO, 29732)
