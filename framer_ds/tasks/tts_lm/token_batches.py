"""Batches of token sequences for a causal LM: padded to the longest sample, or packed blocks with a
block-diagonal causal mask.

Why a 4-D mask for packing: position ids that restart per sample are not enough on their own, since
eager and SDPA attention would still let a sample attend to the one packed before it. The boolean mask
(batch, 1, query, key) allows a query only keys of its own sample at or before it; transformers uses a
4-D mask as given. Pad positions attend only to themselves, so no row is fully masked (NaN-free).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from framer_ds.tasks.tts_lm.token_sequences import IGNORE_INDEX, PackedBlock, TokenSequence


def collate_padded(sequences: Sequence[TokenSequence], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded to the longest sample; pad labels are ignored."""
    longest = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(sequences), longest), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        n = len(sequence)
        input_ids[row, :n] = torch.tensor(sequence.input_ids)
        labels[row, :n] = torch.tensor(sequence.labels)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def packed_attention_mask(segment_ids: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """(batch, length) segment ids (0 = padding) -> (batch, 1, length, length) mask: boolean (True =
    attend; SDPA), or additive in `dtype` (0 / most negative; eager attention adds it to the scores)."""
    length = segment_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    real = (segment_ids != 0)[:, :, None]
    eye = torch.eye(length, dtype=torch.bool)
    allowed = ((same & causal & real) | (~real & eye))[:, None]
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def collate_packed(
    blocks: Sequence[PackedBlock], block_len: int, pad_id: int, mask_dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Blocks padded to block_len, with position ids per sample and the block-diagonal causal mask
    (`mask_dtype` as in packed_attention_mask)."""
    shape = (len(blocks), block_len)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    labels = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    segment_ids = torch.zeros(shape, dtype=torch.long)
    for row, block in enumerate(blocks):
        n = len(block)
        input_ids[row, :n] = torch.tensor(block.input_ids)
        labels[row, :n] = torch.tensor(block.labels)
        position_ids[row, :n] = torch.tensor(block.position_ids)
        segment_ids[row, :n] = torch.tensor(block.segment_ids)
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": position_ids,
        "attention_mask": packed_attention_mask(segment_ids, mask_dtype),
    }
