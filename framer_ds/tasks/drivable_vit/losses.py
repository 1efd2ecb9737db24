"""Training loss (BCE + optional soft Dice + auxiliary heads) and the per-sample evaluation counts.

Why counts: IoU over a data set is summed intersections over summed unions, not a mean of per-image
ratios (an image with a sliver of road would weigh as much as one full of it). `eval_counts` returns
per-sample sums; the loop gathers them from every rank (dropping the sampler's padding duplicates) and
`summarize_counts` divides the totals, so the metric is the same at any number of processes.
Everything here is shape-static (no boolean indexing, no `.item()`): the planner runs it on fake tensors.
"""

from __future__ import annotations

import math

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
        "background_intersection": (~predicted & ~truth).sum(1),
        "background_union": (~predicted | ~truth).sum(1),
        "correct": (predicted == truth).sum(1),
        "pixels": torch.full_like(masks[:, 0], masks.shape[1]),
        "road": truth.sum(1),
        "bce_sum": F.binary_cross_entropy_with_logits(logits, masks, reduction="none").sum(1),
        "soft_intersection": (probabilities * masks).sum(1),
        "soft_total": (probabilities + masks).sum(1),
    }


CLASSES = ("background", "road")  # class 1 (mask > 0) is the drivable road


def class_ious(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per class: summed intersection over summed union (NaN where the class appears in neither the
    masks nor the predictions)."""
    pairs = {"background": ("background_intersection", "background_union"), "road": ("intersection", "union")}
    ious = {}
    for name, (inter, union) in pairs.items():
        union_total = float(sums[union].sum())
        ious[name] = float(sums[inter].sum()) / union_total if union_total > 0 else float("nan")
    return ious


def summarize_counts(sums: dict[str, torch.Tensor], dice_weight: float) -> dict[str, float]:
    """Totals -> `eval/iou` (road class), `eval/iou_background`, `eval/mean_iou` (over the two classes,
    ignoring one absent from masks and predictions alike), `eval/pixel_accuracy`, `eval/loss` (the
    training objective without auxiliary terms, Dice from the summed soft counts) and
    `eval/road_fraction` (the share of road pixels: the IoU and accuracy of predicting all road, the
    baseline to beat)."""
    total = {name: float(value.sum()) for name, value in sums.items()}
    pixels = max(total["pixels"], 1.0)
    bce = total["bce_sum"] / pixels
    dice = 1 - 2 * total["soft_intersection"] / max(total["soft_total"], 1.0)
    ious = class_ious(sums)
    present = [value for value in ious.values() if not math.isnan(value)]
    return {
        "eval/loss": bce + dice_weight * dice if dice_weight > 0 else bce,
        "eval/bce": bce,
        "eval/iou": ious["road"],
        "eval/iou_background": ious["background"],
        "eval/mean_iou": sum(present) / len(present) if present else float("nan"),
        "eval/pixel_accuracy": total["correct"] / pixels,
        "eval/road_fraction": total["road"] / pixels,
    }


def per_class_table(sums: dict[str, torch.Tensor]) -> dict[str, dict[str, float | int | None]]:
    """eval.json's `per_class`: each class's IoU (null where undefined) and its labelled pixels."""
    ious = class_ious(sums)
    road, pixels = int(sums["road"].sum()), int(sums["pixels"].sum())
    labelled = {"background": pixels - road, "road": road}
    return {
        name: {"iou": None if math.isnan(ious[name]) else ious[name], "pixels": labelled[name]}
        for name in CLASSES
    }
