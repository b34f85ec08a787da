"""The model repository: `<repository>/<name>/config.yaml` plus the model file.

The bundled repository is package data (`app/models/`, configs only), so a
regular `pip install .` carries it like an editable one: its generated model
files are built next to the configs on first start (see `bundled`)."""

from pathlib import Path

BUNDLED_REPOSITORY = Path(__file__).resolve().parent.parent / "models"
