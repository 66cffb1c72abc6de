"""ROSE's layout holds what the design promises: every module imports on a machine without CUDA,
no module imports another that imports it back, a handful of modules at the top level, and the
feature switches are flags (none is read from an undocumented environment variable)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import rose

ROOT = Path(rose.__file__).parent
REPO = ROOT.parents[1]


def rose_modules() -> list[str]:
    return ["rose", *(m.name for m in pkgutil.walk_packages(rose.__path__, "rose."))]


def module_file(name: str) -> Path:
    parts = name.split(".")[1:]
    package = ROOT.joinpath(*parts) / "__init__.py"
    return package if package.exists() else ROOT.joinpath(*parts).with_suffix(".py")


def imports_at_load(name: str) -> set[str]:
    """The rose modules `name` imports when it is loaded (not under TYPE_CHECKING, not in functions)."""
    tree = ast.parse(module_file(name).read_text())
    found: set[str] = set()
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for target in targets:
            if target.startswith("rose") and module_file(target).exists():
                found.add(target)
    return found - {name}


def test_every_module_imports_without_cuda() -> None:
    for name in rose_modules():
        importlib.import_module(name)


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = {name: imports_at_load(name) for name in rose_modules()}
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        for target in graph.get(name, ()):
            if target in path:
                cycles.append(path[path.index(target) :] + [target])
            elif len(path) < 12:
                visit(target, [*path, target])

    for name in graph:
        visit(name, [name])

    # A package's __init__ is loaded before its modules; those edges alone are not cycles.
    def nested(a: str, b: str) -> bool:
        return b.startswith(a + ".") or a.startswith(b + ".")

    real = [c for c in cycles if not all(nested(a, b) for a, b in zip(c, c[1:], strict=False))]
    assert not real, real[:3]


def test_the_top_level_holds_a_handful_of_modules() -> None:
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= 5, top


def test_the_start_up_modules_import_without_torch() -> None:
    code = "import sys, rose.loading.prestart, rose.decoder; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_no_feature_is_switched_by_an_undocumented_environment_variable() -> None:
    sources = [*ROOT.rglob("*.py"), *(REPO / "crates").rglob("*.rs")]
    assert not [str(p) for p in sources if "ROSE_FUSED_DECODER" in p.read_text()]
