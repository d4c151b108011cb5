"""replay() and compare(): hcbench's own commands, run in this process by the C++ module.

The keyword arguments are hcbench's flags with ``_`` for ``-`` (``alpha="auto"``,
``tiers="hbm=64GiB,host=256GiB"``, ``prefill_engines=4``); the option list, its parsing, its
validation and its JSON come from tools/hcbench itself (the module links its objects), so a
keyword means exactly what the flag means and a value hcbench refuses is refused here with
hcbench's message. A keyword that names no flag raises TypeError naming it.
"""
from __future__ import annotations

import csv
import json
import numbers
import os
import tempfile
from typing import Any, Iterable, Mapping, Sequence

from . import _hybridcache as _core

# Options a Python caller never passes: the result is returned, not printed or written.
_IMPLIED = {"replay": {"json"}, "compare": set()}


def _options(command: str) -> dict[str, tuple[bool, bool]]:
    cached = _OPTIONS.get(command)
    if cached is None:
        cached = {name: (flag, multi) for name, flag, multi in _core._command_options(command)}
        _OPTIONS[command] = cached
    return cached


_OPTIONS: dict[str, dict[str, tuple[bool, bool]]] = {}


def _text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a string or a number, got a bool (the flag --{name.replace('_', '-')} takes a value)")
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    raise TypeError(f"{name}: expected a string, a number or a path, got {type(value).__name__}")


def _argv(command: str, kwargs: Mapping[str, Any]) -> list[str]:
    """hcbench's command line for the keywords, in their order."""
    known = _options(command)
    unknown = [k for k in kwargs if k.replace("_", "-") not in known or k.replace("_", "-") in _IMPLIED[command]]
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        raise TypeError(f"{command}() got unexpected keyword argument(s) {names}: hcbench {command} has no such flag "
                        f"(known: {', '.join(sorted(n.replace('-', '_') for n in known if n not in _IMPLIED[command]))})")
    argv: list[str] = []
    for key, value in kwargs.items():
        flag_name = key.replace("_", "-")
        is_flag, repeatable = known[flag_name]
        if value is None:
            continue  # not given: hcbench's default
        if is_flag:
            if not isinstance(value, bool):
                raise TypeError(f"{key}: expected True or False (the flag --{flag_name}), got {type(value).__name__}")
            if value:
                argv.append(f"--{flag_name}")
            continue
        if isinstance(value, (list, tuple)):
            items = [_text(key, v) for v in value]
            if repeatable:
                for item in items:
                    argv += [f"--{flag_name}", item]
            else:
                argv += [f"--{flag_name}", ",".join(items)]
            continue
        argv += [f"--{flag_name}", _text(key, value)]
    return argv


# ---- traces from Python objects ----------------------------------------------------------
def _is_path(x: Any) -> bool:
    return isinstance(x, (str, os.PathLike))


def _token_list(x: Any, where: str) -> list[int]:
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple)):
        kind = getattr(getattr(x, "dtype", None), "kind", "i")
        if kind not in "iu":
            raise TypeError(f"{where}: expected integer token ids, got an array of dtype {x.dtype}")
        x = x.tolist()
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{where}: expected a list or array of token ids, got {type(x).__name__}")
    for i, t in enumerate(x):
        if not isinstance(t, int) or isinstance(t, bool):
            raise TypeError(f"{where}[{i}]: expected an int token id, got {type(t).__name__}")
    return list(x)


def _is_messages(x: Any) -> bool:
    return isinstance(x, Mapping) and "messages" in x or (
        isinstance(x, (list, tuple)) and len(x) > 0 and isinstance(x[0], Mapping))


