"""Typed, validated configs: schema, YAML loading with overrides, launch-config cross-checks."""
