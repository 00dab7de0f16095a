"""The package's layout: no import cycle between its modules (read from their source, and
imported in fresh interpreters in several orders), the names ``ringtier.torch`` had as one
module still importable, and ``PathLike`` defined once."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

# Found without importing it: a cycle fails the tests below, not the collection.
_SPEC = importlib.util.find_spec("ringtier")
assert _SPEC is not None and _SPEC.origin is not None, "ringtier is not installed"
PACKAGE_DIR = Path(_SPEC.origin).parent


def package_modules(root: Path = PACKAGE_DIR, name: str = "ringtier") -> Dict[str, Path]:
    """Every Python module of the package under `root`: dotted name -> source file."""
    modules: Dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join([name, *parts])] = path
    return modules


def extension_modules(root: Path = PACKAGE_DIR, name: str = "ringtier") -> List[str]:
    """The compiled modules of the package (``ringtier._ringtier``), built or stubbed."""
    return sorted({f"{name}.{p.name.split('.')[0]}" for p in [*root.glob("*.so"), *root.glob("*.pyi")]})


def imports_of(module: str, path: Path, known: Set[str]) -> Set[str]:
    """The package's modules that `module` imports, at any depth of its source (a function's
    deferred import is a dependency too: it is how two modules came to import each other)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            # `from X import name`: the submodule X.name where there is one, else X itself.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        # Modules outside the package (torch) are not in `known`; a parent package imported on
        # the way to a module is not counted (Python initialises it first, whoever imports).
        out.update(t for t in targets if t in known and t != module)
    return out


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """A cycle of `graph` (as the list of its modules, the first repeated last), or None."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(m: str) -> Optional[List[str]]:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def import_graph(root: Path = PACKAGE_DIR, name: str = "ringtier") -> Dict[str, Set[str]]:
    modules = package_modules(root, name)
    known = set(modules) | set(extension_modules(root, name))
    return {m: imports_of(m, p, known) for m, p in modules.items()}


def test_the_package_has_the_modules_by_concept():
    modules = set(package_modules())
    for m in [
        "ringtier",
        "ringtier._types",
        "ringtier._state_dict_codec",
        "ringtier.checkpoint",
        "ringtier.errors",
        "ringtier.torch",
        "ringtier.torch.data",
        "ringtier.torch.records",
        "ringtier.torch.checkpoint",
        "ringtier.torch.distributed",
        "ringtier.torch.dcp",
    ]:
        assert m in modules, f"{m} is missing from {sorted(modules)}"
    assert extension_modules() == ["ringtier._ringtier"]


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert graph["ringtier.torch.records"], "the import graph was not read"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_deferred_cycle(tmp_path: Path):
    # Two modules that import each other, one of them only inside a function (what
    # `torch.py` and `_torch_records.py` did), and a third outside the cycle.
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .sub import a\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from . import b\nimport os\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .a import x\n    return x\n")
    (pkg / "c.py").write_text("from .sub.b import f\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.c"] == {"pkg.sub.b"}
    assert find_cycle(graph) == ["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"]


# Modules that need an optional framework: module -> the framework's import name.
OPTIONAL = {"ringtier.torch.lightning": "lightning"}


def import_orders() -> List[List[str]]:
    """Every module first (then the rest sorted), the sorted and reversed orders, and a few
    seeded shuffles."""
    mods = sorted(set(package_modules()) | set(extension_modules()))
    # A module for an optional framework imports only where that framework is installed.
    mods = [m for m in mods if m not in OPTIONAL or importlib.util.find_spec(OPTIONAL[m]) is not None]
    orders = [[m] + [n for n in mods if n != m] for m in mods]
    orders += [mods, mods[::-1]]
    rng = random.Random(25)
    for _ in range(3):
        shuffled = list(mods)
        rng.shuffle(shuffled)
        orders.append(shuffled)
    return orders


# Run in a fresh interpreter: imports the modules of each order in turn, forgetting the
# package's Python modules between orders (the compiled one, which imports nothing of the
# package, stays: it cannot be initialised twice in a process; torch stays imported).
IMPORT_ORDERS = """
import importlib, json, sys
for order in json.loads(sys.argv[1]):
    for name in [n for n in sys.modules if n == "ringtier" or n.startswith("ringtier.")]:
        if name != "ringtier._ringtier":
            del sys.modules[name]
    for m in order:
        try:
            importlib.import_module(m)
        except Exception as e:
            sys.exit(f"importing {order}: {m} failed: {type(e).__name__}: {e}")
