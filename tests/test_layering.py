"""Data flows one way: front door -> relax_pass -> (tir_schedules | mlir_bridge) -> TVM.  Read
every module's imports (AST, function-level ones too) and fail on an upward or sideways one."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = {"scanweaver_tvm", "scanweaver_tvm.spec", "scanweaver_tvm.algebra", "scanweaver_tvm.reference",
        "scanweaver_tvm.targets"}
OURS = ("scanweaver_tvm", "relax_pass", "tir_schedules", "mlir_bridge")
# what each layer may import of ours, besides itself and the core vocabulary
ALLOWED = {"tir_schedules": (), "mlir_bridge": (), "relax_pass": ("tir_schedules", "mlir_bridge")}


def _imports(path, package):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:                          # relative: inside the same package
                yield package
            elif node.module:
                yield node.module


def _layer_violations(layer):
    found = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for name in _imports(path, layer):
            top = name.split(".")[0]
            if top not in OURS or top == layer or name in CORE or top in ALLOWED[layer]:
                continue
            found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_no_upward_or_sideways_imports(layer):
    assert _layer_violations(layer) == []


def test_core_imports_nothing_above_it():
    for name in ("spec", "algebra", "reference", "targets"):
        path = ROOT / "scanweaver_tvm" / f"{name}.py"
        ours = [m for m in _imports(path, "scanweaver_tvm") if m.split(".")[0] in OURS and m not in CORE]
        assert ours == [], f"scanweaver_tvm/{name}.py imports {ours}"


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """A test that cannot fail proves nothing: a planted upward import is found."""
    fake = tmp_path / "mlir_bridge"
    fake.mkdir()
    (fake / "bad.py").write_text("def f():\n    from tir_schedules import realize\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert _layer_violations("mlir_bridge") == ["mlir_bridge/bad.py imports tir_schedules"]
