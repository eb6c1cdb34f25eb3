"""The run plan of `tandem bench`: warm every mode up, then for each prompt and workload run
every mode once in a shuffled order (so drift on a noisy machine hits all modes alike), then
the concurrency sweep; read each worker's peak memory; write JSON, markdown and plots."""

import json
import os
import platform
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tandem.bench import report, summary
from tandem.bench.runs import HF_MODES, HFRunner, Run, cluster_mode, cluster_run, concurrent_runs, hf_waves
from tandem import Client

WORKLOADS = {"greedy": 0.0, "sampled": 1.0}


@dataclass
class BenchConfig:
    draft_model: str
    target_model: str
    prompts: list[str]  # text prompts, tokenized with the target's tokenizer
    max_tokens: int = 128
    gammas: list[int] = field(default_factory=lambda: list(range(9)))  # fixed-γ modes; 0 is the target alone
    adaptive: bool = True
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    concurrency_sessions: int = 16  # sessions per concurrency level, at least as many as are in flight
    concurrency_repeats: int = 1  # runs of every mode per level, interleaved (the machine drifts)
    threads: int = 1  # torch threads of the in-process baselines (match the workers')
    seed: int = 0
    progress: bool = True
    draft_ahead: bool | None = True  # the local cluster's setting (reported); None: a cluster at --address
    interleaved: bool = True  # False: the concurrency sweep only
    verifications: list[str] = field(default_factory=lambda: ["token"])  # "token" and/or "block"
    draft_shapes: list[str] = field(default_factory=lambda: ["chain"])  # "chain", "tree", "auto": modes for each
    drafter: str = "hybrid"  # the cluster's draft workers (reported): hybrid, model or ngram

    @property
    def cluster_modes(self) -> list[str]:
        """Every γ (and adaptive) under each verification and draft shape; γ = 0 drafts nothing."""
        gammas = [*self.gammas, *([None] if self.adaptive else [])]
        return [cluster_mode(g, v, shape) for shape in self.draft_shapes for v in self.verifications for g in gammas
                if g != 0 or (v == "token" and shape == "chain")]

    @property
    def modes(self) -> list[str]:
        return [*HF_MODES, *self.cluster_modes]


def peak_memory_mb(pid: int) -> float | None:
    """The process's peak resident set (VmHWM), from /proc; None where there is no /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", disable=not enabled, dynamic_ncols=True)


def _one(config, hf, client, mode, workload, i, prompt) -> Run:
    seed = config.seed + max(i, 0)
    if mode in HF_MODES:
        return hf.run(mode, workload, i, prompt, config.max_tokens, seed)
    return cluster_run(client, mode, workload, i, prompt, config.max_tokens, seed)


def measure(config: BenchConfig, address: str) -> tuple[list[Run], dict]:
    """Every (prompt, workload, mode) once, interleaved, after a warm-up; then concurrency."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.target_model)
    prompts = [tokenizer.encode(p) for p in config.prompts]
    hf = HFRunner(config.target_model, config.draft_model, config.threads)
    order = random.Random(config.seed)
    runs: list[Run] = []
    if not config.interleaved:
        return runs, concurrency_sweep(config, address, prompts, hf)
    with Client(address) as client:
        with _progress(len(config.workloads) * len(config.modes), "warm-up", config.progress) as bar:
            for workload in config.workloads:
                for mode in config.modes:
                    _one(config, hf, client, mode, workload, -1, prompts[0][:16])
                    bar.update()
        total = len(prompts) * len(config.workloads) * len(config.modes)
        with _progress(total, "interleaved runs", config.progress) as bar:
            for i, prompt in enumerate(prompts):
                for workload in config.workloads:
                    modes = list(config.modes)
                    order.shuffle(modes)
                    for mode in modes:
                        runs.append(_one(config, hf, client, mode, workload, i, prompt))
                        bar.update()
    return runs, concurrency_sweep(config, address, prompts, hf)


