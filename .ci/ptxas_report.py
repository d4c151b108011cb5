#!/usr/bin/env python3
"""Reads ptxas -v output (demangled) for sm_80 and sm_90, the launchers' dynamic shared memory
(ptxas_shared.cpp) and the kept PTX; fails on any spill, on shared memory over the per-block
limit, on a fold_row probe that is not an explicit FMA, or on recurrent decode without 128-bit
loads; prints the resource table (markdown) of docs/linear-attention.md.

usage: ptxas_report.py SHARED_TXT PTXAS_SM80 PTXAS_SM90 PTX_SM90"""
import re
import sys

# Per-SM and per-block limits (CUDA programming guide, compute capability 8.0 and 9.0).
LIMITS = {
    "80": dict(smem_sm=167936, smem_block=166912, regs=65536, warps=64, blocks=32),
    "90": dict(smem_sm=233472, smem_block=232448, regs=65536, warps=64, blocks=32),
}
RESERVED = 1024  # shared memory the runtime reserves per CTA
THREADS = {"count_nonfinite": 256, "qwen3_next_gates": 256}  # the rest use kThreads = 128


def key_of(demangled):
    m = re.search(r"kernels::(\w+)<", demangled)
    if not m:
        return None
    name = m.group(1)
    t = re.search(r"(delta_rule|linear_rule), \(hybridcache::attention::state_layout\)(\d), (\d+), (\d+), (?:hybridcache::attention::)?(\w+)", demangled)
    if t:
        layout = "v_major" if t.group(2) == "1" else "k_major"
        return f"{name}|{t.group(1)}|{layout}|{t.group(3)}|{t.group(5)}"
    io = re.search(r"kernels::\w+<(?:hybridcache::attention::)?(\w+)[,>]", demangled)
    return f"{name}|-|-|0|{io.group(1)}"


def parse_ptxas(path):
    out, current = {}, None
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.search(r"Compiling entry function '(.*)' for 'sm_(\d+)'", line)
        if m:
            current = key_of(m.group(1))
            if current:
                out[current] = {"spill": 0, "regs": 0, "smem": 0, "stack": 0}
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            out[current]["stack"] = int(m.group(1))
            out[current]["spill"] = int(m.group(2)) + int(m.group(3))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            out[current]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            out[current]["smem"] = int(s.group(1)) if s else 0
    return out


def occupancy(arch, regs, threads, smem):
    lim = LIMITS[arch]
    warps = threads // 32
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = (lim["regs"] // per_warp) // warps if per_warp else lim["blocks"]
    by_threads = lim["warps"] // warps
    by_smem = lim["smem_sm"] // (smem + RESERVED) if smem else lim["blocks"]
    blocks = min(by_regs, by_threads, by_smem, lim["blocks"])
    return blocks, blocks * warps / lim["warps"]


def entry_body(ptx, fragment):
    for m in re.finditer(r"\.entry (\S+)\(", ptx):
        if fragment(m.group(1)):
            end = ptx.find("\n}", m.end())
            return ptx[m.end():end]
    return None


def main():
    shared_path, sm80, sm90, ptx_path = sys.argv[1:5]
    dyn = {}
    for line in open(shared_path):
        k, v = line.split()
        dyn[k] = int(v)
    res = {"80": parse_ptxas(sm80), "90": parse_ptxas(sm90)}
    failures = []
    for arch in res:
        missing = sorted(set(dyn) - set(res[arch]))
        if missing:
            failures.append(f"sm_{arch}: no ptxas report for {missing}")
    rows = []
    for key in sorted(dyn):
        name = key.split("|")[0]
        threads = THREADS.get(name, 128)
        cells = [key.replace("|-|-|0|", " ").replace("|", " ")]
        for arch in ("80", "90"):
            r = res[arch].get(key)
            if r is None:
                cells += ["?"] * 3
                continue
            smem = r["smem"] + dyn[key]
            if r["spill"]:
                failures.append(f"sm_{arch} {key}: {r['spill']} bytes of spill loads/stores")
            if smem > LIMITS[arch]["smem_block"]:
                failures.append(f"sm_{arch} {key}: {smem} B of shared memory, over the {LIMITS[arch]['smem_block']} B limit")
            blocks, occ = occupancy(arch, r["regs"], threads, smem)
            cells += [str(r["regs"]), f"{smem}", f"{blocks} ({occ:.0%})"]
        rows.append(cells)
    ptx = open(ptx_path, encoding="utf-8", errors="replace").read()
    probe = entry_body(ptx, lambda n: "fold_row_probe" in n)
    if probe is None:
        failures.append("fold_row_probe not found in the PTX")
    else:
        fma, mul_rn = len(re.findall(r"\bfma\.rn\.f32", probe)), len(re.findall(r"\bmul\.rn\.f32", probe))
        loose = len(re.findall(r"\b(?:mul|add|sub)\.f32", probe))
        if fma != 4 or mul_rn != 4 or loose:
            failures.append(f"fold_row is not fma.rn(k, u, mul.rn(alpha, s)): {fma} fma.rn, {mul_rn} mul.rn, {loose} contractible")
    rec = entry_body(ptx, lambda n: "recurrent_step" in n and "delta_rule" in n and "ELi128ELi128ENS0_10bfloat16_t" in n
                     and "state_layoutE1" in n)
    v4 = len(re.findall(r"ld\.global(?:\.nc)?\.v4\.f32", rec or ""))
    if v4 < 4:
        failures.append(f"recurrent_step (d 128, V-major): {v4} 128-bit state loads, expected >= 4 (4 rows in flight)")
    print("| kernel (rule layout d_k input) | sm_80 regs | sm_80 smem B | sm_80 CTAs/SM (occupancy) "
          "| sm_90 regs | sm_90 smem B | sm_90 CTAs/SM (occupancy) |")
    print("|---|---|---|---|---|---|---|")
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    print(f"\nfold_row: {fma if probe else '?'} fma.rn.f32 + {mul_rn if probe else '?'} mul.rn.f32 for 4 elements; "
          f"recurrent_step d 128: {v4} ld.global.v4.f32")
    if failures:
        print("\nptxas gate FAILED:")
        for f in failures:
            print("  " + f)
        return 1
    print(f"\nptxas gate: {len(rows)} kernel instantiations x {{sm_80, sm_90}}: no spill, shared memory within the limits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
