#!/usr/bin/env python3
"""Self-test of doc_commands.py (ctest docs.selftest): the checker must fail when a doc drifts.

On small pages in a scratch folder, with a stand-in hcbench (a shell script printing fixed
numbers), it checks that a page whose quoted output and expect strings come out passes, and that
each of these fails: a quoted number changed by one digit, a number quoted shorter than printed,
an expect string the page no longer quotes, a command block without a marker, a fence without a
language, a skip without a reason, a reduced block whose page does not say so, a console command
with the wrong exit status, a block past its timeout; a reduced run checks the shape (a changed
number passes, a renamed column does not) and --full checks the numbers. Then on a copy of a real
page (--page, e.g. docs/replay.md) with the real hcbench: the copy passes, and the same copy with
one number of a quoted output changed fails.

  python3 tests/docs/doc_commands_selftest.py --checker tests/docs/doc_commands.py --repo . \\
      --hcbench build/h-docs/tools/hcbench --work /tmp/dc-self --page docs/replay.md
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

failures = []

FAKE = """#!/bin/sh
echo "trace       policy   token hit  TTFT p50"
echo "chat_seed7  marconi     13.30%  588.0 ms"
echo "P50 TTFT -15.9% vs single-tier"
echo "warning: on stderr 7.25" >&2
if [ "$1" = sleep ]; then sleep 30; fi
if [ "$1" = bad ]; then echo "hcbench: unknown policy 'fifo'" >&2; exit 1; fi
"""

GOOD = """# page

Replay it:

<!-- doc-test: run expect="-15.9%" -->
```sh
hcbench replay --trace x.jsonl --capacity 5e8
```

<!-- doc-test: output -->
```text
trace       policy   token hit  TTFT p50
chat_seed7  marconi     13.30%  588.0 ms
...
warning: on stderr 7.25
```

P50 TTFT -15.9% against one tier.

<!-- doc-test: run status=1 -->
```console
$ hcbench bad
hcbench: unknown policy 'fifo'
```

<!-- doc-test: skip reason="needs a GPU" -->
```bash
nvidia-smi
```

```cpp
int main() {}
```
"""

REDUCED = """# page

<!-- doc-test: run set="--capacity 1e9" -->
```sh
hcbench replay --capacity 5e8
```

The doc test runs this at 1e9.

