#!/usr/bin/env bash
# The packaging check of the Python module (docs/python.md, issue #35): `pip wheel .` from this
# checkout with the pinned build requirements, then the wheel installed into a scratch venv and
# imported there: version, stub and a replay. Not part of the test command: the wheel is a
# Release build of its own (hcbench's replay code and the bindings, ~4-5 minutes on 2 cores).
#
#   bash scripts/python_wheel.sh [OUT_DIR]     (default build/python-wheel; prints wheel=PATH)
#
# Uses the venv scripts/install-deps.sh makes (scikit-build-core and nanobind at the versions
# pyproject.toml pins), without build isolation, so nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
PY="${HYBRIDCACHE_CACHE:-$HOME/.cache/hybridcache}/python/bin/python"
OUT="${1:-build/python-wheel}"
rm -rf "$OUT"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
t0=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" "$PY" -m pip wheel . --no-deps --no-build-isolation \
  --disable-pip-version-check -w "$OUT/dist" -Cbuild-dir="$OUT/build" >"$OUT/pip.log" 2>&1 ||
  { tail -n 40 "$OUT/pip.log" >&2; echo "python_wheel.sh: pip wheel failed (log: $OUT/pip.log)" >&2; exit 1; }
wheel="$(ls "$OUT"/dist/hybridcache-*.whl)"
echo "python_wheel.sh: built $wheel in $(( $(date +%s) - t0 )) s" >&2
"$PY" -m venv "$OUT/venv"
# NumPy (and tokenizers, for bench/python_costs.py) from the pinned venv: its site-packages
# after the scratch venv's own, which holds the wheel.
"$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
  >"$("$OUT/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/pinned-venv.pth"
"$OUT/venv/bin/python" -m pip install -q --no-deps --disable-pip-version-check "$wheel"
cd "$OUT"  # not the checkout: import the installed package
"$OUT/venv/bin/python" - "$wheel" <<'PY'
import os, sys, zipfile
import hybridcache
names = zipfile.ZipFile(sys.argv[1]).namelist()
for need in ("hybridcache/__init__.py", "hybridcache/_hybridcache.pyi", "hybridcache/py.typed"):
    assert need in names, need
assert any(n.startswith("hybridcache/_hybridcache.") and n.endswith(".so") for n in names)
assert hybridcache.__file__.startswith(os.path.abspath("venv")), hybridcache.__file__
from importlib.metadata import version
assert version("hybridcache") == hybridcache.__version__, (version("hybridcache"), hybridcache.__version__)
import numpy as np
t = hybridcache.PrefixCache(hybridcache.CostModel("jamba_1_5_mini"), capacity_bytes=1 << 30)
assert t.block_table(t.begin(np.arange(64, dtype=np.int32)), 0).dtype == np.int64
r = hybridcache.replay([[1, 2, 3, 4] * 50, [1, 2, 3, 4] * 60], capacity="1GB", policy="sglang+")
assert r["requests"] == 2 and r["skipped_tokens"] > 0
print("python_wheel.sh: the wheel imports, version", hybridcache.__version__, "| files:", len(names))
PY
echo "wheel=$wheel"
