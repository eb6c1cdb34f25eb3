"""The generated wire code is exactly what scripts/gen_protos.sh makes from protos/."""

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_code_matches_the_protos(tmp_path):
    subprocess.run(["bash", str(ROOT / "scripts/gen_protos.sh"), str(tmp_path)], check=True,
                   env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    fresh = sorted(p.name for p in (tmp_path / "tandem/v1").iterdir())
    assert fresh, "protoc generated nothing"
    for name in fresh:
        assert filecmp.cmp(tmp_path / "tandem/v1" / name, ROOT / "tandem/v1" / name, shallow=False), (
            f"tandem/v1/{name} is stale: run scripts/gen_protos.sh")


def test_every_rpc_and_field_is_documented():
    for proto in (ROOT / "protos/tandem/v1").glob("*.proto"):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            code = line.strip()
            is_field = code.endswith(";") and "=" in code and not code.startswith(("syntax", "package", "option"))
            if code.startswith("rpc ") or is_field:
                assert lines[i - 1].strip().startswith("///"), f"{proto.name}:{i + 1} lacks a /// comment"
