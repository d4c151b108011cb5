#!/usr/bin/env python3
"""Documented commands are tests: run the command blocks of README.md and docs/**/*.md and check
that they print what the docs quote (ctest label `docs`; the syntax is in docs/index.md, "Commands
in the docs are tests").

Every fenced block must name its language. A block in ```sh, ```bash, ```shell or ```console is
a command block and must carry a marker, an HTML comment on the lines just above its fence:

    <!-- doc-test: run -->                         run it; its quoted output must come out
    <!-- doc-test: run head=2000 set="--capacities 1e11" expect="13.30%" check="9.87%" -->
    <!-- doc-test: skip reason="needs a GPU" -->   not run, and why

A ```text block or a markdown table marked <!-- doc-test: output --> is quoted output of the sh
run block above it (of="S": of the last one above whose commands contain S, not followed by a letter, digit or -) (several may follow one block, each an excerpt in any order); in a ```console
block the lines after the `$ ` commands are its quoted output. Each non-blank quoted line must occur
in the output, numbers as printed, in order (within an excerpt, within stdout and within stderr); `...` stands for any text and a run of blanks
for any run of blanks. expect="S" (repeatable) is a string the output
must contain and the page must quote (in a table or the text).

head=N runs the block on the first N lines of every JSONL trace under ../shared/data/traces, and
set="--opt V" replaces that option's value in the block: a reduced run. setup="CMD" runs CMD
first (e.g. to put a small fixture where the block names a file of your own). slow="WHY" marks a
block only --full runs (a results page's long generating command: --full checks its tables). It checks the quoted
output's shape (every number stands for any number, a byte size's unit for any unit) and check="S" strings exactly; expect strings
and the quoted numbers are checked by --full, which runs blocks as written. The page must say so
("doc test") next to a reduced block.

Commands run with bash (`set -eo pipefail`; a console block's commands one by one, each expected
to exit with status=N, default 0) in a scratch copy of the repository layout: WORK/run/repo is the
current directory (the repository's folders linked in), ../shared is the shared data (or its
reduced copy), `hcbench` on PATH and build/release/tools/hcbench are the binary given by
--hcbench. Lines that build with cmake (`cmake --preset ...`, `cmake --build ...`,
`cmake --workflow ...`) are not run: the test runs on the build ctest made. A block that needs
../shared when it is absent is not run; then the exit status is 77 (skipped) unless a check failed.

  python3 tests/docs/doc_commands.py --repo . --hcbench build/h-docs/tools/hcbench --work /tmp/dc \\
      [--full] [--list] [--block LINE] docs/replay.md ...
"""
import argparse
import difflib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

COMMAND_LANGS = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)\s*$")
MARKER = re.compile(r"<!--\s*doc-test:(.*?)-->", re.S)
BUILD_LINE = re.compile(r"^\s*cmake\s+(--preset|--build|--workflow|-S)\b")
NUMBER = r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
SIZE_UNIT = r"(?:\s?[KMGTPE]?i?B(?!\w))"
NUMBER_TOKEN = re.compile(r"(?<![\w.])" + NUMBER + r"(?![\w])")
KINDS = {"run": {"head", "set", "expect", "check", "timeout", "status", "setup", "slow"},
         "skip": {"reason"},
         "output": {"of"}}


class DocError(Exception):
    pass


class Block:
    def __init__(self, path, line, lang, body, marker, marker_line):
        self.path, self.line, self.lang, self.body = path, line, lang, body
        self.marker, self.marker_line = marker, marker_line  # (kind, {key: [values]}) or None
        self.output = None                                  # quoted output lines
        self.output_at = []                                 # their 0-based line numbers in the file
        self.chunks = []                                    # quoted excerpts: [lines], each in order
        self.updates = {}                                   # --update: line number -> new text

    @property
    def where(self):
        return f"{self.path}:{self.line}"


def parse_marker(text, where):
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise DocError(f"{where}: doc-test marker: {e}")
    if not words or words[0] not in KINDS:
        raise DocError(f"{where}: doc-test marker must start with run, skip or output: '{text.strip()}'")
    kind, attrs = words[0], {}
    for w in words[1:]:
        key, eq, value = w.partition("=")
        if not eq or key not in KINDS[kind]:
            raise DocError(f"{where}: doc-test {kind}: unknown attribute '{w}' "
                           f"(known: {', '.join(sorted(KINDS[kind])) or 'none'})")
        attrs.setdefault(key, []).append(value)
    if kind == "skip" and not "".join(attrs.get("reason", [])).strip():
        raise DocError(f"{where}: doc-test skip needs reason=\"...\"")
    return kind, attrs


