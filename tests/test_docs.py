"""The documentation's one configuration table (docs/configuration.md) against what it
describes: the `tandem` command's parser, the orchestrator's configuration and the Helm chart's
values. A flag, a config field or a chart value that drifts from the table fails here.

A row's cells name things in code spans, each optionally followed by `(default `X`)` where its
default differs from the row's default column:

    | `up --max-gamma`, `orchestrator --max-gamma` | `max_gamma` | `orchestrator.maxGamma` | `8` | ... |
"""

import argparse
import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from tandem import cli
from tandem.orchestrator.config import OrchestratorConfig

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "configuration.md"
VALUES = ROOT / "helm" / "tandem" / "values.yaml"
COMMANDS = ("up", "orchestrator", "worker")  # the serving commands: every flag of theirs is in the table
NAMED = re.compile(r"`([^`]+)`(?:\s*\(default `([^`]*)`\))?")


def _named(cell: str) -> list[tuple[str, str | None]]:
    """A cell's names, each with the default it states (None: the row's)."""
    return [(m.group(1), m.group(2)) for m in NAMED.finditer(cell)]


def _rows() -> list[dict]:
    lines = TABLE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| CLI flag | config field | Helm value |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"a row of five cells: {line}"
        flags, field, helm, default, _ = cells
        value = NAMED.fullmatch(default)
        assert value and value.group(2) is None, f"the default column is one code span: {line}"
        rows.append({"flags": _named(flags), "fields": _named(field), "helm": _named(helm), "default": value.group(1)})
    assert rows, f"no configuration table in {TABLE}"
    return rows


ROWS = _rows()


def _norm(value) -> str:
    """A default as the table writes it."""
    if value is None or value == "":
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(map(_norm, value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def _option(command: str, flag: str) -> argparse.Action:
    for action in _subparsers()[command]._actions:
        if flag in action.option_strings:
            return action
    raise AssertionError(f"`tandem {command}` has no {flag}")


def _values(path: str):
    node = yaml.safe_load(VALUES.read_text())
    for key in path.split("."):
        assert isinstance(node, dict) and key in node, f"values.yaml has no {path}"
        node = node[key]
    return node


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch):
    """The defaults as a fresh shell sees them: REDIS_URL and TANDEM_API_KEY unset."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("TANDEM_API_KEY", raising=False)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: (r["flags"] + r["fields"] + r["helm"])[0][0])
def test_each_flag_has_the_tables_default(row):
    for name, differs in row["flags"]:
        command, flag = name.split(" ")
        action = _option(command, flag)
        expected = differs or row["default"]
        if expected == "required":
            assert action.required, f"tandem {command} {flag} is required"
        elif flag.startswith("--no-"):  # a switch that turns a setting off: the setting's default
            assert isinstance(action, argparse._StoreTrueAction) and _norm(not action.default) == expected, flag
        else:
            assert _norm(action.default) == expected, f"tandem {command} {flag}: {action.default!r}, table {expected}"


@pytest.mark.parametrize("row", [r for r in ROWS if r["fields"]], ids=lambda r: r["fields"][0][0])
def test_each_config_field_has_the_tables_default(row):
    """The field's value in the config `tandem orchestrator` builds from its flags' defaults (the
    chart's RayService builds it the same way, through tandem.serve_app): the row's default; the
    dataclass's own default: the row's, or the one the field cell states."""
    fields = {f.name: f for f in dataclasses.fields(OrchestratorConfig)}
    (name, differs), = row["fields"]
    assert name in fields, f"OrchestratorConfig has no field {name}"
    if row["default"] == "required":
        assert fields[name].default is dataclasses.MISSING, f"OrchestratorConfig.{name} has a default"
        return
    if any(flag.startswith("orchestrator ") for flag, _ in row["flags"]):
        args = cli.parser().parse_args(["orchestrator", "--draft", "d:1", "--target", "t:2"])
        built = getattr(cli.orchestrator_config(args), name)
        assert _norm(built) == row["default"], f"tandem orchestrator builds {name}={built!r}, table {row['default']}"
    if fields[name].default is not dataclasses.MISSING:
        assert _norm(fields[name].default) == (differs or row["default"]), \
            f"OrchestratorConfig.{name} defaults to {fields[name].default!r}"


@pytest.mark.parametrize("row", [r for r in ROWS if r["helm"]], ids=lambda r: r["helm"][0][0])
def test_each_chart_value_has_the_tables_default(row):
    for path, differs in row["helm"]:
        value = _values(path)
        if isinstance(value, dict):  # a block of its own (a model source): the chart's guide has its fields
            assert differs is None, f"{path} is a mapping, it has no one default"
            continue
        expected = differs or row["default"]
        assert _norm(value) == expected, f"values.yaml {path}: {value!r}, table {expected}"


def test_every_flag_of_the_serving_commands_is_in_the_table():
    documented = {name for row in ROWS for name, _ in row["flags"]}
    for command in COMMANDS:
        for action in _subparsers()[command]._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"{command} {flag}" in documented, f"docs/configuration.md lacks `{command} {flag}`"


def test_every_config_field_is_in_the_table():
    documented = {name for row in ROWS for name, _ in row["fields"]}
    missing = {f.name for f in dataclasses.fields(OrchestratorConfig)} - documented
    assert not missing, f"docs/configuration.md lacks the config fields {sorted(missing)}"


def test_every_chart_value_of_the_orchestrators_flags_is_in_the_table():
    """The chart's orchestrator settings that become flags of `tandem orchestrator`: its scalars and
    lists of numbers, but for the pods' own (their kind and priority class)."""
    documented = {path for row in ROWS for path, _ in row["helm"]}
    pod = {"kind", "priorityClassName"}
    for key, value in _values("orchestrator").items():
        flag_like = (isinstance(value, (str, int, float, bool))
                     or (isinstance(value, list) and value and all(isinstance(v, int) for v in value)))
        if flag_like and key not in pod:
            assert f"orchestrator.{key}" in documented, f"docs/configuration.md lacks orchestrator.{key}"
