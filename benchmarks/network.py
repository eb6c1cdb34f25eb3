"""The cluster across a network: tokens/s against the one-way delay between the orchestrator and
its workers, for every fixed γ and the adaptive policy, on the multi-host test bed; and the
capacity simulator's predictions against those measurements.

    .venv/bin/python benchmarks/network.py up [--delay-ms 5]     # a cluster on the test bed, until Ctrl-C
    .venv/bin/python benchmarks/network.py sweep [--delays 0,1,5,20] [--gammas 0-4,6,8,auto] [--repeats 4]
    .venv/bin/python benchmarks/network.py calibrate             # after a sweep
    .venv/bin/python benchmarks/network.py runahead [--settings off,1,1+8]   # drafting ahead for more outcomes
    .venv/bin/python benchmarks/network.py sweep --drafter model --out results/network_drafters/model
    .venv/bin/python benchmarks/network.py drafters              # the drafters' sweeps side by side
    .venv/bin/python benchmarks/network.py pool --sweeps A,B --out C   # sweeps of the same points, as one
    .venv/bin/python benchmarks/network.py --smoke --out DIR     # each subcommand at a tiny size

The test bed (tandem.bench.testbed, tandem.bench.network) puts the orchestrator, the draft worker
and the target verifier each in a network namespace of its own, on its own address, and runs
every orchestrator↔worker link through a user-space delay proxy (the kernel here has no netem).
`up` starts it, prints the ingress and the link addresses, and takes the proxy's commands on stdin
(`delay * 20`, `drop draft-0`, ...). `sweep` runs, per delay, workload (greedy, T = 1) and
sessions in flight (1, 8), every mode over the held-out prompts, with ignore_eos so that every
stream is max_tokens long, in --repeats rounds, each running every point's modes in a new order
with new sampling seeds; a point's tokens/s per mode is its median run, adaptive's ratio to the
best fixed γ is also paired round by round (with its 95 % interval), against the fixed γ the
other rounds found best, and so again with every run put at the machine's median speed (a probe
beside the bed: tandem.bench.speed, tandem.bench.pairing); it times both models' passes before
the first round and after each. `--control` runs γ = 0 twice a round, the second
apart from the modes: its ratio to the first, paired the same way, is what the bed's noise alone
moves a ratio by at that point.
`--fresh-adaptive` starts a new orchestrator before each adaptive run (and the control's, which
then measures what a replica just started serves), warmed up in its own mode and workload with
one stream per session in flight (`--warm-up-streams N`: N streams), on prompts the run does not
serve (fixed γ = 0 warmed so served 0.98–1.01× the warm replica's): every mode runs on one
cluster, and the policy's state is its replica's, so without it an adaptive run starts from what
the fixed modes before it taught the replica, and with a warm-up at γ = 0 from nothing (a
replica's first seconds, not its hours).
Needs root (network namespaces). `--drafter` picks who drafts: a draft worker on its own host
(hybrid, the default; model; ngram) or the verifier with the shipped EAGLE-3 head (head: its
blocks cross only the verifier's link). `drafters` puts several
drafters' sweeps side by side. `calibrate` predicts each fixed-γ point with
tandem.capacity.simulate, the bed's processes sharing the host's cores, from costs measured apart
from it (`_costs`). `runahead` measures a lone session's tokens/s against the delay with
drafting ahead off and for guesses of the bonus token and of the recovered tokens (`tandem
orchestrator --ahead-guesses G --ahead-rejections R`), one cluster per setting and round, the
settings in a new order each round. `pool` joins sweeps of the same points and code, run at
different times, as one sweep of all their rounds. `--smoke` runs sweep, calibrate, drafters and
pool on that sweep, and runahead at a tiny size (SMOKE), everything under --out: the code path,
not numbers to read.

Writes sweep.{json,md,png}, calibration.{json,md,png} and runahead.{json,md,png} to --out (sweep,
pool, calibrate and runahead take it; default results/network), drafters.{md,png} to drafters'
--out (default results/network_drafters).
"""

import argparse
import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import grpc
import matplotlib
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.bench.network import NetworkCluster
from tandem.bench.procfs import cpu_seconds
from tandem.bench.pairing import NAN3, at_speed, held_out_best, paired, speed_slope
from tandem.bench.runs import ahead_setting, cluster_mode, concurrent_runs
from tandem.bench.speed import SpeedProbe
from tandem.bench.summary import (acceptance, acceptance_by_block, acceptance_by_position, concurrency_row, cycles,
                                  cycles_by_gamma)
from tandem.bench.testbed import unavailable
from tandem.capacity import Cluster, Costs, load_tokens_per_s, lone_cycle_ms
from tandem.capacity import cold_ms as capacity_cold_ms
from tandem.capacity import pass_ms as capacity_pass_ms
from tandem.cli import HELDOUT_PROMPTS, default_pair, head_for
from tandem.local import spawn_worker, stop_processes
from tandem.math.analytic import expected_tokens
from tandem.math.params import SamplingParams
from tandem.orchestrator.config import OrchestratorConfig
from tandem.services.llama import Feed, LlamaPass
from tandem.v1 import worker_pb2_grpc
from tandem.wire import worker as wire

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "network"
DRAFTERS_OUT = OUT.parent / "network_drafters"  # `sweep --drafter D --out DRAFTERS_OUT/D`, `drafters`
# sweep --drafter's choices (tandem.local.DRAFTERS but "self", which would need its exit layer).
NETWORK_DRAFTERS = ("hybrid", "model", "ngram", "head")
WORKLOADS = ("greedy", "sampled")
GREEDY = SamplingParams(temperature=0.0)


def _modes(text: str) -> list[str]:
    """"0-8,auto" → the cluster modes of γ 0 … 8 and adaptive."""
    modes = []
    for part in text.split(","):
        if part == "auto":
            modes.append(cluster_mode(None))
        elif "-" in part:
            lo, hi = part.split("-")
            modes += [cluster_mode(g) for g in range(int(lo), int(hi) + 1)]
        else:
            modes.append(cluster_mode(int(part)))
    return modes


def up(args) -> None:
    draft, target = default_pair()
    with NetworkCluster(draft, target, args.drafters, args.verifiers, args.delay_ms, args.jitter_ms,
                        echo=True) as cluster:
        print(f"ingress {cluster.address}; links {cluster.bed.links}", flush=True)
        print("commands: delay NAME|* MS [JITTER_MS], drop NAME|*, down NAME|*, up NAME|*; Ctrl-D to stop", flush=True)
        for line in sys.stdin:
            try:
                cluster.bed.command(line.strip())
                print("ok", flush=True)
            except ValueError as e:
                print(e, flush=True)


def busy_ms() -> float:
    """The machine's CPU time so far, all cores and processes (the bed's, the client's), from /proc/stat."""
    user, nice, system, _, _, irq, softirq = map(int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8])
    return (user + nice + system + irq + softirq) * 1e3 / os.sysconf("SC_CLK_TCK")


def _prompts(target: str) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(target)
    return [tokenizer.encode(json.loads(line)["prompt"]) for line in open(HELDOUT_PROMPTS)]


# What a sweep keeps of each run (tandem.bench.summary's row, and the machine's CPU per cycle).
SWEEP_FIELDS = ("in_flight", "sessions", "aggregate_tokens_per_s", "ttft_ms", "mean_gamma", "acceptance_rate",
                "mean_acceptance_length", "acceptance_by_position", "cycle", "cpu_ms_per_cycle", "cores_by_role",
                "sessions_per_pass", "cycles_by_gamma", "acceptance_by_block", "speed_us")


# A stream's first drafted blocks kept apart in acceptance_by_block (the last pools the rest).
BLOCKS_KEPT = 6


