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


def import_ray() -> Any:
    """Ray (the `ray` extra): executors as Ray actors (RAY_ADDRESS)."""
    try:
        import ray
    except ImportError as exc:  # optional extra
        raise RuntimeError("RAY_ADDRESS needs Ray: pip install -e '.[ray]' (ray==2.60.0)") from exc
    return ray