def parse(path, text):
    """The blocks of one markdown file, with their markers; the page's text outside comments and
    fences (where expect strings must be quoted)."""
    lines = text.split("\n")
    blocks, prose, i = [], [], 0
    pending = None  # (marker text, line) of the last comment, until a non-blank line
    while i < len(lines):
        line = lines[i]
        if "<!--" in re.sub(r"`[^`]*`", "", line):
            start = i
            chunk = line
            while "-->" not in chunk and i + 1 < len(lines):
                i += 1
                chunk += "\n" + lines[i]
            for m in MARKER.finditer(chunk):
                pending = (m.group(1), start + 1)
            rest = re.sub(r"<!--.*?-->", "", chunk, flags=re.S).strip()
            if rest:
                if "doc-test:" in chunk:
                    raise DocError(f"{path}:{start + 1}: a doc-test marker goes on its own line(s) above a fence")
                prose.append(rest)
                pending = None
            i += 1
            continue
        m = FENCE.match(line)
        if m:
            indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
            j = i + 1
            while j < len(lines) and not re.match(r"^\s*" + re.escape(fence[0]) + "{%d,}\\s*$" % len(fence), lines[j]):
                j += 1
            if j == len(lines):
                raise DocError(f"{path}:{i + 1}: fence never closed")
            body = [l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[i + 1:j]]
            marker = None
            if pending:
                marker = parse_marker(pending[0], f"{path}:{pending[1]}")
            blocks.append(Block(path, i + 1, lang, body, marker, pending[1] if pending else None))
            pending = None
            i = j + 1
            continue
        if line.lstrip().startswith("|") and pending and pending[0].split()[:1] == ["output"]:
            j = i
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            blocks.append(Block(path, i + 1, "table", [l.strip() for l in lines[i:j]],
                                parse_marker(pending[0], f"{path}:{pending[1]}"), pending[1]))
            prose.extend(lines[i:j])
            pending = None
            i = j
            continue
        if line.strip():
            if pending:
                raise DocError(f"{path}:{pending[1]}: a doc-test marker must be followed by a fence")
            prose.append(line)
        i += 1
    return blocks, "\n".join(prose)


def console_commands(body):
    """[(command text, [quoted output lines])] of a console block."""
    cmds, cont = [], False
    for line in body:
        if cont:
            cmds[-1][0].append(line)
        elif line.startswith("$ "):
            cmds.append([[line[2:]], []])
        elif cmds:
            cmds[-1][1].append(line)
            continue
        else:
            raise DocError(f"console block: output line before the first `$ ` command: '{line}'")
        cont = line.rstrip().endswith("\\")
    return [("\n".join(c), out) for c, out in cmds]


def check_file(path, rel, text):
    """Markers and fences of one file; returns the run blocks (with their quoted output)."""
    blocks, prose = parse(rel, text)
    errors, runs = [], []
    last_run = None
    for b in blocks:
        kind = b.marker[0] if b.marker else None
        if b.lang == "table":
            pass
        elif not b.lang:
            errors.append(f"{b.where}: fence without a language: name it (sh or console for a command, "
                          "text for output or a picture, json, cpp, ...)")
            continue
        if b.lang in COMMAND_LANGS:
            if kind not in ("run", "skip"):
                errors.append(f"{b.where}: command block ({b.lang}) without a doc-test marker: put "
                              "<!-- doc-test: run --> or <!-- doc-test: skip reason=\"...\" --> above it")
                continue
            if b.lang != "console" and any(l.startswith("$ ") for l in b.body):
                errors.append(f"{b.where}: `$ ` prompts in a {b.lang} block: make it ```console")
                continue
            if kind == "run":
                attrs = b.marker[1]
                for s in attrs.get("expect", []):
                    if s not in prose:
                        errors.append(f"{b.where}: expect=\"{s}\" is not quoted on the page")
                if (attrs.get("head") or attrs.get("set")) and not reduced_stated(text, b):
                    errors.append(f"{b.where}: a reduced run (head=/set=): say on the page, next to "
                                  "the block, what the doc test runs (the words 'doc test')")
                if b.lang == "console":
                    try:
                        b.commands = console_commands(b.body)
                    except DocError as e:
                        errors.append(f"{b.where}: {e}")
                        continue
                    b.output = [l for _, out in b.commands for l in out]
                    b.chunks = [b.output]
                    b.output_at = [b.line + k for k, l in enumerate(b.body)
                                   if not is_command_line(b.body, k)]
                else:
                    b.commands = None
                runs.append(b)
                last_run = b
            else:
                last_run = None
        elif kind == "output":
            of = b.marker[1].get("of")
            if of:  # the output of an earlier run block: the last one whose commands contain it
                word = re.compile(re.escape(of[0]) + r"(?![\w-])")
                last_run = next((r for r in reversed(runs) if word.search("\n".join(r.body))), None)
            if b.lang not in ("text", "table"):
                errors.append(f"{b.where}: doc-test output marks a ```text block or a table, not ```{b.lang}")
            elif last_run is None or last_run.lang == "console":
                errors.append(f"{b.where}: doc-test output without a sh run block above it")
            else:
                last_run.output = (last_run.output or []) + b.body
                last_run.chunks.append(b.body)
                first = b.line - 1 if b.lang == "table" else b.line
                last_run.output_at += [first + k for k in range(len(b.body))]
        elif kind:
            errors.append(f"{b.where}: doc-test {kind} marks a command block (sh, bash, shell, console), "
                          f"not ```{b.lang}")
    return runs, errors


