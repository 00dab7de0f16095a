"""The hand-written stubs (``ringtier/_ringtier.pyi``) against the compiled module: every class,
function, method, property and attribute of one is in the other, of the same kind, and the
parameters match where the module states them (``__text_signature__``). Fails on drift."""

from __future__ import annotations

import ast
import ctypes
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

import ringtier._ringtier as ext

STUB = Path(importlib.util.find_spec("ringtier").origin).parent / "_ringtier.pyi"  # type: ignore[union-attr, arg-type]

# Dunder methods a stub states because they type the class (len(), x[i], iteration, `in`);
# others (__repr__, __new__, comparisons) come from object or are pyo3's.
PROTOCOL_DUNDERS = {
    "__len__",
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__contains__",
    "__iter__",
    "__next__",
    "__enter__",
    "__exit__",
    "__call__",
    "__bool__",
}

# `__buffer__` in a stub (PEP 688) stands for the buffer protocol, checked on the type's slot.
BUFFER = "__buffer__"


@dataclass
class StubParam:
    name: str
    kind: inspect._ParameterKind
    default: Any  # inspect.Parameter.empty, Ellipsis (unstated) or a literal


@dataclass
class StubFunction:
    params: List[StubParam]


@dataclass
class StubClass:
    methods: Dict[str, StubFunction] = field(default_factory=dict)
    data: set = field(default_factory=set)  # properties and attributes


NO_DEFAULT = inspect.Parameter.empty


def _default(node: Optional[ast.expr]) -> Any:
    if node is None:
        return NO_DEFAULT
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ...  # an expression (4 << 20): stated, not compared


def _stub_function(fn: ast.FunctionDef) -> StubFunction:
    a = fn.args
    params: List[StubParam] = []
    positional = a.posonlyargs + a.args
    defaults: List[Optional[ast.expr]] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, d) in enumerate(zip(positional, defaults)):
        kind = inspect.Parameter.POSITIONAL_ONLY if i < len(a.posonlyargs) else inspect.Parameter.POSITIONAL_OR_KEYWORD
        params.append(StubParam(arg.arg, kind, _default(d)))
    if a.vararg:
        params.append(StubParam(a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, NO_DEFAULT))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        params.append(StubParam(arg.arg, inspect.Parameter.KEYWORD_ONLY, _default(d)))
    if a.kwarg:
        params.append(StubParam(a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, NO_DEFAULT))
    return StubFunction(params)