def sweep(args) -> None:
    draft, target = default_pair()
    prompts = _prompts(target)
    modes = _modes(args.gammas)
    if set(modes) == {cluster_mode(None)}:
        raise SystemExit("sweep: --gammas needs a fixed γ besides auto: each round judges adaptive against the best "
                         "fixed γ")
    if args.warm_up_streams < 0 or args.warm_up_streams and not args.fresh_adaptive:
        raise SystemExit("sweep: --warm-up-streams must be >= 0, and warms the replicas of --fresh-adaptive")
    delays = [float(d) for d in args.delays.split(",")]
    levels = [int(n) for n in args.in_flight.split(",")]
    points = [(d, w, n) for d in delays for w in args.workloads.split(",") for n in levels]
    rng = random.Random(args.seed)
    rows, controls = [], []
    # The control (--control): γ = 0 a second time each round, kept apart from the modes.
    rounds = [*modes, *([CONTROL] if args.control else [])]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    # The passes timed on this machine as it is now, the bed idle: calibrate's costs. Timed again
    # after each round, for the drift (a pass here took 4.8 to 6.6 ms within an hour).
    prompt = round(sum(map(len, prompts)) / len(prompts))
    context = mean_context(prompt, args.max_tokens)
    timings = [time_passes(draft, target, prompt, context, args.pass_repetitions)]
    with NetworkCluster(draft, target, delay_ms=delays[0], drafter=args.drafter,
                        head=head_for(args.drafter, None)) as cluster, SpeedProbe() as speed:
        concurrent_runs(cluster.address, cluster_mode(None), "greedy", prompts[:2], 16, 2, 0)  # warm-up
        start = time.time()
        # A round runs every point's modes, each point's in a new order: a point's rounds spread
        # over the sweep as its modes over a round, so the machine's drift moves every point alike
        # (with a point's rounds back to back, one slow stretch of minutes took a whole point).
        for repeat in range(args.repeats):
            for i, (delay, workload, in_flight) in enumerate(points):
                cluster.bed.set_delay(delay, args.jitter_ms)
                # The same prompts at every delay and workload: points differ only in what they vary.
                batch = [prompts[j % len(prompts)] for j in range(max(args.sessions, 2 * in_flight))]
                streams = args.warm_up_streams or in_flight
                warm_up = [prompts[(len(batch) + j) % len(prompts)] for j in range(streams)]  # others where there are
                for run in rng.sample(rounds, len(rounds)):
                    (controls if run == CONTROL else rows).append({
                        "drafter": args.drafter, "delay_ms": delay, "jitter_ms": args.jitter_ms,
                        "workload": workload, "repeat": repeat,
                        **_sweep_run(cluster, speed, args, run, workload, batch, warm_up, in_flight, repeat)})
                best, adaptive, _ = _point(rows[-len(modes):])  # the point's runs of this round
                print(f"[round {repeat + 1}/{args.repeats}, point {i + 1}/{len(points)}, {time.time() - start:.0f} s] "
                      f"delay {delay:g} ms, {workload}, {in_flight} in flight: best {best['mode']} "
                      f"{best['aggregate_tokens_per_s']:.1f} tokens/s"
                      + (f", adaptive {adaptive['aggregate_tokens_per_s']:.1f} (mean γ "
                         f"{adaptive['mean_gamma'] or 0:.2f})" if adaptive else ""), flush=True)
            timings.append(time_passes(draft, target, prompt, context, args.pass_repetitions))
            write(rows, args, timings, controls)


def _sweep_run(cluster: NetworkCluster, speed: SpeedProbe, args, run: str, workload: str,
               batch: list[list[int]], warm_up: list[list[int]], in_flight: int, repeat: int) -> dict:
    """One run of a sweep's round → its row's measured fields (SWEEP_FIELDS) and mode; warm_up: the
    prompts a fresh replica serves first (--fresh-adaptive), `in_flight` at a time."""
    mode = cluster_mode(0) if run == CONTROL else run
    # A new replica for adaptive (its policy starts from nothing the other modes taught it) and
    # for the control (which then measures what a replica just started serves).
    if args.fresh_adaptive and (mode == cluster_mode(None) or run == CONTROL):
        cluster.restart_orchestrator()
        # Warm it up in its own mode, as loaded as the run will be, on other streams: a replica
        # serves for hours, and has learned the pair on its traffic (warmed at γ = 0, a fresh
        # replica's first cohort learned the pair from its streams' first blocks: α fell to 0.24
        # on three, and it ran γ = 0 for 0.8 s of a 10 s run at 1 ms, where γ = 0 serves 0.75×).
        concurrent_runs(cluster.address, mode, workload, warm_up, args.max_tokens, in_flight, 0, ignore_eos=True)
    busy, by_role, passes, probed = busy_ms(), cluster.cpu_ms(), cluster.passes(), speed.reading()
    runs, wall = concurrent_runs(cluster.address, mode, workload, batch, args.max_tokens, in_flight,
                                 round_seed(args.seed, repeat), ignore_eos=True)
    speed_us = SpeedProbe.us_per_unit(probed, speed.reading())
    row = concurrency_row(runs, wall, in_flight) | acceptance(runs)
    row["acceptance_by_position"] = acceptance_by_position(runs, OrchestratorConfig.max_gamma)
    # How the choice spread: a mean γ hides cycles at γ = 0 beside long blocks.
    row["cycles_by_gamma"] = cycles_by_gamma(runs, OrchestratorConfig.max_gamma)
    row["acceptance_by_block"] = acceptance_by_block(runs, BLOCKS_KEPT)
    row["cpu_ms_per_cycle"] = (busy_ms() - busy) / len(cycles(runs))
    # The machine's speed meanwhile (tandem.bench.speed), which moves every mode's runs alike.
    row["speed_us"] = speed_us
    # Each role's cores during the run: a worker near 1 is the bottleneck (one model thread).
    row["cores_by_role"] = {role: (ms - by_role.get(role, 0.0)) / (wall * 1e3) for role, ms in cluster.cpu_ms().items()}
    # How full each worker's passes were: cohorts that merge or take turns move a run's tokens/s
    # by more than the policy's goal.
    row["sessions_per_pass"] = {name: (sessions - passes[name][0]) / max(count - passes[name][1], 1.0)
                                for name, (sessions, count) in cluster.passes().items()}
    return {"mode": mode, **{k: row[k] for k in SWEEP_FIELDS}}


# The control run's name in a round (--control): γ = 0 again, the same requests and tokens.
CONTROL = "control"


def round_seed(seed: int, repeat: int) -> int:
    """The sampling seeds of a round (the same for each of its modes, which they pair): new each
    round. With one seed for all rounds a sampled mode's rounds drew the same tokens, and the best
    fixed γ of a point was partly the luckiest draw (acceptance 0.72 to 0.75 across fixed γs at
    T = 1, 20 ms: 8 % in expected tokens)."""
    return seed + 1000 * repeat


def _setting_flags(setting: str) -> list[str]:
    """A runahead setting's orchestrator flags."""
    if (parsed := ahead_setting(setting)) is None:
        return ["--no-draft-ahead"]
    return ["--ahead-guesses", str(parsed[0]), "--ahead-rejections", str(parsed[1])]


def runahead(args) -> None:
    draft, target = default_pair()
    prompts = _prompts(target)[:args.sessions]
    settings = args.settings.split(",")
    for setting in settings:
        _setting_flags(setting)  # a bad one fails here, not after an hour
    delays = [float(d) for d in args.delays.split(",")]
    rng, rows, start = random.Random(args.seed), [], time.time()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for repeat in range(args.repeats):
        for setting in rng.sample(settings, len(settings)):
            flags = _setting_flags(setting)
            with NetworkCluster(draft, target, delay_ms=delays[0], orchestrator_args=flags) as cluster:
                concurrent_runs(cluster.address, cluster_mode(None), "greedy", prompts[:2], 16, 1, 0)  # warm-up
                for delay, workload, mode in ((d, w, m) for d in delays for w in args.workloads.split(",")
                                              for m in _modes(args.gammas)):
                    cluster.bed.set_delay(delay)
                    runs, wall = concurrent_runs(cluster.address, mode, workload, prompts, args.max_tokens, 1,
                                                 round_seed(args.seed, repeat), ignore_eos=True)
                    row = concurrency_row(runs, wall, 1)
                    rows.append({"delay_ms": delay, "workload": workload, "mode": mode, "setting": setting,
                                 "repeat": repeat, "aggregate_tokens_per_s": row["aggregate_tokens_per_s"],
                                 "mean_gamma": row["mean_gamma"],
                                 "drafted_ahead_share": row["cycle"].get("drafted_ahead_share")})
            print(f"[round {repeat + 1}/{args.repeats}, {time.time() - start:.0f} s] {setting} done", flush=True)
            write_runahead(rows, args)


