#!/usr/bin/env python3
"""Writes the random-weight hybrid GGUF models that llama.cpp runs in our tests.

  python scripts/llama_models.py --out DIR [--traces FILE ...] [--vocab-size 32000]

Run it with the Python of scripts/llama.sh's venv (numpy, tokenizers and the sdist's own
gguf-py, all pinned there). Nothing is downloaded: the weights are drawn from a seeded numpy
generator, so the same inputs give byte-identical files.

Written into DIR:
  tokenizer.json    a byte-level BPE trained with the `tokenizers` package on the traces
                    (scripts/train_bpe_tokenizer.py, Qwen 2's pre-tokenizer regex, no
                    normalizer) with the ChatML specials <|im_start|>, <|im_end|>, <|endoftext|>
  qwen35.gguf       arch `qwen35` (Qwen3.5): Gated DeltaNet layers with one gated-attention
                    layer in four (full_attention_interval 4)
  nemotron_h.gguf   arch `nemotron_h` (Nemotron-H): Mamba2, MLP and attention blocks, one
                    attention block per three Mamba2 blocks
  chat_cases.txt    conversations from the traces rendered with the ChatML template and the
                    token ids the `tokenizers` package gives them (the llama tests compare
                    llama.cpp's rendering and tokenization against these)
  models.txt        NAME=FILE for each model (FILE inside DIR)

Both models carry the vocabulary as a GPT-2-style BPE (tokenizer.ggml.model "gpt2", merges,
pre-tokenizer "qwen2", which llama.cpp implements with the same regex) and a ChatML
`tokenizer.chat_template`, so llama-server's /v1/chat/completions renders and tokenizes text
conversations the way it does for a production Qwen model.

Sizes (see docs/llama_cpp.md for the measured speed): n_embd 256, one llama.cpp CPU thread
prefills several thousand tokens per second; context length 65,536.
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CONTEXT_LENGTH = 65536

# ChatML as Qwen's models render it: one block per message, "<|im_start|>ROLE\nCONTENT<|im_end|>\n";
# tool results wrapped in <tool_response> inside a user block, assistant tool calls as
# <tool_call> JSON lines; the generation prompt opens an assistant block. Written for these
# tests (not taken from a model): it renders plain text conversations exactly like Qwen's.
CHAT_TEMPLATE = (
    "{%- macro text(c) -%}"
    "{%- if c is string -%}{{- c -}}"
    "{%- elif c is iterable -%}{%- for p in c -%}{%- if p.type == 'text' -%}{{- p.text -}}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Their signatures are inside <tools></tools>:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each call, return a JSON object with the function name and arguments inside "
    "<tool_call></tool_call>:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n"
    "</tool_call><|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}"
    "{%- if not (tools and loop.first) -%}{{- '<|im_start|>system\\n' + text(m.content) + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text(m.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if m.content -%}{{- text(m.content) -}}{%- endif -%}"
    "{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "{%- if loop.first and m.content -%}{{- '\\n' -}}{%- elif not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' -}}"
    "{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + text(m.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def render_chatml(messages, add_generation_prompt=True):
    """The template above for text-only messages (no tools), in plain Python."""
    out = "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"]) for m in messages)
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


# --- the vocabulary -----------------------------------------------------------------------

def train_tokenizer(traces, vocab_size, path):
    import train_bpe_tokenizer as tb
    corpus = []
    for p in traces:
        corpus += tb.texts(p)
    tok = tb.train(corpus, vocab_size, split="qwen2", nfc=False)
    tok.save(path)
    return tok


def vocab_from_tokenizer_json(path):
    """tokens (by id), token types, merges ("a b") and the ids of the specials."""
    import gguf
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    model = tj["model"]
    if model["type"] != "BPE":
        raise SystemExit("%s: not a BPE tokenizer" % path)
    by_id = {i: t for t, i in model["vocab"].items()}
    specials = {}
    for a in tj["added_tokens"]:
        by_id[a["id"]] = a["content"]
        if a["special"]:
            specials[a["content"]] = a["id"]
    n = len(by_id)
    if sorted(by_id) != list(range(n)):
        raise SystemExit("%s: token ids are not 0..%d" % (path, n - 1))
    for s in SPECIALS:
        if s not in specials:
            raise SystemExit("%s: special token %s missing" % (path, s))
    tokens = [by_id[i] for i in range(n)]
    types = [int(gguf.TokenType.CONTROL) if i in specials.values() else int(gguf.TokenType.NORMAL) for i in range(n)]
    merges = [m if isinstance(m, str) else "%s %s" % (m[0], m[1]) for m in model["merges"]]
    for m in merges:
        if m.count(" ") != 1:
            raise SystemExit("%s: merge %r has a space inside a token" % (path, m))
    return tokens, types, merges, specials


def add_vocab(w, tokens, types, merges, specials):
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")  # llama.cpp's regex for it is the one the tokenizer was trained with
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(specials["<|endoftext|>"])
    w.add_eos_token_id(specials["<|im_end|>"])
    w.add_eot_token_id(specials["<|im_end|>"])
    w.add_pad_token_id(specials["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


# --- weights ------------------------------------------------------------------------------

class Weights:
    """Adds tensors given in ggml's order of dimensions (ne0 first), drawn from one generator."""

    def __init__(self, w, arch, seed):
        import gguf
        self.w = w
        self.rng = np.random.default_rng(seed)
        arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
        self.known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch_id]}
        self.n_params = 0

    def _check(self, name):
        base = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
        parts = base.split(".")
        if parts[0] == "blk":
            base = "blk.{bid}." + ".".join(parts[2:])
        if base not in self.known:
            raise SystemExit("tensor %s is not one of this architecture's" % name)

    def add(self, name, ne, data):
        self._check(name)
        arr = np.ascontiguousarray(np.asarray(data, dtype=np.float32).reshape(tuple(reversed(ne))))
        self.w.add_tensor(name, arr)
        self.n_params += arr.size

    def matrix(self, name, n_in, n_out, gain=1.0):
        """A projection from n_in to n_out (ggml {n_in, n_out}), scaled by 1/sqrt(n_in)."""
        self.add(name, (n_in, n_out), self.rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in)))

    def ones(self, name, ne):
        self.add(name, ne, np.ones(int(np.prod(ne))))

    def uniform(self, name, ne, lo, hi):
        self.add(name, ne, self.rng.uniform(lo, hi, int(np.prod(ne))))