def concurrency_sweep(config: BenchConfig, address: str, prompts: list[list[int]], hf: HFRunner | None = None,
                      prefix: str = "") -> dict:
    """Greedy sessions at each level of sessions in flight: the cluster with γ = 0 and adaptive
    (keys prefixed with `prefix`), and HF's target alone in batches of the same size when `hf`
    is given → {mode: [row per level]}. Each level runs every mode in turn, `concurrency_repeats`
    times: one run moves 10–15 % on a busy machine, and interleaving puts the modes side by side
    on its drift. A row pools its repeats and lists each one's tokens/s."""
    cluster_modes = [m for m in ("gamma_0", "adaptive") if m in config.cluster_modes]
    modes = cluster_modes + (["hf_target"] if hf else [])
    for mode in cluster_modes:  # warm up a cluster that has not run these modes yet
        concurrent_runs(address, mode, "greedy", [p[:16] for p in prompts[:4]], 8, 4, config.seed)
    concurrency: dict[str, list[dict]] = {}
    total = len(modes) * len(config.concurrency) * config.concurrency_repeats
    with _progress(total, f"{prefix}concurrency", config.progress) as bar:
        for level in config.concurrency:
            sessions = [prompts[i % len(prompts)] for i in range(max(config.concurrency_sessions, level))]
            repeats: dict[str, list[tuple[list[Run], float]]] = {mode: [] for mode in modes}
            for _ in range(config.concurrency_repeats):
                for mode in modes:
                    if mode == "hf_target":
                        repeats[mode].append(hf_waves(hf, sessions, config.max_tokens, level))
                    else:
                        repeats[mode].append(concurrent_runs(address, mode, "greedy", sessions, config.max_tokens,
                                                             level, config.seed))
                    bar.update()
            for mode, measured in repeats.items():
                concurrency.setdefault(prefix + mode, []).append(summary.pooled_concurrency_row(measured, level))
    return concurrency


def machine() -> dict:
    import torch

    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def run_bench(config: BenchConfig, address: str, out_dir: str | Path, worker_pids: dict[str, int] | None = None) -> dict:
    """Measure against the cluster at `address`; write bench.json, bench.md, runs.jsonl and the
    plots to out_dir; return the results."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    runs, concurrency = measure(config, address)
    memory = {kind: peak_memory_mb(pid) for kind, pid in (worker_pids or {}).items()}
    memory["bench process (both HF baselines)"] = peak_memory_mb(os.getpid())
    max_gamma = max([*config.gammas, 8])
    results = {
        "config": {k: v for k, v in asdict(config).items() if k != "prompts"} | {"prompts": len(config.prompts)},
        "machine": machine(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "duration_s": time.time() - started,
        "workloads": {w: summary.summarize(runs, w, config.modes, max_gamma) for w in config.workloads if runs},
        "greedy_identical_to_target": summary.greedy_identity(runs),
        "concurrency": concurrency,
        "peak_memory_mb": memory,
    }
    with open(out / "runs.jsonl", "w") as f:
        for r in runs:
            f.write(json.dumps(r.as_dict()) + "\n")
    _write(results, runs, out)
    return results


def add_unbatched(config: BenchConfig, address: str, out_dir: str | Path) -> dict:
    """The concurrency sweep again against a cluster whose workers run one session per pass
    (`--max-batch-tokens 1`: the workers before batching), added to the results in out_dir."""
    from transformers import AutoTokenizer

    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(config.target_model)
    prompts = [tokenizer.encode(p) for p in config.prompts]
    results = json.loads((out / "bench.json").read_text())
    started = time.time()
    results["concurrency"] |= concurrency_sweep(config, address, prompts, prefix="unbatched_")
    results["duration_s"] += time.time() - started
    runs = [Run(**json.loads(line)) for line in (out / "runs.jsonl").read_text().splitlines()]
    _write(results, runs, out)
    return results


def _write(results: dict, runs: list[Run], out: Path) -> None:
    (out / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "bench.md").write_text(report.markdown(results))
    report.plots(results, runs, out)