def _write_trace(trace: Sequence[Any], fmt: str | None, folder: str) -> tuple[str, str]:
    """Writes an in-memory trace as a file hcbench reads; returns (path, format).

    A list of token arrays (or of dicts with input_tokens and optional output_tokens,
    session_id, turn_id, ts) becomes Marconi JSONL, one request per element in order; a list
    of OpenAI conversations (each a message list, or a dict with "messages") becomes openai
    JSONL. The file is named python.jsonl, so the trace's label is "python".
    """
    if len(trace) == 0:
        raise ValueError("trace: an empty list holds no request")
    path = os.path.join(folder, "python.jsonl")
    if _is_messages(trace[0]):
        if fmt not in (None, "openai"):
            raise ValueError(f"format={fmt!r}: a trace of OpenAI message lists is read as format 'openai'")
        with open(path, "w", encoding="utf-8") as f:
            for i, conv in enumerate(trace):
                if isinstance(conv, Mapping):
                    line = dict(conv)
                elif isinstance(conv, (list, tuple)):
                    line = {"messages": list(conv)}
                else:
                    raise TypeError(f"trace[{i}]: expected a message list or a dict with 'messages', got {type(conv).__name__}")
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
        return path, "openai"
    if fmt not in (None, "marconi"):
        raise ValueError(f"format={fmt!r}: a trace of token arrays is read as format 'marconi'")
    with open(path, "w", encoding="utf-8") as f:
        for i, req in enumerate(trace):
            if isinstance(req, Mapping):
                extra = set(req) - {"input_tokens", "output_tokens", "session_id", "turn_id", "ts"}
                if extra or "input_tokens" not in req:
                    raise ValueError(f"trace[{i}]: a request dict has input_tokens and optional output_tokens, session_id, "
                                     f"turn_id, ts (got keys {sorted(req)})")
                inp = _token_list(req["input_tokens"], f"trace[{i}]['input_tokens']")
                out = _token_list(req.get("output_tokens", []), f"trace[{i}]['output_tokens']")
                session, turn, ts = req.get("session_id", i), req.get("turn_id", 0), req.get("ts", float(i))
            else:
                inp, out = _token_list(req, f"trace[{i}]"), []
                session, turn, ts = i, 0, float(i)
            f.write(json.dumps({"session_id": session, "turn_id": turn, "ts": ts, "num_input_tokens": len(inp),
                                "num_output_tokens": len(out), "input_tokens": inp, "output_tokens": out}) + "\n")
    return path, "marconi"


def _trace_args(trace: Any, kwargs: dict[str, Any], folder: str) -> None:
    """Puts `trace` into kwargs as hcbench's --trace (and --format for an in-memory one)."""
    if trace is None:
        return
    if _is_path(trace):
        kwargs["trace"] = trace
        return
    if isinstance(trace, (list, tuple)) and trace and all(_is_path(t) for t in trace):
        kwargs["trace"] = list(trace)  # compare: several files
        return
    if not isinstance(trace, (list, tuple)):
        raise TypeError(f"trace: expected a path, a list of token arrays or a list of OpenAI conversations, got "
                        f"{type(trace).__name__}")
    path, fmt = _write_trace(trace, kwargs.get("format"), folder)
    kwargs["trace"] = path
    kwargs["format"] = fmt


def _trace_first(kwargs: dict[str, Any]) -> dict[str, Any]:
    """--trace and --format first, as one writes the command (the JSON's "command" shows it)."""
    head = {k: kwargs[k] for k in ("trace", "format") if k in kwargs}
    return {**head, **{k: v for k, v in kwargs.items() if k not in head}}


def _number(text: str) -> Any:
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def replay(trace: Any, **options: Any) -> dict[str, Any]:
    """One trace through one policy, as ``hcbench replay ... --json``; returns its JSON object.

    ``trace``: a file (any --format), a list of token arrays, or a list of OpenAI conversations.
    ``options``: hcbench replay's flags, ``_`` for ``-`` (model=, capacity=, policy=, alpha=,
    tiers=, tokenizer=, drive=, ...). The replay runs in C++ with the GIL released.
    """
    with tempfile.TemporaryDirectory(prefix="hybridcache-") as folder:
        kwargs = dict(options)
        _trace_args(trace, kwargs, folder)
        argv = _argv("replay", _trace_first(kwargs)) + ["--json"]
        text = _core._run_command("replay", argv)
    return json.loads(text)


def compare(trace: Any = None, **options: Any) -> list[dict[str, Any]]:
    """Several policies x capacities (x traces), as ``hcbench compare``; returns the table's rows.

    Each row is a dict with the columns of hcbench's results.csv (numbers as int/float, an
    empty cell as None). ``trace``: None (the embedded synth-v1 workloads), a file, a list of
    files, or an in-memory trace as for replay(). ``out=DIR`` also keeps hcbench's files
    (results.csv, table.txt, hit_rate_vs_capacity.svg); without it they go to a temporary folder.
    """
    with tempfile.TemporaryDirectory(prefix="hybridcache-") as folder:
        kwargs = dict(options)
        _trace_args(trace, kwargs, folder)
        out = kwargs.get("out")
        if out is None:
            kwargs["out"] = out = os.path.join(folder, "out")
        _core._run_command("compare", _argv("compare", _trace_first(kwargs)))
        with open(os.path.join(os.fspath(out), "results.csv"), newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    return [{k: (_number(v) if k not in ("trace", "model", "policy", "followed") else v) for k, v in row.items()}
            for row in rows]


def command_line(command: str, **options: Any) -> list[str]:
    """The hcbench arguments `replay`/`compare` would run for these keywords (for a log, or to
    run the same thing from a shell). In-memory traces are not written: pass a path."""
    return [command] + _argv(command, _trace_first(options))


__all__: Iterable[str] = ("replay", "compare", "command_line")
