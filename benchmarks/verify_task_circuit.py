"""A task circuit's faithfulness recomputed independently: plain Hugging Face forward hooks, no TransformerLens.

    python benchmarks/verify_task_circuit.py --model DIR --task ioi --pairs 16 --heads 20.9

circuitkit finds the circuit through TransformerLens's bridge (``hook_z``). Here the same figure is computed on the
Hugging Face model alone: each attention layer's ``o_proj`` input (every head's ``z``, concatenated) is recorded on
the corrupted prompts, then, on the clean prompts, every head outside ``--heads`` has its slice replaced by the
corrupted one (MLPs recomputed), and the task's metric is read at each prompt's last token. The prompts' token
ids come from circuitkit's tokenization (data, not computation); everything else is transformers' own forward.

    faithfulness = (m_C - m_all) / (m_clean - m_all)     m_all: every head patched
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", default="ioi")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heads", default="20.9", help="the circuit, as layer.head,layer.head,...")
    parser.add_argument("--results", default=None, help="a benchmarks/tasks.py JSON: take the task's circuit from it")
    args = parser.parse_args(argv)
    if not Path(args.model).is_dir():
        sys.exit(f"{args.model}: no such directory")
    from transformers import AutoModelForCausalLM

    from circuitkit import tasks
    from circuitkit.graph.metrics import METRICS
    from circuitkit.models.loading import load_model

    bridge = load_model(args.model)  # for the task's token ids only
    task = tasks.get_task(args.task, bridge, n=args.pairs, seed=args.seed)
    batch = task.tokenize(bridge)
    del bridge
    hf = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32, local_files_only=True).eval()
    layers = hf.model.layers
    n_heads = hf.config.num_attention_heads
    d_head = hf.config.hidden_size // n_heads
    heads = args.heads.split(",")
    if args.results:
        heads = next(r["heads"] for r in json.loads(Path(args.results).read_text()) if r["task"] == args.task)
    kept = {tuple(int(x) for x in h.split(".")) for h in heads}
    rows = torch.arange(batch.n_pairs)
    metric = METRICS[task.metric]

    def run(tokens: torch.Tensor, hooks: list) -> torch.Tensor:
        handles = [layers[i].self_attn.o_proj.register_forward_pre_hook(fn) for i, fn in hooks]
        try:
            with torch.no_grad():
                logits = hf(tokens).logits
        finally:
            for h in handles:
                h.remove()
        last = logits[rows, batch.last]
        return metric(last, batch).mean()  # the task's metric, as defined in circuitkit.graph.metrics

    corrupted_z: dict[int, torch.Tensor] = {}

    def record(i: int):
        def hook(module, inputs):
            corrupted_z[i] = inputs[0].detach().clone()
        return hook

    m_corrupted = run(batch.corrupted, [(i, record(i)) for i in range(len(layers))])
    m_clean = run(batch.clean, [])

    def patch(i: int, keep: set):
        def hook(module, inputs):
            x = inputs[0].clone().view(*inputs[0].shape[:2], n_heads, d_head)
            z = corrupted_z[i].view_as(x)
            for h in range(n_heads):
                if (i, h) not in keep:
                    x[:, :, h] = z[:, :, h]
            return (x.view_as(inputs[0]),)
        return hook

    m_all = run(batch.clean, [(i, patch(i, set())) for i in range(len(layers))])
    m_circuit = run(batch.clean, [(i, patch(i, kept)) for i in range(len(layers))])
    faithfulness = float((m_circuit - m_all) / (m_clean - m_all))
    print(json.dumps({"task": args.task, "pairs": batch.n_pairs, "heads": sorted(f"{a}.{b}" for a, b in kept),
                      "clean": float(m_clean), "corrupted": float(m_corrupted), "all_heads_patched": float(m_all),
                      "circuit_kept": float(m_circuit), "faithfulness": faithfulness}))


if __name__ == "__main__":
    main()
