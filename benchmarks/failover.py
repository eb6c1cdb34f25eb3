"""What a failure costs a stream on the shipped pair: the time from a SIGKILL to the next token,
for each process that can die, and what the re-prefill after a failover costs.

    .venv/bin/python benchmarks/failover.py [--repeats 5] [--tokens 300] [--out DIR] [--smoke]

A local cluster (`LocalCluster`: 2 draft workers, 2 target verifiers, 2 orchestrator replicas,
the embedded Redis with its append-only file) serves one greedy stream at a time. Once the
stream has delivered a third of its tokens, one process is SIGKILLed: the draft worker or the
target verifier the session uses, the orchestrator replica writing it, or Redis. Measured: the
time from the kill to the next chunk, against the same stream's median time between chunks;
every stream is checked token for token against an undisturbed run. The supervisor restarts
what died before the next stream.

Then the re-prefill a failover costs the worker that takes a session over: one verify from
cache_len 0 over the whole sequence (64 to 1,000 tokens), against a steady verify (one
committed token and 3 drafted ones), on a verifier of its own.

Writes failover.{json,md,png} to --out (results/).

--smoke: the whole path at a tiny size (one kill of each kind, 24-token streams, re-prefill at 64
and 128 tokens, one repetition), into --out alone; its numbers mean nothing, but every stream is
still checked against the undisturbed run.
"""

import argparse
import asyncio
import json
import os
import signal
import statistics as st
import time
from pathlib import Path

import matplotlib
from tqdm import tqdm

import tandem
from tandem.cli import default_pair
from tandem.local import LocalCluster, spawn_worker, stop_processes
from tandem.math.params import SamplingParams
from tandem.orchestrator.clients import VerifierClient
from tandem.orchestrator.store import read_session
from tandem.ports import free_port
from tandem.wire.worker import Proposal

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = Path(__file__).resolve().parent / "results"
KILLS = ("draft worker", "target verifier", "orchestrator replica", "redis")
PROMPT = "def parse_arguments(argv):"
LENGTHS = (64, 128, 256, 512, 1000)
SMOKE = {"repeats": 1, "tokens": 24, "lengths": (64, 128)}
HEALTH_CHECK_PERIOD_S = 2.0  # the orchestrator deployment's


def _victim(cluster: LocalCluster, kill: str, session_id: str) -> int:
    """The pid to SIGKILL: the process of that kind serving the session."""
    if kill == "redis":
        return cluster.supervisor.proc("redis").pid
    record = asyncio.run(read_session(cluster.redis_url, session_id))
    if kill == "orchestrator replica":
        return int(record.owner.split(":")[1])  # host:pid:id
    address = record.workers["draft" if kill == "draft worker" else "target"]
    name = next(n for n, a in cluster.addresses.items() if a == address)
    return cluster.workers[name].pid


def one_stream(cluster: LocalCluster, tokens: int, kill: str | None) -> dict:
    """A greedy stream; kill (None: none) once a third of it is delivered → timings and tokens."""
    arrivals, out, killed_at = [], [], None
    with tandem.Client(cluster.address, timeout_s=300) as client:
        for chunk in client.stream(PROMPT, max_tokens=tokens, temperature=0, gamma=3):
            arrivals.append(time.perf_counter())
            out.extend(chunk.token_ids)
            if kill and killed_at is None and len(out) >= tokens // 3:
                os.kill(_victim(cluster, kill, chunk.session_id), signal.SIGKILL)
                killed_at = time.perf_counter()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    after = next((t for t in arrivals if killed_at and t > killed_at), None)
    return {"tokens": out, "median_gap_ms": st.median(gaps) * 1e3,
            "kill_to_next_ms": (after - killed_at) * 1e3 if after else None}


def wait_recovered(cluster: LocalCluster, kill: str, timeout_s: float = 120.0) -> None:
    """Until every supervised process runs and both replicas serve: one failure at a time."""
    from ray import serve

    if kill == "orchestrator replica":  # Serve counts a dead replica as running until a health check
        time.sleep(2 * HEALTH_CHECK_PERIOD_S)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = all(cluster.supervisor.proc(n).poll() is None for n in cluster.supervisor.names)
        app = serve.status().applications.get("tandem")
        replicas = app.deployments["GenerationService"].replica_states.get("RUNNING", 0) if app else 0
        if running and replicas == 2:
            time.sleep(2.0)  # the replicas' health watches see restarted workers serving
            return
        time.sleep(0.5)
    raise TimeoutError("the cluster did not recover")


def kills(draft: str, target: str, repeats: int, tokens: int) -> dict:
    with LocalCluster(draft, target, free_port(), echo=False, draft_workers=2, target_workers=2, replicas=2,
                      threads=1) as cluster:
        reference = one_stream(cluster, tokens, None)
        results = {kill: [] for kill in KILLS}
        for kill in tqdm([k for k in KILLS for _ in range(repeats)], desc="kills"):
            run = one_stream(cluster, tokens, kill)
            if run["tokens"] != reference["tokens"]:
                raise RuntimeError(f"{kill}: the output changed (the stream differs from the undisturbed run)")
            results[kill].append({k: v for k, v in run.items() if k != "tokens"})
            wait_recovered(cluster, kill)
        return {"reference_median_gap_ms": reference["median_gap_ms"], "tokens": len(reference["tokens"]),
                "kills": results}