<!-- doc-test: output -->
```text
chat_seed7  marconi     13.30%  588.0 ms
```
"""


def run(checker, repo, hcbench, work, page_text, extra=(), name="page.md"):
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write(page_text)
    r = subprocess.run([sys.executable, checker, "--repo", repo, "--hcbench", hcbench, "--work",
                        os.path.join(work, "w"), "--shared", os.path.join(work, "shared"), path, *extra],
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def expect(rc_ok, what, rc, out):
    ok = rc == 0 if rc_ok else rc == 1
    if not ok:
        failures.append(f"{what}: exit {rc} (want {'0' if rc_ok else '1'}):\n{out}")
    else:
        print(f"ok: {what} (exit {rc})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checker", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--hcbench", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--page", required=True, help="a real page with a run block that quotes output")
    a = p.parse_args()
    repo = os.path.abspath(a.repo)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(os.path.join(a.work, "shared"))
    fake = os.path.join(a.work, "fake_hcbench")
    with open(fake, "w") as f:
        f.write(FAKE)
    os.chmod(fake, 0o755)

    def fake_run(text, what, ok, extra=()):
        rc, out = run(a.checker, repo, fake, os.path.join(a.work, "synthetic"), text, extra)
        expect(ok, what, rc, out)

    fake_run(GOOD, "a page whose quoted output comes out passes", True)
    fake_run(GOOD.replace("13.30%  588.0", "13.31%  588.0"), "a quoted number changed by one digit fails", False)
    fake_run(GOOD.replace("13.30%  588.0", "13.3%  588.0"), "a number quoted shorter than printed fails", False)
    fake_run(GOOD.replace("P50 TTFT -15.9% against", "P50 TTFT -15.8% against"),
             "an expect string the page no longer quotes fails", False)
    fake_run(GOOD.replace('-15.9%" -->', '-15.8%" -->').replace("P50 TTFT -15.9% against", "P50 TTFT -15.8% against"),
             "an expect string that does not come out fails", False)
    fake_run(GOOD.replace('<!-- doc-test: skip reason="needs a GPU" -->\n', ""),
             "a command block without a marker fails", False)
    fake_run(GOOD.replace("```cpp", "```"), "a fence without a language fails", False)
    fake_run(GOOD.replace('skip reason="needs a GPU"', "skip"), "a skip without a reason fails", False)
    fake_run(GOOD.replace("run status=1", "run"), "a console command with the wrong exit status fails", False)
    fake_run(GOOD.replace("```bash\nnvidia-smi", "```bash\nhcbench sleep").replace(
        'skip reason="needs a GPU"', "run timeout=2"), "a block past its timeout fails", False)
    fake_run(REDUCED, "a reduced run passes on the quoted output's shape", True)
    fake_run(REDUCED.replace("13.30%", "99.99%"), "a reduced run: a changed number still has the shape", True)
    fake_run(REDUCED.replace("13.30%", "99.99%"), "--full: the changed number fails", False, ["--full"])
    fake_run(REDUCED.replace("marconi ", "sglang+ "), "a reduced run: a changed word fails", False)
    slow = REDUCED.replace('set="--capacity 1e9"', 'slow="long"').replace("13.30%", "99.99%")
    fake_run(slow, "a slow block is not run by default", True)
    fake_run(slow, "--full runs a slow block and checks it", False, ["--full"])
    fake_run(REDUCED.replace("The doc test runs this at 1e9.", "Runs at 1e9."),
             "a reduced block the page does not explain fails", False)
    fake_run(REDUCED.replace('set="--capacity 1e9"', 'set="--capacities 1e9"'),
             "set= of an option the block lacks fails", False)

    # --update rewrites a drifted quoted number from the run, keeping the trailing `...`, and the
    # page then passes.
    upd = os.path.join(a.work, "update")
    drifted = GOOD.replace("13.30%  588.0 ms", "13.31%  588.0 ms").replace(
        "chat_seed7  marconi     13.31%  588.0 ms", "chat_seed7  marconi     13.31%  ...")
    rc, out = run(a.checker, repo, fake, upd, drifted, ["--update"])
    with open(os.path.join(upd, "page.md")) as f:
        updated = f.read()
    if rc != 1 or "chat_seed7  marconi     13.30%  ..." not in updated:
        failures.append(f"--update did not rewrite the drifted line (exit {rc}):\n{out}\n{updated}")
    else:
        print("ok: --update rewrites a drifted quoted number (exit 1 on that run)")
    rc, out = run(a.checker, repo, fake, upd, updated)
    expect(True, "the updated page passes", rc, out)

    # A real page with the real hcbench: the blocks that quote output pass, and fail once one
    # quoted number is changed.
    with open(os.path.join(repo, a.page), encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.checker)))
    sys.dont_write_bytecode = True  # nothing written into the source tree
    import doc_commands
    blocks, _ = doc_commands.parse(a.page, text)
    target, run_line = None, None
    for b in blocks:
        kind = b.marker[0] if b.marker else None
        if kind == "run":
            run_line = b.line
        if kind == "skip":
            run_line = None
        quoted = kind == "output" or (kind == "run" and b.lang == "console")
        if not quoted or run_line is None:
            continue
        for k, body_line in enumerate(b.body):
            if b.lang == "console" and body_line.startswith("$ "):
                continue
            m = list(re.finditer(r"(?<![\w.])\d+\.\d+(?![\w.])", body_line))
            if m:
                j = b.line - 1 + k if b.lang == "table" else b.line + k
                assert lines[j].strip() == body_line.strip(), (lines[j], body_line)
                target = (j, m[0], run_line)
                break
        if target:
            break
    if target is None:
        failures.append(f"{a.page}: no quoted output with a decimal number to mutate")
    else:
        j, m, fence_line = target
        fence = fence_line - 1
        real = os.path.join(a.work, "real")
        os.makedirs(real)
        shared = os.path.abspath(os.path.join(repo, "..", "shared"))
        for name, body, ok, what in [
                ("same.md", text, True, f"{a.page} (the block at line {fence + 1}) passes"),
                ("mutated.md", None, False, None)]:
            if body is None:
                num = m.group()
                new = num[:-1] + str((int(num[-1]) + 1) % 10)
                mutated = list(lines)
                mutated[j] = lines[j][:m.start()] + new + lines[j][m.end():]
                body = "\n".join(mutated)
                what = f"{a.page}:{j + 1} with {num} -> {new} fails"
            path = os.path.join(real, name)
            with open(path, "w") as f:
                f.write(body)
            r = subprocess.run([sys.executable, a.checker, "--repo", repo, "--hcbench", a.hcbench, "--work",
                                os.path.join(real, "w"), "--shared", shared, "--block", str(fence + 1), path],
                               capture_output=True, text=True, timeout=300)
            if r.returncode == 77:
                print(f"skipped: {what}: ../shared absent")
                continue
            expect(ok, what, r.returncode, r.stdout + r.stderr)
    if failures:
        print("FAIL\n" + "\n".join(failures))
        return 1
    print("doc_commands_selftest: all cases as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
