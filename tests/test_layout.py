"""The package reads like its architecture: layer folders, the face at the top, no import cycle between our
modules (a cycle is a misplaced item: at import time it breaks as soon as someone imports the other end first,
and hidden in a function it still ties two layers together), no module too long to read, no object reaching
into another module's private members, no mixin."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "pykvcompact"
FACE = {"__init__", "__main__", "errors", "events"}
LAYERS = {"engine", "remote", "models", "chat", "session", "compaction", "server", "cli", "timeline"}


def _modules() -> dict:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (p, is_package)
    return out


def _imports_at_import_time(name: str, path: pathlib.Path, is_package: bool, known, anywhere: bool = False) -> set:
    """Our modules that ``name`` imports at module level (not in functions, not under ``if TYPE_CHECKING``);
    ``anywhere``: in functions too."""
    deps = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in (ast.walk(tree) if anywhere else tree.body):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                deps.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            deps.update(a.name for a in node.names)
    return {d for d in deps if d in known and d != name}


def test_only_the_face_lives_at_the_top_of_the_package():
    top_modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert top_modules <= FACE, sorted(top_modules - FACE)
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == LAYERS, sorted(folders ^ LAYERS)


@pytest.mark.parametrize("anywhere", [False, True], ids=["at_import_time", "in_functions_too"])
def test_no_import_cycle_between_our_modules(anywhere):
    mods = _modules()
    graph = {m: _imports_at_import_time(m, p, pkg, mods, anywhere) for m, (p, pkg) in mods.items()}
    # a module reaching itself again through its imports is a cycle
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, f"{start} imports itself back through {sorted(seen)}"
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])


MAX_LINES = 350


def test_no_module_is_too_long_to_read():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, long


def _names_defined(tree: ast.AST) -> set:
    """Functions, classes, module names and ``self.``/``cls.`` attributes a module defines."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
    return own


def test_no_module_reaches_into_another_modules_private_members():
    """``x._name`` is allowed only for a ``_name`` the same module defines (its own objects)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own = _names_defined(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and node.attr not in own:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def test_no_mixin_a_class_inherits_only_exceptions_events_and_libraries():
    """A class of ours inherits another of ours only for an exception or an event (and a UI specializing the
    plain UI of its own module); behaviour is shared by handing an object its collaborators."""
    ours = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                ours.setdefault(node.name, set()).add(path)
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                name = ast.unparse(base).split(".")[-1]
                if name not in ours or name == "Event" or name.endswith("Error") or path in ours[name]:
                    continue
                found.append(f"{path.relative_to(PACKAGE)}: {node.name}({name})")
    assert not found, found
