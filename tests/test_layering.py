"""Data flows one way: front door -> relax_pass -> (tir_schedules | mlir_bridge) -> TVM, and
every layer may use the shared vocabulary in ``scanweaver_core``, which imports nothing of
ours.  Read every module's imports (AST, function-level ones too) and fail on an upward or
sideways one."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = "scanweaver_core"
OURS = (CORE, "scanweaver_tvm", "relax_pass", "tir_schedules", "mlir_bridge")
# what each layer may import of ours, besides itself and the core
ALLOWED = {"tir_schedules": (), "mlir_bridge": (), "relax_pass": ("tir_schedules", "mlir_bridge"),
           CORE: ()}


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
            if top not in OURS or top == layer or (top == CORE and layer != CORE) or top in ALLOWED[layer]:
                continue
            found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_no_upward_or_sideways_imports(layer):
    assert _layer_violations(layer) == []


def test_the_shared_vocabulary_lives_in_the_core():
    """Spec, algebra, reference, the scan op and the affine analysis are core modules; the
    front door re-exports the public ones."""
    for name in ("spec", "algebra", "reference", "scan_op", "affine", "exprs", "targets"):
        assert (ROOT / CORE / f"{name}.py").is_file(), name
    import scanweaver_tvm as sw
    from scanweaver_core import spec
    assert sw.AffineScanSpec is spec.AffineScanSpec


def test_every_spec_is_reexported():
    """Every public class of ``scanweaver_core.spec`` (a spec, whatever module of it defines
    it) is ``scanweaver_tvm.<name>`` and ``scanweaver_tvm.spec.<name>``, and in their ``__all__``."""
    import inspect

    import scanweaver_tvm as sw
    from scanweaver_core import spec
    from scanweaver_tvm import spec as public

    classes = {name for name, obj in vars(spec).items() if inspect.isclass(obj) and not name.startswith("_")
               and obj.__module__.startswith(spec.__name__)}
    assert {"AffineScanSpec", "MatrixScanSpec", "DeltaScanSpec"} <= classes
    for name in sorted(classes):
        assert getattr(sw, name, None) is getattr(spec, name), name
        assert getattr(public, name, None) is getattr(spec, name), name
        assert name in sw.__all__ and name in spec.__all__, name


@pytest.mark.parametrize("layer,source,found", [
    ("mlir_bridge", "def f():\n    from tir_schedules import realize\n", "tir_schedules"),
    ("scanweaver_core", "from relax_pass.lift import Lifter\n", "relax_pass.lift"),
])
def test_the_checker_sees_a_violation(tmp_path, monkeypatch, layer, source, found):
    """A test that cannot fail proves nothing: a planted upward import is found (a sideways one
    between realizations, and the core importing a layer)."""
    fake = tmp_path / layer
    fake.mkdir()
    (fake / "bad.py").write_text(source)
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert _layer_violations(layer) == [f"{layer}/bad.py imports {found}"]