def is_command_line(body, k):
    """Whether body[k] of a console block is a `$ ` command or its continuation."""
    j = k
    while j > 0 and body[j - 1].rstrip().endswith("\\") and not body[j].startswith("$ "):
        j -= 1
    return body[j].startswith("$ ")


def propose_updates(b, streams):
    """--update: the quoted lines that no longer come out, each replaced by the output line most
    like it (after the previous quoted line's, in the same stream); a trailing `...` is kept in
    place of the fields after as many as the quote had before it. Returns ({file line: text}, [lines left as they were])."""
    lines = [t.split("\n") for t in streams]
    updates, left = {}, []
    starts, off = set(), 0
    for c in b.chunks:
        starts.add(off)
        off += len(c)
    for i, (q, at) in enumerate(zip(b.output, b.output_at)):
        if i in starts:
            cursor = [0] * len(lines)  # each excerpt is looked for from the start
        qs = q.strip()
        if not qs or qs == "...":
            continue
        pat = line_pattern(qs, False)
        hit = next(((k, n) for k, ls in enumerate(lines) for n in range(cursor[k], len(ls)) if pat.search(ls[n])), None)
        if hit:
            cursor[hit[0]] = hit[1]  # a wrapped quote may hold several pieces of one line
            continue
        best = None
        for k, ls in enumerate(lines):
            for n in range(cursor[k], len(ls)):
                r = difflib.SequenceMatcher(None, qs, ls[n].strip()).ratio()
                if best is None or r > best[0]:
                    best = (r, k, n)
        inner = "..." in qs[:-3]
        if best is None or best[0] < 0.5 or inner:
            left.append(q)
            continue
        _, k, n = best
        cursor[k] = n + 1
        new = lines[k][n].rstrip()
        if qs.endswith("..."):  # keep as many fields as the quote had before its `...`
            fields = list(re.finditer(r"\S+", new))
            keep = len(qs[:-3].split())
            if 0 < keep < len(fields):
                new = new[:fields[keep].start()] + "..."
        updates[at] = new
    return updates, left


def reduced_stated(text, b):
    lines = text.split("\n")
    lo = max(0, (b.marker_line or b.line) - 8)
    hi = min(len(lines), b.line + len(b.body) + 40)
    return "doc test" in "\n".join(lines[lo:hi]).lower()


def line_pattern(quoted, shape):
    """Regex for one quoted line: `...` any text, blanks any blanks, numbers as printed (or any
    number when shape)."""
    parts = []
    for k, piece in enumerate(quoted.split("...")):
        if k:
            parts.append(".*?")
        pos = 0
        for m in re.finditer((NUMBER_TOKEN.pattern + SIZE_UNIT + "?|" if shape else "") + r"\s+", piece):
            parts.append(re.escape(piece[pos:m.start()]))
            if m.group().isspace():
                parts.append(r"\s+")
            else:  # a number, and a byte unit after it may be another (human-readable sizes)
                parts.append(NUMBER + (SIZE_UNIT if re.search(SIZE_UNIT + "$", m.group()) else ""))
            pos = m.end()
        parts.append(re.escape(piece[pos:]))
    pat = "".join(parts)
    if re.match(r"[\w.]", quoted):
        pat = r"(?<![\w.])" + pat
    if re.search(r"\w$", quoted):
        pat += r"(?!\w)"
    return re.compile(pat)


