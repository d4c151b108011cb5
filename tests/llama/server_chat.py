#!/usr/bin/env python3
"""llama-server renders and tokenizes our test models' chat prompts like the `tokenizers` package.

  server_chat.py --server PATH/llama-server --model M.gguf --cases chat_cases.txt

Starts llama-server on 127.0.0.1 (a free port, one slot, one thread), then for every
conversation of chat_cases.txt (written by scripts/llama_models.py):
  - POST /apply-template renders the messages with the model's chat template through the
    server's own Jinja engine: the prompt must equal the ChatML text the case holds;
  - POST /tokenize (specials parsed, as for a chat prompt) must give the ids the `tokenizers`
    package gave that text;
and for a few of them POST /v1/chat/completions (2 tokens, greedy) must report
usage.prompt_tokens equal to the number of those ids. Stops the server in every case.
Exit status 0 when everything matched, 1 otherwise.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from llama_http import free_port, http, stop  # noqa: E402


def read_cases(path):
    cases = []
    with open(path, "rb") as f:
        while True:
            header = f.readline()
            if not header:
                break
            tag, n_bytes, n_ids, n_msgs = header.split()
            if tag != b"case":
                raise SystemExit("%s: bad header %r" % (path, header))
            msgs = []
            for _ in range(int(n_msgs)):
                role, n = f.readline().split()
                content = f.read(int(n)).decode("utf-8")
                f.read(1)
                msgs.append({"role": role.decode(), "content": content})
            rendered = f.read(int(n_bytes)).decode("utf-8")
            f.read(1)
            ids = [int(x) for x in f.readline().split()]
            if len(ids) != int(n_ids):
                raise SystemExit("%s: id count mismatch" % path)
            cases.append((msgs, rendered, ids))
    return cases


def request(url, body=None, timeout=120):
    status, text = http(url, body, timeout=timeout)
    return status, json.loads(text or "null")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--completions", type=int, default=3, help="cases also sent to /v1/chat/completions")
    a = ap.parse_args()
    cases = read_cases(a.cases)
    n_ctx = max(len(ids) for _, _, ids in cases) + 64
    port = free_port()
    base = "http://127.0.0.1:%d" % port
    log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
    cmd = [a.server, "-m", a.model, "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-tb", "1",
           "-np", "1", "-c", str(n_ctx)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    failed = set()  # cases with a difference
    checked = 0
    try:
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit("llama-server exited with %s (log %s)" % (proc.returncode, log.name))
            try:
                if request(base + "/health", timeout=5)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.time() > deadline:
                raise SystemExit("llama-server did not become healthy in 120 s (log %s)" % log.name)
            time.sleep(0.2)

        for i, (msgs, rendered, ids) in enumerate(cases):
            _, r = request(base + "/apply-template", {"messages": msgs})
            if r.get("prompt") != rendered:
                failed.add(i)
                print("case %d: /apply-template renders differently:\n  got  %r\n  want %r" % (i, r.get("prompt", "")[:200], rendered[:200]))
            _, r = request(base + "/tokenize", {"content": rendered, "add_special": True, "parse_special": True})
            if r.get("tokens") != ids:
                failed.add(i)
                got = r.get("tokens") or []
                j = next((k for k in range(min(len(got), len(ids))) if got[k] != ids[k]), min(len(got), len(ids)))
                print("case %d: /tokenize differs from the tokenizers package at token %d (%d vs %d tokens)" % (i, j, len(got), len(ids)))
            checked += 1
            if i < a.completions:
                _, r = request(base + "/v1/chat/completions",
                               {"messages": msgs, "max_tokens": 2, "temperature": 0, "cache_prompt": False})
                n = r.get("usage", {}).get("prompt_tokens")
                if n != len(ids):
                    failed.add(i)
                    print("case %d: /v1/chat/completions prompt_tokens %s, the tokenizers package has %d" % (i, n, len(ids)))
    finally:
        stop(proc)
        log.close()
    print("%s: %d conversations rendered and tokenized by llama-server, %d of them completed" %
          (os.path.basename(a.model), checked, min(a.completions, len(cases))))
    if not failed:
        os.unlink(log.name)
    else:
        print("server log: %s" % log.name)
    print("%d passed, %d failed" % (checked - len(failed), len(failed)))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
