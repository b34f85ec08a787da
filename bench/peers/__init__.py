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

Nothing here is imported by the server; `ray` is imported lazily, and the
Triton binary is located without importing `pytriton`. The nvidia-pytriton
wheel is installed with ``--no-deps`` (``pip install --no-deps
nvidia-pytriton==0.7.0``), not through the extra: it pins numpy < 2 for its
own Python API, which the peer does not use, and the server runs numpy 2 (the
binary and its Python backend do too: bench/peers/triton_model.py moves
tensors through DLPack for that).
"""
