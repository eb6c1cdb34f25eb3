"""The orchestrator's validated configuration."""

import os
from dataclasses import dataclass

from tandem.orchestrator.pool import split_address


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
    draft_ahead: bool = True  # draft past each block while the target verifies it (cycle.py)

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
        if self.tokenizer is not None and not os.path.isdir(self.tokenizer):
            raise ValueError(f"tokenizer directory not found: {self.tokenizer}")
        if not 0 <= self.max_gamma <= 64:
            raise ValueError(f"max_gamma must be in [0, 64], got {self.max_gamma}")
        if not 1 <= self.default_max_tokens <= self.max_tokens_cap:
            raise ValueError("default_max_tokens must be in [1, max_tokens_cap]")
        if not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be in [0, 65535], got {self.metrics_port}")
        if self.session_ttl_s < 1 or min(self.worker_timeout_s, self.verifier_wait_s, self.redis_retry_s) <= 0:
            raise ValueError("session_ttl_s, worker_timeout_s, verifier_wait_s and redis_retry_s must be positive")
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")

    def load_tokenizer(self):
        """The tokenizer, or None when there is none (token-id prompts only)."""
        if self.tokenizer is None:
            return None
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(self.tokenizer)
        except (OSError, ValueError):
            return None
