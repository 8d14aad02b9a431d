"""The SDK's wire layer is what static/proto generates, with the pinned
generator: a .proto change without `generate.sh` fails here."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def test_the_generated_code_matches_static_proto():
    venv = Path(sys.executable).parent.parent
    if not (venv / "bin" / "protoc-gen-connect-python").exists() and not shutil.which("protoc-gen-connect-python"):
        pytest.fail("the test environment lacks the generator: run packaging/python/test-env.sh")
    r = subprocess.run(
        [str(ROOT / "packaging/python/generate.sh"), "--check"],
        capture_output=True, text=True, env={**os.environ, "PY_GEN_VENV": str(venv)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