def _runahead_medians(rows: list[dict]) -> dict[tuple, dict]:
    """(delay, workload, mode, setting) → its median row over the rounds."""

    def key(r: dict) -> tuple:
        return r["delay_ms"], r["workload"], r["mode"], r["setting"]

    return {key(m): m for m in sorted(_medians(rows, key), key=key)}


def _setting_label(setting: str) -> str:
    if (parsed := ahead_setting(setting)) is None:
        return "no drafting ahead"
    guesses, rejections = parsed
    return f"{guesses} guess{'es' * (guesses != 1)}" + (f" + {rejections} rejections" if rejections else "")


def write_runahead(rows: list[dict], args) -> None:
    out = Path(args.out)
    (out / "runahead.json").write_text(json.dumps({"args": vars(args) | {"func": None}, "rows": rows}, indent=1))
    medians = _runahead_medians(rows)
    settings = [s for s in args.settings.split(",") if any(k[3] == s for k in medians)]
    base = next((s for s in settings if s != "off"), None)  # the others against the first drafting ahead
    pairs = [(s, "off") for s in settings if s != "off" and "off" in settings] + \
        [(s, base) for s in settings if s not in ("off", base)]
    lines = [f"| delay (ms) | workload | γ | {' | '.join(map(_setting_label, settings))} | "
             + "".join(f"{s} / {against}, paired (95 % CI) | " for s, against in pairs)
             + "drafted ahead (share of drafting cycles) |", "|---" * (4 + len(settings) + len(pairs)) + "|"]
    for delay, workload, mode in sorted({k[:3] for k in medians}):
        at = {s: medians.get((delay, workload, mode, s)) for s in settings}
        group = [r for r in rows if (r["delay_ms"], r["workload"], r["mode"]) == (delay, workload, mode)]
        ratios = [paired(group, s, against, by="setting") for s, against in pairs]
        shares = ", ".join(f"{r['drafted_ahead_share']:.2f}" for s, r in at.items()
                           if s != "off" and r and r["drafted_ahead_share"] is not None)
        lines.append(f"| {delay:g} | {workload} | {mode} | "
                     + " | ".join(f"{r['aggregate_tokens_per_s'] if r else float('nan'):.1f}" for r in at.values())
                     + " | " + "".join(f"{p[0]:.2f} ({p[1]:.2f}–{p[2]:.2f}) | " for p in ratios) + f"{shares} |")
    (out / "runahead.md").write_text("\n".join(lines) + "\n")
    plot_runahead(medians, settings, out / "runahead.png")


def plot_runahead(medians: dict[tuple, dict], settings: list[str], path: Path) -> None:
    panels = sorted({(k[1], k[2]) for k in medians})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (workload, mode) in zip(axes[0], panels):
        for setting in settings:
            points = sorted((k[0], r["aggregate_tokens_per_s"]) for k, r in medians.items()
                            if k[1:] == (workload, mode, setting))
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=_setting_label(setting))
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("one-way delay, orchestrator ↔ each worker (ms)")
        ax.set_ylabel("tokens/s, one session")
        ax.set_title(f"{workload}, {mode}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def drafters(args) -> None:
    """Sweeps of several drafters side by side (each a `sweep --drafter`'s sweep.json): per point,
    γ = 0, each drafter's best fixed γ and its adaptive γ, in a table and a plot against delay."""
    paths = [Path(p) / "sweep.json" for p in args.sweeps.split(",")] if args.sweeps else \
        [OUT / "sweep.json", *sorted(DRAFTERS_OUT.glob("*/sweep.json"))]
    rows = [r | {"drafter": r.get("drafter", "hybrid")} for p in paths if p.is_file()
            for r in json.loads(p.read_text())["rows"]]
    if not rows:
        raise SystemExit(f"drafters: no sweep at {', '.join(map(str, paths))}")
    points = {}  # (drafter, delay, workload, in flight) → (best, adaptive, γ = 0)
    for key in sorted({(r["drafter"], *_key(r)) for r in rows}):
        points[key] = _point([r for r in rows if (r["drafter"], *_key(r)) == key])
    order = [d for d in NETWORK_DRAFTERS if any(k[0] == d for k in points)]
    zeros = {}  # (delay, workload, in flight) → γ = 0's tokens/s, from the first drafter in order that ran it
    for (_, *point), (_, _, zero) in sorted(points.items(), key=lambda item: order.index(item[0][0])):
        if zero:
            zeros.setdefault(tuple(point), zero["aggregate_tokens_per_s"])
    lines = ["| delay (ms) | workload | in flight | γ = 0 tokens/s | "
             + " | ".join(f"{d}: best fixed γ, adaptive (mean γ)" for d in order) + " |", "|---" * (4 + len(order)) + "|"]
    for delay, workload, in_flight in sorted({k[1:] for k in points}):
        at = [points.get((d, delay, workload, in_flight)) for d in order]
        zero = zeros.get((delay, workload, in_flight), float("nan"))
        lines.append(f"| {delay:g} | {workload} | {in_flight} | {zero:.1f} | " + " | ".join(
            f"{p[0]['aggregate_tokens_per_s']:.1f} (γ {_gamma_of(p[0]['mode'])}), "
            + (f"{p[1]['aggregate_tokens_per_s']:.1f} ({p[1]['mean_gamma'] or 0:.2f})" if p[1] else "–")
            if p else "–" for p in at) + " |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "drafters.md").write_text("\n".join(lines) + "\n")
    plot_drafters(points, zeros, order, out / "drafters.png")
    print((out / "drafters.md").read_text())


def plot_drafters(points: dict[tuple, tuple], zeros: dict[tuple, float], order: list[str], path: Path) -> None:
    panels = sorted({(k[2], k[3]) for k in points})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels) + 2, 4), squeeze=False, layout="constrained")
    for ax, (workload, in_flight) in zip(axes[0], panels):
        at = {k: p for k, p in points.items() if (k[2], k[3]) == (workload, in_flight)}
        zero = sorted((point[0], z) for point, z in zeros.items() if point[1:] == (workload, in_flight))
        ax.plot(*zip(*zero), color="grey", linestyle=":", marker=".", label="γ = 0")
        for i, drafter in enumerate(order):
            color = f"C{i}"
            adaptive = sorted((k[1], p[1]["aggregate_tokens_per_s"]) for k, p in at.items() if k[0] == drafter and p[1])
            best = sorted((k[1], p[0]["aggregate_tokens_per_s"]) for k, p in at.items() if k[0] == drafter)
            if adaptive:
                ax.plot(*zip(*adaptive), color=color, marker="o", linewidth=2, label=f"{drafter}, adaptive γ")
            ax.plot(*zip(*best), color=color, marker="x", linestyle="--", alpha=0.6, label=f"{drafter}, best fixed γ")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("one-way delay, orchestrator ↔ each worker (ms)")
        ax.set_ylabel("tokens/s (all sessions)")
        ax.set_title(f"{workload}, {in_flight} in flight")
        ax.grid(alpha=0.3)
    labelled = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(labelled.values(), labelled.keys(), loc="outside right center", fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def calibrate(args) -> None:
    """The simulator (tandem.capacity) against the sweep: every fixed-γ point predicted from costs
    measured apart from it (`_costs`), and the prediction's ratio to what the point measured."""
    paths = [Path(p) for p in args.sweep.split(",")] if args.sweep else [Path(args.out) / "sweep.json"]
    sweep = _joined_sweeps(paths)
    rows = _median_rows(sweep["rows"])
    if lack := _lacks(rows):
        raise SystemExit(f"calibrate: the sweeps at {', '.join(map(str, paths))} lack what the costs are "
                         f"measured from: {lack}")
    draft, target = default_pair()
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [len(tokenizer.encode(json.loads(line)["prompt"])) for line in open(HELDOUT_PROMPTS)]
    prompt = round(sum(prompts) / len(prompts))
    passes = _passes(args, sweep, draft, target, prompt)
    cores = args.host_cores or sweep.get("host_cores") or os.cpu_count()
    background = {w: _background_ms(rows, passes, prompt, w) for w in {r["workload"] for r in rows}}
    lone_speed = {w: _lone_speed_us(rows, w) for w in background}
    out = []
    for r in rows:
        gamma = _gamma_of(r["mode"])
        if gamma is None:
            continue
        costs = replace(_costs(rows, passes, prompt, r, gamma), background_ms=background[r["workload"]])
        costs = costs.slowed(_slowing(r, lone_speed[r["workload"]]))
        cluster = Cluster(1, 1, r["in_flight"], tokens_per_session=sweep["args"]["max_tokens"], host_cores=cores,
                          draft_ahead=True, ahead_rejections=OrchestratorConfig.ahead_rejections)
        predicted = load_tokens_per_s(costs, cluster, gamma, r["sessions"])
        out.append({"delay_ms": r["delay_ms"], "workload": r["workload"], "in_flight": r["in_flight"], "gamma": gamma,
                    "measured": r["aggregate_tokens_per_s"], "predicted": predicted,
                    "ratio": predicted / r["aggregate_tokens_per_s"], "costs": asdict(costs)})
        print(f"delay {r['delay_ms']:g} ms, {r['workload']}, {r['in_flight']} in flight, γ = {gamma}: measured "
              f"{out[-1]['measured']:.1f}, predicted {predicted:.1f} tokens/s ({out[-1]['ratio']:.2f})", flush=True)
    where = Path(args.out)
    where.mkdir(parents=True, exist_ok=True)
    (where / "calibration.json").write_text(json.dumps({"pass_ms": passes, "points": out}, indent=1))
    lines = ["| delay (ms) | workload | in flight | γ | measured tokens/s | predicted | predicted / measured |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {o['delay_ms']:g} | {o['workload']} | {o['in_flight']} | {o['gamma']} | {o['measured']:.1f} | "
              f"{o['predicted']:.1f} | {o['ratio']:.2f} |" for o in out]
    (where / "calibration.md").write_text("\n".join(lines) + "\n")
    plot_calibration(out, where / "calibration.png")


def _lone_speed_us(rows: list[dict], workload: str) -> float | None:
    """The speed probe's median CPU per unit over the workload's lone runs, whose costs `_costs`
    takes (tandem.bench.speed); None for a sweep that did not probe it."""
    lone = [r["speed_us"] for r in rows if r["in_flight"] == 1 and r["workload"] == workload and r.get("speed_us")]
    return float(np.median(lone)) if lone else None


def _slowing(point: dict, lone_us: float | None) -> float:
    """How much slower the machine ran during a point's run than during the lone runs its costs
    come from (`lone_us`: _lone_speed_us); 1 where either was not probed. The costs scaled by it
    are the point's at the speed it ran."""
    return point["speed_us"] / lone_us if lone_us and point.get("speed_us") else 1.0


def pool(args) -> None:
    """Sweeps of the same points and code run at different times, as one sweep of all their rounds
    (each sweep's rounds numbered after those of the sweeps before it): a point's paired ratios
    then rest on every round, each still pairing only the modes that ran back to back in it."""
    paths, out = [Path(p) / "sweep.json" for p in args.sweeps.split(",")], Path(args.out)
    if len(paths) < 2:
        raise SystemExit("pool: needs two sweeps or more (--sweeps A,B)")
    if (out / "sweep.json").is_file() and not any((out / "sweep.json").samefile(path) for path in paths):
        raise SystemExit(f"pool: {out / 'sweep.json'} holds a sweep that is not one of --sweeps (name another --out)")
    sweeps = _read_sweeps(paths, "pool", "--sweeps")
    if len({(s["args"]["max_tokens"], s["args"]["sessions"], s["args"].get("drafter")) for s in sweeps}) > 1:
        raise SystemExit("pool: the sweeps ran different --max-tokens, --sessions or --drafter")
    rows, controls, rounds = [], [], 0
    for s in sweeps:
        rows += [r | {"repeat": r["repeat"] + rounds} for r in s["rows"]]
        controls += [c | {"repeat": c["repeat"] + rounds} for c in s.get("controls") or []]
        rounds += 1 + max(r["repeat"] for r in s["rows"])
    out.mkdir(parents=True, exist_ok=True)
    settings = argparse.Namespace(**sweeps[0]["args"] | {"out": args.out, "repeats": rounds, "pooled": args.sweeps})
    write(rows, settings, [t for s in sweeps for t in s.get("pass_ms") or []], controls)
    print((out / "sweep.md").read_text())


def _read_sweeps(paths: list[Path], command: str, option: str) -> list[dict]:
    """The sweeps at `paths` (sweep.json files), or `command`'s error naming the one missing and
    the `option` that names sweeps."""
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"{command}: no sweep at {path} (run `network.py sweep` first, or name one with {option})")
    return [json.loads(path.read_text()) for path in paths]


