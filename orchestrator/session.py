"""A session: the request it was created with, frozen, and its progress, which every cycle
moves on; and the one codec both have in Redis, a hash of named fields.

    request (written once):  temperature top_k top_p seed prompt_len max_tokens gamma
                             verification draft_shape tree_widths ignore_eos tree_rule
    progress (every commit): cycle status owner epoch draft_worker target_worker
                             draft_cache_len target_cache_len acceptance ttft_s
    once, at creation:       created_s

The committed tokens and each cycle's stats are strings of their own (tandem.orchestrator.store).
A session runs as a `Session`; a resume reads it back as a `SessionRecord`.
A hash is read back whole (a resume), so every field is a string there; `gamma` "" means
adaptive, a worker "" none yet, `tree_widths` is comma-separated, `acceptance` the γ policy's
per-session numbers (tandem.orchestrator.policy.SESSION_STATE) as a JSON object.
"""

import json
from dataclasses import dataclass, field

from tandem.math.params import SamplingParams
from tandem.orchestrator.policy import GammaPolicy
from tandem.wire.generation import CycleStats, Stats

POOLS = ("draft", "target")


@dataclass(frozen=True)
class Request:
    """What a session was asked for, resolved (every default filled in)."""

    params: SamplingParams
    prompt_len: int
    max_tokens: int
    gamma: int | None = None  # None: adaptive
    verification: str = "token"  # the chain rule (tandem.rules)
    draft_shape: str = "chain"  # what cycles draft: "chain", "tree" or "auto" (tandem.orchestrator.cycle)
    tree_widths: tuple[int, ...] = (2, 2)  # a tree's children per node at depths 1, 2, …, then 1
    ignore_eos: bool = False  # generate past the target's EOS, up to max_tokens
    tree_rule: str = "rrsw"  # a sampled tree's: "rrsw" or "greedy" (tandem.rules.tree)

    def fields(self) -> dict[str, str | int | float]:
        p = self.params
        return {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "seed": p.seed,
                "prompt_len": self.prompt_len, "max_tokens": self.max_tokens,
                "gamma": "" if self.gamma is None else self.gamma, "verification": self.verification,
                "draft_shape": self.draft_shape, "tree_widths": ",".join(map(str, self.tree_widths)),
                "ignore_eos": int(self.ignore_eos), "tree_rule": self.tree_rule}

    @classmethod
    def of(cls, fields: dict[str, str]) -> "Request":
        """From a stored hash (strings); a record from before block verification, trees or tree
        rules reads as token-level chains and RRSw trees."""
        params = SamplingParams(float(fields["temperature"]), int(fields["top_k"]), float(fields["top_p"]),
                                int(fields["seed"]))
        widths = fields.get("tree_widths", "")
        return cls(params, int(fields["prompt_len"]), int(fields["max_tokens"]),
                   int(fields["gamma"]) if fields.get("gamma", "") != "" else None,
                   fields.get("verification", "token"), fields.get("draft_shape", "chain"),
                   tuple(int(w) for w in widths.split(",")) if widths else (),
                   fields.get("ignore_eos", "0") == "1", fields.get("tree_rule", "rrsw"))


