"""The engine before a change, beside the engine after it, in one run: a benchmark script that
calls `compare` measures here, and with `--baseline COMMIT` (or a directory holding a `tandem`
package) runs itself again on that commit's code in a subprocess, so that both sets of numbers
come from the same machine at the same time."""

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
