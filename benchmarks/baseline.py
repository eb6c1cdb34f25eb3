"""The engine before a change, beside the engine after it, in one run, on the code of a commit
(or a directory holding its `tandem` package):

- `compare`: a benchmark script measures here, then runs itself again on the baseline's code in a
  subprocess (both sets of numbers from the same machine, one after the other);
- `side_by_side`, `Engine` and `serve`: the script's measurements as a server in a process per
  engine, so that the engines can take turns measurement by measurement (`in_turn`), side by
  side on the machine's drift (which here moves a run by 10 to 30 %)."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
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
                              text=True, check=True)
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
    (package) a baseline's."""

    def __init__(self, script: str, package: str | None = None, args: tuple[str, ...] = ("--serve",)) -> None:
        env = dict(os.environ, **({"PYTHONPATH": package} if package else {}))
        self.proc = subprocess.Popen([sys.executable, script, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{script} --serve did not start")

    def ask(self, **question) -> dict:
        self.proc.stdin.write(json.dumps(question) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def side_by_side(script: str, commit: str | None, measure: Callable[[dict[str, Engine]], list],
                 args: tuple[str, ...] = ("--serve",)) -> tuple[list, list[str]]:
    """measure(engines) with this tree's engine ("batched") and, given a commit, that commit's
    ("before"), each `script *args` in a process of its own → (what it measured, the engines)."""
    engines = {"batched": Engine(script, args=args)}
    if commit:
        engines["before"] = Engine(script, package(commit), args=args)
    try:
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
    orchestrator/ under tandem/) → its path; a directory given instead is taken as it is."""
    if Path(commit).is_dir():
        return commit
    out = Path(tempfile.mkdtemp(prefix=f"tandem-{commit[:10]}-"))
    tree = out / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "tandem", "services", "orchestrator"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    (tree / "tandem").rename(out / "tandem")
    for part in ("services", "orchestrator"):
        (tree / part).rename(out / "tandem" / part)
    return str(out)
