"""Shared fixtures: a tiny model pair saved and loaded through from_pretrained, a real Redis,
real worker processes, and one Ray Serve session for the whole test run."""

import concurrent.futures
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from support.models import build_tokenizer, llama_config

PROMPT_LEN = 8
# A chat template for the pair's tokenizer, so that /v1/chat/completions has one to render.
CHAT_TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}")


def _prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, PROMPT_LEN), generator=g).tolist()


@pytest.fixture(scope="session")
def pair(tmp_path_factory) -> dict:
    """A target and a draft that agrees with it often but not always (a noisy copy), with a
    tokenizer, and an EOS token chosen so that some greedy continuations end early."""
    root = tmp_path_factory.mktemp("pair")
    tokenizer = build_tokenizer(300, max_chars=100_000)
    tokenizer.chat_template = CHAT_TEMPLATE
    vocab = len(tokenizer)
    config = llama_config(vocab, 2, 64, eos_token_id=None, max_context=256, init_std=0.3)
    torch.manual_seed(0)
    target = LlamaForCausalLM(config).eval()
    prompts = _prompts(vocab, 24, seed=1)
    with torch.no_grad():
        free = target.generate(torch.tensor(prompts), do_sample=False, max_new_tokens=24, eos_token_id=None,
                               pad_token_id=0)[:, PROMPT_LEN:]
    # EOS: the token that appears in the most continuations, but not in all of them.
    counts = torch.zeros(vocab)
    for row in free:
        counts[row.unique()] += 1
    counts[counts >= len(prompts) - 2] = 0
    eos = int(counts.argmax())
    target.config.eos_token_id = target.generation_config.eos_token_id = eos
    target.generation_config.pad_token_id = 0
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    draft = LlamaForCausalLM(config).eval()
    draft.load_state_dict(target.state_dict())
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std() * 0.05)
    draft.config.eos_token_id = draft.generation_config.eos_token_id = eos
    draft.save_pretrained(root / "draft")
    return {"draft": str(root / "draft"), "target": str(root / "target"), "eos": eos, "vocab": vocab,
            "prompts": prompts}


@pytest.fixture(scope="session")
def target_model(pair):
    return AutoModelForCausalLM.from_pretrained(pair["target"]).eval()


@pytest.fixture(scope="session")
def redis_url():
    from tandem.orchestrator.redis_server import EmbeddedRedis

    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture(scope="session")
def otlp():
    """Every tandem process of the test run (workers, Ray Serve's replica) exports its spans
    here, through the standard OTEL_* variables, set before any of them starts."""
    from tandem.bench.otlp import OTLPReceiver

    receiver = OTLPReceiver()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # milliseconds: spans arrive soon after a request
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def workers(pair, otlp):
    """A draft worker and a target verifier as real processes (`tandem worker`)."""
    from tandem.local import spawn_worker, stop_processes
    from tandem.ports import free_port

    ports = {"draft": free_port(), "target": free_port()}  # Prometheus
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both at once: each takes seconds to load
        procs = list(pool.map(lambda kind: spawn_worker(kind, pair[kind], "127.0.0.1", 1, "cpu", "float32",
                                                        metrics_port=ports[kind]), ("draft", "target")))
    yield {"draft": procs[0][1], "target": procs[1][1], "pids": {"draft": procs[0][0].pid, "target": procs[1][0].pid},
           "metrics_ports": ports}
    stop_processes([proc for proc, _ in procs])


@pytest.fixture(scope="session")
def cluster(pair, workers, redis_url):
    """The whole cluster: Ray Serve's gRPC ingress in front of the orchestrator deployment."""
    from tandem.orchestrator.app import start_ingress, stop_ingress
    from tandem.orchestrator.config import OrchestratorConfig
    from tandem.ports import free_port

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    config = OrchestratorConfig(draft_addresses=(workers["draft"],), target_addresses=(workers["target"],),
                                redis_url=redis_url, tokenizer=pair["target"], max_gamma=8, metrics_port=free_port())
    port = free_port()
    http_port = start_ingress(config, port)
    yield {"address": f"127.0.0.1:{port}", "config": config, "port": port, "http_port": http_port,
           "base_url": f"http://127.0.0.1:{http_port}/v1"}
    stop_ingress(config.app_name)
