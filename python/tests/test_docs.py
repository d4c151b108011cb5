"""docs/python.md's Python blocks run, in order, in one namespace (as a reader would paste
them), in a folder holding the files they name: chat.jsonl (hcbench gen) and tokenizer.json (a
small BPE the `tokenizers` package trains on the docs, as hf_exact.py does)."""
import os
import re
import subprocess
import sys

import pytest


def test_python_blocks_of_docs_python_md(source_dir, hcbench, tmp_path, monkeypatch):
    text = open(os.path.join(source_dir, "docs", "python.md"), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 4
    subprocess.run([hcbench, "gen", "--profile", "chat", "--seed", "1", "--sessions", "20", "--out",
                    str(tmp_path / "chat.jsonl")], check=True, capture_output=True)
    pytest.importorskip("tokenizers")
    sys.path.insert(0, os.path.join(source_dir, "tests", "tokenizer"))
    import hf_exact
    hf_exact.train(hf_exact.corpus_lines(source_dir), 1000, True, str(tmp_path / "tokenizer.json"))
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/python.md python block {i + 1}", "exec"), namespace)