def _joined_sweeps(paths: list[Path]) -> dict:
    """Sweeps run apart as one (e.g. the lone points and those under load, each with its own
    --sessions): their rows and pass timings together, the first one's settings."""
    sweeps = _read_sweeps(paths, "calibrate", "--sweep")
    if len({s["args"]["max_tokens"] for s in sweeps}) > 1:
        raise SystemExit("calibrate: the sweeps generated different --max-tokens")
    return dict(sweeps[0], rows=[r for s in sweeps for r in s["rows"]],
                pass_ms=[t for s in sweeps for t in s.get("pass_ms") or []])


def _lacks(rows: list[dict]) -> str | None:
    """What `_costs` needs from a sweep and it lacks, or None: per workload, lone runs (1 in
    flight) of γ = 0 at delay 0 and at every delay it predicts, of two fixed γ ≥ 1 or more (the
    draft calls' time against γ), and of every fixed γ it predicts (its acceptance)."""
    for workload in sorted({r["workload"] for r in rows}):
        fixed = [r for r in rows if r["workload"] == workload and r["mode"] != "adaptive"]
        alone = [r for r in fixed if r["in_flight"] == 1]
        zero = {r["delay_ms"] for r in alone if r["mode"] == cluster_mode(0)}
        delays = {0.0} | {r["delay_ms"] for r in fixed}
        if not delays <= zero:
            return f"{workload}: γ = 0 alone (1 in flight) at delays {sorted(delays)} ms; it has {sorted(zero)}"
        gammas = {_gamma_of(r["mode"]) for r in alone} - {0}
        if len(gammas) < 2:
            return f"{workload}: two fixed γ ≥ 1 or more alone (1 in flight); it has {sorted(gammas)}"
        if missing := {_gamma_of(r["mode"]) for r in fixed} - gammas - {0}:
            return f"{workload}: γ {sorted(missing)} alone (1 in flight)"
    return None


def _passes(args, sweep: dict, draft: str, target: str, prompt: int) -> dict:
    """The pass timings calibrate uses: --passes FILE's, else the sweep's own (the mean of its
    timings before and after its points), else timed now. JSON keeps the sizes as strings. A
    sweep from before the rows were timed has no "rows" (a row then costs nothing more); one from
    before the idles or the calls' handling were timed gets them timed now, on this machine as it
    is now."""
    if args.passes:
        timings = [json.loads(Path(args.passes).read_text())["pass_ms"]]
    elif sweep.get("pass_ms"):
        timings = sweep["pass_ms"]
    else:
        return time_passes(draft, target, prompt, mean_context(prompt, sweep["args"]["max_tokens"]))
    mean = {model: {int(n): float(np.mean([t[model][n] for t in timings])) for n in timings[0][model]}
            for model in ("draft", "target")}
    if all("rows" in t for t in timings):
        mean["rows"] = {model: float(np.mean([t["rows"][model] for t in timings])) for model in ("draft", "target")}
    context = mean_context(prompt, sweep["args"]["max_tokens"])
    if all("cold" in t for t in timings):
        mean["cold"] = {model: {int(idle): float(np.mean([t["cold"][model][idle] for t in timings]))
                                for idle in timings[0]["cold"][model]} for model in ("draft", "target")}
    else:
        mean["cold"] = {name: cold_ms(_pass_runner(Path(path)), context) for name, path in
                        (("draft", draft), ("target", target))}
    if all("handling" in t for t in timings):
        mean["handling"] = {int(n): float(np.mean([t["handling"][n] for t in timings])) for n in timings[0]["handling"]}
    else:
        mean["handling"] = call_handling_ms(target, context)
    return mean


