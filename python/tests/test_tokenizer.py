"""Tokenizer: ids equal to the `tokenizers` package's on the C++ test's fixtures
(tests/tokenizer/hf_exact.py: its corpus, its string generators, its training recipes)."""
import os
import random
import sys

import numpy as np
import pytest

import hybridcache

tokenizers = pytest.importorskip("tokenizers", reason="the pinned venv of scripts/install-deps.sh has it")


@pytest.fixture(scope="module")
def hf_exact(source_dir):
    sys.path.insert(0, os.path.join(source_dir, "tests", "tokenizer"))
    import hf_exact as h
    return h


@pytest.fixture(scope="module")
def cases(hf_exact, source_dir):
    lines = hf_exact.corpus_lines(source_dir)
    rng = random.Random(35)
    texts = [l for l in lines if l.strip()]
    rng.shuffle(texts)
    out = texts[:600] + hf_exact.random_strings(rng, 600) + hf_exact.random_code_points(rng, 200)
    out += [b.decode("utf-8", "replace") for b in hf_exact.random_bytes(rng, 200)]
    out += ["", " ", "  ", "\n", "a", "'s", " '", "\u3000\u3000x", "a   b", "x\n\ny", "<|im_start|>user\nhi<|im_end|>"]
    return out


@pytest.fixture(scope="module", params=["gpt2", "llama3"])
def trained(request, hf_exact, source_dir, tmp_path_factory):
    lines = hf_exact.corpus_lines(source_dir)
    path = str(tmp_path_factory.mktemp("tok") / f"tokenizer_{request.param}.json")
    if request.param == "gpt2":
        tok = hf_exact.train(lines, 2000, True, path)
    else:  # the Split pre-tokenizer and the BOS post-processor of Llama 3
        tok = hf_exact.train(lines, 2000, True, path, split=hf_exact.LLAMA3_REGEX, bos=True)
    return tok, path


def test_encode_equals_the_package(trained, cases):
    ref, path = trained
    tok = hybridcache.Tokenizer.from_file(path)
    assert tok.fast_encoder and tok.vocab_size == ref.get_vocab_size(with_added_tokens=False)
    for text in cases:
        want = ref.encode(text, add_special_tokens=False).ids
        got = tok.encode(text)
        assert got.dtype == np.int32 and got.ndim == 1
        assert got.tolist() == want, repr(text)
    for text in cases[:50]:  # the package's default: the post-processor's tokens (Llama 3: BOS)
        assert tok.encode(text, add_special_tokens=True).tolist() == ref.encode(text).ids


def test_encode_batch_and_decode_equal_the_package(trained, cases):
    ref, path = trained
    # Model files (GPT-2, Llama 3, Qwen 2) have the ByteLevel decoder, which Tokenizer.decode is;
    # hf_exact's trained files have none (the package would join token spellings with spaces).
    ref.decoder = tokenizers.decoders.ByteLevel()
    tok = hybridcache.Tokenizer.from_file(path)
    want = [e.ids for e in ref.encode_batch(cases, add_special_tokens=False)]
    for threads in (1, 2, 0):
        assert [a.tolist() for a in tok.encode_batch(cases, threads=threads)] == want
    for ids in want:
        assert tok.decode(ids) == ref.decode(ids)
        assert tok.decode(np.asarray(ids, dtype=np.int64)) == ref.decode(ids)
    ids = ref.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False)
    assert tok.token_to_id("<|im_end|>") == ref.token_to_id("<|im_end|>")


def test_bad_input(trained, tmp_path):
    _, path = trained
    tok = hybridcache.Tokenizer.from_file(path)
    with pytest.raises(TypeError):
        tok.encode(12)
    with pytest.raises(TypeError):
        tok.encode_batch("not a list of str")
    with pytest.raises(hybridcache.InvalidArgument, match="not in the vocabulary"):
        tok.decode([10**8])
    with pytest.raises(hybridcache.InvalidArgument, match=r"ids\[1\]"):
        tok.decode([1, -1])
    with pytest.raises(TypeError, match="float"):
        tok.decode(np.zeros(3, dtype=np.float32))
    with pytest.raises(hybridcache.InvalidArgument, match="cannot read"):
        hybridcache.Tokenizer.from_file(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(hybridcache.Error):
        hybridcache.Tokenizer.from_file(str(bad))
