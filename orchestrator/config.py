"""The orchestrator's validated configuration."""

import hashlib
import os
from dataclasses import dataclass

from tandem.math import tree
from tandem.orchestrator.pool import split_address
from tandem.orchestrator.store import check_redis_url
from tandem.tls import TLSFiles
from tandem.wire.generation import DRAFT_SHAPES, TREE_RULES, VERIFICATION_MODES

MAX_TREE_NODES = 64  # a tree's nodes (the workers' MAX_GAMMA: drafted tokens per call)
MAX_AHEAD_GUESSES = 8  # more guesses of a bonus token than the draft's top few rarely come true
MAX_AHEAD_REJECTIONS = 16  # a block's first positions drafting ahead may draft past a rejection at


@dataclass(frozen=True)
class OrchestratorConfig:
    # Each address is host:port or a DNS name resolving to several workers (a headless Service).
    draft_addresses: tuple[str, ...]  # draft workers; none at all means γ = 0 for every session
    target_addresses: tuple[str, ...]  # target verifiers; at least one
    redis_url: str
    tokenizer: str | None = None  # a Hugging Face tokenizer directory; None: token ids only
    max_gamma: int = 8
    max_tokens_cap: int = 4096
    default_max_tokens: int = 128
    session_ttl_s: int = 3600
    worker_timeout_s: float = 30.0  # one worker call, and the wait for the first verifier
    verifier_wait_s: float = 30.0  # how long a generation waits for a verifier when none is up
    redis_retry_s: float = 10.0  # how long a Redis operation is retried while Redis is down
    app_name: str = "tandem"
    replicas: int = 1  # Ray Serve replicas of the orchestrator, each serving any session
    metrics_port: int = 0  # Prometheus metrics of the replica's process; 0: none
    metrics_host: str = "127.0.0.1"  # the interface the metrics listen on
    draft_ahead: bool = True  # draft past each block while the target verifies it (cycle.py)
    ahead_guesses: int = 1  # guesses of a block's bonus token that drafting ahead drafts past, a chain under each
    # A block's first positions at which drafting ahead also drafts past a rejection (a guess of the
    # recovered token, a chain under it); 0: only past the whole block accepted.
    ahead_rejections: int = 8
    verification: str = "block"  # how drafted blocks are accepted unless a request says: "token" or "block"
    draft_shape: str = "chain"  # what cycles draft unless a request says: "chain", "tree" or "auto"
    # A token tree's children per node at depths 1, 2, …, then 1 (a chain under every leaf) down to γ.
    tree_widths: tuple[int, ...] = (2, 2)
    tree_rule: str = "rrsw"  # how sampled trees are drawn and verified unless a request says: "rrsw" or "greedy"
    # The ingress's bearer token, as its SHA-256 hex digest: the secret itself never travels in
    # the application's config. None: no token, anyone who reaches the ingress may call it.
    api_key_sha256: str | None = None
    max_sessions: int = 64  # generations in flight per replica; more are refused (RESOURCE_EXHAUSTED)
    stream_interval: int = 1  # tokens a streamed chunk holds at least, but the first and the last
    tls: TLSFiles | None = None  # mutual TLS to the workers: the orchestrator's cert and key, the workers' CA
    openai_api: bool = True  # the OpenAI-compatible API's routes on Serve's HTTP ingress (http_ingress.py)

    def __post_init__(self) -> None:
        if not self.target_addresses:
            raise ValueError("target_addresses: at least one target verifier is needed")
        for name in ("draft_addresses", "target_addresses"):
            for address in getattr(self, name):
                try:
                    split_address(address)
                except ValueError as e:
                    raise ValueError(f"{name}: {e}") from None
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url must be a redis:// URL, got {self.redis_url!r}")
        check_redis_url(self.redis_url)
        if self.tls is not None:
            self.tls.check()  # here, not at the first worker call inside a Ray replica
        if self.tokenizer is not None and not os.path.isdir(self.tokenizer):
            raise ValueError(f"tokenizer directory not found: {self.tokenizer}")
        if self.verification not in VERIFICATION_MODES:
            raise ValueError(f"verification must be one of {VERIFICATION_MODES}, got {self.verification!r}")
        if not 0 <= self.max_gamma <= 64:
            raise ValueError(f"max_gamma must be in [0, 64], got {self.max_gamma}")
        if not 1 <= self.ahead_guesses <= MAX_AHEAD_GUESSES:
            raise ValueError(f"ahead_guesses must be in [1, {MAX_AHEAD_GUESSES}], got {self.ahead_guesses}")
        if not 0 <= self.ahead_rejections <= MAX_AHEAD_REJECTIONS:
            raise ValueError(f"ahead_rejections must be in [0, {MAX_AHEAD_REJECTIONS}], got {self.ahead_rejections}")
        if self.draft_shape not in DRAFT_SHAPES:
            raise ValueError(f"draft_shape must be one of {DRAFT_SHAPES}, got {self.draft_shape!r}")
        if self.tree_rule not in TREE_RULES:
            raise ValueError(f"tree_rule must be one of {TREE_RULES}, got {self.tree_rule!r}")
        if not self.tree_widths or min(self.tree_widths) < 1:
            raise ValueError(f"tree_widths must be one or more widths of at least 1, got {self.tree_widths}")
        if (nodes := tree.size(tree.widths_at(self.tree_widths, self.max_gamma))) > MAX_TREE_NODES:
            raise ValueError(f"tree_widths {self.tree_widths} make a tree of {nodes} nodes at max_gamma "
                             f"{self.max_gamma}; at most {MAX_TREE_NODES}: narrow it or lower max_gamma")
        if not 1 <= self.default_max_tokens <= self.max_tokens_cap:
            raise ValueError("default_max_tokens must be in [1, max_tokens_cap]")
        if not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be in [0, 65535], got {self.metrics_port}")
        if self.session_ttl_s < 1 or min(self.worker_timeout_s, self.verifier_wait_s, self.redis_retry_s) <= 0:
            raise ValueError("session_ttl_s, worker_timeout_s, verifier_wait_s and redis_retry_s must be positive")
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")
        if self.api_key_sha256 is not None and len(self.api_key_sha256) != 64:
            raise ValueError("api_key_sha256 must be a SHA-256 hex digest (use api_key_digest)")

    @property
    def route_prefix(self) -> str:
        """Where the application's HTTP routes are: the default application at the root (the
        OpenAI base URL is http://host:port/v1), another under its name (/name/v1)."""
        return "/" if self.app_name == OrchestratorConfig.app_name else f"/{self.app_name}"

    def load_tokenizer(self):
        """The tokenizer, or None when there is none (token-id prompts only)."""
        if self.tokenizer is None:
            return None
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(self.tokenizer)
        except (OSError, ValueError):
            return None


def api_key_digest(api_key: str | None) -> str | None:
    """What OrchestratorConfig.api_key_sha256 holds for a token (None and "" mean none)."""
    if not api_key:
        return None
    if not api_key.isprintable() or len(api_key) > 4096:
        raise ValueError("the API key must be printable and at most 4096 characters")
    return hashlib.sha256(api_key.encode()).hexdigest()