"""


def test_every_module_imports_in_a_fresh_interpreter_in_any_order():
    pytest.importorskip("torch")  # ringtier.torch imports torch
    orders = import_orders()
    interpreters = 3  # each runs every third order, its first in a truly fresh process

    def run(i: int) -> Optional[str]:
        mine = orders[i::interpreters]
        p = subprocess.run(
            [sys.executable, "-c", IMPORT_ORDERS, json.dumps(mine)],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
            cwd=str(Path(__file__).parent),
        )
        return None if p.returncode == 0 else p.stderr[-3000:]

    with ThreadPoolExecutor(max_workers=interpreters) as pool:
        failures = [f for f in pool.map(run, range(interpreters)) if f]
    assert not failures, "\n\n".join(failures)


def test_the_names_of_the_old_torch_module_still_import():
    pytest.importorskip("torch")  # ringtier.torch imports torch
    import ringtier
    import ringtier.torch as rt
    from ringtier.torch import (  # noqa: F401  (every name users could import before the split)
        CheckpointStore,
        DistributedCheckpointStore,
        DistributedSaveFuture,
        IterableDataset,
        Loader,
        PathLike,
        RecordDataset,
        SaveFuture,
        _rank_world,
        _step,
        _to_tensor,
    )

    assert set(rt.__all__) >= {"IterableDataset", "DistributedCheckpointStore", "DistributedSaveFuture", "RecordDataset",
                               "PackedBatch"}
    assert rt.PackedBatch is rt._packed.PackedBatch
    assert rt.CheckpointStore is ringtier.CheckpointStore
    assert rt.SaveFuture is ringtier.SaveFuture
    assert rt.Loader is ringtier.Loader
    assert rt.IterableDataset is rt.data.IterableDataset
    assert rt.RecordDataset is rt.records.RecordDataset
    assert rt.DistributedCheckpointStore is rt.distributed.DistributedCheckpointStore
    assert _rank_world(1, 4) == (1, 4)
    for name in rt.__all__:
        assert getattr(rt, name).__module__.startswith("ringtier.torch."), name


def test_pathlike_is_defined_once():
    pytest.importorskip("torch")  # ringtier.torch imports torch
    import ringtier
    from ringtier._types import PathLike

    defined = []
    for module, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(isinstance(t, ast.Name) and t.id == "PathLike" for t in targets):
                defined.append(module)
    assert defined == ["ringtier._types"]
    import ringtier.checkpoint
    import ringtier.torch.data
    import ringtier.torch.distributed
    import ringtier.torch.records

    for m in [ringtier, ringtier.checkpoint, ringtier.torch, ringtier.torch.data, ringtier.torch.records, ringtier.torch.distributed]:
        assert m.PathLike is PathLike, m.__name__


@pytest.mark.parametrize("old", ["ringtier._state", "ringtier._torch_records"])
def test_the_old_module_names_are_gone(old: str):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_ringtier_grain_imports_grain_only_for_file_dataset():
    """``import ringtier.grain`` does not import grain; ``FileDataset`` without grain says what
    to install (grain blocked in a fresh interpreter, as where it is not installed)."""
    code = (
        "import sys\n"
        "sys.modules['grain'] = None\n"
        "import ringtier.grain as g\n"
        "assert g.FileSource is not None\n"
        "try:\n"
        "    g.FileDataset\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pip install 'ringtier[grain]'" in out.stdout, out.stdout
