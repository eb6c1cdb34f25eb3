"""Imports point one way, read from the source of every installed module:

    tandem.math (pure; only its `sampling`, `block`, `tree_sampling` and `tree_greedy` use torch)
      ↑
    tandem.wire (the codec and validation every side shares) ← the SDK (tandem, tandem.sdk)
    tandem.rules (the verification rules: both halves; torch only inside a worker half)
      ↑
    tandem.services (workers)        tandem.orchestrator (reaches workers only over gRPC)
      ↑                                ↑
    the top: cli, serve_app, local, suitability, bench

Everything installed imports under `tandem.`, never as a bare `services` or `orchestrator`.
The tests import what they share from tests/support/, never from one another.
"""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where each installed package's source lives (pyproject.toml's package-dir).
PACKAGE_DIRS = {"tandem": ROOT / "tandem", "tandem.services": ROOT / "services",
                "tandem.orchestrator": ROOT / "orchestrator"}
SDK = ("tandem", "tandem.sdk", "tandem.sdk.client", "tandem.sdk.errors")
THIRD_PARTY_OF_THE_SDK = {"grpc", "google", "opentelemetry"}  # OpenTelemetry only if the caller has it


def _modules() -> dict[str, Path]:
    modules = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


MODULES = _modules()


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (a function's lazy imports count too);
    `from a import b` counts as a and a.b, since b may be a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import; tandem imports absolutely"
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _in(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _imports_of(*packages: str) -> dict[str, set[str]]:
    return {m: imports(p) for m, p in MODULES.items() if _in(m, *packages)}


def test_the_tree_is_what_the_wheel_installs():
    assert {"tandem.sdk.client", "tandem.wire.generation", "tandem.math.sampling", "tandem.services.server",
            "tandem.orchestrator.cycle", "tandem.cli", "tandem.serve_app"} <= set(MODULES)


@pytest.mark.parametrize("folder", ["tandem", "services", "orchestrator", "tests", "benchmarks", "models"])
def test_everything_imports_under_tandem(folder):
    for path in (ROOT / folder).rglob("*.py"):
        bare = {m for m in imports(path) if _in(m, "services", "orchestrator")}
        assert not bare, f"{path.relative_to(ROOT)} imports {sorted(bare)}; use tandem.services / tandem.orchestrator"


def test_tests_share_helpers_through_support_never_through_each_other():
    """What several test modules use lives in tests/support/; tests/ itself holds only test
    modules and conftest.py, and nothing imports a test module or conftest.py."""
    tests = ROOT / "tests"
    assert {p.name for p in tests.glob("*.py") if not p.name.startswith("test_")} == {"conftest.py"}
    test_modules = {p.stem for p in tests.glob("*.py")}
    for path in tests.rglob("*.py"):
        reached = {m for m in imports(path) if m.split(".")[0] in test_modules}
        assert not reached, f"{path.relative_to(ROOT)} imports {sorted(reached)}; share it through tests/support/"


def test_the_sdk_needs_only_grpc_protobuf_the_wire_and_the_pure_math():
    allowed = ("tandem.sdk", "tandem.wire.generation", "tandem.wire.validation", "tandem.v1",
               "tandem.math.acceptance")
    for module in (*SDK, "tandem.wire.generation"):
        for name in imports(MODULES[module]):
            top = name.split(".")[0]
            assert (top in sys.stdlib_module_names or top in THIRD_PARTY_OF_THE_SDK or _in(name, *allowed)
                    or name == "tandem.wire"), f"{module} imports {name}"


def test_the_wire_is_plain_python_and_protobuf():
    for module, found in _imports_of("tandem.wire").items():
        for name in found:
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or top in {"grpc", "google"} or _in(
                name, "tandem.wire", "tandem.v1", "tandem.math.params", "tandem.math.acceptance"), f"{module} imports {name}"


# The math modules of the workers' half, the only ones that use torch.
TORCH_MATH = ("tandem.math.sampling", "tandem.math.block", "tandem.math.tree_sampling", "tandem.math.tree_greedy")


def test_the_math_is_the_bottom_layer_and_only_the_workers_half_uses_torch():
    for module, found in _imports_of("tandem.math").items():
        for name in found:
            top = name.split(".")[0]
            if module in TORCH_MATH and top == "torch":
                continue
            assert top in sys.stdlib_module_names or _in(name, "tandem.math"), f"{module} imports {name}"


def test_a_rule_loads_torch_only_inside_its_worker_half():
    """The orchestrator imports every rule: a rule module's own imports (its functions' aside)
    are the pure math's and the wire's types."""
    for module, path in MODULES.items():
        if not _in(module, "tandem.rules"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name for n in top_level if isinstance(n, ast.Import) for a in n.names} | {
            n.module for n in top_level if isinstance(n, ast.ImportFrom)}
        for name in names:
            assert name.split(".")[0] in sys.stdlib_module_names or (
                _in(name, "tandem.math", "tandem.rules") and not _in(name, *TORCH_MATH)
            ), f"{module} imports {name} at its top"


def test_workers_and_orchestrator_meet_only_on_the_wire():
    top = ("tandem.cli", "tandem.serve_app", "tandem.local", "tandem.suitability", "tandem.bench")
    for module, found in _imports_of("tandem.services").items():
        assert not {n for n in found if _in(n, "tandem.orchestrator", *top)}, f"{module} reaches past the wire"
    for module, found in _imports_of("tandem.orchestrator").items():
        reached = {n for n in found if _in(n, "tandem.services", *TORCH_MATH, "torch", *top)}
        assert not reached, f"{module} reaches past the wire"


def test_only_the_wire_builds_messages():
    for module, found in _imports_of("tandem").items():
        messages = {n for n in found if _in(n, "tandem.v1") and n.endswith("_pb2")}
        assert not messages or _in(module, "tandem.wire", "tandem.v1"), f"{module} imports {sorted(messages)}"


def test_the_cli_offers_the_verification_modes_draft_shapes_and_drafters_there_are():
    from tandem import cli, local
    from tandem.wire.generation import DRAFT_SHAPES, TREE_RULES, VERIFICATION_MODES

    assert cli.VERIFICATIONS == VERIFICATION_MODES  # the CLI keeps its own copy: it imports no wire at start
    assert cli.DRAFT_SHAPES == DRAFT_SHAPES
    assert cli.TREE_RULES == TREE_RULES
    assert cli.DRAFTERS == local.DRAFTERS  # nor tandem.local
