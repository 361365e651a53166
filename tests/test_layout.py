"""The package reads like its architecture: layer folders, the face at the top, no import cycle between our
modules at import time (a cycle is a misplaced item, and breaks as soon as someone imports the other end first)."""

from __future__ import annotations

import ast
import pathlib

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


def _imports_at_import_time(name: str, path: pathlib.Path, is_package: bool, known) -> set:
    """Our modules that ``name`` imports at module level (not in functions, not under ``if TYPE_CHECKING``)."""
    deps = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
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


def test_no_import_cycle_between_our_modules():
    mods = _modules()
    graph = {m: _imports_at_import_time(m, p, pkg, mods) for m, (p, pkg) in mods.items()}
    # a module reaching itself again through its imports is a cycle
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, f"{start} imports itself back through {sorted(seen)}"
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])
