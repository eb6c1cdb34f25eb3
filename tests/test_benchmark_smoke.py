"""Every script in benchmarks/ runs end to end in its smoke mode, so that none rots between the
runs that measure: `python benchmarks/<script>.py --smoke --out DIR` takes the script's whole
path at a tiny size (few prompts, few tokens, one repetition), writes its results to DIR and
never to benchmarks/results/, and exits 0. The numbers it writes mean nothing; that it writes
them, and that they parse, is what is checked.

Scripts that start a whole cluster are marked `cluster`; the test bed's are marked `network`
and skip where this machine cannot make network namespaces."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.bench import testbed

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py"))

# What a script's smoke run needs beyond a Python process: marks, and its own bound on time.
CLUSTER = {"control_plane", "draft_ahead_ab", "failover", "gamma_under_load", "openai_api", "pass_fill",
           "tree_rules", "vllm_peer"}
NETWORK = {"network"}
BOUND_S = 420  # a smoke run alone takes well under a minute; the bound allows a busy machine


def _marks(script: str) -> list:
    if script in NETWORK:
        reason = testbed.unavailable()
        return [pytest.mark.network, pytest.mark.skipif(reason is not None, reason=f"no test bed here: {reason}")]
    return [pytest.mark.cluster] if script in CLUSTER else []


def _results() -> dict[str, int]:
    """benchmarks/results/ as it stands: every file's modification time."""
    return {str(p): p.stat().st_mtime_ns for p in (BENCHMARKS / "results").rglob("*") if p.is_file()}


@pytest.mark.parametrize("script", [pytest.param(s, marks=_marks(s)) for s in SCRIPTS])
def test_a_benchmark_runs_in_its_smoke_mode(script, tmp_path):
    before = _results()
    out = tmp_path / "out"
    # RAY_ADDRESS=local: a script's cluster starts a Ray of its own, never joining one this
    # machine already runs (ray.init would join the one at RAY_ADDRESS, or one `ray start` left).
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_ADDRESS": "local"}
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{script}.py"), "--smoke", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=BOUND_S)
    assert done.returncode == 0, f"{script} --smoke exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written, f"{script} --smoke wrote nothing to --out"
    for path in written:
        assert path.stat().st_size > 0, f"{script} --smoke wrote an empty {path.name}"
        if path.suffix == ".json":
            json.loads(path.read_text())
    assert _results() == before, f"{script} --smoke changed benchmarks/results/"


def test_the_marks_name_scripts_that_exist():
    """A renamed script would otherwise lose its mark and run in `make test-fast`."""
    assert CLUSTER | NETWORK <= set(SCRIPTS)
