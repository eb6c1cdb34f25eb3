"""What a cycle's Redis commit costs the orchestrator and Redis, by how many sessions commit in
one turn of the replica's event loop (the turn's commits travel together: tandem.orchestrator.
store), against a real Redis (the embedded one `tandem up` starts).

Per turn every session commits one token, its cycle's stats and two progress fields, as a
cycle at γ = 0 does; the sessions' commits are made concurrently, as the cycle loop makes them.
Measured: the client's CPU per commit (the event loop thread's: redis-py's packing and parsing,
the store's own work), Redis's CPU per commit (its process's), and a turn's wall time. With
`--baseline COMMIT` (benchmarks/baseline.py) the same runs on that commit's store right after.
Writes commit_cost.{json,md,png} to --out (results/). `--smoke` runs it all at a tiny size
(2 levels, 40 commits each), against the checkout's HEAD unless --baseline names another.

    .venv/bin/python benchmarks/commit_cost.py [--sessions 1,8,32,64] [--commits 20000] [--baseline COMMIT]
        [--out DIR] [--smoke]
"""

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import baseline

from tandem.math.params import SamplingParams
from tandem.orchestrator.policy import GammaPolicy
from tandem.orchestrator.redis_server import EmbeddedRedis
from tandem.orchestrator.session import Request, Session
from tandem.orchestrator.store import SessionStore
from tandem.wire.generation import CycleStats

OUT = Path(__file__).resolve().parent / "results"
STATS = CycleStats(gamma=0, accepted=0, output_tokens=1, start_ms=1.0, draft_ms=0.0, verify_ms=2.0, transport_ms=1.0,
                   redis_ms=0.0, orchestration_ms=0.5, wire_bytes=100)


def process_cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def turns(store: SessionStore, sessions: list[Session], first: int, count: int) -> None:
    """count turns in which every session commits its next cycle at once."""
    for cycle in range(first, first + count):
        await asyncio.gather(*(store.commit(s.session_id, s.owner, cycle, [7], STATS,
                                            {"target_cache_len": 16 + cycle, "acceptance": '{"accepted": 0.0}'}, 0.4)
                               for s in sessions))


async def measure_level(redis: EmbeddedRedis, n: int, count: int) -> dict:
    store = SessionStore.from_url(redis.url)
    try:
        sessions = [Session(f"commit-cost-{n}-{i}", Request(SamplingParams(), 16, 1 << 20), list(range(16)),
                            GammaPolicy(), owner="bench") for i in range(n)]
        for s in sessions:
            await store.create(s)
        await turns(store, sessions, 1, 20)  # warm: connections, the script loaded
        wall, cpu, server = time.perf_counter(), time.thread_time(), process_cpu_s(redis.process.pid)
        await turns(store, sessions, 21, count)
        commits = n * count
        return {"sessions": n, "client_us": 1e6 * (time.thread_time() - cpu) / commits,
                "redis_us": 1e6 * (process_cpu_s(redis.process.pid) - server) / commits,
                "turn_ms": 1e3 * (time.perf_counter() - wall) / count}
    finally:
        await store.close()


def measure(levels: list[int], commits: int) -> list[dict]:
    """Each level's `commits` commits (Redis's CPU clock ticks every 10 ms: enough of them to read it)."""
    with EmbeddedRedis() as redis:
        return [asyncio.run(measure_level(redis, n, max(1, commits // n))) for n in levels]


def report(results: dict, out: Path) -> None:
    engines = [e for e in ("before", "batched") if e in results]
    names = {"before": f"before ({results.get('baseline', '')[:10]})", "batched": "now"}
    lines = ["| sessions per turn | " + " | ".join(f"client µs/commit, {names[e]}" for e in engines)
             + " | " + " | ".join(f"Redis µs/commit, {names[e]}" for e in engines)
             + " | " + " | ".join(f"turn ms, {names[e]}" for e in engines) + " |",
             "|---" * (1 + 3 * len(engines)) + "|"]
    for i, row in enumerate(results["batched"]):
        cells = [f"{results[e][i][key]:.1f}" if key != "turn_ms" else f"{results[e][i][key]:.2f}"
                 for key in ("client_us", "redis_us", "turn_ms") for e in engines]
        lines.append(f"| {row['sessions']} | " + " | ".join(cells) + " |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "commit_cost.json").write_text(json.dumps(results, indent=1))
    (out / "commit_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plt = baseline.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "client_us", "orchestrator CPU per commit (µs)"),
                           (axes[1], "redis_us", "Redis CPU per commit (µs)")):
        for e in engines:
            ax.plot([r["sessions"] for r in results[e]], [r[key] for r in results[e]], marker="o", label=names[e])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sessions committing in one turn")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "commit_cost.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="1,8,32,64", help="sessions committing per turn, comma-separated")
    parser.add_argument("--commits", type=int, default=20000, help="commits measured per level")
    parser.add_argument("--out", type=Path,
                        help="the folder for commit_cost.{json,md,png} (default: benchmarks/results)")
    parser.add_argument("--smoke", action="store_true", help="the whole run at a tiny size, against HEAD by default")
    baseline.add_arguments(parser)
    args = parser.parse_args()
    if args.smoke and args.out is None:  # a smoke run writes nothing over the measured results
        parser.error("--smoke writes only to a folder given with --out")
    args.out = args.out or OUT
    if args.smoke:
        args.sessions, args.commits, args.baseline = "1,4", 40, args.baseline or "HEAD"
    levels = [int(n) for n in args.sessions.split(",")]
    results = baseline.compare(args, lambda: measure(levels, args.commits))
    if results is not None:
        report(results, args.out)


if __name__ == "__main__":
    main()
