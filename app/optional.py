"""Optional extras, imported where they are needed with an error that says
how to install them."""

from __future__ import annotations

from typing import Any


def import_torch() -> Any:
    """PyTorch (the `torch` extra; importing it costs seconds)."""
    try:
        import torch
    except ImportError as exc:  # optional extra
        raise RuntimeError(
            "backend 'torch' needs PyTorch: pip install -e '.[torch]' (torch==2.13.0)"
        ) from exc
    return torch
