"""Cost of ``circuitkit.head_scores`` against one plain forward pass of the same batch, and against a
TransformerLens ``detect_head`` loop (one prompt at a time, one call per head type) on the same model.

Target: ``head_scores`` <= 1.3x one forward pass. Run: ``python benchmarks/detect.py [--json out.json]``.
Prints a table, then the same numbers as JSON. All timings are medians of ``--repeats`` runs after a warm-up,
measured side by side in this one process.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from _common import emit_json, interleaved_medians  # benchmarks/ is on sys.path when a script here runs

TARGET_RATIO = 1.3


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    return interleaved_medians([fn], repeats)[0]


def random_bridge(n_layers: int, n_heads: int, d_model: int, d_vocab: int, n_ctx: int):
    from circuitkit.models.bridge import native_bridge
    from circuitkit.models.tokenizer import word_tokenizer

    return native_bridge(
        tokenizer=word_tokenizer(d_vocab),
        n_layers=n_layers,
        n_heads=n_heads,
        d_model=d_model,
        d_head=d_model // n_heads,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        attn_only=False,
        seed=0,
    )


def bench_model(label: str, model, *, block_len: int, batch: int, repeats: int, tl_prompts: int) -> dict:
    from transformer_lens.head_detector import detect_head

    from circuitkit.detect import RepeatedTokens, head_scores

    scores = head_scores(model, RepeatedTokens(block_len=block_len, batch=batch))
    tokens = scores.tokens

    def forward():
        with torch.no_grad():
            model(tokens)

    def ours():
        head_scores(model, RepeatedTokens(block_len=block_len, batch=batch))

    # TransformerLens: strings through the model's tokenizer (it prepends the BOS itself), one prompt per call
    body = tokens[:, 1:] if scores.bos is not None else tokens
    prompts = [" ".join(f"t{int(t)}" for t in row) for row in body[:tl_prompts]]

    def transformer_lens_loop():
        with torch.no_grad():
            for prompt in prompts:
                for kind in ("induction_head", "previous_token_head", "duplicate_token_head"):
                    detect_head(model, prompt, kind)

    t_forward, t_ours = interleaved_medians([forward, ours], repeats)
    t_tl = median_seconds(transformer_lens_loop, max(1, repeats // 3)) * batch / len(prompts)
    cfg = model.cfg
    return {
        "model": label,
        "shape": f"{cfg.n_layers}L x {cfg.n_heads}H, d_model {cfg.d_model}, vocab {cfg.d_vocab}",
        "batch": list(tokens.shape),
        "forward_s": t_forward,
        "head_scores_s": t_ours,
        "tl_detect_head_loop_s": t_tl,
        "ratio_vs_forward": t_ours / t_forward,
        "tl_loop_over_head_scores": t_tl / t_ours,
        "meets_target": t_ours / t_forward <= TARGET_RATIO,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=str, default=None, help="also write the JSON here")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--quick", action="store_true", help="skip the GPT-2-small-shaped model (random weights)")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)

    from circuitkit import zoo

    rows = []
    rows.append(
        bench_model("zoo induction-2l", zoo.load("induction-2l"), block_len=20, batch=16, repeats=args.repeats,
                    tl_prompts=4)
    )
    rows.append(
        bench_model("random 4L bridge", random_bridge(4, 8, 256, 2000, 256), block_len=64, batch=16,
                    repeats=args.repeats, tl_prompts=4)
    )

    if not args.quick:
        rows.append(
            bench_model("gpt2-small shape", random_bridge(12, 12, 768, 50257, 1024), block_len=64, batch=16,
                        repeats=max(3, args.repeats // 3), tl_prompts=2)
        )

    header = f"{'model':<18} {'batch':>9} {'forward':>9} {'head_scores':>11} {'ratio':>6} {'TL loop':>9} {'TL/ours':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        forward_ms, ours_ms, tl_ms = (r[k] * 1e3 for k in ("forward_s", "head_scores_s", "tl_detect_head_loop_s"))
        print(
            f"{r['model']:<18} {str(tuple(r['batch'])):>9} {forward_ms:>7.1f}ms {ours_ms:>9.1f}ms "
            f"{r['ratio_vs_forward']:>5.2f}x {tl_ms:>7.0f}ms {r['tl_loop_over_head_scores']:>7.1f}x"
        )
    print(f"target: head_scores <= {TARGET_RATIO}x forward; TL loop = 3 head types x one detect_head call per prompt")
    out = {"target_ratio": TARGET_RATIO, "torch_threads": torch.get_num_threads(), "rows": rows}
    emit_json(out, args.json)


if __name__ == "__main__":
    main()
