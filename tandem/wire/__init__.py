"""The wire code every side shares: the only modules that build tandem.v1 messages.

- `generation`: the Generation service (SDK ↔ orchestrator);
- `worker`: the DraftWorker and TargetVerifier services (orchestrator ↔ workers);
- `validation`: field checks that turn a bad request into a gRPC status naming the field.

Plain Python, protobuf and grpcio: no torch, no numpy.
"""