def read_stub(text: str) -> Tuple[Dict[str, StubClass], Dict[str, StubFunction], set]:
    """(classes, functions, module attributes) a stub declares. A plain assignment (`_Buffer =
    Any`) is a type alias of the stub, not an entry."""
    classes: Dict[str, StubClass] = {}
    functions: Dict[str, StubFunction] = {}
    attributes = set()
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef):
            cls = StubClass()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    decorators = {d.id for d in item.decorator_list if isinstance(d, ast.Name)}
                    if "property" in decorators:
                        cls.data.add(item.name)
                    else:
                        cls.methods[item.name] = _stub_function(item)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    cls.data.add(item.target.id)
            classes[node.name] = cls
        elif isinstance(node, ast.FunctionDef):
            functions[node.name] = _stub_function(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            attributes.add(node.target.id)
    return classes, functions, attributes


def exports_buffer(cls: type) -> bool:
    """Whether the type fills the buffer protocol's `bf_getbuffer` slot."""
    get_slot = ctypes.pythonapi.PyType_GetSlot
    get_slot.argtypes = [ctypes.py_object, ctypes.c_int]
    get_slot.restype = ctypes.c_void_p
    Py_bf_getbuffer = 1
    return bool(get_slot(cls, Py_bf_getbuffer))


def is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def runtime_members(cls: type) -> Tuple[Dict[str, Any], set]:
    """(methods, data members) the class defines itself, as a stub would state them."""
    methods: Dict[str, Any] = {}
    data = set()
    for name, member in vars(cls).items():
        if is_dunder(name) and name not in PROTOCOL_DUNDERS:
            continue
        if inspect.isdatadescriptor(member):
            data.add(name)
        elif callable(member):
            methods[name] = member
        else:
            data.add(name)
    return methods, data


def has_constructor(cls: type) -> bool:
    """Whether the class has a ``#[new]``. Before Python 3.10 every PyO3 class has a ``__new__``
    of its own, which for a class without one refuses to create an instance."""
    if "__new__" not in vars(cls):
        return False
    if sys.version_info >= (3, 10):
        return True
    try:
        cls.__new__(cls)
    except TypeError as e:
        return not ("cannot create" in str(e) or "No constructor defined" in str(e))
    except Exception:
        pass
    return True


def runtime_signature(obj: Any, bound: bool) -> Optional[inspect.Signature]:
    """The signature the module states for `obj` (None where it states none); `bound` drops
    the leading `self`."""
    if getattr(obj, "__text_signature__", None) is None:
        return None
    try:
        sig = inspect.signature(obj)
    except (ValueError, TypeError):
        return None
    params = list(sig.parameters.values())
    if bound and params and params[0].name in ("self", "$self"):
        params = params[1:]
    return sig.replace(parameters=params)


def compare_params(where: str, stub: StubFunction, runtime: inspect.Signature, bound: bool) -> List[str]:
    stub_params = stub.params[1:] if bound else stub.params
    problems = []
    got = [(p.name, p.kind, p.default) for p in runtime.parameters.values()]
    want = [(p.name, p.kind, p.default) for p in stub_params]
    if len(got) != len(want):
        return [f"{where}: the module takes ({runtime}), the stub ({', '.join(p.name for p in stub_params)})"]
    for (rname, rkind, rdef), (sname, skind, sdef) in zip(got, want):
        if rkind == inspect.Parameter.POSITIONAL_ONLY:
            # A positional-only name (a slot's `key`) is not part of the interface.
            if skind not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
                problems.append(f"{where}: parameter {sname!r} is positional in the module, {skind.name} in the stub")
            continue
        if rname != sname:
            problems.append(f"{where}: parameter {sname!r} of the stub is {rname!r} in the module ({runtime})")
            continue
        if rkind != skind:
            problems.append(f"{where}: parameter {rname!r} is {rkind.name} in the module, {skind.name} in the stub")
        if (rdef is NO_DEFAULT) != (sdef is NO_DEFAULT):
            problems.append(f"{where}: parameter {rname!r} has a default in only one of the module and the stub")
        elif rdef not in (NO_DEFAULT, ...) and sdef not in (NO_DEFAULT, ...) and rdef != sdef:
            problems.append(f"{where}: parameter {rname!r} defaults to {rdef!r} in the module, {sdef!r} in the stub")
    return problems


def drift(module: Any, stub_text: str) -> List[str]:
    """Every difference between `module` and the stub `stub_text`; empty when they agree."""
    classes, functions, attributes = read_stub(stub_text)
    problems: List[str] = []
    names = {n for n in vars(module) if not is_dunder(n)} | ({"__version__"} & set(vars(module)))
    stub_names = set(classes) | set(functions) | attributes
    for n in sorted(names - stub_names):
        problems.append(f"{n}: in the module, not in the stub")
    for n in sorted(stub_names - names):
        problems.append(f"{n}: in the stub, not in the module")

    for n in sorted(set(functions) & names):
        obj = getattr(module, n)
        if not callable(obj) or isinstance(obj, type):
            problems.append(f"{n}: a function in the stub, a {type(obj).__name__} in the module")
            continue
        sig = runtime_signature(obj, bound=False)
        if sig is not None:
            problems += compare_params(n, functions[n], sig, bound=False)

    for n in sorted(attributes & names):
        if callable(getattr(module, n)):
            problems.append(f"{n}: an attribute in the stub, callable in the module")

    for cname in sorted(set(classes) & names):
        cls = getattr(module, cname)
        if not isinstance(cls, type):
            problems.append(f"{cname}: a class in the stub, a {type(cls).__name__} in the module")
            continue
        stub = classes[cname]
        methods, data = runtime_members(cls)
        stub_methods = {m for m in stub.methods if m not in ("__init__", BUFFER)}
        for m in sorted(set(methods) - stub_methods - stub.data):
            problems.append(f"{cname}.{m}: a method in the module, not in the stub")
        for m in sorted(data - stub.data - stub_methods):
            problems.append(f"{cname}.{m}: an attribute in the module, not in the stub")
        for m in sorted((stub_methods | stub.data) - set(methods) - data):
            problems.append(f"{cname}.{m}: in the stub, not in the module")
        for m in sorted(stub_methods & data):
            problems.append(f"{cname}.{m}: a method in the stub, an attribute (property) in the module")
        for m in sorted(stub.data & set(methods)):
            problems.append(f"{cname}.{m}: an attribute (property) in the stub, a method in the module")
        for m in sorted(stub_methods & set(methods)):
            sig = runtime_signature(methods[m], bound=True)
            if sig is not None:
                problems += compare_params(f"{cname}.{m}", stub.methods[m], sig, bound=True)
        # The constructor: stated in the stub exactly when the class has one.
        constructible = has_constructor(cls)
        if constructible != ("__init__" in stub.methods):
            problems.append(
                f"{cname}: the module {'has' if constructible else 'has no'} constructor, the stub "
                f"{'states one' if '__init__' in stub.methods else 'none'}"
            )
        elif constructible:
            sig = runtime_signature(cls, bound=False)
            if sig is not None:
                problems += compare_params(f"{cname}.__init__", stub.methods["__init__"], sig, bound=True)
        if exports_buffer(cls) != (BUFFER in stub.methods):
            problems.append(
                f"{cname}: {'exports' if exports_buffer(cls) else 'does not export'} a buffer, the stub "
                f"{'states' if BUFFER in stub.methods else 'does not state'} {BUFFER}"
            )
    return problems


def test_the_stubs_match_the_module():
    problems = drift(ext, STUB.read_text())
    assert not problems, "the stubs drifted from ringtier._ringtier:\n" + "\n".join(problems)


def test_the_check_sees_every_class_and_function():
    classes, functions, attributes = read_stub(STUB.read_text())
    assert {"Loader", "Sample", "RecordLoader", "Record", "RecordField", "CheckpointStore", "PartBuffer"} <= set(classes)
    assert {"serve_metrics", "metrics_text", "_engine_pid"} <= set(functions)
    assert attributes == {"__version__", "JPEG_DECODER", "HAS_S3"}
    assert runtime_signature(ext.Loader, bound=False) is not None, "the module states no signatures to compare"
    assert exports_buffer(ext.Sample) and not exports_buffer(ext.Loader)


def _without(text: str, line: str) -> str:
    assert line in text, line
    return text.replace(line, "", 1)


@pytest.mark.parametrize(
    "edit, expect",
    [
        # a method removed from the stub
        (lambda t: _without(t, "    def delete(self, step: int) -> None: ...\n"), "CheckpointStore.delete: a method in the module"),
        # a function removed
        (lambda t: _without(t, "def _engine_pid() -> int: ...\n"), "_engine_pid: in the module, not in the stub"),
        # a class renamed
        (lambda t: t.replace("class PartBuffer:", "class PartBuffers:"), "PartBuffers: in the stub, not in the module"),
        # a property removed
        (lambda t: t.replace("    def views(self) -> int: ...\n", "", 1), "PartBuffer.views: an attribute in the module"),
        # an attribute removed
        (lambda t: _without(t, "    shard_key: str\n"), "Record.shard_key: an attribute in the module"),
        # a method the module lacks
        (lambda t: t.replace("    def latest(self)", "    def newest(self) -> int: ...\n    def latest(self)", 1), "CheckpointStore.newest: in the stub, not in the module"),
        # a parameter renamed
        (lambda t: t.replace("def epoch_shards(self, epoch: int = 0)", "def epoch_shards(self, e: int = 0)", 1), "RecordLoader.epoch_shards: parameter 'e'"),
        # a parameter missing
        (lambda t: _without(t, "        keys: Optional[Sequence[str]] = None,\n"), "Loader.__init__: the module takes"),
        # a keyword-only parameter made positional
        (lambda t: t.replace("        path: Union[str, \"os.PathLike[str]\"],\n        *,\n        batch_size", "        path: Union[str, \"os.PathLike[str]\"],\n        batch_size", 1), "parameter 'batch_size' is KEYWORD_ONLY in the module"),
        # a default changed
        (lambda t: t.replace("        keep_last: int = 2,", "        keep_last: int = 3,", 1), "parameter 'keep_last' defaults to 2"),
        # the buffer protocol dropped
        (lambda t: t.replace("    def views(self) -> int: ...\n    def __len__(self) -> int: ...\n    def __buffer__(self, flags: int) -> memoryview: ...\n", "    def views(self) -> int: ...\n    def __len__(self) -> int: ...\n", 1), "PartBuffer: exports a buffer, the stub does not state"),
        # a protocol method removed
        (lambda t: t.replace("    def __contains__(self, name: str) -> bool: ...\n", "", 1), "Record.__contains__: a method in the module"),
        # a property stated as a method
        (lambda t: t.replace("    @property\n    def pool_buffers(self) -> int: ...", "    def pool_buffers(self) -> int: ...", 1), "Loader.pool_buffers: a method in the stub, an attribute"),
    ],
)
def test_the_check_fails_on_drift(edit: Any, expect: str):
    text = STUB.read_text()
    edited = edit(text)
    assert edited != text, "the edit did not apply"
    problems = drift(ext, edited)
    assert any(expect in p for p in problems), f"expected {expect!r} in {problems}"