def _cold_costs(cold: dict) -> dict:
    """Costs' draft_cold_ms, target_cold_ms and cold_after_ms from the timed idles' extra ms
    (cold_ms, per model): most · (1 − e^(−idle / after)), by least squares, one `after` for both."""
    idles = np.array(IDLES_MS, dtype=float)
    extra = {model: np.array([cold[model].get(idle, 0.0) for idle in IDLES_MS]) for model in ("draft", "target")}
    best = None
    for after in np.arange(1.0, 60.5, 0.5):
        x = -np.expm1(-idles / after)
        most = {model: max(0.0, float(x @ y / (x @ x))) for model, y in extra.items()}
        error = sum(float(np.sum((most[model] * x - y) ** 2)) for model, y in extra.items())
        if best is None or error < best[0]:
            best = error, {"draft_cold_ms": most["draft"], "target_cold_ms": most["target"],
                           "cold_after_ms": float(after)}
    return best[1]


def mean_context(prompt: int, max_tokens: int) -> int:
    """The cache a session's steps see on average: its prompt and half its max_tokens."""
    return prompt + max_tokens // 2


def time_passes(draft: str, target: str, prompt: int, context: int, repetitions: int = 15) -> dict:
    """Both models' passes (pass_ms) at this context, the target's prefill of the prompt, what a
    row costs (row_ms), what a pass costs more after an idle (cold_ms) and what a target worker's
    call costs beyond its passes (call_handling_ms) → {"draft": {tokens: ms}, "target": {…},
    "rows": {model: ms}, "cold": {model: {idle ms: ms}}, "handling": {rows: ms}}."""
    models = {"draft": _pass_runner(Path(draft)), "target": _pass_runner(Path(target))}
    timings = {name: pass_ms(run, PASS_TOKENS, context, repetitions) for name, run in models.items()}
    timings["target"][prompt] = pass_ms(models["target"], (prompt,), 0, repetitions)[prompt]
    timings["rows"] = {name: row_ms(run, context, repetitions) for name, run in models.items()}
    timings["cold"] = {name: cold_ms(run, context, COLD_TIMES * repetitions) for name, run in models.items()}
    timings["handling"] = call_handling_ms(target, context, repetitions)
    return timings


# Pass sizes calibrate measures: a lone session's steps and blocks, and 8 sessions' passes.
PASS_TOKENS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 48, 72)
ROWS = 8  # the rows of the pass that row_ms times: 8 sessions in flight
IDLES_MS = (2, 5, 10, 20, 40)  # the idles cold_ms times a pass after
# cold_ms's repetitions per pass_ms's: a difference of two medians is noisier than either (on the
# shipped target, 15 gave 0.8 ms more after 2 ms idle where 40 gave nothing).
COLD_TIMES = 3


def _pass_runner(model_dir: Path) -> LlamaPass:
    """The runtime's pass on one thread, as a worker here runs it."""
    torch.set_num_threads(1)
    return LlamaPass(AutoModelForCausalLM.from_pretrained(model_dir).eval(), column_major=True)


def pass_ms(run: LlamaPass, sizes: tuple[int, ...], context: int, repetitions: int = 15) -> dict[int, float]:
    """One session's pass of n tokens on a cache of `context` tokens, per n → its median ms."""
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repetitions):
        for n in sizes:
            times[n].append(_timed_pass(run, context, 1, n))
    return {n: float(np.median(t)) for n, t in times.items()}


def row_ms(run: LlamaPass, context: int, repetitions: int = 15) -> float:
    """What a pass costs per row past its first beyond its tokens (tandem.capacity.Costs'
    *_row_ms), each row attending over a cache of its own: a pass of ROWS sessions' one token
    each against one session's ROWS tokens, at this context (measured on the shipped target:
    0.13 ms a row at 50 tokens, 0.39 at 190)."""
    rows, one = [], []
    for _ in range(repetitions):
        rows.append(_timed_pass(run, context, ROWS, 1))
        one.append(_timed_pass(run, context, 1, ROWS))
    return max(0.0, float(np.median(rows) - np.median(one)) / (ROWS - 1))


def cold_ms(run: LlamaPass, context: int, repetitions: int = 45) -> dict[int, float]:
    """What a one-token pass costs more after its thread idled, per idle in IDLES_MS: its median
    after the idle less its median back to back (tandem.capacity.Costs.*_cold_ms)."""
    times: dict[int, list[float]] = {idle: [] for idle in (0, *IDLES_MS)}
    for _ in range(repetitions):
        for idle in times:
            times[idle].append(_timed_pass(run, context, 1, 1, idle))
    warm = float(np.median(times[0]))
    return {idle: float(np.median(times[idle])) - warm for idle in IDLES_MS}


def _timed_pass(run: LlamaPass, context: int, rows: int, tokens: int, idle_ms: float = 0.0) -> float:
    """One pass of `rows` sessions' `tokens` each, each on a cache of `context` tokens of its own,
    idle_ms after the caches were filled → ms."""
    with torch.inference_mode():
        caches = [run.new_cache() for _ in range(rows)]
        for cache in caches:
            if context:
                run.forward(cache, 0, list(range(200, 200 + context)), keep=1)
        feeds = [Feed(cache, context, list(range(100, 100 + tokens)), tokens) for cache in caches]
        if idle_ms:
            time.sleep(idle_ms / 1e3)
        start = time.perf_counter()
        run.forward_batch(feeds)
        elapsed = (time.perf_counter() - start) * 1e3
        for cache in caches:
            run.release(cache)
    return elapsed


def call_handling_ms(target: str, context: int, repetitions: int = 15) -> dict[int, float]:
    """What a target verifier's process spends on a call beyond its passes (Costs.handling_ms and
    handling_call_ms), timed on a worker of its own on loopback (one torch thread, as on the bed):
    γ = 0 calls of one token a row on caches of `context` tokens, back to back, of 1 row and of
    ROWS rows in turns of CALLS_TIMED calls, `repetitions` turns each → per row count, the median
    turn's process CPU per call less its passes (the answers' compute_ms)."""
    proc, address = spawn_worker("target", target, "127.0.0.1", 1, "cpu", "float32", echo=False)
    try:
        with grpc.insecure_channel(address) as channel:
            stub = worker_pb2_grpc.TargetVerifierStub(channel)
            cached = {f"handling-{i}": 0 for i in range(ROWS)}  # session → its cache's tokens

            def call(fed: dict[str, list[int]]) -> float:
                request = wire.batch_request("VerifyBatch", [wire.verify_request(
                    session, cached[session], tokens, None, GREEDY) for session, tokens in fed.items()])
                answers = wire.batch_answers(stub.VerifyBatch(request, timeout=60))
                for session, tokens in fed.items():
                    cached[session] += len(tokens)
                return wire.verification_from_pb(answers[0]).compute_ms  # the rows shared their passes

            call({session: list(range(200, 200 + context)) for session in cached})  # the caches
            turns: dict[int, list[float]] = {1: [], ROWS: []}
            for _ in range(repetitions):
                for n in turns:
                    cpu, compute = cpu_seconds(proc.pid), 0.0
                    for _ in range(CALLS_TIMED):
                        compute += call({session: [100 + cached[session] % 50] for session in list(cached)[:n]})
                    turns[n].append(((cpu_seconds(proc.pid) - cpu) * 1e3 - compute) / CALLS_TIMED)
            return {n: float(np.median(t)) for n, t in turns.items()}
    finally:
        stop_processes([proc])


CALLS_TIMED = 20  # call_handling_ms's calls per turn: the process's CPU clock ticks every 10 ms


