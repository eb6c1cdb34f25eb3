"""`tandem distill` (tandem.distill) on the tiny random pair: a few steps make a draft that loads
through from_pretrained and that `tandem check` measures against the target; a run SIGKILLed
mid-training carries on from its checkpoint to the very weights of a run never stopped; a head
loads as the verifier loads one; bad input is refused naming the flag."""

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tandem import distill
from tandem.cli import main as cli
from tandem.services import head as head_module

STEPS = ["--window", "48", "--batch", "4", "--continuations", "4", "--device", "cpu"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """Three standard-library modules, copied: two to train on, one held out."""
    root = tmp_path_factory.mktemp("data")
    for name in ("bisect.py", "colorsys.py", "keyword.py"):
        (root / name).write_text((Path(sysconfig.get_paths()["stdlib"]) / name).read_text())
    (root / "binary.bin").write_bytes(b"\0\1\2")  # left out
    return str(root)


def _distill(argv: list[str]) -> None:
    cli(["distill", *argv])


def test_a_few_steps_make_a_draft_that_loads_and_that_tandem_check_measures(pair, data, tmp_path, capsys):
    out = tmp_path / "draft"
    _distill(["--target", pair["target"], "--data", data, "--out", str(out), "--steps", "3", *STEPS])
    draft = AutoModelForCausalLM.from_pretrained(out)
    assert draft.config.vocab_size == pair["vocab"] and draft.config.num_hidden_layers == 1
    summary = json.loads((out / "distill.json").read_text())
    assert summary["steps"] == 3 and summary["plan"]["data"] == sorted(summary["plan"]["data"])
    assert len(summary["plan"]["data"]) == 3  # the binary file is not read
    check = summary["check"]
    assert check["vocab_size"] == pair["vocab"] and check["shared_tokens"] is None and check["positions"] > 0
    assert 0 <= check["greedy_agreement"] <= 1 and check["verdict"]
    err = capsys.readouterr().err
    assert "data: 2 files" in err and "1 held out" in err and "step 3" in err and "verdict" in err
    cli_report = subprocess.run([sys.executable, "-m", "tandem.cli", "check", "--draft", str(out), "--target",
                                 pair["target"], "--prompts", str(Path(data) / "keyword.py"), "--limit", "1",
                                 "--max-new-tokens", "8", "--json"], capture_output=True, text=True, timeout=120)
    assert cli_report.returncode in (0, 1) and json.loads(cli_report.stdout)["vocab_size"] == pair["vocab"]


def test_a_killed_run_carries_on_from_its_checkpoint_to_the_weights_of_a_run_never_stopped(pair, data, tmp_path):
    args = ["--target", pair["target"], "--data", data, "--steps", "150", "--checkpoint-minutes", "0", *STEPS]
    whole = tmp_path / "whole"
    _distill([*args, "--out", str(whole)])
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "tandem.cli", "distill", *args, "--out", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and not _step(killed) >= 5:
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    stopped_at = _step(killed)
    assert 5 <= stopped_at < 150, "the run should have been killed mid-training"
    resumed = subprocess.run([sys.executable, "-m", "tandem.cli", "distill", *args, "--out", str(killed)],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at step" in resumed.stderr
    ours, theirs = (AutoModelForCausalLM.from_pretrained(d).state_dict() for d in (killed, whole))
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


def _step(out: Path) -> int:
    """The step of out's checkpoint, 0 while there is none (or it is being replaced)."""
    try:
        return torch.load(out / distill.CHECKPOINT, weights_only=False)["step"]
    except (FileNotFoundError, RuntimeError, EOFError):
        return 0


def test_a_checkpoint_of_another_run_is_refused(pair, data, tmp_path):
    out = tmp_path / "other"
    _distill(["--target", pair["target"], "--data", data, "--out", str(out), "--steps", "2", *STEPS])
    with pytest.raises(SystemExit, match="another run's"):
        _distill(["--target", pair["target"], "--data", data, "--out", str(out), "--steps", "2", "--seed", "1",
                  *STEPS])


def test_head_makes_a_head_the_verifier_loads(pair, data, tmp_path):
    out = tmp_path / "head"
    _distill(["--target", pair["target"], "--data", data, "--out", str(out), "--steps", "2", "--head", *STEPS])
    loaded = head_module.load(out, AutoConfig.from_pretrained(pair["target"]))
    assert loaded.config.vocab_size == pair["vocab"]
    agreement = json.loads((out / "distill.json").read_text())["held_out_agreement_per_step"]
    assert len(agreement) == 3 and all(0 <= a <= 1 for a in agreement)


@pytest.mark.parametrize("argv, message", [
    (["--steps", "2", "--data", "/nonexistent"], "--data /nonexistent: no such file"),
    (["--steps", "2", "--draft-config", "huge"], "--draft-config must be tiny, small or a JSON object"),
    (["--steps", "2", "--draft-config", "{bad"], "--draft-config: not JSON"),
    (["--minutes", "0"], "--steps and --minutes must be positive"),
])
def test_bad_input_is_refused_naming_the_flag(pair, data, tmp_path, argv, message):
    args = ["--target", pair["target"], "--out", str(tmp_path / "x"), *STEPS, *argv]
    if "--data" not in argv:
        args += ["--data", data]
    with pytest.raises(SystemExit, match=message):
        _distill(args)