def reprefill(target: str, repeats: int, lengths: tuple[int, ...] = LENGTHS) -> list[dict]:
    """Verify compute from cache_len 0 over n tokens, against a steady verify, on one verifier."""
    proc, address = spawn_worker("target", target, "127.0.0.1", 1, "cpu", "float32", echo=False)
    greedy = SamplingParams(temperature=0.0)

    async def measure():
        client = VerifierClient(address)
        block = Proposal([11, 12, 13], [1.0] * 3, [], 0.0)  # 3 drafted tokens, greedy
        rows = []
        for n in tqdm(lengths, desc="re-prefill"):
            sequence = [(17 * i) % 4000 + 10 for i in range(n)]
            full, steady = [], []
            for r in range(repeats):
                session = f"reprefill-{n}-{r}"
                full.append((await client.verify(session, 0, sequence, block, greedy)).answer.compute_ms)
                steady.append((await client.verify(session, n, [42], block, greedy)).answer.compute_ms)
                await client.release(session)
            rows.append({"tokens": n, "reprefill_ms": st.median(full), "steady_ms": st.median(steady)})
        await client.close()
        return rows

    try:
        return asyncio.run(measure())
    finally:
        stop_processes([proc])


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "failover.json").write_text(json.dumps(result, indent=2) + "\n")
    k = result["kills"]
    lines = ["# What a failure costs a stream", "",
             f"Shipped pair, greedy, γ = 3, {k['tokens']}-token streams; {result['repeats']} kills of each "
             f"kind; 2 draft workers, 2 target verifiers, 2 orchestrator replicas, embedded Redis. Median time "
             f"between two chunks of an undisturbed stream: {k['reference_median_gap_ms']:.1f} ms. Every "
             "stream's output was identical to the undisturbed run.", "",
             "| killed | kill → next token, median (ms) | max (ms) | that stream's median gap (ms) |", "|---|---|---|---|"]
    for kill, runs in k["kills"].items():
        waits = [r["kill_to_next_ms"] for r in runs if r["kill_to_next_ms"] is not None]
        lines.append(f"| {kill} | {st.median(waits):.0f} | {max(waits):.0f} | "
                     f"{st.median(r['median_gap_ms'] for r in runs):.1f} |")
    lines += ["", "Re-prefill on the verifier that takes a session over (one verify, cache_len 0, greedy, "
              "3 drafted tokens), against a steady verify:", "",
              "| sequence (tokens) | re-prefill (ms) | steady verify (ms) | ratio |", "|---|---|---|---|"]
    for row in result["reprefill"]:
        lines.append(f"| {row['tokens']} | {row['reprefill_ms']:.1f} | {row['steady_ms']:.1f} | "
                     f"{row['reprefill_ms'] / row['steady_ms']:.1f}× |")
    (out / "failover.md").write_text("\n".join(lines) + "\n")

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(k["kills"])
    waits = [[r["kill_to_next_ms"] for r in k["kills"][n] if r["kill_to_next_ms"] is not None] for n in names]
    left.boxplot(waits, tick_labels=[n.replace(" ", "\n") for n in names])
    left.axhline(k["reference_median_gap_ms"], color="grey", linestyle="--", label="undisturbed gap between chunks")
    left.set_yscale("log")
    left.set_ylabel("kill → next token (ms)")
    left.set_title("SIGKILL mid-stream: time to the next token")
    left.legend(fontsize=8)
    rows = result["reprefill"]
    right.plot([r["tokens"] for r in rows], [r["reprefill_ms"] for r in rows], "o-", label="re-prefill (cache_len 0)")
    right.plot([r["tokens"] for r in rows], [r["steady_ms"] for r in rows], "s-", label="steady verify")
    right.set_xlabel("committed sequence (tokens)")
    right.set_ylabel("verify compute (ms)")
    right.set_title("What a failover costs the new verifier")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "failover.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None, help="the folder for failover.{json,md,png} (results/)")
    parser.add_argument("--smoke", action="store_true", help="the whole path at a tiny size; numbers mean nothing")
    args = parser.parse_args()
    lengths = LENGTHS
    if args.smoke:
        if args.out is None:
            parser.error("--smoke writes only to --out: give one")
        args.repeats, args.tokens, lengths = SMOKE["repeats"], SMOKE["tokens"], SMOKE["lengths"]
    if args.repeats < 1 or args.tokens < 3:
        parser.error("--repeats must be ≥ 1 and --tokens ≥ 3 (the kill comes once a third is delivered)")
    args.out = args.out or OUT
    draft, target = default_pair()
    started = time.time()
    result = {"repeats": args.repeats, "smoke": args.smoke,
              "kills": kills(draft, target, args.repeats, args.tokens),
              "reprefill": reprefill(target, args.repeats, lengths)}
    result["duration_s"] = time.time() - started
    write(result, args.out)
    print((args.out / "failover.md").read_text())


if __name__ == "__main__":
    main()
