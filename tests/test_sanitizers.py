"""The engine tests under AddressSanitizer + UndefinedBehaviorSanitizer (.ci/sanitize builds the
native module with them and runs the tiny-model engine tests). Six minutes on 2 cores, so it runs
in CI (CI=true) or when PYKVCOMPACT_SANITIZE_TESTS=1."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
WANTED = os.environ.get("CI") == "true" or os.environ.get("PYKVCOMPACT_SANITIZE_TESTS") == "1"


@pytest.mark.skipif(not WANTED, reason="slow: runs in CI, or with PYKVCOMPACT_SANITIZE_TESTS=1")
def test_engine_tests_pass_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    for tool in ("cmake", "gcc"):
        assert shutil.which(tool), f"{tool} is needed to build the sanitizer variant"
    env = dict(os.environ, SANITIZE_BUILD_DIR=str(tmp_path / "build"))
    r = subprocess.run(["bash", str(ROOT / ".ci" / "sanitize")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=1800)
    tail = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, tail
    assert "passed" in r.stdout and "ERROR: AddressSanitizer" not in tail and "runtime error:" not in tail, tail
