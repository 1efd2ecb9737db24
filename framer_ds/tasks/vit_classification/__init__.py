"""`vit_classification`: an HF ViTForImageClassification on an ImageFolder or the built-in digits."""
