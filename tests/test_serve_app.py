"""tandem.serve_app, the Serve application builder of a RayService (`import_path:
tandem.serve_app:app`): the flags of `tandem orchestrator` → the same OrchestratorConfig, bad
flags → ValueError naming them. Builds the Application object only: no Ray is started."""

import re

import pytest
import ray

from tandem import cli, serve_app

FLAGS = ["--draft", "a:1,b:2", "--target", "c:3", "--replicas", "3", "--max-sessions", "5", "--host", "0.0.0.0",
         "--no-draft-ahead"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in ("REDIS_URL", cli.API_KEY_ENV):
        monkeypatch.delenv(key, raising=False)


def test_app_builds_what_tandem_orchestrator_runs_without_starting_ray(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://redis.example:6379/1")
    monkeypatch.setenv(cli.API_KEY_ENV, "s3cret-token-of-enough-length")
    ray_before = ray.is_initialized()  # an earlier test module of the run may have started it
    app = serve_app.app({"argv": FLAGS})
    deployment = app._bound_deployment
    config = deployment.init_args[0]
    assert config == cli.orchestrator_config(cli.parser().parse_args(["orchestrator", *FLAGS]))
    assert config.draft_addresses == ("a:1", "b:2") and config.target_addresses == ("c:3",)
    assert config.redis_url == "redis://redis.example:6379/1" and config.api_key_sha256 is not None
    assert not config.draft_ahead and config.metrics_host == "0.0.0.0"
    assert deployment.num_replicas == 3
    assert ray.is_initialized() == ray_before


@pytest.mark.parametrize("flag", ["--grpc-port", "--grpc-port=9001", "--grpc"])
def test_grpc_port_is_the_serve_configs(flag):
    argv = [*FLAGS, flag] if "=" in flag else [*FLAGS, flag, "9001"]
    with pytest.raises(ValueError, match="--grpc-port .*grpc_options"):
        serve_app.app({"argv": argv})


def test_http_port_is_the_serve_configs_and_zero_turns_the_openai_api_off():
    assert serve_app.config(FLAGS).openai_api
    assert not serve_app.config([*FLAGS, "--http-port", "0"]).openai_api
    with pytest.raises(ValueError, match="--http-port: .*http_options.port"):
        serve_app.config([*FLAGS, "--http-port", "8001"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--draft", "a:1"], "required: --target"),
    ([*FLAGS, "--bogus"], "unrecognized arguments: --bogus"),
    ([*FLAGS, "--max-gamma", "x"], "--max-gamma: invalid int value: 'x'"),
    ([*FLAGS, "--redis-url", "ftp://x"], "tandem orchestrator: redis_url must be a redis:// URL"),
    ([*FLAGS, "--tls-cert", "/nonexistent.pem"], "tandem orchestrator: --tls-cert, --tls-key and --tls-ca go together"),
])
def test_bad_flags_are_a_value_error_naming_them(argv, message):
    with pytest.raises(ValueError, match="^tandem\\.serve_app: .*" + re.escape(message)):
        serve_app.config(argv)


@pytest.mark.parametrize("args", [{"argv": "--draft a:1"}, {"argv": FLAGS, "flags": []}])
def test_bad_application_args(args):
    with pytest.raises(ValueError, match="tandem.serve_app"):
        serve_app.app(args)
