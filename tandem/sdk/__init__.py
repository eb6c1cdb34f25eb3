"""The SDK: what `pip install tandem` is for (grpcio and protobuf, nothing more).

`tandem.sdk.client` holds `Client` and `AsyncClient`, `tandem.sdk.errors` the exceptions they
raise; `tandem` re-exports both, so users write `from tandem import Client`. The SDK speaks the
wire (`tandem.wire.generation`, the generated `tandem.v1`), which it shares with the server.
Without extras, the `tandem` command answers `generate` (this SDK) and `plan` (the capacity
planner, `tandem.capacity`, plain Python). Everything else in `tandem` is the server side and
needs `pip install 'tandem[server]'`: the workers (`tandem.services`), the orchestrator
(`tandem.orchestrator`), the verification rules and their tensor math, the local cluster and the
benchmarks' harness.
"""
