"""A task's mean clean and corrupted metric under each BOS rule, beside the same figure computed by hand.

    python benchmarks/task_tokens.py --model DIR [--pairs 96] [--seed 7] [--json out.json]

The built-in IOI generator writes ``--pairs`` pairs (seeded). circuitkit tokenizes them under ``prepend_bos`` None
(the tokenizer's default), True and False and reads the mean logit difference ``logit(IO) - logit(S)`` at each
prompt's last token through the TransformerLens bridge. The oracle: ``transformers.AutoTokenizer`` on the same
directory, each prompt alone (``add_special_tokens=True``, nothing circuitkit computed), through
``AutoModelForCausalLM``'s own forward. Prints a table and the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def circuitkit_means(model_dir: str, pairs: int, seed: int) -> tuple[dict, list]:
    from circuitkit import tasks
    from circuitkit.graph.metrics import METRICS, last_logits
    from circuitkit.models.adapters import adapt
    from circuitkit.models.loading import load_model

    bridge = load_model(model_dir)
    adapter = adapt(bridge)
    task = tasks.ioi(bridge, n=pairs, seed=seed)
    out = {}
    for rule in (None, True, False):
        batch = task.tokenize(adapter, prepend_bos=rule)
        means = {}
        for side in ("clean", "corrupted"):
            values = []
            for start in range(0, batch.n_pairs, 16):
                part = batch.subset(torch.arange(start, min(start + 16, batch.n_pairs)))
                with torch.no_grad():
                    logits = adapter.run(getattr(part, side), [])
                values.append(METRICS["logit_diff"](last_logits(logits, part.last)[0], part))
            means[side] = float(torch.cat(values).mean())
        means["first_prompt_ids"] = batch.clean[0, : int(batch.last[0]) + 1].tolist()
        out[batch.rule] = means
    examples = [(p.clean, p.corrupted, p.answers[0], p.wrongs[0]) for p in task.pairs]
    return out, examples


def by_hand(model_dir: str, examples: list) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True).eval()
    sums = {"clean": 0.0, "corrupted": 0.0}
    first = None
    for clean, corrupted, answer, wrong in examples:
        a = tokenizer(answer, add_special_tokens=False)["input_ids"][0]
        w = tokenizer(wrong, add_special_tokens=False)["input_ids"][0]
        for side, prompt in (("clean", clean), ("corrupted", corrupted)):
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            first = first or ids[0].tolist()
            with torch.no_grad():
                logits = model(ids).logits[0, -1]
            sums[side] += float(logits[a] - logits[w])
    return {"clean": sums["clean"] / len(examples), "corrupted": sums["corrupted"] / len(examples),
            "first_prompt_ids": first}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--pairs", type=int, default=96)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not Path(args.model).is_dir():
        sys.exit(f"{args.model}: no such directory")
    torch.set_num_threads(2)
    rules, examples = circuitkit_means(args.model, args.pairs, args.seed)
    rules["by hand (AutoTokenizer + AutoModelForCausalLM)"] = by_hand(args.model, examples)
    print(f"IOI, {args.pairs} pairs (seed {args.seed}), mean logit difference logit(IO) - logit(S)")
    print(f"{'tokens':<48} {'clean':>8} {'corrupted':>10}  first prompt's first ids")
    for name, row in rules.items():
        label = {"auto": "circuitkit, prepend_bos=None (default)", "yes": "circuitkit, prepend_bos=True",
                 "no": "circuitkit, prepend_bos=False"}.get(name, name)
        print(f"{label:<48} {row['clean']:>+8.3f} {row['corrupted']:>+10.3f}  {row['first_prompt_ids'][:4]}")
    text = json.dumps({"pairs": args.pairs, "seed": args.seed, "rules": rules}, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
