"""The model repository: `models/<name>/config.yaml` plus the model file."""