def match_quoted(quoted, streams, shape):
    """None when every non-blank quoted line occurs in the output, else the first that does not.
    The lines quoted from each stream (stdout, stderr) must come in that stream's order: a line is
    looked for in stdout after the last stdout match, else in stderr after the last stderr match."""
    pos = [0] * len(streams)
    for q in quoted:
        q = q.strip()
        if not q or q == "...":
            continue
        pat = line_pattern(q, shape)
        for k, text in enumerate(streams):
            m = pat.search(text, pos[k])
            if m:
                pos[k] = m.end()
                break
        else:
            return q
    return None


def make_tree(repo, work, hcbench, shared, head):
    """WORK/run/{repo,shared,bin}: the layout the docs' commands assume."""
    run = os.path.join(work, "run")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(os.path.join(run, "repo", "build", "release", "tools"))
    os.makedirs(os.path.join(run, "bin"))
    for name in os.listdir(repo):
        if name in (".git", "build"):
            continue
        os.symlink(os.path.join(repo, name), os.path.join(run, "repo", name))
    os.symlink(hcbench, os.path.join(run, "repo", "build", "release", "tools", "hcbench"))
    os.symlink(hcbench, os.path.join(run, "bin", "hcbench"))
    if os.path.isdir(shared):
        if head:
            copy_reduced(shared, os.path.join(run, "shared"), head)
        else:
            os.symlink(shared, os.path.join(run, "shared"))
    return run


def copy_reduced(src, dst, head):
    """dst mirrors src; the JSONL files under data/traces keep their first `head` lines."""
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for f in files:
            s, d = os.path.join(root, f), os.path.join(dst, rel, f)
            if f.endswith(".jsonl") and rel.replace(os.sep, "/").startswith("data/traces"):
                with open(s, "rb") as fin, open(d, "wb") as fout:
                    for n, line in enumerate(fin):
                        if n >= head:
                            break
                        fout.write(line)
            else:
                os.symlink(s, d)


def apply_set(script, settings, where):
    for s in settings:
        opt, _, value = s.strip().partition(" ")
        pat = re.compile(r"(?<!\S)" + re.escape(opt) + r"(\s+|=)(\"[^\"]*\"|'[^']*'|\S+)")
        if not pat.search(script):
            raise DocError(f"{where}: set=\"{s}\": the block has no {opt}")
        script = pat.sub(lambda m: opt + " " + value.strip(), script)
    return script


def build_script(b, full):
    attrs = b.marker[1]
    statuses = attrs.get("status", ["0"])
    if b.commands is None:
        cmds = [("\n".join(b.body), statuses[0])]
    else:
        if len(statuses) not in (1, len(b.commands)):
            raise DocError(f"{b.where}: status= once, or once per `$ ` command ({len(b.commands)})")
        cmds = [(c, statuses[k if len(statuses) > 1 else 0]) for k, (c, _) in enumerate(b.commands)]
    out = ["set -o pipefail"]
    for setup in attrs.get("setup", []):
        out.append("( set -e\n%s\n) || { echo \"doc-test: setup failed: %s\" >&2; exit 98; }"
                   % (setup, setup.replace('"', "'")[:200]))
    for cmd, status in cmds:
        cmd = "\n".join(":  # built by the test's build: " + l.strip() if BUILD_LINE.match(l) else l
                        for l in cmd.split("\n"))
        if not full:
            cmd = apply_set(cmd, attrs.get("set", []), b.where)
        if b.commands is None and status == "0":
            out.append("set -e\n" + cmd)
        else:
            out.append("( %s\n)\n__s=$?\nif [ \"$__s\" != %s ]; then echo \"doc-test: exit status $__s, "
                       "expected %s: %s\" >&2; exit 99; fi" % (cmd, status, status,
                                                              shlex.quote(cmd.split("\n")[0])[:200]))
    return "\n".join(out) + "\n"


