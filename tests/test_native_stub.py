"""pykvcompact/_native.pyi says what the extension has: every public method with its argument names, and
nothing the extension lacks (pybind11 writes each method's signature as the first line of its __doc__)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

from pykvcompact.engine import native

STUB = pathlib.Path(__file__).resolve().parents[1] / "pykvcompact" / "_native.pyi"


def _stub_classes() -> dict:
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {f.name: [a.arg for a in f.args.args[1:] + f.args.kwonlyargs]
                              for f in node.body if isinstance(f, ast.FunctionDef)}
    return out


def _bound_args(method) -> list:
    first = (method.__doc__ or "").split("\n")[0]
    inside = first[first.index("(") + 1: first.rindex(")")]
    names = re.findall(r"(?:^|, )(\*|\w+)(?::|(?=,|$))", inside)
    return [n for n in names if n not in ("self", "*")]


@pytest.mark.parametrize("cls", ["Engine", "Job"])
def test_the_stub_lists_every_method_with_its_argument_names(cls):
    stub = _stub_classes()[cls]
    bound = getattr(native(), cls)
    public = {m for m in dir(bound) if not m.startswith("_")}
    assert public == set(stub) - {"__init__"}, (public ^ (set(stub) - {"__init__"}))
    for name in sorted(public):
        args = _bound_args(getattr(bound, name))
        assert not any(re.fullmatch(r"arg\d+", a) for a in args), f"{cls}.{name} has unnamed arguments: {args}"
        assert args == stub[name], (name, args, stub[name])


def test_the_engine_constructor_takes_keywords_with_defaults():
    args = _bound_args(native().Engine.__init__)
    assert args == _stub_classes()["Engine"]["__init__"]
    first = native().Engine.__init__.__doc__.split("\n")[0]
    assert re.search(r", \*, n_ctx: [^,]*= 4096", first)          # keywords only after the model path
    assert re.search(r"background_share: [^,]*= -1\.0\)", first)