def write_qwen35(path, vocab, seed):
    import gguf
    tokens = vocab[0]
    n_vocab = len(tokens)
    n_embd, n_ff, n_layer = 256, 768, 8
    n_head, n_head_kv, head_dim = 4, 2, 64
    interval = 4                     # layers 3 and 7 are gated attention, the rest Gated DeltaNet
    d_conv, head_k, n_k_heads, n_v_heads = 4, 64, 2, 4
    head_v = head_k                  # llama.cpp's qwen35 takes the value head size from ssm.state_size
    key_dim, value_dim = head_k * n_k_heads, head_v * n_v_heads
    n_rot = head_dim // 4            # partial_rotary_factor 0.25, as Qwen3.5 ships
    sections = [3, 3, 2, 0]          # interleaved M-RoPE sections (t, h, w): n_rot / 2 pairs, like Qwen's 11/11/10 of 32

    w = gguf.GGUFWriter(path, "qwen35")
    w.add_name("hybridcache test qwen35 (random weights)")
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(n_rot)
    w.add_rope_dimension_sections(sections)
    w.add_rope_freq_base(10000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_state_size(head_k)
    w.add_ssm_group_count(n_k_heads)
    w.add_ssm_time_step_rank(n_v_heads)
    w.add_ssm_inner_size(value_dim)
    w.add_full_attention_interval(interval)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_vocab(w, *vocab)

    t = Weights(w, "qwen35", seed)
    t.add("token_embd.weight", (n_embd, n_vocab), t.rng.standard_normal((n_vocab, n_embd)) * 0.5)
    t.ones("output_norm.weight", (n_embd,))
    for il in range(n_layer):
        b = "blk.%d." % il
        t.ones(b + "attn_norm.weight", (n_embd,))
        t.ones(b + "post_attention_norm.weight", (n_embd,))
        if (il + 1) % interval == 0:  # gated attention: q carries the output gate (2 x n_head x head_dim)
            t.matrix(b + "attn_q.weight", n_embd, 2 * n_head * head_dim)
            t.matrix(b + "attn_k.weight", n_embd, n_head_kv * head_dim)
            t.matrix(b + "attn_v.weight", n_embd, n_head_kv * head_dim)
            t.matrix(b + "attn_output.weight", n_head * head_dim, n_embd)
            t.ones(b + "attn_q_norm.weight", (head_dim,))
            t.ones(b + "attn_k_norm.weight", (head_dim,))
        else:  # Gated DeltaNet
            t.matrix(b + "attn_qkv.weight", n_embd, 2 * key_dim + value_dim)
            t.matrix(b + "attn_gate.weight", n_embd, value_dim)
            t.add(b + "ssm_conv1d.weight", (d_conv, 2 * key_dim + value_dim),
                  t.rng.standard_normal((2 * key_dim + value_dim, d_conv)) / np.sqrt(d_conv))
            t.ones(b + "ssm_dt.bias", (n_v_heads,))
            t.uniform(b + "ssm_a", (n_v_heads,), -16.0, -1.0)  # -exp(A_log): must be negative
            t.matrix(b + "ssm_beta.weight", n_embd, n_v_heads)
            t.matrix(b + "ssm_alpha.weight", n_embd, n_v_heads)
            t.ones(b + "ssm_norm.weight", (head_v,))
            t.matrix(b + "ssm_out.weight", value_dim, n_embd)
        t.matrix(b + "ffn_gate.weight", n_embd, n_ff)
        t.matrix(b + "ffn_up.weight", n_embd, n_ff)
        t.matrix(b + "ffn_down.weight", n_ff, n_embd)
    finish(w)
    return t.n_params


NEMOTRON_PATTERN = "M-M-M*-M-M-M*-"  # M Mamba2, - MLP, * attention (as Nemotron-H's hybrid_override_pattern)


def write_nemotron_h(path, vocab, seed):
    import gguf
    tokens = vocab[0]
    n_vocab = len(tokens)
    n_embd, n_ff = 256, 1024
    n_head, n_head_kv, head_dim = 4, 2, 64
    d_conv, d_state, n_group, n_ssm_head, ssm_head_dim = 4, 64, 1, 8, 64
    d_inner = n_ssm_head * ssm_head_dim
    d_xbc = d_inner + 2 * n_group * d_state
    d_in_proj = 2 * d_inner + 2 * n_group * d_state + n_ssm_head
    pattern = NEMOTRON_PATTERN
    n_layer = len(pattern)

    w = gguf.GGUFWriter(path, "nemotron_h")
    w.add_name("hybridcache test nemotron_h (random weights)")
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length([n_ff if c == "-" else 0 for c in pattern])
    w.add_head_count(n_head)
    w.add_head_count_kv([n_head_kv if c == "*" else 0 for c in pattern])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_eps(1e-5)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_state_size(d_state)
    w.add_ssm_group_count(n_group)
    w.add_ssm_time_step_rank(n_ssm_head)
    w.add_ssm_inner_size(d_inner)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_vocab(w, *vocab)

    t = Weights(w, "nemotron_h", seed)
    t.add("token_embd.weight", (n_embd, n_vocab), t.rng.standard_normal((n_vocab, n_embd)) * 0.5)
    t.ones("output_norm.weight", (n_embd,))
    for il, c in enumerate(pattern):
        b = "blk.%d." % il
        t.ones(b + "attn_norm.weight", (n_embd,))
        if c == "M":
            t.matrix(b + "ssm_in.weight", n_embd, d_in_proj)
            t.add(b + "ssm_conv1d.weight", (d_conv, d_xbc), t.rng.standard_normal((d_xbc, d_conv)) / np.sqrt(d_conv))
            t.add(b + "ssm_conv1d.bias", (d_xbc,), t.rng.standard_normal(d_xbc) * 0.1)
            dt = np.exp(t.rng.uniform(np.log(1e-3), np.log(1e-1), n_ssm_head))
            t.add(b + "ssm_dt.bias", (n_ssm_head,), dt + np.log(-np.expm1(-dt)))  # inverse softplus
            t.uniform(b + "ssm_a", (1, n_ssm_head), -16.0, -1.0)  # -exp(A_log)
            t.ones(b + "ssm_d", (1, n_ssm_head))
            t.ones(b + "ssm_norm.weight", (d_inner // n_group, n_group))
            t.matrix(b + "ssm_out.weight", d_inner, n_embd)
        elif c == "*":
            t.matrix(b + "attn_q.weight", n_embd, n_head * head_dim)
            t.matrix(b + "attn_k.weight", n_embd, n_head_kv * head_dim)
            t.matrix(b + "attn_v.weight", n_embd, n_head_kv * head_dim)
            t.matrix(b + "attn_output.weight", n_head * head_dim, n_embd)
        else:
            t.matrix(b + "ffn_up.weight", n_embd, n_ff)
            t.matrix(b + "ffn_down.weight", n_ff, n_embd)
    finish(w)
    return t.n_params


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


# --- the conversations the tests tokenize ---------------------------------------------------

EXTRA_TEXTS = [
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n\n\n\tindent\r\nwindows line",
    "Numbers 1234567 and 3.14159, emoji 👩‍👩‍👧 and ﬁ ligature, Ｆｕｌｌｗｉｄｔｈ, e\u0301 combining",
    "Looks special but is not: <|im_start|  <|im_end  |endoftext|> <im_start>",
    "   leading spaces, trailing spaces   ",
    "I'm sure they'll say we've done it, isn't it? 'S 'T",
]


def chat_cases(traces, n_cases):
    """Conversations from the ShareGPT-style traces (role names mapped to OpenAI's), cut after
    their last user message as a chat request is, every other one with a system message, plus a
    few edge-case texts."""
    convs = []
    for p in traces:
        with open(p, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                d = json.loads(line)
                msgs = d.get("conversations") or d.get("messages") or []
                out = []
                for m in msgs:
                    role = {"human": "user", "gpt": "assistant", "system": "system"}.get(m.get("from"), m.get("role"))
                    content = m.get("value", m.get("content"))
                    if role in ("user", "assistant", "system") and isinstance(content, str):
                        out.append({"role": role, "content": content})
                while out and out[-1]["role"] == "assistant":
                    out.pop()  # a request ends with the user's turn (llama-server continues a final assistant message)
                if out:
                    convs.append(out)
                if len(convs) >= n_cases:
                    break
    cases = []
    for i, msgs in enumerate(convs):
        if i % 2 == 0 and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": "You are a helpful assistant."}] + msgs
        cases.append(msgs)
    cases.append([{"role": "user", "content": t} for t in EXTRA_TEXTS])
    return cases


def write_cases(path, tok, cases):
    """chat_cases.txt: per case a header line `case BYTES IDS MESSAGES`; per message a line
    `ROLE BYTES`, its content (BYTES bytes of UTF-8) and a newline; the rendered prompt (BYTES
    bytes), a newline; then the ids on one line, separated by spaces."""
    check_template(cases)
    with open(path, "wb") as f:
        for msgs in cases:
            text = render_chatml(msgs)
            ids = tok.encode(text).ids
            raw = text.encode("utf-8")
            f.write(b"case %d %d %d\n" % (len(raw), len(ids), len(msgs)))
            for m in msgs:
                content = m["content"].encode("utf-8")
                f.write(b"%s %d\n" % (m["role"].encode(), len(content)))
                f.write(content + b"\n")
            f.write(raw + b"\n")
            f.write((" ".join(str(i) for i in ids) + "\n").encode())


def check_template(cases):
    """When jinja2 is importable, the template must render every case like render_chatml."""
    try:
        import jinja2
    except ImportError:
        return
    env = jinja2.Environment()
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    tmpl = env.from_string(CHAT_TEMPLATE)
    for msgs in cases:
        got = tmpl.render(messages=msgs, add_generation_prompt=True, tools=None)
        if got != render_chatml(msgs):
            raise SystemExit("chat template renders differently from ChatML:\n%r\n%r" % (got[:300], render_chatml(msgs)[:300]))


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    default_trace = os.path.join(HERE, "..", "..", "shared", "data", "traces", "sharegpt_zh_1k", "sharegpt_zh_1K_format.jsonl")
    ap.add_argument("--traces", nargs="+", default=[default_trace])
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--cases", type=int, default=24)
    ap.add_argument("--seed", type=int, default=20240933)
    a = ap.parse_args()
    for p in a.traces:
        if not os.path.exists(p):
            raise SystemExit("trace %s not found (pass --traces)" % p)
    os.makedirs(a.out, exist_ok=True)

    tj = os.path.join(a.out, "tokenizer.json")
    tok = train_tokenizer(a.traces, a.vocab_size, tj)
    vocab = vocab_from_tokenizer_json(tj)

    models = {}
    for name, fn, seed in (("qwen35", write_qwen35, a.seed), ("nemotron_h", write_nemotron_h, a.seed + 1)):
        path = os.path.join(a.out, name + ".gguf")
        n = fn(path, vocab, seed)
        models[name] = path
        print("%s: %s, %d parameters, %d bytes, sha256 %s" % (name, path, n, os.path.getsize(path), sha256_file(path)[:16]),
              file=sys.stderr)

    write_cases(os.path.join(a.out, "chat_cases.txt"), tok, chat_cases(a.traces, a.cases))
    with open(os.path.join(a.out, "models.txt"), "w") as f:
        for name, path in models.items():
            f.write("%s=%s\n" % (name, os.path.basename(path)))


if __name__ == "__main__":
    main()