def _costs(rows: list[dict], passes: dict, prompt: int, point: dict, gamma: int) -> Costs:
    """A point's costs, none read from its tokens/s or, but for its acceptance, from any run with
    others in flight:
    - the passes as timed, a table per model (a pass here is no line: its matrix kernels change
      with the rows) at a session's mean context, the target's with the mean prompt's prefill,
      and a row's cost past a pass's first;
    - α as the i.i.d. rate that gives the point's mean acceptance length, which its prompts and
      sampling seeds set (a lone sweep's 6 prompts accept less than a loaded one's 48: 2.42 tokens
      a cycle at γ = 4 greedy, against 2.71);
    - what a pass costs more after its worker idled (_cold_costs);
    - from γ = 0's lone cycles: the call's CPU as the verifier's time beyond its pass (and the
      pass's coldness after the rest of the cycle) plus the transport at zero delay (gRPC's
      encoding, the delay proxy's relaying, the event loops), of which the verifier's process
      takes the handling (_handling_ms) between its passes (each row past a call's first what
      call_handling_ms timed a row to add), the round trip as what the transport takes more at
      the point's delay, and the orchestrator's time per cycle;
    - the orchestrator's CPU per call to the drafter, from the lone run of the point's γ at the
      least delay (_orchestrator_draft_call_ms);
    - a drafted token's CPU beyond its pass, from the lone draft calls' time against γ, its
      transport (_wire_token_ms) and a draft-ahead call's CPU per step (_ahead_step_ms);
    - drafting ahead's rates of right guesses (_fit_guess_rates)."""
    workload = point["workload"]
    alone = [r for r in rows if r["in_flight"] == 1 and r["workload"] == workload and r["mode"] != "adaptive"]
    same_gamma = [r for r in alone if r["mode"] == point["mode"]]
    alpha = _alpha_for(point["mean_acceptance_length"], gamma) if gamma else 0.0
    zeros = {r["delay_ms"]: r for r in alone if r["mode"] == cluster_mode(0)}
    drafting = [r for r in alone if r["mean_gamma"]]
    # A cycle's draft time, per cycle that made a draft call (a block drafted ahead made none).
    per_call = [r["cycle"]["draft_ms"] / (1.0 - (r["cycle"].get("drafted_ahead_share") or 0.0)) for r in drafting]
    per_token, _ = np.polyfit([r["mean_gamma"] for r in drafting], per_call, 1)
    bonus, recovered = _fit_guess_rates(alone)
    rows = passes.get("rows", {})
    lone_zero = next(r for r in alone if r["mode"] == cluster_mode(0) and r["delay_ms"] == 0.0)
    handling = _handling_ms(lone_zero)  # a call of one row's, of which a row's is what one more adds
    per_row = min(handling, max(0.0, (passes["handling"][ROWS] - passes["handling"][1]) / (ROWS - 1)))
    cold = _cold_costs(passes["cold"]) if "cold" in passes else {}
    # γ = 0's verify alone came after the rest of its cycle idle: its pass colder than the table's.
    zero = zeros[0.0]["cycle"]
    zero_cold = capacity_cold_ms(cold["target_cold_ms"], zero["total_ms"] - zero["verify_ms"],
                                 cold["cold_after_ms"]) if cold else 0.0
    call = max(0.0, zero["verify_ms"] - passes["target"][1] - zero_cold) + zero["transport_ms"]
    nearest = min(same_gamma, key=lambda r: r["delay_ms"])  # the point's γ alone, at the least delay
    return Costs(draft_pass=tuple(sorted(passes["draft"].items())), target_pass=tuple(sorted(passes["target"].items())),
                 draft_row_ms=rows.get("draft", 0.0), target_row_ms=rows.get("target", 0.0), **cold, alpha=alpha,
                 bonus_guess=bonus, recovered_guess=recovered,
                 rtt_ms=max(0.0, zeros[point["delay_ms"]]["cycle"]["transport_ms"] - zero["transport_ms"]),
                 orchestrator_ms=zero["orchestration_ms"],
                 orchestrator_draft_call_ms=_orchestrator_draft_call_ms(nearest, zeros[nearest["delay_ms"]]) if gamma
                 else 0.0,
                 call_ms=max(0.0, call - handling), handling_ms=per_row, handling_call_ms=handling - per_row,
                 draft_token_ms=max(0.0, float(per_token) - passes["draft"][1]), wire_token_ms=_wire_token_ms(drafting),
                 ahead_step_ms=_ahead_step_ms(alone, passes), prompt_tokens=prompt)


def _wire_token_ms(drafting: list[dict]) -> float:
    """A drafted token's transport (Costs.wire_token_ms): the slope of the lone drafting runs'
    transport per cycle against their mean γ, at the least delay they ran (where it is CPU: at
    T = 1 every drafted token carries a vocabulary's probabilities, from the drafter through the
    delay proxies and the orchestrator to the verifier)."""
    least = min(r["delay_ms"] for r in drafting)
    near = [r for r in drafting if r["delay_ms"] == least]
    if len({r["mean_gamma"] for r in near}) < 2:
        return 0.0
    slope, _ = np.polyfit([r["mean_gamma"] for r in near], [r["cycle"]["transport_ms"] for r in near], 1)
    return max(0.0, float(slope))


def _handling_ms(lone_zero: dict) -> float:
    """A call's handling in its worker's process between passes (Costs.handling_ms): in a lone
    γ = 0 run at 0 ms, the verifier's process's CPU per cycle less its passes' (the cycle's
    compute). 0 for a sweep that did not measure the processes' CPU."""
    cpu = _cpu_per_cycle_ms(lone_zero, "target")
    return 0.0 if cpu is None else max(0.0, cpu - lone_zero["cycle"]["verify_ms"])


def _orchestrator_draft_call_ms(lone: dict, zero: dict) -> float:
    """The orchestrator's CPU per call to the drafter (Costs.orchestrator_draft_call_ms): a lone
    drafting run's orchestration per cycle beyond its γ = 0 run's (`lone`, `zero`: their rows),
    over its calls to the drafter per cycle (its draft call where the block was not drafted ahead,
    its draft-ahead call where it drafts ahead). The orchestration is the cycle's wall time beyond
    its calls, so it holds the wait for a draft-ahead call that outlasts the verify, which the
    simulator runs as a call of its own: sampled at γ = 6 and 8 alone at 0 ms, 6.0 and 8.7 ms a
    cycle, where the Serve replica's process used 2.4 and 2.8 ms of CPU more than at γ = 0. So it
    is taken at most at that CPU, where the sweep measured the processes'."""
    cycle = lone["cycle"]
    share = cycle.get("drafted_ahead_share") or 0.0
    calls = 1.0 - share + (1.0 if cycle.get("ahead_ms") else 0.0)
    beyond = max(0.0, cycle["orchestration_ms"] - zero["cycle"]["orchestration_ms"])
    cpu = [_cpu_per_cycle_ms(r, "serve replica") for r in (lone, zero)]
    if None not in cpu:
        beyond = min(beyond, max(0.0, cpu[0] - cpu[1]))
    return beyond / calls


def _cpu_per_cycle_ms(row: dict, role: str) -> float | None:
    """A lone run's CPU per cycle in the processes whose role starts with `role` (the verifier's:
    "target"; the orchestrator's cycles run in the "serve replica"), from their shares of a core
    and the run's cycles per ms; None where the sweep did not measure the processes' CPU."""
    shares = [share for name, share in row.get("cores_by_role", {}).items() if name.startswith(role)]
    if not shares:
        return None
    cycles_per_ms = row["aggregate_tokens_per_s"] / 1e3 / row["mean_acceptance_length"]
    return sum(shares) / cycles_per_ms


def _ahead_step_ms(alone: list[dict], passes: dict) -> float | None:
    """A draft-ahead call's CPU per step besides its pass (Costs.ahead_step_ms): the mean, over
    the lone fixed-γ runs, of what their draft-ahead calls took (their compute, per cycle) per
    step (γ + 1 of them) beyond a pass of their chains; None without draft-ahead calls."""
    rejections = OrchestratorConfig.ahead_rejections
    draft = tuple(sorted(passes["draft"].items()))
    beyond = [r["cycle"]["ahead_ms"] / (gamma + 1) - capacity_pass_ms(draft, 1 + min(gamma, rejections))
              for r in alone if (gamma := _gamma_of(r["mode"])) and r["cycle"].get("ahead_ms")]
    return max(0.0, float(np.mean(beyond))) if beyond else None


