"""Peer systems the comparison runs against (optional extra: ``pip install -e .[peers]``).

- `ray_serve_app`: a Ray Serve application serving a model repository with the
  daemon's native ``POST /infer`` API (``@serve.batch``, one replica per device).
- `ray_serve_launcher`: start/stop it locally (``start_ray_serve``/``stop``; CLI).
- `ray_grid`: the (max_batch_size, batch_wait_timeout_s) grid a careful user tries.

Nothing here is imported by the server; `ray` is imported lazily.
"""
