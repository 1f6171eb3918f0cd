"""A circuit of heads and MLP neuron groups recomputed independently: Hugging Face forward hooks, no TransformerLens.

    python benchmarks/verify_neuron_circuit.py --model DIR --results neurons.json [--task ioi] [--pairs 16]

``benchmarks/neurons.py`` finds the circuit through TransformerLens's bridge (``hook_z``, ``mlp.hook_post``). Here
its faithfulness is computed on the Hugging Face model alone, on the same discovery pairs (the scan's split: seed 0,
half held out): each attention layer's ``o_proj`` input (every head's ``z``) and each MLP's ``down_proj`` input (its
hidden units, after the gate) are recorded on the corrupted prompts; then, on the clean prompts, every head and every
neuron group outside the circuit takes the corrupted values (group ``g`` of ``G``: the units ``u`` with
``floor(u * G / U) = g``), and the task's metric is read at each prompt's last token.

    faithfulness = (m_C - m_all) / (m_clean - m_all)     m_all: every head and every group patched
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
    parser.add_argument("--results", required=True, help="benchmarks/neurons.py's JSON")
    parser.add_argument("--task", default="ioi")
    parser.add_argument("--pairs", type=int, default=16)
    args = parser.parse_args(argv)
    if not Path(args.model).is_dir():
        sys.exit(f"{args.model}: no such directory")
    from transformers import AutoModelForCausalLM

    from circuitkit import tasks
    from circuitkit.graph.metrics import METRICS
    from circuitkit.models.loading import load_model
    from circuitkit.tasks.scan import split_pairs

    results = json.loads(Path(args.results).read_text())
    found, G = results["heads+neurons"], results["groups_per_layer"]
    bridge = load_model(args.model)  # for the task's token ids only
    task = tasks.get_task(args.task, bridge, n=args.pairs, seed=0)
    batch = task.tokenize(bridge).subset(split_pairs(task.n_pairs, 0.5, 0)[0])
    del bridge
    hf = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32, local_files_only=True).eval()
    layers = hf.model.layers
    n_heads = hf.config.num_attention_heads
    d_head = hf.config.hidden_size // n_heads
    kept_heads = {tuple(int(x) for x in h.split(".")) for h in found["heads"]}
    kept_groups = {tuple(int(x) for x in g[1:].split(".n")) for g in found["neuron_groups"]}
    rows = torch.arange(batch.n_pairs)
    metric = METRICS[task.metric]

    def run(tokens: torch.Tensor, hooks: list) -> torch.Tensor:
        handles = [module.register_forward_pre_hook(fn) for module, fn in hooks]
        try:
            with torch.no_grad():
                logits = hf(tokens).logits
        finally:
            for h in handles:
                h.remove()
        return metric(logits[rows, batch.last], batch).mean()

    corrupted: dict[tuple[str, int], torch.Tensor] = {}

    def record(key: tuple[str, int]):
        def hook(module, inputs):
            corrupted[key] = inputs[0].detach().clone()
        return hook

    every = [(layer.self_attn.o_proj, record(("z", i))) for i, layer in enumerate(layers)]
    every += [(layer.mlp.down_proj, record(("post", i))) for i, layer in enumerate(layers)]
    m_corrupted = run(batch.corrupted, every)
    m_clean = run(batch.clean, [])

    def patch_heads(i: int, keep: set):
        def hook(module, inputs):
            x = inputs[0].clone().view(*inputs[0].shape[:2], n_heads, d_head)
            z = corrupted[("z", i)].view_as(x)
            for h in range(n_heads):
                if (i, h) not in keep:
                    x[:, :, h] = z[:, :, h]
            return (x.view_as(inputs[0]),)
        return hook

    def patch_groups(i: int, keep: set):
        def hook(module, inputs):
            x = inputs[0].clone()
            units = x.shape[-1]
            group = torch.arange(units) * G // units
            out = torch.tensor([(i, int(g)) not in keep for g in group])
            x[..., out] = corrupted[("post", i)][..., out]
            return (x,)
        return hook

    def patched(heads: set, groups: set) -> list:
        return ([(layer.self_attn.o_proj, patch_heads(i, heads)) for i, layer in enumerate(layers)]
                + [(layer.mlp.down_proj, patch_groups(i, groups)) for i, layer in enumerate(layers)])

    m_all = run(batch.clean, patched(set(), set()))
    m_circuit = run(batch.clean, patched(kept_heads, kept_groups))
    faithfulness = float((m_circuit - m_all) / (m_clean - m_all))
    print(json.dumps({"task": args.task, "discovery_pairs": batch.n_pairs, "heads": len(kept_heads),
                      "neuron_groups": len(kept_groups), "clean": float(m_clean), "corrupted": float(m_corrupted),
                      "all_patched": float(m_all), "circuit_kept": float(m_circuit), "faithfulness": faithfulness,
                      "circuitkit_faithfulness": found["faithfulness"]}))


if __name__ == "__main__":
    main()
