"""Where the heads with the largest direct logit attribution on IOI look, and which name each writes.

For every head of the model, on ``ioi(model, n, seed=0)``'s clean prompts, from each prompt's last token:

- its attention to the indirect object (IO), the subject's first mention (S1) and its repeat (S2), averaged over the
  pairs (the task scan's ``io_attention`` is IO - S1, its ``s2_attention`` S2 - IO);
- its direct effect on the answer's logit and on the subject's, through the final RMSNorm at the clean run's scale
  (frozen): ``(z W_O / scale) . (w_norm * W_U[:, t])``; their difference is the head's direct logit attribution
  (the scan's DLA, computed there by a backward through the same frozen norm);
- the role :func:`circuitkit.tasks.roles.ioi_roles` would give it from those figures, were it in the circuit.

Usage: ``python benchmarks/ioi_roles.py --model /work/models/qwen [--pairs 32] [--json OUT]``. Reads the model
from a local directory only.
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--top", type=int, default=16)
    parser.add_argument("--json")
    args = parser.parse_args()

    from circuitkit.models.adapters import HOOKS, adapt
    from circuitkit.models.loading import load_model
    from circuitkit.tasks import generators
    from circuitkit.tasks.roles import ioi_roles

    t0 = time.perf_counter()
    model = load_model(args.model)
    task = generators.ioi(model, args.pairs, seed=0)
    adapter = adapt(model)
    batch = task.tokenize(adapter)
    spec = adapter.spec
    L, H = spec.n_layers, spec.n_heads
    W_O = adapter.weights(embeddings=False).W_O
    zs: dict[int, torch.Tensor] = {}
    patterns: dict[int, torch.Tensor] = {}
    final: dict[str, torch.Tensor] = {}

    def keep_z(z: torch.Tensor, hook) -> None:
        zs[HOOKS.layer_of(hook.name)] = z.detach()

    def keep_pattern(p: torch.Tensor, hook) -> None:
        patterns[HOOKS.layer_of(hook.name)] = p.detach()

    def keep_final(x: torch.Tensor, hook) -> None:
        final["x"] = x.detach()

    hooks = [(HOOKS.z(layer), keep_z) for layer in range(L)] + [(HOOKS.pattern(layer), keep_pattern)
                                                                  for layer in range(L)]
    with torch.no_grad():
        logits = adapter.run(batch.clean, hooks + [(HOOKS.resid_post(L - 1), keep_final)])
        wrong = adapter.run(batch.corrupted, [])
    n = batch.n_pairs
    rows = torch.arange(n)
    last = batch.last
    shift = batch.prefix if batch.prefix is not None else torch.zeros(n, dtype=torch.long)
    at = {mark: torch.tensor([m[mark] for m in task.marks]) + shift for mark in ("io", "s1", "s2")}
    attention = {mark: torch.stack([patterns[layer][rows, :, last, pos].float().mean(0) for layer in range(L)])
                 for mark, pos in at.items()}  # mark -> [layer, head]

    params = dict(model.named_parameters())
    w_norm = next(p for name, p in params.items() if name.startswith("model.norm")).detach().float()
    W_U = next(p for name, p in params.items() if name.startswith("lm_head")).detach().float()  # [vocab, d_model]
    eps = float(getattr(getattr(model, "cfg", None), "eps", 1e-6) or 1e-6)
    x = final["x"][rows, last].float()
    scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()  # [pair, 1]
    u_io = W_U[batch.answers[:, 0]] * w_norm
    u_s = W_U[batch.wrongs[:, 0]] * w_norm
    to_io, to_s = torch.zeros(L, H), torch.zeros(L, H)
    for layer in range(L):
        out = torch.einsum("phd,hdm->phm", zs[layer][rows, last].float(), W_O[layer].detach().float())
        out = out / scale[:, None]
        to_io[layer] = (out * u_io[:, None]).sum(-1).mean(0)
        to_s[layer] = (out * u_s[:, None]).sum(-1).mean(0)
    dla = to_io - to_s
    everyone = tuple((layer, h) for layer in range(L) for h in range(H))
    io_attention = attention["io"] - attention["s1"]
    s2_attention = attention["s2"] - attention["io"]

    def diff(lg: torch.Tensor) -> float:
        return float((lg[rows, last, batch.answers[:, 0]] - lg[rows, last, batch.wrongs[:, 0]]).mean())

    clean_gap = (diff(logits), diff(wrong))
    as_circuit = SimpleNamespace(heads=everyone, edges=(), clean=clean_gap[0], corrupted=clean_gap[1])
    scan = SimpleNamespace(circuit=as_circuit, dla=dla, head_scores={"io_attention": io_attention,
                           "s2_attention": s2_attention}, pattern_scores={})
    old = SimpleNamespace(circuit=as_circuit, dla=dla, head_scores={"io_attention": io_attention}, pattern_scores={})
    role_of = {h: r for r, heads in (ioi_roles(scan) or {}).items() for h in heads}
    old_role = {h: r for r, heads in (ioi_roles(old) or {}).items() for h in heads}
    top = sorted(everyone, key=lambda h: -abs(float(dla[h])))[: args.top]
    table = [{"head": f"{a}.{b}", "dla": float(dla[a, b]), "to_io_logit": float(to_io[a, b]),
              "to_s_logit": float(to_s[a, b]), "attention_io": float(attention["io"][a, b]),
              "attention_s1": float(attention["s1"][a, b]), "attention_s2": float(attention["s2"][a, b]),
              "role": role_of.get((a, b)), "role_by_io_attention_alone": old_role.get((a, b))} for a, b in top]
    # a role agrees with the head's direct effects where it writes what the role says: a name mover raises the
    # answer's logit, a negative one lowers it; a subject suppressor lowers the subject's, a subject mover raises it
    says = {"name mover": lambda r: r["to_io_logit"] > 0, "negative name mover": lambda r: r["to_io_logit"] < 0,
            "subject suppressor": lambda r: r["to_s_logit"] < 0, "subject mover": lambda r: r["to_s_logit"] > 0}
    agree = {key: [sum(1 for r in table if r[key] in says and says[r[key]](r)),
                   sum(1 for r in table if r[key] in says)] for key in ("role", "role_by_io_attention_alone")}
    print(f"IOI, {n} pairs: logit difference clean {clean_gap[0]:+.3f}, corrupted {clean_gap[1]:+.3f}")
    print(f"{'head':>6} {'DLA':>7} {'IO lgt':>7} {'S lgt':>7} {'att IO':>6} {'S1':>6} {'S2':>6}  "
          "role (io_attention alone)")
    for r in table:
        print(f"{r['head']:>6} {r['dla']:+7.3f} {r['to_io_logit']:+7.3f} {r['to_s_logit']:+7.3f} "
              f"{r['attention_io']:6.3f} {r['attention_s1']:6.3f} {r['attention_s2']:6.3f}  {r['role']} "
              f"({r['role_by_io_attention_alone']})")
    print(f"roles agreeing with the head's direct effects, of the roles given among these {len(table)} heads: "
          f"{agree['role'][0]} of {agree['role'][1]} (io_attention alone: {agree['role_by_io_attention_alone'][0]} "
          f"of {agree['role_by_io_attention_alone'][1]})")
    result = {"model": args.model, "pairs": n, "agree": agree,
              "logit_diff": {"clean": clean_gap[0], "corrupted": clean_gap[1]},
              "heads": table, "seconds": time.perf_counter() - t0}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
