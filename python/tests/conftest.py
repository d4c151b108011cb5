"""Fixtures of the Python module's tests (ctest `python`, label python; docs/python.md).

ctest sets PYTHONPATH to the build's package folder, HCBENCH to the hcbench binary of the same
build (the replay results are compared with it) and HYBRIDCACHE_SOURCE_DIR.
"""
import os
import shutil
import subprocess
import sys

import pytest

SOURCE_DIR = os.environ.get("HYBRIDCACHE_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


@pytest.fixture(scope="session")
def source_dir():
    return SOURCE_DIR


@pytest.fixture(scope="session")
def hcbench():
    path = os.environ.get("HCBENCH") or shutil.which("hcbench")
    if not path:
        pytest.fail("set HCBENCH to the hcbench binary of the build the module comes from (ctest does)")
    return path


@pytest.fixture(scope="session")
def chat_trace(tmp_path_factory, hcbench):
    """A synth-v1 chat trace (hcbench gen, 20 sessions: a replay takes milliseconds)."""
    path = tmp_path_factory.mktemp("traces") / "chat.jsonl"
    subprocess.run([hcbench, "gen", "--profile", "chat", "--seed", "1", "--sessions", "20", "--out", str(path)],
                   check=True, capture_output=True)
    return str(path)


def run_hcbench(hcbench, *args):
    r = subprocess.run([hcbench, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


sys.path.insert(0, os.path.dirname(__file__))
