"""drivable_vit: drivable-space segmentation from several cameras over several frames."""
