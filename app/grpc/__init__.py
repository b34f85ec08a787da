"""The KServe v2 gRPC endpoint: `inference.GRPCInferenceService`.

The service definitions are the published ones that `tritonclient[grpc]`
ships (`tritonclient.grpc.service_pb2`, `service_pb2_grpc`,
`model_config_pb2`), served by grpcio's asyncio server in the same process
and on the same event loop as the HTTP API. Requests go to the one live
service through the same call as the HTTP v2 infer route
(`InferenceService.infer`), so one scheduler sees both and a batch may mix
requests from HTTP and gRPC.

grpcio and the protos (tritonclient[grpc]) are default dependencies; an
install without them (`pip install 'deadline-serve[triton]'` adds them)
logs an error at start-up when `GRPC_PORT` > 0 and runs HTTP only. Only `lifecycle`
may be imported without the extra; the other modules import grpc.

The modules, from the socket inwards:

    lifecycle   start and stop the server in the app's lifespan (GRPC_PORT on HOST)
    servicer    the RPCs: health, metadata, config, readiness, inference, index
    extensions  statistics and model control; the RPCs not served (UNIMPLEMENTED)
    status      ServingError → gRPC status code, in one table
    tensors     ModelInferRequest → tensors (app.api.tensors' checks), results → response
    metadata    model metadata and Triton's ModelConfig from our ModelConfig
"""