def _fit_guess_rates(alone: list[dict]) -> tuple[float, float]:
    """Drafting ahead's (bonus_guess, recovered_guess) (tandem.capacity.Costs): the rates that
    best give, by least squares, the share of drafting cycles each lone fixed-γ run found drafted
    ahead, α^γ · bonus + (1 − α^min(γ, R)) · recovered with α its own (_alpha_for) and R the
    sweep's ahead_rejections."""
    rejections = OrchestratorConfig.ahead_rejections
    fits = []  # (α^γ, 1 − α^min(γ, R), share)
    for r in alone:
        gamma, share = _gamma_of(r["mode"]), r["cycle"].get("drafted_ahead_share")
        if gamma and share is not None:
            alpha = _alpha_for(r["mean_acceptance_length"], gamma)
            fits.append((alpha ** gamma, 1.0 - alpha ** min(gamma, rejections), share))
    if not fits:
        return 0.0, 0.0
    x, y = np.array([f[:2] for f in fits]), np.array([f[2] for f in fits])
    rates = np.linalg.lstsq(x, y, rcond=None)[0]  # with R = 0 the second column is 0, and so its rate
    return tuple(float(np.clip(rate, 0.0, 1.0)) for rate in rates)


def _background_ms(rows: list[dict], passes: dict, prompt: int, workload: str) -> float:
    """The CPU per cycle that no call waits for (Costs.background_ms; per cycle, whatever its γ:
    a chunk streamed, a commit): the machine's CPU per cycle in the workload's lone γ = 0 run at
    0 ms (every process's: the bed's, Ray's, the client's), less all that the simulator charges
    that cycle (at 0 ms, all of it is CPU: its pass, its call, the orchestrator). 0 for a sweep
    that did not measure the CPU."""
    lone = [r for r in rows if r["in_flight"] == 1 and r["delay_ms"] == 0.0 and r["workload"] == workload
            and r["mode"] == cluster_mode(0) and "cpu_ms_per_cycle" in r]
    if not lone:
        return 0.0
    return max(0.0, lone[0]["cpu_ms_per_cycle"] - lone_cycle_ms(_costs(rows, passes, prompt, lone[0], 0), 0))


def _alpha_for(length: float, gamma: int) -> float:
    """The α whose i.i.d. acceptance gives `length` tokens per cycle at γ (bisection; the
    expected length rises with α)."""
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens(mid, gamma) < length else (low, mid)
    return (low + high) / 2


def _key(r: dict) -> tuple:
    return r["delay_ms"], r["workload"], r["in_flight"]


def _gamma_of(mode: str) -> int | None:
    """A fixed-γ mode's γ; None for adaptive."""
    return None if mode == "adaptive" else int(mode.removeprefix("gamma_"))


