"""The package: one version with hcbench, the generated type stub, the example port."""
import os
import subprocess
import sys

import hybridcache


def test_version_is_hcbench_version(hcbench):
    out = subprocess.run([hcbench, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "hcbench " + hybridcache.build_version
    assert hybridcache.build_version.split()[0] == hybridcache.__version__
    # One source: CMakeLists.txt's project(VERSION), which pyproject.toml's version reads too.
    src = open(os.path.join(os.environ.get("HYBRIDCACHE_SOURCE_DIR", "."), "CMakeLists.txt"), encoding="utf-8").read()
    assert f"VERSION {hybridcache.__version__}\n" in src


def test_stub_is_generated_and_ships():
    stub = os.path.join(os.path.dirname(hybridcache._hybridcache.__file__), "_hybridcache.pyi")
    text = open(stub, encoding="utf-8").read()
    for name in ("class PrefixCache", "def begin(", "def block_table(", "class Tokenizer", "def encode_batch(",
                 "class CostModel", "InvalidArgument"):
        assert name in text, name
    assert os.path.exists(os.path.join(os.path.dirname(hybridcache.__file__), "py.typed"))


def test_tiny_hybrid_runtime_port(source_dir):
    """examples/python/tiny_hybrid_runtime.py: outputs identical to its own uncached run."""
    script = os.path.join(source_dir, "examples", "python", "tiny_hybrid_runtime.py")
    r = subprocess.run([sys.executable, script, "--requests", "60"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "identical outputs: 60/60 requests" in r.stdout
