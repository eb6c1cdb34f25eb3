"""The engine before a change, beside the engine after it, in one run, on the code of a commit
(or a directory holding its `tandem` package):

- `compare`: a benchmark script measures here, then runs itself again on the baseline's code in a
  subprocess (both sets of numbers from the same machine, one after the other);
- `side_by_side`, `Engine` and `serve`: the script's measurements as a server in a process per
  engine, so that the engines can take turns measurement by measurement (`in_turn`), side by
  side on the machine's drift (which here moves a run by 10 to 30 %).

Run as a script, it checks that machinery end to end on a baseline (the checkout's HEAD unless
--baseline names another): `compare` and `side_by_side` each time 10,000 accept tests
(tandem.math.acceptance) on this tree's code and on the baseline's; the run fails unless the
baseline's engines imported the baseline's `tandem` (and its `tandem.services`) and this tree's
did not; the timings go to DIR/baseline.{json,png}.

    .venv/bin/python benchmarks/baseline.py --smoke --out DIR [--baseline COMMIT]
"""

import argparse
import atexit
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENGINE_ONLY = "--engine-only"
RESULT = "RESULT "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", help="a commit (or a directory holding its tandem package) to measure too")
    parser.add_argument(ENGINE_ONLY, action="store_true", help=argparse.SUPPRESS)  # the baseline's subprocess


def compare(args: argparse.Namespace, measure: Callable[[], Any]) -> dict | None:
    """measure() here → {"batched": it, and with --baseline, "before": the same on the baseline};
    None in the baseline's own subprocess, which prints its numbers for the caller instead."""
    value = measure()
    if args.engine_only:
        print(RESULT + json.dumps(value), flush=True)
        return None
    results = {"batched": value}
    if args.baseline:
        argv, skip = [], False
        for a in sys.argv[1:]:  # this run's arguments, less --baseline
            if skip or a.startswith("--baseline="):
                skip = False
                continue
            skip = a == "--baseline"
            if not skip:
                argv.append(a)
        env = dict(os.environ, PYTHONPATH=package(args.baseline))
        done = subprocess.run([sys.executable, sys.argv[0], *argv, ENGINE_ONLY], env=env, capture_output=True,
                              text=True)
        if done.returncode:  # its stderr, or the reason would be lost with it
            raise RuntimeError(f"the baseline's run ({args.baseline}) exited {done.returncode}:\n"
                               f"{done.stderr[-4000:]}")
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith(RESULT))
        results["before"], results["baseline"] = json.loads(line[len(RESULT):]), args.baseline
    return results


def serve(measure: Callable[[dict], dict]) -> None:
    """Answer the questions read from stdin, one JSON object a line, with measure(question) on
    stdout, after a line saying "ready"."""
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(measure(json.loads(line))), flush=True)


