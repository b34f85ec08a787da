"""Peer systems the comparison runs against (optional extra: ``pip install -e .[peers]``).

- `ray_serve_app`: a Ray Serve application serving a model repository with the
  daemon's native ``POST /infer`` API (``@serve.batch``, one replica per device).
- `ray_serve_launcher`: start/stop it locally (``start_ray_serve``/``stop``; CLI).
- `ray_grid`: the (max_batch_size, batch_wait_timeout_s) grid a careful user tries.
- `bentoml_service`: a BentoML service with adaptive batching (one batchable
  ``POST /infer/<model>`` per model, one worker per device); the one
  deadline-aware peer (it sheds what it predicts will miss ``max_latency_ms``).
- `bentoml_launcher`: its own venv (``--setup``: BentoML's OpenTelemetry pins
  conflict with the server's), start/stop (``start_bentoml``/``stop``; CLI).
- `bentoml_grid`: its (max_batch_size, max_latency_ms) grid and the request
  body (``bentoml_request``) the load generator sends it.

Nothing here is imported by the server; `ray` is imported lazily, and
`bentoml` only in the peer's own interpreter.
"""
