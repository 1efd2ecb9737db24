"""The planner's per-rank memory terms against values computed by hand for one known model.

Model: 1M trainable and 3M frozen elements, largest trainable parameter 250k, 20k elements in
parameters under the persistence threshold, 10 MB of frozen helpers, 100 MB of activations, 2 ranks,
bf16 (2 bytes), reduce bucket 2^18 with overlap_comm and contiguous gradients, ZeRO-3 max live 1M.
"""

from __future__ import annotations

import pytest

from framer_ds.lab.memory_model import ParameterCensus, estimate

CENSUS = ParameterCensus(
    trainable=1_000_000,
    frozen=3_000_000,
    largest_trainable=250_000,
    persistent_small=20_000,
    helper_bytes=10_000_000,
)
ZERO2 = {"stage": 2, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 2**18}
ZERO3 = {
    "stage": 3,
    "overlap_comm": True,
    "contiguous_gradients": True,
    "reduce_bucket_size": 2**18,
    "stage3_max_live_parameters": 1_000_000,
    "stage3_param_persistence_threshold": 100_000,
}
ACTIVATIONS = 100_000_000


def peak(strategy: str, zero: dict | None = None, where: str = "device") -> int:
    return estimate(strategy, CENSUS, 2, "bf16", ACTIVATIONS, zero).peak(where)  # type: ignore[arg-type]


def test_ddp_keeps_fp32_weights_gradients_and_states_of_what_is_trained_only():
    # persistent: weights 4M + frozen (bf16, stored in the compute dtype as under DeepSpeed) 6M + gradients
    # 4M + Adam 8M + helpers 10M = 32M; backward: activations 100M + autocast's bf16 weight copies 2M
    assert peak("ddp") == 32_000_000 + 102_000_000
    assert peak("ddp", where="host") == 0
    # in fp32 the frozen weights stay as loaded (fp32: 12M), and autocast copies nothing
    assert estimate("ddp", CENSUS, 2, "no", ACTIVATIONS).peak() == 38_000_000 + 100_000_000


def test_zero2_partitions_master_gradients_and_states_and_holds_two_buckets_in_backward():
    # persistent: weights 2M + frozen 6M + fp32 master 2M + Adam 4M + gradient partition 1M + helpers 10M
    # backward: 2 buckets x 2^18 x 2 B + one parameter's gradient 0.5M + activations 100M
    # step (flattened 1M + fp32 2M) is smaller than backward
    assert peak("zero2", ZERO2) == 25_000_000 + 2 * 2**18 * 2 + 500_000 + ACTIVATIONS


def test_zero2_offload_moves_master_states_and_fp32_gradients_to_the_host():
    # device: weights 2M + frozen 6M + helpers 10M + transfer buffer 0.5M; backward as plain ZeRO-2
    assert peak("zero2_offload", ZERO2) == 18_500_000 + 2 * 2**18 * 2 + 500_000 + ACTIVATIONS
    # host: master 2M + Adam 4M + fp32 gradients 2M + bf16 staging 1M + transfer buffer 0.5M
    assert peak("zero2_offload", ZERO2, "host") == 9_500_000
    no_overlap = {**ZERO2, "overlap_comm": False, "contiguous_gradients": False}
    # offload forces contiguous gradients: one bucket without overlap
    assert peak("zero2_offload", no_overlap) == 18_500_000 + 2**18 * 2 + 500_000 + ACTIVATIONS


def test_zero3_shards_frozen_weights_too_and_gathers_at_most_max_live():
    # persistent: trainable partition 1M + frozen partition 3M + small parameters 40k + gradient partition
    # 1M + bucket 2^18 x 2 + fp32 master 2M + Adam 4M + helpers 10M; backward: gathered 2M + the
    # reduce-scatter's flat copy of a bucket 2^18 x 2 + activations
    persistent = 1_000_000 + 3_000_000 + 40_000 + 1_000_000 + 2**18 * 2 + 2_000_000 + 4_000_000 + 10_000_000
    assert peak("zero3", ZERO3) == persistent + 2_000_000 + 2**18 * 2 + ACTIVATIONS


def test_zero3_offload_leaves_buffers_and_gathered_parameters_on_the_device():
    device = 40_000 + 2**18 * 2 + 10_000_000
    assert peak("zero3_offload", ZERO3) == device + 2_000_000 + 2**18 * 2 + ACTIVATIONS
    # host: partitions 4M + gradients 1M + master 2M + Adam 4M + the fp32 gradient partition 2M, which
    # lives for the run (DeepSpeed copies reduced gradients straight into it); the step makes no copy
    assert peak("zero3_offload", ZERO3, "host") == 11_000_000 + 2_000_000
    terms = estimate("zero3_offload", CENSUS, 2, "no", 0, ZERO3).by_name()
    assert terms["fp32 gradient partition"] == 4 * 500_000  # in fp32 training too
    assert "flattened gradient partition" not in terms


def test_zeropp_adds_the_secondary_partition_of_the_whole_model():
    hpz = {**ZERO3, "zero_hpz_partition_size": 2}
    assert peak("zeropp", hpz) - peak("zero3", ZERO3) == 2 * 4_000_000 // 2


def test_lora_pays_optimizer_and_master_for_the_trained_part_only():
    lora = ParameterCensus(trainable=10_000, frozen=1_000_000, largest_trainable=4_096)
    terms = estimate("zero3", lora, 2, "no", 0, ZERO3).by_name()
    assert terms["fp32 master partition"] == 4 * 5_000  # a copy even in fp32 (measured)
    assert terms["optimizer states partition (fp32 Adam)"] == 8 * 5_000
    assert terms["frozen weights partition"] == 4 * 500_000
    assert estimate("ddp", lora, 2, "no", 0).by_name()["optimizer states (fp32 Adam)"] == 8 * 10_000


def test_unknown_strategy_names_the_choices():
    with pytest.raises(ValueError, match="zero2_offload"):
        estimate("zero4", CENSUS, 2, "bf16", 0)


def test_fsdp2_shards_everything_and_gathers_one_unit_and_the_next():
    """FSDP2's fp32 trainable shard + fp32 gradient shard + Adam shard = 16 bytes x T / N, the frozen
    weights sharded in their loaded dtype (fp32 here), one unit gathered in bf16 while the next is
    prefetched, and the unit's fp32 gradients before their reduce-scatter. Largest unit 500k elements."""
    census = ParameterCensus(**{**CENSUS.__dict__, "largest_fsdp_unit": 500_000})
    # persistent: trainable 2M + frozen 6M + gradients 2M + Adam 4M + helpers 10M = 24M
    # backward: 2 units x 500k x 2 B + the unit's gradients 4 B x 500k + activations 100M
    one = estimate("fsdp2", census, 2, "bf16", ACTIVATIONS)
    assert one.peak() == 24_000_000 + 2_000_000 + 2_000_000 + ACTIVATIONS
    # accumulation turns the gradient sync off: every trainable gradient stays whole (fp32) in the window
    windowed = estimate("fsdp2", census, 2, "bf16", ACTIVATIONS, accumulation=2)
    assert windowed.peak() == one.peak() + 4 * 1_000_000
    # without the task's block classes the whole model is one unit
    assert (
        estimate("fsdp2", CENSUS, 2, "bf16", ACTIVATIONS).peak()
        == 24_000_000 + 16_000_000 + 4_000_000 + ACTIVATIONS
    )
