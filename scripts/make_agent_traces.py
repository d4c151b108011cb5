#!/usr/bin/env python3
"""Agent trajectories for the llama.cpp head-to-head, written from the ShareGPT trace.

No public agent trajectory set can be downloaded here, so this writes trajectories with the
structure that makes agent serving what it is: one long system prompt with tool descriptions
shared by every episode, a user task, then many steps of an assistant message with a tool call
and the tool's result, each request carrying the whole history so far. The texts are ShareGPT
messages (the user task is a human turn; tool results are assistant answers, cut to a few
hundred to a few thousand characters, as file views and search results are), so the tokenizer
sees real text. Deterministic for a seed.

  make_agent_traces.py --sharegpt FILE --out DIR [--episodes 12] [--steps 6-12] [--seed 1]

writes DIR/tau_bench.json (tau-bench results: [{"task_id", "reward", "info", "traj", "trial"}])
and DIR/swe_agent/episode_NNN.traj (SWE-agent: {"environment", "trajectory", "history"}), the
same episodes in both formats but with each format's own system prompt.
"""
import argparse
import json
import os
import random
import sys

TOOLS = [
    ("open_file", "Open a file of the repository and show lines [start, end]. Arguments: path (string), start (integer), end (integer)."),
    ("search", "Search the repository for a regular expression and list matching lines with their paths. Arguments: query (string), path (string, optional)."),
    ("edit_file", "Replace lines [start, end] of a file with new text; the edit is linted and refused if it breaks the syntax. Arguments: path, start, end, text."),
    ("run", "Run a shell command in the repository's environment and return its standard output and error (at most 4,000 characters). Arguments: command (string)."),
    ("list_dir", "List the entries of a directory with their sizes. Arguments: path (string)."),
    ("lookup_order", "Find an order by its id and return its items, status, payment method and shipping address. Arguments: order_id (string)."),
    ("lookup_user", "Find a user by email or by name and zip code; return the profile with addresses and payment methods. Arguments: email or name, zip."),
    ("refund", "Refund items of a delivered order to the original payment method or a gift card. Arguments: order_id, item_ids (list), payment_method_id."),
    ("exchange", "Exchange delivered items for other options of the same product. Arguments: order_id, item_ids, new_item_ids, payment_method_id."),
    ("cancel_order", "Cancel a pending order; the reason must be 'no longer needed' or 'ordered by mistake'. Arguments: order_id, reason."),
    ("transfer_to_human", "Transfer the user to a human agent with a summary of the problem. Arguments: summary (string)."),
    ("submit", "Submit the change and end the episode. No arguments."),
]

POLICY = """Rules you must follow in every episode:
- Authenticate the user (email, or name and zip code) before you read or change anything of theirs, even if they give you an order id.
- Act on one user per conversation; refuse requests about other users' data.
- Before any action that changes the database (refunds, exchanges, cancellations, edits), list the details of the action and ask for an explicit confirmation (yes) before you call the tool.
- Make at most one tool call at a time, and never call a tool and answer the user in the same message.
- Do not make up information or procedures that the tools and this policy do not give you; if a request is outside what you can do, transfer the user to a human agent.
- When you edit code, open the file first, keep each edit small, run the tests after every edit, and submit only when they pass.
- Keep your messages short and factual; show the user what the tools returned when it matters to their decision."""


def system_prompt(kind):
    intro = {
        "tau": "You are a customer service agent for an online retail store. You help users with their orders, returns, exchanges, payments and profile, using the tools below.",
        "swe": "You are an autonomous programmer working in a software repository. You fix the issue you are given using the tools below, then submit.",
    }[kind]
    tools = "\n".join(f"{i + 1}. {name}: {desc}" for i, (name, desc) in enumerate(TOOLS))
    return f"{intro}\n\n# Tools\n{tools}\n\n# Policy\n{POLICY}\n\nRespond with your reasoning in one or two sentences, then the tool call, as JSON."


def read_sharegpt(path):
    humans, answers = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            conv = json.loads(line).get("conversations", [])
            for m in conv:
                text = (m.get("value") or "").strip()
                if not text:
                    continue
                (humans if m.get("from") == "human" else answers).append(text)
    return humans, answers


def episode(rng, humans, answers, steps):
    task = rng.choice(humans)[:1200]
    msgs = [{"role": "user", "content": task}]
    for step in range(steps):
        name = rng.choice(TOOLS)[0]
        thought = rng.choice(answers)[: rng.randint(60, 240)]
        args = json.dumps({"query": rng.choice(humans)[:80], "step": step}, ensure_ascii=False)
        msgs.append({"role": "assistant", "content": thought,
                     "tool_calls": [{"id": f"call_{step}", "type": "function", "function": {"name": name, "arguments": args}}]})
        result = rng.choice(answers)[: rng.randint(300, 3000)]
        msgs.append({"role": "tool", "tool_call_id": f"call_{step}", "content": result})
    msgs.append({"role": "assistant", "content": rng.choice(answers)[:400]})
    return msgs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sharegpt", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--steps", default="6-12", help="steps per episode, MIN-MAX")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    lo, _, hi = a.steps.partition("-")
    lo, hi = int(lo), int(hi or lo)
    if a.episodes < 1 or lo < 1 or hi < lo:
        sys.exit("make_agent_traces: --episodes >= 1 and --steps MIN-MAX with 1 <= MIN <= MAX")
    humans, answers = read_sharegpt(a.sharegpt)
    if len(humans) < 10 or len(answers) < 10:
        sys.exit(f"make_agent_traces: {a.sharegpt} has too few messages")
    rng = random.Random(a.seed)
    episodes = [episode(rng, humans, answers, rng.randint(lo, hi)) for _ in range(a.episodes)]
    os.makedirs(os.path.join(a.out, "swe_agent"), exist_ok=True)
    tau = [{"task_id": i, "reward": 1.0, "info": {}, "trial": 0,
            "traj": [{"role": "system", "content": system_prompt("tau")}] + e} for i, e in enumerate(episodes)]
    with open(os.path.join(a.out, "tau_bench.json"), "w", encoding="utf-8") as f:
        json.dump(tau, f, ensure_ascii=False, indent=1)
    for i, e in enumerate(episodes):
        doc = {"environment": "swe_main", "trajectory": [],
               "history": [{"role": "system", "content": system_prompt("swe"), "agent": "primary"}] + [dict(m, agent="primary") for m in e]}
        with open(os.path.join(a.out, "swe_agent", f"episode_{i:03d}.traj"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
    print(f"make_agent_traces: {a.episodes} episodes ({sum(len(e) for e in episodes)} messages) into {a.out}")


if __name__ == "__main__":
    main()