class Engine:
    """`script --serve` (or `script *args`) in a process of its own, on this tree's code or
    (package) a baseline's. Made, it is starting; ready() waits for it, so that several engines
    load at once."""

    def __init__(self, script: str, package: str | None = None, args: tuple[str, ...] = ("--serve",)) -> None:
        env = dict(os.environ, **({"PYTHONPATH": package} if package else {}))
        self.script = script
        self.proc = subprocess.Popen([sys.executable, script, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    def ready(self) -> None:
        """Wait for the engine's "ready" line."""
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{self.script} --serve did not start")

    def ask(self, **question) -> dict:
        self.proc.stdin.write(json.dumps(question) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"{self.script} --serve exited (code {self.proc.wait()}) before answering {question}")
        return json.loads(answer)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def side_by_side(script: str, commit: str | None, measure: Callable[[dict[str, Engine]], list],
                 args: tuple[str, ...] = ("--serve",)) -> tuple[list, list[str]]:
    """measure(engines) with this tree's engine ("batched") and, given a commit, that commit's
    ("before"), each `script *args` in a process of its own → (what it measured, the engines)."""
    engines = {"batched": Engine(script, args=args)}
    try:
        if commit:
            engines["before"] = Engine(script, package(commit), args=args)
        for engine in engines.values():
            engine.ready()
        return measure(engines), list(engines)
    finally:
        for engine in engines.values():
            engine.close()


def in_turn(engines: dict[str, Engine], i: int) -> list[str]:
    """The engines' order for measurement i: each goes first half the time."""
    return list(engines) if i % 2 else list(reversed(engines))


def shown(engines: list[str]) -> list[str]:
    """The engines in a table's order: the one before first."""
    return [e for e in ("before", "batched") if e in engines]


def save(out: Path, name: str, commit: str | None, rows: list) -> None:
    """rows as out/name.json, with the baseline they were measured against."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"baseline": commit, "rows": rows}, indent=1))


def pyplot():
    """matplotlib's pyplot, drawing to files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def package(commit: str) -> str:
    """A directory holding the commit's `tandem` package, laid out as installed (services/ and
    orchestrator/ under tandem/) → its path; a directory given instead is taken as it is. The
    directory made lasts until this process exits (its engines' subprocesses end before)."""
    if Path(commit).is_dir():
        return commit
    out = Path(tempfile.mkdtemp(prefix=f"tandem-{commit[:10]}-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    tree = out / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "tandem", "services", "orchestrator"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    (tree / "tandem").rename(out / "tandem")
    for part in ("services", "orchestrator"):
        (tree / part).rename(out / "tandem" / part)
    return str(out)


def where() -> dict:
    """Where this process's `tandem` and `tandem.services` come from, and the milliseconds of
    10,000 accept tests (tandem.math.acceptance): what the smoke check compares."""
    from tandem.math.acceptance import count_accepted

    start = time.perf_counter()
    for _ in range(10_000):
        count_accepted([0.9, 0.8, 0.7], [0.5, 0.9, 0.1], [0.3, 0.6, 0.2])
    return {"tandem": importlib.util.find_spec("tandem").origin,
            "services": importlib.util.find_spec("tandem.services").origin,
            "ms": (time.perf_counter() - start) * 1e3}


def check_sources(engine: str, found: dict, package_dir: str) -> None:
    """Fail unless the "before" engine ran the baseline's code and "batched" this tree's."""
    root = Path(package_dir).resolve()
    for key in ("tandem", "services"):
        inside = root in Path(found[key]).resolve().parents
        if inside != (engine == "before"):
            raise SystemExit(f"baseline check: the {engine!r} engine imported {key} from {found[key]}, "
                             f"{'outside' if engine == 'before' else 'inside'} the baseline's package {package_dir}")


def smoke(args: argparse.Namespace) -> None:
    """compare and side_by_side on the baseline, their engines' sources checked, the timings saved."""
    if args.engine_only:  # compare's subprocess, on the baseline's code
        compare(args, where)
        return
    commit = args.baseline or "HEAD"
    args.baseline = package(commit)  # one archive for both paths
    compared = compare(args, where)
    rows, engines = side_by_side(__file__, args.baseline,
                                 lambda e: [{name: e[name].ask() for name in in_turn(e, i)} for i in range(2)])
    for engine in ("batched", "before"):
        check_sources(engine, compared[engine], args.baseline)
        for row in rows:
            check_sources(engine, row[engine], args.baseline)
    out = Path(args.out)
    save(out, "baseline", commit, [{"compare": compared}, *rows])
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    names = shown(engines)
    for i, row in enumerate([{e: compared[e] for e in names}, *rows]):
        ax.plot(names, [row[e]["ms"] for e in names], marker="o", label="compare" if i == 0 else f"side by side {i}")
    ax.set(title=f"10,000 accept tests, now and at {commit[:10]}", ylabel="ms")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "baseline.png", dpi=120)
    print(json.dumps({"compare": compared, "side_by_side": rows}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="check this module's machinery (its only run)")
    parser.add_argument("--out", help="the folder for baseline.json and baseline.png")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # side_by_side's engine
    add_arguments(parser)
    args = parser.parse_args()
    if args.serve:
        serve(lambda question: where())
    elif not (args.smoke and args.out):
        parser.error("baseline.py is a library; run as a script it is its own check: --smoke --out DIR")
    else:
        smoke(args)


if __name__ == "__main__":
    main()
