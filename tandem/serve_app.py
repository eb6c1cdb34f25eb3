"""tandem's Ray Serve application for a cluster that runs Serve itself: the application builder
of a KubeRay RayService's serveConfigV2 (`import_path: tandem.serve_app:app`, as the Helm chart
renders it), or of `serve deploy` / `serve run` with a config file.

The application's args are the flags of `tandem orchestrator` (`{"argv": [...]}`), parsed by
tandem's own parser into the same OrchestratorConfig that `tandem orchestrator` runs with
(tandem.cli.orchestrator_config). The Redis URL and the ingress token may come from the
environment of the Ray pods (REDIS_URL, TANDEM_API_KEY), as for `tandem orchestrator`, so no
secret need be written into the Serve config. Serve's gRPC ingress itself (its port, tandem's
servicer function) is the Serve config's grpc_options, so `--grpc-port` is refused here; likewise
its HTTP port is http_options', and `--http-port` may only be 0 (the OpenAI API off).

Needs the server extra (Ray); imports point one way: this module imports tandem.cli and
tandem.orchestrator, and nothing under them imports it.
"""

import contextlib
import io

from ray import serve

from tandem import cli
from tandem.orchestrator.app import build_app
from tandem.orchestrator.config import OrchestratorConfig

# Flags of the `tandem orchestrator` process that the Serve config sets instead (grpc_options).
SET_BY_SERVE = ("--grpc-port",)


def _names(argv: list[str], flag: str) -> bool:
    """Whether ARGV gives FLAG, whole or abbreviated as argparse accepts it (`--grpc`, `--grpc-port=1`)."""
    return any(a.startswith("--") and len(name := a.split("=", 1)[0]) > 2 and flag.startswith(name) for a in argv)


def config(argv: list[str]) -> OrchestratorConfig:
    """The OrchestratorConfig `tandem orchestrator ARGV` runs with; ValueError with the one line
    that `tandem orchestrator` would have exited with."""
    argv = [str(a) for a in argv]
    for flag in SET_BY_SERVE:
        if _names(argv, flag):
            raise ValueError(f"tandem.serve_app: {flag} is not a flag here: the Serve config's grpc_options.port "
                             "sets the ingress's port")
    errors = io.StringIO()
    try:
        # argparse prints its usage and then the error, and exits; the message is the last line.
        with contextlib.redirect_stderr(errors):
            args = cli.parser().parse_args(["orchestrator", *argv])
        if _names(argv, "--http-port") and args.http_port != 0:
            raise SystemExit("--http-port: the Serve config's http_options.port sets the OpenAI API's port "
                             "(--http-port 0 turns the API off)")
        return cli.orchestrator_config(args)
    except SystemExit as e:
        lines = errors.getvalue().strip().splitlines()
        message = e.code if isinstance(e.code, str) else lines[-1] if lines else f"exit status {e.code}"
        raise ValueError(f"tandem.serve_app: {message}") from None


def app(args: dict) -> serve.Application:
    """The Serve application builder: `{"argv": [flags of tandem orchestrator]}` → tandem's application."""
    unknown = set(args) - {"argv"}
    if unknown:
        raise ValueError(f"tandem.serve_app: unknown application args {sorted(unknown)}; give {{'argv': [...]}}")
    argv = args.get("argv", [])
    if not isinstance(argv, list):
        raise ValueError(f"tandem.serve_app: argv is a list of flags, not {type(argv).__name__}")
    return build_app(config(argv))
