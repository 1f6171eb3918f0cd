"""The induction scan's circuit checked independently: its faithfulness and necessity recomputed on the Hugging Face
model alone, with plain forward pre-hooks, no TransformerLens.

    python benchmarks/verify_induction_circuit.py --model DIR --scores OUT/scores.json

circuitkit finds the circuit through TransformerLens's bridge (``hook_z``). Here, on the scan's own batch (its token
ids come from circuitkit: data, not computation) and on transformers' own forward, every attention layer's
``o_proj`` input (the heads' ``z``, concatenated) is recorded on the clean run, and an ablated head's slice is
replaced by its mean over the batch and positions (the scan's default, mean ablation). The repeated-copies loss is
the mean next-token loss over the second copy's tokens after its first::

    faithfulness = (L_all - L_C) / (L_all - L_clean)     necessity = L_(only C ablated) - L_clean
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the Hugging Face directory the scan ran on")
    parser.add_argument("--scores", required=True, help="the scan's scores.json (default settings)")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from circuitkit.detect.tokens import RepeatedTokens, as_batch
    from circuitkit.models import load_model
    from circuitkit.models.adapters import adapt

    scores = json.load(open(args.scores, encoding="utf-8"))
    settings = scores["settings"]
    circuit = {tuple(int(x) for x in name.split(".")) for name in scores["circuit"]["heads"]}
    spec = RepeatedTokens(block_len=settings["block_len"], n_repeats=settings["n_repeats"], batch=settings["batch"],
                          seed=settings["seed"], bos=False if settings["bos"] is None else settings["bos"])
    tokens = as_batch(spec, adapt(load_model(args.model))).tokens.cpu()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, local_files_only=True).eval()
    config = model.config
    L, H = config.num_hidden_layers, config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // H
    B, T = tokens.shape
    block, repeats = int(settings["block_len"]), int(settings["n_repeats"])
    prefix = T - repeats * block
    # positions predicted in the later copies (each copy's first token is unpredictable)
    targets = torch.tensor([t for t in range(prefix + block, T) if (t - prefix) % block != 0])
    means: dict[int, torch.Tensor] = {}
    ablated: dict[int, list[int]] = {}

    def pre_hook(layer: int):
        def hook(module, inputs):
            z = inputs[0].reshape(B, T, H, d_head)
            if layer not in means:  # the clean run records each head's mean output
                means[layer] = z.mean(dim=(0, 1))
                return None
            heads = ablated.get(layer, [])
            if not heads:
                return None
            z = z.clone()
            z[:, :, heads] = means[layer][heads]
            return (z.reshape(B, T, H * d_head),)

        return hook

    for layer, block_module in enumerate(model.model.layers):
        block_module.self_attn.o_proj.register_forward_pre_hook(pre_hook(layer))

    def loss() -> float:
        with torch.no_grad():
            logits = model(tokens).logits
        logp = logits[:, targets - 1].float().log_softmax(-1)
        return float(-logp.gather(-1, tokens[:, targets, None]).mean())

    clean = loss()
    ablated = {layer: list(range(H)) for layer in range(L)}
    everything = loss()
    ablated = {layer: [h for h in range(H) if (layer, h) not in circuit] for layer in range(L)}
    kept = loss()
    ablated = {layer: [h for h in range(H) if (layer, h) in circuit] for layer in range(L)}
    only = loss()
    out = {"heads": len(circuit), "clean": clean, "all_ablated": everything, "circuit_kept": kept,
           "faithfulness": (everything - kept) / (everything - clean), "necessity": only - clean,
           "circuitkit": {"faithfulness": scores["circuit"]["faithfulness"],
                          "necessity": scores["circuit"]["necessity"],
                          "clean": scores["circuit"]["losses"]}}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
