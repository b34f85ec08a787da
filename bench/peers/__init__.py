"""Peer systems the comparison runs against (optional extra: ``pip install -e .[peers]``).

- `ray_serve_app`: a Ray Serve application serving a model repository with the
  daemon's native ``POST /infer`` API (``@serve.batch``, one replica per device).
- `ray_serve_launcher`: start/stop it locally (``start_ray_serve``/``stop``; CLI).
- `ray_grid`: the (max_batch_size, batch_wait_timeout_s) grid a careful user tries.
- `triton_repository`: a Triton model repository (``config.pbtxt`` with the
  dynamic batcher and its REJECT queue policy, one instance per device, a
  Python-backend ``model.py``) generated from one of ours.
- `triton_model`: the Python-backend model inside Triton: the daemon's emulated
  or ONNX backend per instance, per-device locks for shared devices.
- `triton_launcher`: start/stop the real ``tritonserver`` of the nvidia-pytriton
  wheel on it (``start_triton``/``stop``; CLI) and ``kserve_request`` bodies.
- `triton_grid`: the (max_queue_delay, queue timeout) grid a careful user tries.
- `bentoml_service`: a BentoML service with adaptive batching (one batchable
  ``POST /infer/<model>`` per model, one worker per device); the one
  deadline-aware peer (it sheds what it predicts will miss ``max_latency_ms``).
- `bentoml_launcher`: its own venv (``--setup``: BentoML's OpenTelemetry pins
  conflict with the server's), start/stop (``start_bentoml``/``stop``; CLI).
- `bentoml_grid`: its (max_batch_size, max_latency_ms) grid and the request
  body (``bentoml_request``) the load generator sends it.

Nothing here is imported by the server; `ray` is imported lazily, `bentoml`
only in the peer's own interpreter, and the Triton binary is located without
importing `pytriton`. The nvidia-pytriton wheel is installed with
``--no-deps`` (``pip install --no-deps nvidia-pytriton==0.7.0``), not
through the extra: it pins numpy < 2 for its own Python API, which the peer
does not use, and the server runs numpy 2 (the binary and its Python backend
do too: bench/peers/triton_model.py moves tensors through DLPack for that).
"""