@dataclass
class Session:
    """A session as its writer runs it: the request, the committed tokens, and its progress,
    mirrored to Redis after every cycle (`progress`)."""

    session_id: str
    request: Request
    tokens: list[int]  # committed sequence, prompt first
    policy: GammaPolicy  # the replica's costs and acceptance, this session's probes and shapes
    owner: str = ""  # this writer's id: the store commits only its cycles
    epoch: int = 1  # this writer's epoch (the store's claims of the session): workers run no older one's calls
    cycle: int = 0
    # By pool ("draft", "target"): the session's worker, and how many committed tokens it is
    # believed to hold (a hint: it may have evicted or lost them).
    workers: dict = field(default_factory=lambda: dict.fromkeys(POOLS))
    cache_lens: dict = field(default_factory=lambda: dict.fromkeys(POOLS, 0))
    used: set = field(default_factory=set)  # (pool, address) of every worker that took its calls
    finish_reason: str = ""
    started: float = 0.0  # perf_counter() when the generation began (earlier than now on a resume)
    stats: Stats = field(default_factory=Stats)
    committed: dict = field(default_factory=dict, repr=False)  # the progress this writer last committed

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.request.prompt_len

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    def progress(self) -> dict[str, str | int | float]:
        """The fields a commit writes."""
        fields = {"status": self.finish_reason or "running", "acceptance": json.dumps(self.policy.to_dict()),
                  "ttft_s": self.stats.ttft_s}
        for pool in POOLS:
            fields |= {f"{pool}_worker": self.workers[pool] or "", f"{pool}_cache_len": self.cache_lens[pool]}
        return fields

    def changes(self) -> dict[str, str | int | float]:
        """The progress fields that differ from what this writer last committed (all of them at
        its first commit), marked committed: a commit that fails ends the writer."""
        progress = self.progress()
        changed = {k: v for k, v in progress.items() if self.committed.get(k) != v}
        self.committed = progress
        return changed

    def fields(self, created_s: float) -> dict[str, str | int | float]:
        """Every field of a new session's hash."""
        return self.request.fields() | self.progress() | {"cycle": self.cycle, "owner": self.owner,
                                                          "epoch": self.epoch, "created_s": created_s}


@dataclass
class SessionRecord:
    """A stored session, as a resume (or a tool) reads it back."""

    session_id: str
    request: Request
    tokens: list[int]  # the committed sequence, prompt first
    cycle: int = 0
    status: str = "running"  # running, abandoned, unavailable (all resumable); stop, length
    owner: str = ""  # the writer allowed to commit
    epoch: int = 1  # its writer epoch: 1 for the writer that created it, one more per claim
    workers: dict = field(default_factory=lambda: dict.fromkeys(POOLS))  # by pool: an address, or None
    cache_lens: dict = field(default_factory=lambda: dict.fromkeys(POOLS, 0))  # by pool: hints
    acceptance: dict = field(default_factory=dict)  # the γ policy's per-session numbers
    ttft_s: float = 0.0
    created_s: float = 0.0  # wall clock (epoch seconds) when the session began
    per_cycle: list[CycleStats] = field(default_factory=list)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.request.prompt_len:]

    @classmethod
    def of(cls, session_id: str, fields: dict[str, str], tokens: list[int], per_cycle: list[CycleStats],
           ) -> "SessionRecord":
        """From a stored hash (strings), its tokens and its cycles."""
        fields = _named(fields)
        return cls(session_id, Request.of(fields), tokens, int(fields["cycle"]), fields["status"],
                   fields.get("owner", ""), int(fields.get("epoch", 0)),
                   {pool: fields.get(f"{pool}_worker") or None for pool in POOLS},
                   {pool: int(fields.get(f"{pool}_cache_len", 0)) for pool in POOLS},
                   json.loads(fields.get("acceptance") or "{}"), float(fields.get("ttft_s", 0)),
                   float(fields.get("created_s", 0)), per_cycle)


def _named(fields: dict[str, str]) -> dict[str, str]:
    """A hash in this module's fields; one a version before them wrote held JSON objects
    (`params`, `policy`, `workers`, `cache_lens`)."""
    if "params" not in fields:
        return fields
    params = json.loads(fields["params"])
    named = {k: "" if v is None else ",".join(map(str, v)) if isinstance(v, list) else str(v)
             for k, v in params.items()}
    workers, cache_lens = json.loads(fields.get("workers", "{}")), json.loads(fields.get("cache_lens", "{}"))
    for pool in POOLS:
        named[f"{pool}_worker"] = workers.get(pool) or ""
        named[f"{pool}_cache_len"] = str(cache_lens.get(pool, 0))
    return fields | named | {"acceptance": fields.get("policy", "{}")}
