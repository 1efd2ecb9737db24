"""Training loss (BCE + optional soft Dice + auxiliary heads) and the per-sample evaluation counts.

Why counts: IoU over a data set is summed intersections over summed unions, not a mean of per-image
ratios (an image with a sliver of road would weigh as much as one full of it). `eval_counts` returns
per-sample sums; the loop gathers them from every rank (dropping the sampler's padding duplicates) and
`summarize_counts` divides the totals, so the metric is the same at any number of processes.
Everything here is shape-static (no boolean indexing, no `.item()`): the planner runs it on fake tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from framer_ds.tasks.drivable_vit.config import DrivableModelConfig
from framer_ds.tasks.drivable_vit.model import patchify


def soft_dice_loss(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """1 - 2|P.Y| / (|P| + |Y|) over the whole micro-batch, P = sigmoid(logits)."""
    probabilities = logits.sigmoid()
    intersection = (probabilities * masks).sum()
    return 1 - 2 * intersection / (probabilities.sum() + masks.sum()).clamp(min=1.0)


def segmentation_loss(logits: torch.Tensor, masks: torch.Tensor, dice_weight: float) -> torch.Tensor:
    logits, masks = logits.float(), masks.float()
    loss = F.binary_cross_entropy_with_logits(logits, masks)
    if dice_weight > 0:
        loss = loss + dice_weight * soft_dice_loss(logits, masks)
    return loss


def auxiliary_losses(
    outputs: dict[str, torch.Tensor], pixel_values: torch.Tensor, config: DrivableModelConfig
) -> dict[str, torch.Tensor]:
    """Weighted auxiliary terms for the heads the model built (empty when all are off)."""
    aux, losses = config.aux, {}
    if "reconstruction" in outputs:
        target = patchify(pixel_values.float(), config.patch_size)
        error = (outputs["reconstruction"].float() - target).pow(2).mean(-1)
        mask = outputs["token_mask"].float()
        losses["masked_patch"] = aux.masked_patch_weight * (error * mask).sum() / mask.sum().clamp(min=1.0)
    if "next_frame_prediction" in outputs:
        prediction, target = outputs["next_frame_prediction"].float(), outputs["next_frame_target"].float()
        losses["next_frame"] = aux.next_frame_weight * F.mse_loss(prediction, target)
    if "view_embeddings" in outputs:
        views = F.normalize(outputs["view_embeddings"].float(), dim=-1)
        centre = F.normalize(views.mean(dim=2, keepdim=True), dim=-1)
        losses["cross_view"] = aux.cross_view_weight * (1 - (views * centre).sum(-1)).mean()
    return losses


def eval_counts(logits: torch.Tensor, masks: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-sample sums ([B] each) from logits and 0/1 masks of shape [B, ...]."""
    logits, masks = logits.float().flatten(1), masks.float().flatten(1)
    predicted, truth = logits > 0, masks > 0.5
    probabilities = logits.sigmoid()
    return {
        "intersection": (predicted & truth).sum(1),
        "union": (predicted | truth).sum(1),
        "correct": (predicted == truth).sum(1),
        "pixels": torch.full_like(masks[:, 0], masks.shape[1]),
        "road": truth.sum(1),
        "bce_sum": F.binary_cross_entropy_with_logits(logits, masks, reduction="none").sum(1),
        "soft_intersection": (probabilities * masks).sum(1),
        "soft_total": (probabilities + masks).sum(1),
    }


def summarize_counts(sums: dict[str, torch.Tensor], dice_weight: float) -> dict[str, float]:
    """Totals -> `eval/iou` (road class), `eval/pixel_accuracy`, `eval/loss` (the training objective
    without auxiliary terms, Dice from the summed soft counts) and `eval/road_fraction` (the share of
    road pixels: the IoU and accuracy of predicting all road, the baseline to beat)."""
    total = {name: float(value.sum()) for name, value in sums.items()}
    pixels = max(total["pixels"], 1.0)
    bce = total["bce_sum"] / pixels
    dice = 1 - 2 * total["soft_intersection"] / max(total["soft_total"], 1.0)
    return {
        "eval/loss": bce + dice_weight * dice if dice_weight > 0 else bce,
        "eval/bce": bce,
        "eval/iou": total["intersection"] / total["union"] if total["union"] > 0 else float("nan"),
        "eval/pixel_accuracy": total["correct"] / pixels,
        "eval/road_fraction": total["road"] / pixels,
    }
