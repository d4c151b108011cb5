#!/usr/bin/env python3
"""Static figures of the decode kernels and of the chunk kernels' tensor-core loops, read off their SASS: no GPU needed.

An issue-bound kernel's time follows the instructions it issues per unit of work. This script
compiles the shipped kernels for the Qwen3-Next shapes (Gated DeltaNet, d_k = d_v = 128, bf16
in, fp32 state, V-major) with `nvcc -lineinfo -cubin`, disassembles them with `nvdisasm -gi`
(SASS with the inlined source line of every instruction), finds each loop (a backward branch)
and names the ones whose back edge comes from a source line listed in LOOPS below (the state
row loops, the buffer's per-token loop). For each it prints the SASS instructions of one
work item (a state row, a buffered token, a tensor-core product; nested loops' bodies counted
once) and how many of them are FP32 math, warp shuffles, global / shared / generic loads and
stores, barriers and special-function ops. Registers,
shared memory and occupancy are the ptxas gate's (.ci/check-ptxas.sh, docs/linear-attention.md).

    python3 scripts/kernel_sass_figures.py [--arch 90] [--arch 80] [--markdown] [--source DIR]

Needs nvcc (the CUDA toolkit) and nvdisasm. The toolkit here ships nvcc and ptxas only; the
disassembler comes from PyPI, pinned to a CUDA 13 release that reads sm_80/sm_90 cubins:

    pip install nvidia-cuda-nvdisasm==13.2.51

(`--tools DIR` names another directory holding nvdisasm.) `--source DIR` reads the headers of
another checkout (e.g. a `git worktree` of an older commit), to compare before and after.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

# The configuration the goals are stated for (Qwen3-Next GDN).
CONFIG = ("delta_rule", "v_major", 128, 128, "bfloat16_t")

# Named loops: (kernel, label, header, struct whose body holds the line, regex of the loop's
# line, regex of the SASS op that occurs once per work item). Every line of the struct that
# matches is a loop of its own (a trailing `// ...` comment on it joins its label). The
# compiler unrolls some loops (the recurrent one does decode_rows_in_flight rows per
# iteration by design), so an iteration's figures are divided by the work items it does,
# counted by their one-per-item op: a state row's 128-bit state load (d_k = 128 over a warp:
# one LDG.E.128 per lane), a buffered token's value load.
ROW = r"^LDG\.E\.128$"
TOKEN = r"^LDG\.E$"
# chunk_prepare's Gram phase, both paths of one kernel (prefill_io::math): a tile of the
# tensor-core path (16 rows x 8 keys of K K^T and Q K^T, d_k / 16 HMMA pairs; HMMA is the
# item, so multiply by 2 d_k / 16 = 16 for one tile), an entry pair (k_r.k_j, q_r.k_j) per
# lane of the fp32 path (its loop over j: one iteration, item None).
HMMA = r"^HMMA\b"
LOOPS = [
    ("recurrent_step", "recurrent decode, per state row", "decode_programs.hpp", "recurrent_program",
     r"for \(int c0 = row_begin; c0 < DV; c0 \+= R \* row_step\)", ROW),
    ("kv_step", "KVBuffer, per state row", "decode_programs.hpp", "kv_step_program",
     r"for \(int c = row_begin; c < DV; c \+= row_step\)", ROW),
    ("kv_step", "KVBuffer columns, per column and buffered token", "decode_programs.hpp", "kv_step_program",
     r"for \(int j = 0; j < m; \+\+j\) \{", TOKEN),
    ("kv_commit", "commit fold, per state row", "decode_programs.hpp", "kv_commit_program",
     r"for \(int c = row_begin; c < DV; c \+= row_step\)", ROW),
    ("chunk_prepare", "tensor-core Gram (K K^T and Q K^T), per HMMA (16 per 16x8 tile pair)", "chunk_programs.hpp",
     "chunk_prepare_program", r"for \(int tile = warp, mt = 0, first = 0;", HMMA),
    ("chunk_prepare", "fp32 Gram, per entry pair (k_r.k_j, q_r.k_j) of a lane, its loops over d_k counted once", "chunk_programs.hpp",
     "chunk_prepare_program", r"for \(int j = lane; j <= r; j \+= lanes\) \{  // Gram", None),
    ("chunk_scan", "tensor-core tile loop, per HMMA", "chunk_programs.hpp",
     "chunk_scan_program", r"for \(int tile = warp; tile \* mma_shape::m < len; tile \+= warps\) \{  //", HMMA),
]

CLASSES = [
    ("fp32", re.compile(r"^(FFMA|FMUL|FADD|FMNMX|FSETP|FSEL)\b")),
    ("shfl", re.compile(r"^SHFL\b")),
    ("ldg", re.compile(r"^LDG\b")),
    ("lds", re.compile(r"^LDS\b")),
    ("ld", re.compile(r"^LD\b")),  # generic loads (shared memory the compiler could not tell apart)
    ("st", re.compile(r"^(STG|STS)\b")),
    ("sync", re.compile(r"^(BAR|WARPSYNC|BSYNC|BSSY)\b")),
    ("mufu", re.compile(r"^MUFU\b")),
]


def find_tool(name, extra):
    for d in ([extra] if extra else []) + os.environ.get("PATH", "").split(os.pathsep) + ["/usr/local/cuda/bin"]:
        p = os.path.join(d, name)
        if d and os.access(p, os.X_OK):
            return p
    try:  # the PyPI package's location
        import nvidia  # noqa: F401  (namespace package of NVIDIA's wheels)
        for base in nvidia.__path__:
            for sub in ("cu13/bin", "cuda_nvdisasm/bin"):
                p = os.path.join(base, sub, name)
                if os.access(p, os.X_OK):
                    return p
    except ImportError:
        pass
    return None


def loop_lines(source, header, struct, pattern):
    """[(line number, trailing comment)] of the lines of `struct` that match `pattern`."""
    path = os.path.join(source, "include/hybridcache/attention", header)
    lines = open(path, encoding="utf-8").read().split("\n")
    start = next((i for i, l in enumerate(lines) if re.match(rf"struct {struct}\b", l)), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("};")), len(lines))
    out = []
    for i in range(start, end):
        if re.search(pattern, lines[i]):
            c = re.search(r"//\s*(.*)$", lines[i])
            out.append((i + 1, c.group(1).strip() if c else ""))
    return out


def compile_cubin(nvcc, source, arch, work):
    rule, layout, dk, dv, io = CONFIG
    cu = os.path.join(work, "kernels.cu")
    with open(cu, "w") as f:
        f.write('#include "hybridcache/attention/cuda/linear_attention_kernels.cuh"\n')
        f.write("using namespace hybridcache::attention;\n")
        f.write(f"using R = recurrent_program<{rule}, state_layout::{layout}, {dk}, {dv}, {io}, float>;\n")
        f.write(f"using K = kv_step_program<{rule}, state_layout::{layout}, {dk}, {dv}, {io}, float, float>;\n")
        f.write(f"using C = kv_commit_program<{rule}, state_layout::{layout}, {dk}, {dv}, {io}, float>;\n")
        f.write("template __global__ void hybridcache::attention::kernels::recurrent_step<R>(R);\n")
        f.write("template __global__ void hybridcache::attention::kernels::kv_step<K>(K);\n")
        f.write("template __global__ void hybridcache::attention::kernels::kv_commit<C>(C);\n")
        f.write(f"template __global__ void hybridcache::attention::kernels::chunk_prepare<{rule}, state_layout::{layout}, "
                f"{dk}, {dv}, {io}, float>(prefill_io<{io}, float>);\n")
        f.write(f"template __global__ void hybridcache::attention::kernels::chunk_scan<{rule}, state_layout::{layout}, "
                f"{dk}, {dv}, {io}, float>(prefill_io<{io}, float>);\n")
    out = os.path.join(work, f"k{arch}.cubin")
    subprocess.run([nvcc, "-std=c++20", f"-arch=sm_{arch}", "-lineinfo", "-cubin", "-I", os.path.join(source, "include"),
                    cu, "-o", out], check=True)
    return out


def parse_sass(text):
    """{kernel name: [(offset, opcode, branch target label or None, frames, label)]}"""
    kernels, current, frames, pending, labels = {}, None, [], [], {}
    for line in text.split("\n"):
        m = re.match(r"\s*\.text\.(\S+):", line) or re.match(r"\s*\.section\s+\.text\.(\S+),", line)
        if m:
            current = m.group(1).rstrip(":")
            kernels.setdefault(current, [])
            frames, pending = [], []
            continue
        if line.strip().startswith("//## File"):
            if not pending:
                frames = []
            pending.append(line)
            frames += [(os.path.basename(f), int(n)) for f, n in re.findall(r'"([^"]+)", line (\d+)', line)]
            continue
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m and current:
            labels.setdefault(current, {})[m.group(1)] = len(kernels[current])
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*);", line)
        if m and current:
            target = re.search(r"`\((\.L_x_\d+)\)", m.group(3))
            kernels[current].append((int(m.group(1), 16), m.group(2), target.group(1) if target else None, frames))
            pending = []
    return kernels, labels


def loops_of(instrs, labels):
    """[(first index, back-edge index)] of every backward branch."""
    out = []
    for i, (_, op, target, _) in enumerate(instrs):
        if op.startswith("BRA") and target is not None and labels.get(target, i + 1) <= i:
            out.append((labels[target], i))
    return out


def figures(instrs, lo, hi, item):
    """Instructions of one iteration of the loop [lo, hi], per class, and its work items."""
    counts = {name: 0 for name, _ in CLASSES}
    n = items = 0
    for _, op, _, _ in instrs[lo:hi + 1]:
        if op == "NOP":
            continue
        n += 1
        items += 1 if item is not None and re.match(item, op) else 0
        for name, rx in CLASSES:
            if rx.match(op):
                counts[name] += 1
                break
    return n, counts, items if item is not None else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", action="append", choices=["80", "90"], help="sm_80 and/or sm_90 (default: 90)")
    ap.add_argument("--tools", help="directory holding nvdisasm")
    ap.add_argument("--source", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="checkout whose headers are compiled (default: this one)")
    ap.add_argument("--markdown", action="store_true", help="a markdown table")
    args = ap.parse_args()
    nvcc = find_tool("nvcc", args.tools)
    nvdisasm = find_tool("nvdisasm", args.tools)
    if nvcc is None:
        sys.exit("kernel_sass_figures: nvcc not found (the CUDA toolkit)")
    if nvdisasm is None:
        sys.exit("kernel_sass_figures: nvdisasm not found; pip install nvidia-cuda-nvdisasm==13.2.51 (or --tools DIR)")
    source = os.path.abspath(args.source)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for arch in args.arch or ["90"]:
            cubin = compile_cubin(nvcc, source, arch, work)
            sass = subprocess.run([nvdisasm, "-gi", "-c", cubin], check=True, capture_output=True, text=True).stdout
            kernels, labels = parse_sass(sass)
            for kernel, label, header, struct, pattern, item in LOOPS:
                names = [k for k in kernels if f"kernels{len(kernel)}{kernel}" in k or f"7kernels{len(kernel)}{kernel}I" in k]
                for line, comment in loop_lines(source, header, struct, pattern):
                    for name in names:
                        instrs = kernels[name]
                        found = [(lo, hi) for lo, hi in loops_of(instrs, labels.get(name, {}))
                                 if (header, line) in instrs[hi][3]]
                        for lo, hi in found:
                            n, counts, items = figures(instrs, lo, hi, item)
                            nested = sum(1 for a, b in loops_of(instrs, labels[name]) if lo <= a and b < hi)
                            what = label + (f" ({comment})" if comment else "")
                            what += f", {items} per iteration" + (f", {nested} nested loops" if nested else "")
                            rows.append((f"sm_{arch}", kernel, what, f"{header}:{line}", n, max(items, 1), counts))
    if not rows:
        sys.exit("kernel_sass_figures: no named loop found in the SASS (did the loop lines change?)")
    cols = [name for name, _ in CLASSES]
    if args.markdown:
        print("| arch | kernel | loop | source line | SASS per item | " + " | ".join(cols) + " |")
        print("|---|---|---|---|---|" + "---|" * len(cols))
        for arch, kernel, what, where, n, per, counts in rows:
            cells = [f"{counts[c] / per:.3g}" for c in cols]
            print(f"| {arch} | {kernel} | {what} | {where} | {n / per:.3g} | " + " | ".join(cells) + " |")
    else:
        print(f"{'arch':6} {'kernel':15} {'SASS/item':>9} " + " ".join(f"{c:>5}" for c in cols) + "  loop")
        for arch, kernel, what, where, n, per, counts in rows:
            print(f"{arch:6} {kernel:15} {n / per:9.3g} " + " ".join(f"{counts[c] / per:5.3g}" for c in cols) +
                  f"  {what} [{where}]")


if __name__ == "__main__":
    main()
