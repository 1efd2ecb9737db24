"""Small shims over library versions, in one place."""

from __future__ import annotations


def image_processor_class(name: str) -> type:
    """transformers >= 5 names its torchvision-free processors `<Name>Pil` and warns on stderr when the
    plain name falls back to it; older versions only have the plain name."""
    import transformers

    try:
        return getattr(transformers, f"{name}Pil")
    except (AttributeError, ImportError):
        return getattr(transformers, name)