def run_block(b, args, repo, shared):
    """'ok' | 'skipped: ...' | 'FAIL ...'."""
    attrs = b.marker[1]
    if attrs.get("slow") and not args.full:
        return f"not run: slow ({attrs['slow'][0]}); --full runs it"
    reduced = bool(attrs.get("head") or attrs.get("set")) and not args.full
    head = int(attrs["head"][0]) if attrs.get("head") and not args.full else 0
    text = "\n".join(b.body + attrs.get("setup", []))
    if "../shared" in text and not os.path.isdir(shared):
        return "skipped: needs ../shared (absent)"
    try:
        script = build_script(b, args.full)
    except DocError as e:
        return f"FAIL {e}"
    run = make_tree(repo, args.work, os.path.abspath(args.hcbench), shared, head)
    env = dict(os.environ)
    env["PATH"] = os.path.join(run, "bin") + os.pathsep + env.get("PATH", "")
    env["HYBRIDCACHE_SOURCE_DIR"] = repo
    timeout = float(attrs.get("timeout", [args.timeout])[0])
    t0 = time.monotonic()
    p = subprocess.Popen(["bash", "-c", script], cwd=os.path.join(run, "repo"), env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, errors="replace", start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return f"FAIL {b.where}: still running after {timeout:.0f} s (timeout=)"
    secs = time.monotonic() - t0
    if args.verbose:
        sys.stdout.write(f"--- {b.where} output ({secs:.1f} s):\n{out}{err}---\n")
    if p.returncode != 0:
        tail = "\n".join((out + err).strip().split("\n")[-15:])
        return f"FAIL {b.where}: exited {p.returncode} ({secs:.1f} s):\n{tail}"
    output = out + "\n" + err
    problems = []
    if args.update and b.output and not reduced and \
            any(match_quoted(c, [out, err], shape=False) is not None for c in b.chunks):
        b.updates, left = propose_updates(b, [out, err])
        for q in left:
            print(f"  {b.where}: could not update, edit by hand: '{q.strip()}'")
    for chunk in b.chunks:
        miss = match_quoted(chunk, [out, err], shape=reduced)
        if miss is not None:
            problems.append(f"quoted line not in the output{' (shape: numbers any)' if reduced else ''}: '{miss}'")
    for s in attrs.get("check", []) if reduced else attrs.get("expect", []):
        if s not in output:
            problems.append(f"'{s}' not in the output")
    if problems:
        return f"FAIL {b.where} ({secs:.1f} s): " + "; ".join(problems) + \
            "\n  output:\n    " + "\n    ".join(output.strip().split("\n")[:40])
    return f"ok ({secs:.1f} s{', reduced' if reduced else ''})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", help="markdown files (relative to --repo)")
    p.add_argument("--repo", default=".")
    p.add_argument("--hcbench", help="the hcbench binary (needed unless --list or no run block)")
    p.add_argument("--work", default=None, help="scratch folder (default: a temp folder)")
    p.add_argument("--shared", default=None, help="shared data folder (default: REPO/../shared)")
    p.add_argument("--full", action="store_true", help="run reduced blocks as written; check every quoted number")
    p.add_argument("--list", action="store_true", help="check markers only and list the blocks")
    p.add_argument("--block", type=int, action="append", help="run only the block whose fence is on this line")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("-v", "--verbose", action="store_true", help="print every run's output")
    p.add_argument("--update", action="store_true",
                   help="rewrite quoted output lines that no longer come out with the output line most like "
                        "each (a trailing ... kept); review the diff. Reduced blocks only with --full")
    args = p.parse_args()
    repo = os.path.abspath(args.repo)
    shared = os.path.abspath(args.shared or os.path.join(repo, "..", "shared"))
    if args.work is None:
        import tempfile
        args.work = tempfile.mkdtemp(prefix="doc_commands_")
    failed, skipped, t0 = [], [], time.monotonic()
    for f in args.files:
        path = os.path.join(repo, f)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        try:
            runs, errors = check_file(path, f, text)
        except DocError as e:
            runs, errors = [], [str(e)]
        for e in errors:
            print(f"FAIL {e}")
        failed += errors
        if args.list:
            for b in runs:
                print(f"run  {b.where}  {b.marker[1]}")
            continue
        for b in runs:
            if args.block and b.line not in args.block:
                continue
            if not args.hcbench:
                sys.exit("doc_commands.py: --hcbench is needed to run the blocks")
            r = run_block(b, args, repo, shared)
            print(f"{r if r.startswith('FAIL') else b.where + ': ' + r}", flush=True)
            if r.startswith("FAIL"):
                failed.append(r)
            elif r.startswith("skipped"):
                skipped.append(b.where)
        changes = {at: new for b in runs for at, new in b.updates.items()}
        if changes:
            lines = text.split("\n")
            for at, new in changes.items():
                lines[at] = new
            with open(path, "w", encoding="utf-8") as fh:
                fh.write("\n".join(lines))
            print(f"{f}: --update rewrote {len(changes)} quoted line(s); review with git diff, then run again")
    print(f"doc_commands: {len(failed)} failed, {len(skipped)} not run for missing data, "
          f"{time.monotonic() - t0:.1f} s")
    if failed:
        return 1
    return 77 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