def plot_calibration(out: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for in_flight, marker in ((1, "o"), (8, "s")):
        for workload, color in (("greedy", "tab:blue"), ("sampled", "tab:orange")):
            pts = [o for o in out if o["in_flight"] == in_flight and o["workload"] == workload]
            ax.scatter([o["measured"] for o in pts], [o["predicted"] for o in pts], marker=marker, color=color,
                       alpha=0.7, label=f"{workload}, {in_flight} in flight")
    top = max(max(o["measured"], o["predicted"]) for o in out) * 1.1
    ax.plot([0, top], [0, top], color="black", linewidth=1)
    for band in (0.85, 1.15):
        ax.plot([0, top], [0, top * band], color="gray", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = [t for t in (10, 20, 50, 100, 200, 500, 1000) if t <= top]
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers, no crowded minor labels
        axis.set_ticks(ticks)
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured tokens/s (test bed)")
    ax.set_ylabel("predicted tokens/s (tandem.capacity)")
    ax.set_title("the simulator against the test bed (±15 % dashed)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _medians(group: list[dict], by=lambda r: r["mode"]) -> list[dict]:
    """A point's rows, one per mode (or per `by`): its repeat with the median tokens/s (the lower
    middle one)."""
    groups: dict = {}
    for r in group:
        groups.setdefault(by(r), []).append(r)
    return [sorted(rs, key=lambda r: r["aggregate_tokens_per_s"])[(len(rs) - 1) // 2] for rs in groups.values()]


def _median_rows(rows: list[dict]) -> list[dict]:
    """Every point's median row per mode."""
    return [m for key in sorted({_key(r) for r in rows}) for m in _medians([r for r in rows if _key(r) == key])]


def _point(group: list[dict]) -> tuple[dict, dict | None, dict | None]:
    """A point's rows → (its best fixed γ's, adaptive γ's, γ = 0's median rows; None where not run)."""
    group = _medians(group)
    best = max((r for r in group if r["mode"] != "adaptive"), key=lambda r: r["aggregate_tokens_per_s"])
    adaptive = next((r for r in group if r["mode"] == "adaptive"), None)
    zero = next((r for r in group if r["mode"] == cluster_mode(0)), None)
    return best, adaptive, zero


def _interval(paired: tuple[float, float, float]) -> str:
    """A paired ratio and its interval, as the tables print them ("–" where not run)."""
    return "–" if np.isnan(paired[0]) else f"{paired[0]:.2f} ({paired[1]:.2f}–{paired[2]:.2f})"


def write(rows: list[dict], args, timings: list[dict], controls: list[dict] = ()) -> None:
    """sweep.json (the runs; the control's apart, under "controls"), sweep.md and sweep.png."""
    out = Path(args.out)
    (out / "sweep.json").write_text(json.dumps({"args": vars(args) | {"func": None}, "host_cores": os.cpu_count(),
                                                "pass_ms": timings, "rows": rows, "controls": list(controls)},
                                               indent=1))
    fixed = {r["mode"] for r in rows if r["mode"] != "adaptive"}
    steady = at_speed(rows, speed_slope(rows, fixed, _key))
    lines = ["| delay (ms) | workload | in flight | best fixed γ | its tokens/s | adaptive tokens/s | adaptive / best "
             "| paired per round (95 % CI) | against the other rounds' best | at the machine's speed "
             "| adaptive mean γ | γ = 0 tokens/s | control: γ = 0 twice (95 % CI) |", "|---" * 13 + "|"]
    for key in sorted({_key(r) for r in rows}):
        group, at = [r for r in rows if _key(r) == key], [r for r in steady if _key(r) == key]
        best, adaptive, zero = _point(group)
        a = adaptive["aggregate_tokens_per_s"] if adaptive else float("nan")
        against = (best["mode"], held_out_best(group, fixed), held_out_best(at, fixed))
        ratios = [paired(g, "adaptive", m) if adaptive else NAN3 for g, m in zip((group, group, at), against)]
        control = paired([*group, *({**c, "mode": CONTROL} for c in controls if _key(c) == key)], CONTROL,
                         cluster_mode(0))
        lines.append(f"| {key[0]:g} | {key[1]} | {key[2]} | {best['mode']} | {best['aggregate_tokens_per_s']:.1f} | "
                     f"{a:.1f} | {a / best['aggregate_tokens_per_s']:.2f} | "
                     + "".join(f"{_interval(r)} | " for r in ratios)
                     + f"{(adaptive or {}).get('mean_gamma') or 0:.2f} | "
                     f"{zero['aggregate_tokens_per_s'] if zero else float('nan'):.1f} | {_interval(control)} |")
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    plot(rows, out / "sweep.png")


def plot(rows: list[dict], path: Path) -> None:
    panels = sorted({(r["workload"], r["in_flight"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (workload, in_flight) in zip(axes[0], panels):
        group = [r for r in _median_rows(rows) if (r["workload"], r["in_flight"]) == (workload, in_flight)]
        for mode in sorted({r["mode"] for r in group}, key=lambda m: (m == "adaptive", m)):
            points = sorted((r["delay_ms"], r["aggregate_tokens_per_s"]) for r in group if r["mode"] == mode)
            style = dict(color="black", linewidth=2.5) if mode == "adaptive" else dict(alpha=0.6)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=mode, **style)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("one-way delay, orchestrator ↔ each worker (ms)")
        ax.set_ylabel("tokens/s (all sessions)")
        ax.set_title(f"{workload}, {in_flight} in flight")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# The smoke run (--smoke): every subcommand that measures, at a tiny size, into --out. The sweep
# has what calibrate's costs need (γ = 0 and two fixed γ ≥ 1, alone, at delay 0), and one delay
# through the proxies beside it.
SMOKE = (["sweep", "--delays", "0,1", "--gammas", "0-2,auto", "--workloads", "greedy", "--in-flight", "1",
          "--sessions", "2", "--max-tokens", "8", "--repeats", "1", "--pass-repetitions", "2", "--control",
          "--fresh-adaptive"],
         ["calibrate"],
         ["drafters", "--sweeps", "{out}"],
         ["pool", "--sweeps", "{out},{out}"],
         ["runahead", "--settings", "off,2+2", "--delays", "1", "--workloads", "greedy", "--sessions", "1",
          "--max-tokens", "8", "--repeats", "1"])


def smoke(parser: argparse.ArgumentParser, out: str) -> None:
    """SMOKE's subcommands in turn, each with --out `out`."""
    for argv in SMOKE:
        argv = [a.format(out=out) for a in argv]
        args = _subcommand(parser.parse_args([*argv, "--out", out]))
        print(f"smoke: network.py {' '.join(argv)} --out {out}", flush=True)
        args.func(args)


def _subcommand(args: argparse.Namespace) -> argparse.Namespace:
    """A subcommand's arguments: its --out (else the one before it, else OUT), without the
    top-level options (sweep.json keeps its subcommand's arguments)."""
    args.out = getattr(args, "out", None) or args.top_out or str(DRAFTERS_OUT if args.func is drafters else OUT)
    del args.top_out, args.smoke
    return args


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C (SystemExit), so that the `with` blocks take the test bed's
    namespaces, proxies and processes down with this process."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="each subcommand but up at a tiny size, into "
                                                             "--out (no subcommand)")
    # A destination of its own: a subcommand's defaults would overwrite a shared one.
    parser.add_argument("--out", dest="top_out", metavar="DIR",
                        help=f"where results go (or a subcommand's --out); default {OUT}")
    sub = parser.add_subparsers()
    p_up = sub.add_parser("up", help="a cluster on the test bed until Ctrl-D")
    p_up.add_argument("--delay-ms", type=float, default=5.0)
    p_up.add_argument("--jitter-ms", type=float, default=0.0)
    p_up.add_argument("--drafters", type=int, default=1)
    p_up.add_argument("--verifiers", type=int, default=1)
    p_up.set_defaults(func=up)
    p_sweep = sub.add_parser("sweep", help="tokens/s against delay, per γ and the adaptive policy")
    p_sweep.add_argument("--delays", default="0,1,5,20", help="one-way delays in ms")
    p_sweep.add_argument("--jitter-ms", type=float, default=0.0)
    p_sweep.add_argument("--drafter", choices=NETWORK_DRAFTERS, default="hybrid",
                         help="who drafts: a draft worker on a host of its own (hybrid, model, ngram), or the "
                              "verifier with the shipped EAGLE-3 head (head)")
    p_sweep.add_argument("--gammas", default="0-4,6,8,auto")
    p_sweep.add_argument("--workloads", default="greedy,sampled")
    p_sweep.add_argument("--in-flight", default="1,8")
    p_sweep.add_argument("--sessions", type=int, default=6,
                         help="sessions per point (at least twice as many as in flight)")
    p_sweep.add_argument("--max-tokens", type=int, default=64)
    p_sweep.add_argument("--repeats", type=int, default=4, help="runs of each mode per point (the median is kept)")
    p_sweep.add_argument("--pass-repetitions", type=int, default=15,
                         help="timings of each pass size, before and after the points (the median is kept)")
    p_sweep.add_argument("--seed", type=int, default=0)
    p_sweep.add_argument("--control", action="store_true",
                         help="run γ = 0 a second time each round: the bed's own noise at each point, paired as "
                              "adaptive is (an A/A; kept apart from the modes)")
    p_sweep.add_argument("--fresh-adaptive", action="store_true",
                         help="a new orchestrator before each adaptive run (and the control's): its policy "
                              "starts from what it measures itself, not from what the fixed modes before it "
                              "left on the replica")
    p_sweep.add_argument("--warm-up-streams", type=int, default=0,
                         help="with --fresh-adaptive: the streams the new orchestrator serves first, in its own "
                              "mode and workload, on prompts the run does not serve (default: one per session in "
                              "flight; a lone session's policy settles in some 200 cycles)")
    p_sweep.add_argument("--out", help="where sweep.{json,md,png} go")
    p_sweep.set_defaults(func=sweep)
    p_ahead = sub.add_parser("runahead", help="a lone session's tokens/s against delay, drafting ahead off or for "
                                               "guesses of the bonus token and of recovered tokens")
    p_ahead.add_argument("--settings", default="off,1,1+8",
                         help="off (--no-draft-ahead), G (--ahead-guesses G) or G+R (and --ahead-rejections R)")
    p_ahead.add_argument("--delays", default="0,1,5,20", help="one-way delays in ms")
    p_ahead.add_argument("--gammas", default="auto", help="the modes, as sweep's --gammas")
    p_ahead.add_argument("--workloads", default="greedy,sampled")
    p_ahead.add_argument("--sessions", type=int, default=6, help="streams per point, one at a time")
    p_ahead.add_argument("--max-tokens", type=int, default=64)
    p_ahead.add_argument("--repeats", type=int, default=3, help="rounds over the settings (the median is kept)")
    p_ahead.add_argument("--seed", type=int, default=0)
    p_ahead.add_argument("--out", help="where runahead.{json,md,png} go")
    p_ahead.set_defaults(func=runahead)
    p_dr = sub.add_parser("drafters", help="the sweeps of several drafters side by side")
    p_dr.add_argument("--sweeps", help="sweep directories, comma-separated (default: results/network and every "
                                       "results/network_drafters/*)")
    p_dr.add_argument("--out", help=f"where drafters.{{md,png}} go (default {DRAFTERS_OUT})")
    p_dr.set_defaults(func=drafters)
    p_pool = sub.add_parser("pool", help="sweeps of the same points and code, as one sweep of all their rounds")
    p_pool.add_argument("--sweeps", required=True, help="sweep directories, comma-separated")
    p_pool.add_argument("--out", help="where sweep.{json,md,png} go")
    p_pool.set_defaults(func=pool)
    p_cal = sub.add_parser("calibrate", help="the capacity simulator's predictions against the sweep's measurements")
    p_cal.add_argument("--sweep", help="a sweep's results (JSON; several, comma-separated, as one: default "
                                          "--out's sweep.json)")
    p_cal.add_argument("--out", help="where calibration.{json,md,png} go")
    p_cal.add_argument("--passes", help="the pass timings of this calibration.json (default: the sweep's own, "
                                        "or timed now for a sweep without them)")
    p_cal.add_argument("--host-cores", type=int, help="the cores the test bed's processes shared (default: the "
                                                      "sweep's machine's, or this one's)")
    p_cal.add_argument("--seed", type=int, default=0)
    p_cal.set_defaults(func=calibrate)
    args = parser.parse_args()
    func = getattr(args, "func", None)
    if args.smoke and (func or not args.top_out):
        parser.error("--smoke takes --out DIR and no subcommand (it runs the others itself)")
    if not args.smoke and not func:
        parser.error("a subcommand (up, sweep, calibrate, runahead, drafters), or --smoke --out DIR")
    if func not in (calibrate, drafters) and (reason := unavailable()):
        raise SystemExit(f"benchmarks/network.py: the test bed cannot run here: {reason}")
    _stop_on_sigterm()
    if args.smoke:
        smoke(parser, args.top_out)
        return
    func(_subcommand(args))


if __name__ == "__main__":
    main()
