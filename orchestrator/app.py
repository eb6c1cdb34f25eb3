"""The builder: a validated OrchestratorConfig → the Ray Serve application, and the function
that runs it behind Ray Serve's gRPC ingress."""

import ray
from ray import serve
from ray.serve.config import HTTPOptions, gRPCOptions

from orchestrator.config import OrchestratorConfig
from orchestrator.deployment import GenerationService

SERVICER_FUNCTIONS = ["tandem.v1.generation_pb2_grpc.add_GenerationServicer_to_server"]


def build_app(config: OrchestratorConfig) -> serve.Application:
    return GenerationService.bind(config)


def start_ingress(config: OrchestratorConfig, grpc_port: int, http_port: int = 0,
                  host: str = "127.0.0.1") -> None:
    """Start Ray (local unless RAY_ADDRESS says otherwise), Serve's gRPC proxy, and the app.

    Returns once the app is running; requests need the metadata ("application", app_name).
    """
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore"}})
    from orchestrator.redis_server import free_port

    serve.start(
        http_options=HTTPOptions(host=host, port=http_port or free_port()),
        grpc_options=gRPCOptions(port=grpc_port, grpc_servicer_functions=SERVICER_FUNCTIONS),
    )
    serve.run(build_app(config), name=config.app_name, route_prefix=f"/{config.app_name}", blocking=False)


def stop_ingress() -> None:
    serve.shutdown()
    ray.shutdown()
