"""`tandem plan`: the analytic model from the command line, run in-process."""

import json

import pytest

from tandem.cli import main


def closed_form_tokens(alpha: float, gamma: int) -> float:
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def closed_form_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    return closed_form_tokens(alpha, gamma) / (1 + gamma / cost_ratio)


def brute_force(alpha: float, cost_ratio: float, max_gamma: int) -> int:
    speedups = [closed_form_speedup(alpha, g, cost_ratio) for g in range(max_gamma + 1)]
    return speedups.index(max(speedups))


def plan_json(capsys, *args: str) -> dict:
    main(["plan", *args, "--json"])
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out  # exactly one JSON line
    return json.loads(out)


@pytest.mark.parametrize("alpha,cost_ratio", [(0.8, 20.0), (0.6, 10.0), (0.9, 50.0), (0.5, 5.0), (0.0, 20.0),
                                              (1.0, 4.0), (0.95, 1.5)])
def test_plan_cost_ratio_json(capsys, alpha, cost_ratio):
    out = plan_json(capsys, "--alpha", str(alpha), "--cost-ratio", str(cost_ratio))
    assert set(out) == {"gamma", "tokens_per_step", "speedup"}
    gamma = brute_force(alpha, cost_ratio, 16)  # default --max-gamma is 16
    assert out["gamma"] == gamma and isinstance(out["gamma"], int)
    assert out["tokens_per_step"] == pytest.approx(closed_form_tokens(alpha, gamma), rel=1e-12)
    assert out["speedup"] == pytest.approx(closed_form_speedup(alpha, gamma, cost_ratio), rel=1e-12)


def test_plan_known_value(capsys):
    out = plan_json(capsys, "--alpha", "0.8", "--cost-ratio", "20")
    assert out["gamma"] == 8
    assert out["tokens_per_step"] == pytest.approx((1 - 0.8**9) / 0.2)
    assert out["speedup"] == pytest.approx((1 - 0.8**9) / 0.2 / 1.4)


def test_plan_fixed_gamma(capsys):
    out = plan_json(capsys, "--alpha", "0.8", "--gamma", "4")
    assert out == {"gamma": 4, "tokens_per_step": pytest.approx((1 - 0.8**5) / (1 - 0.8))}
    assert plan_json(capsys, "--alpha", "1", "--gamma", "4")["tokens_per_step"] == 5.0
    assert plan_json(capsys, "--alpha", "0.3", "--gamma", "0")["tokens_per_step"] == 1.0


@pytest.mark.parametrize("max_gamma", [0, 1, 3, 7, 30])
def test_plan_max_gamma_honored(capsys, max_gamma):
    out = plan_json(capsys, "--alpha", "0.99", "--cost-ratio", "1000", "--max-gamma", str(max_gamma))
    assert out["gamma"] == brute_force(0.99, 1000.0, max_gamma)
    assert out["gamma"] <= max_gamma
    if max_gamma <= 7:
        assert out["gamma"] == max_gamma  # drafting pays all the way up to the cap here


def test_plan_text_output(capsys):
    main(["plan", "--alpha", "0.8", "--cost-ratio", "20"])
    out = capsys.readouterr().out
    assert out.startswith("gamma 8: ")
    assert f"{(1 - 0.8**9) / 0.2:.3f} tokens per target pass" in out
    assert f"speedup {(1 - 0.8**9) / 0.2 / 1.4:.3f}x" in out
    main(["plan", "--alpha", "0.8", "--gamma", "4"])
    out = capsys.readouterr().out
    assert out.startswith("gamma 4: 3.362 tokens per target pass") and "speedup" not in out


@pytest.mark.parametrize("args", [
    ["--alpha", "1.5", "--cost-ratio", "20"],
    ["--alpha", "-0.1", "--gamma", "3"],
    ["--alpha", "nan", "--gamma", "3"],
    ["--alpha", "0.8", "--cost-ratio", "0"],
    ["--alpha", "0.8", "--cost-ratio", "-5"],
    ["--alpha", "0.8", "--gamma", "-1"],
])
def test_plan_rejects_bad_values(capsys, args):
    with pytest.raises(SystemExit) as e:
        main(["plan", *args, "--json"])
    assert e.value.code != 0 and e.value.code is not None
    assert "tandem plan:" in str(e.value.code)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("args", [
    ["--alpha", "0.8"],  # neither --cost-ratio nor --gamma
    ["--alpha", "0.8", "--cost-ratio", "20", "--gamma", "3"],  # both
    ["--cost-ratio", "20"],  # no --alpha
    ["--alpha", "abc", "--gamma", "3"],
])
def test_plan_usage_errors(capsys, args):
    with pytest.raises(SystemExit) as e:
        main(["plan", *args])
    assert e.value.code == 2  # argparse's usage error
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("argv", [["--cost-ratio", "nan"], ["--cost-ratio", "20", "--max-gamma", "-1"]])
def test_plan_refuses_nan_cost_ratio_and_negative_max_gamma(argv):
    with pytest.raises(SystemExit) as info:
        main(["plan", "--alpha", "0.8", *argv])
    assert info.value.code != 0
