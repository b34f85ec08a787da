"""API worker processes (API_WORKERS ≥ 1): the front door apart from the scheduler.

With API_WORKERS=N the daemon is one scheduler process (the service, its
executors, the scheduling cores and Triton's metrics port) and N worker
processes that each accept HTTP and gRPC on the shared ports (SO_REUSEPORT),
parse and validate a request as the single process does, write its tensors
into the model's shared-memory arena and send the scheduler a small
descriptor over ZeroMQ; the answer comes back as a descriptor and the
worker reads the outputs from the same slots. No tensor byte passes through
the scheduler process.

- `messages`: the descriptors and the service's state as workers see it.
- `channel`: the ZeroMQ sockets.
- `remote`: the service a worker's API calls (app.server.service.InferenceService).
- `worker`: a worker process (uvicorn on a SO_REUSEPORT socket).
- `receiver`: the scheduler's side: descriptors into `LiveService.infer`.
- `supervisor`: the scheduler process: the service, the receiver and the workers.
"""
