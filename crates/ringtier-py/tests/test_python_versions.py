"""The package's Python code stays importable on the oldest CPython the wheels are built for.

build-wheels.sh builds version-specific wheels for CPython 3.9 and 3.10 beside the abi3 one
(>= 3.11). This machine has no 3.9/3.10 interpreter to import them, so the Python half is
checked statically here: it parses as 3.9 grammar, every module postpones annotations (PEP 604
``X | None`` in a signature is not evaluated on 3.9), and none calls an API newer than 3.9.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import ringtier

# The package as installed (the wheel's copy in CI, the source build's here): the same files.
PACKAGE = pathlib.Path(ringtier.__file__).resolve().parent
OLDEST = (3, 9)

# Calls and names that fail at run time on 3.9 (the grammar check cannot see them).
NEWER_APIS = {
    r"\bzip\([^)]*strict\s*=": "zip(strict=) is 3.10",
    r"dataclass\([^)]*(slots|kw_only)\s*=": "dataclass(slots=/kw_only=) is 3.10",
    r"\bTypeAlias\b": "typing.TypeAlias is 3.10",
    r"\bParamSpec\b": "typing.ParamSpec is 3.10",
    r"\bimport tomllib\b": "tomllib is 3.11",
    r"\bExceptionGroup\b": "ExceptionGroup is 3.11",
    r"\.add_note\(": "BaseException.add_note is 3.11",
    r"\bdatetime\.UTC\b": "datetime.UTC is 3.11",
    r"from typing import [^\n]*\bSelf\b": "typing.Self is 3.11",
    r"isinstance\([^)]*\|": "isinstance with X | Y is 3.10",
    r"\bint\.bit_count\b|\.bit_count\(\)": "int.bit_count is 3.10",
    r"\baiter\(|\banext\(": "aiter/anext are 3.10",
}


def modules():
    found = sorted(PACKAGE.rglob("*.py"))
    assert found, f"no Python modules under {PACKAGE}"
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_runs_on_the_oldest_python(path: pathlib.Path) -> None:
    src = path.read_text()
    tree = ast.parse(src, filename=str(path), feature_version=OLDEST)
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Match), f"{path}:{node.lineno}: match is 3.10"
    has_annotations = any(
        isinstance(n, (ast.AnnAssign, ast.arg)) and getattr(n, "annotation", None) is not None
        or isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns is not None
        for n in ast.walk(tree)
    )
    if has_annotations:
        postponed = any(
            isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
            for n in tree.body
        )
        assert postponed, f"{path}: annotations without `from __future__ import annotations` (PEP 604 unions fail on 3.9)"
    code = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith("#"))
    for pattern, why in NEWER_APIS.items():
        m = re.search(pattern, code)
        assert m is None, f"{path}: {why}: {m.group(0)!r}"


def test_the_checks_catch_what_they_look_for(tmp_path: pathlib.Path) -> None:
    """The static checks are not vacuous: each kind of 3.10+ code is refused."""
    with pytest.raises(SyntaxError):
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=OLDEST)
    assert re.search(next(iter(NEWER_APIS)), "for a, b in zip(xs, ys, strict=True):")
    assert re.search(r"isinstance\([^)]*\|", "isinstance(v, int | str)")
