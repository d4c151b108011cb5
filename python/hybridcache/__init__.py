"""hybridcache from Python: the library's C++ at C++ speed (docs/python.md).

- ``replay(trace, **options)`` / ``compare(...)``: hcbench's replay and comparison in this
  process (the same option parsing, validation and JSON; GIL released).
- ``Tokenizer.from_file("tokenizer.json")``: the exact byte-level BPE (ids equal to the
  ``tokenizers`` package's), ``encode`` / ``encode_batch`` / ``decode``.
- ``ModelSpec``, ``CostModel``, ``preset_names()``: model shapes and their exact costs.
- ``PrefixCache``: a prefix cache of one of hcbench's policies (sglang+, marconi, gdsf, lru,
  vllm+) over a pool, with the request lifecycle (begin / state / block_table /
  resume_checkpoint / checkpoint_slot / grow / finish / abort), cache salts and the pool's
  memory as NumPy arrays without a copy; or over a store that only counts bytes.

Errors are ``hybridcache.Error`` subclasses carrying the library's message and ``.code``:
``InvalidArgument`` (also a ValueError), ``FormatError``, ``OutOfCapacity``, ``HandleError``.
"""
from __future__ import annotations

from typing import Any

from . import _hybridcache
from ._harness import command_line, compare, replay
from ._hybridcache import (
    CostModel,
    Error,
    FormatError,
    HandleError,
    InvalidArgument,
    MemoryReadLock,
    ModelSpec,
    OutOfCapacity,
    PrefixCache,
    Ticket,
    Tokenizer,
    preset_names,
)

#: The project version (CMakeLists.txt's project(VERSION)); hcbench --version prints the same.
__version__: str = _hybridcache.__version__
#: What ``hcbench --version`` prints after "hcbench ": the version and the build's git describe.
build_version: str = _hybridcache.build_version
#: Whether this build has the Redis tier (``PrefixCache(redis_tier=...)``; hiredis at build time).
has_redis_tier: bool = _hybridcache.has_redis_tier


__all__ = [
    "__version__", "build_version", "replay", "compare", "command_line", "Tokenizer", "ModelSpec", "CostModel",
    "preset_names", "PrefixCache", "Ticket", "MemoryReadLock", "has_redis_tier", "Error", "InvalidArgument", "FormatError", "OutOfCapacity", "HandleError",
]
