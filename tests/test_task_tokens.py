"""A task's text prompts become the tokens the user's tokenizer gives: checked against ``transformers.AutoTokenizer``
loaded from the same directory, per tokenizer kind, on tiny models loaded through ``circuitkit.load_model`` (whose
TransformerLens bridge carries a tokenizer reloaded with ``add_bos_token=True``).

Kinds: a Llama-style tokenizer (its post-processor prepends ``<s>``), a Qwen2-style byte-level tokenizer (adds
nothing; its BOS is the end-of-text marker, which the bridge's tokenizer prepends anyway) and a GPT-2-style one
(BOS = EOS), each with chat-template special tokens. Built offline with the tokenizers library.
"""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.models import load_model
from circuitkit.models.adapters import adapt
from circuitkit.tasks import Task, scan_task

VOCAB = 272
CHAT = ("<|im_start|>", "<|im_end|>")
PROMPTS = ("When Mary and John went out, John gave a drink to", "When Mary and Kate went out, Kate gave a drink to")
CORRUPT = ("When Mary and John went out, Anna gave a drink to", "When Mary and Kate went out, Anna gave a drink to")


def _byte_level_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    vocab["Ġ" + "M"] = len(vocab)  # one merge, so that BPE merging runs
    return vocab, [("Ġ", "M")]


def _tokenizer(kind: str):
    from transformers import GPT2Tokenizer, LlamaTokenizer, Qwen2Tokenizer

    if kind == "llama":
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
        for c in "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ,.":
            vocab[c] = len(vocab)
        tokenizer = LlamaTokenizer(vocab=vocab, merges=[], add_bos_token=True)
    else:
        vocab, merges = _byte_level_vocab()
        tokenizer = (Qwen2Tokenizer(vocab=vocab, merges=merges, bos_token="<|endoftext|>")  # BOS named, never added
                     if kind == "qwen2" else GPT2Tokenizer(vocab=vocab, merges=merges))
    tokenizer.add_special_tokens({"additional_special_tokens": list(CHAT)})
    return tokenizer


MODELS = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
          "gpt2": ("GPT2Config", "GPT2LMHeadModel")}


@pytest.fixture(scope="module", params=sorted(MODELS))
def saved(request, tmp_path_factory):
    """(kind, directory holding a tiny model and its tokenizer, the bridge circuitkit loads from it)."""
    import transformers

    kind = request.param
    config_class, model_class = MODELS[kind]
    sizes = (dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128) if kind == "gpt2" else
             dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128))
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp(kind)
    getattr(transformers, model_class)(getattr(transformers, config_class)(**sizes)).save_pretrained(str(directory))
    _tokenizer(kind).save_pretrained(str(directory))
    return kind, directory, load_model(str(directory))


def _auto(directory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def _pairs(prompts=PROMPTS, corrupt=CORRUPT):
    return Task.from_pairs([(c, k, [5], [6]) for c, k in zip(prompts, corrupt, strict=True)], name="names")


def test_default_tokens_equal_auto_tokenizer(saved):
    kind, directory, bridge = saved
    auto = _auto(directory)
    batch = _pairs().tokenize(bridge)
    for i, prompt in enumerate(PROMPTS):
        expected = auto(prompt)["input_ids"]
        assert batch.clean[i, : int(batch.last[i]) + 1].tolist() == expected
        assert batch.corrupted[i, : int(batch.last[i]) + 1].tolist() == auto(CORRUPT[i])["input_ids"]
    bos_added = kind == "llama"
    assert (auto(PROMPTS[0])["input_ids"][0] == auto.bos_token_id) == bos_added
    assert batch.prefix.tolist() == [int(bos_added)] * 2 and batch.rule == "auto"
    if kind == "qwen2":  # the case the default rule exists for: the bridge's own tokenizer prepends a BOS
        assert bridge.tokenizer(PROMPTS[0])["input_ids"][0] == auto.bos_token_id


def test_chat_template_special_tokens_are_the_tokenizer_s(saved):
    kind, directory, bridge = saved
    auto = _auto(directory)
    clean = f"{CHAT[0]}user\nWhen Mary and John went out, John gave a drink to{CHAT[1]}"
    corrupted = clean.replace(", John", ", Anna")
    batch = _pairs((clean,), (corrupted,)).tokenize(bridge)
    expected = auto(clean)["input_ids"]
    assert batch.clean[0].tolist() == expected
    start = int(kind == "llama")  # after the BOS a Llama tokenizer prepends
    assert expected[start] == auto.convert_tokens_to_ids(CHAT[0])
    assert expected[-1] == auto.convert_tokens_to_ids(CHAT[1]) and len(expected) < len(clean)


@pytest.mark.parametrize("prepend_bos", [True, False], ids=["yes", "no"])
def test_explicit_bos_rules(saved, prepend_bos):
    kind, directory, bridge = saved
    auto = _auto(directory)
    batch = _pairs().tokenize(bridge, prepend_bos=prepend_bos)
    text = auto(PROMPTS[0], add_special_tokens=False)["input_ids"]
    expected = [auto.bos_token_id, *text] if prepend_bos else text
    assert batch.clean[0, : int(batch.last[0]) + 1].tolist() == expected
    assert batch.rule == ("yes" if prepend_bos else "no") and batch.prefix.tolist() == [int(prepend_bos)] * 2


def test_token_id_prompts_run_as_given_under_every_rule(saved):
    _, _, bridge = saved
    task = Task.from_pairs([([7, 8, 9], [7, 10, 9], [5], [6])])
    for rule in (None, True, False):
        assert task.tokenize(bridge, prepend_bos=rule).clean[0].tolist() == [7, 8, 9]


def test_length_error_counts_the_tokens_the_model_gets(saved):
    kind, directory, bridge = saved
    auto = _auto(directory)
    clean, corrupted = "When Mary went", "When Mary leaves"
    task = Task.from_pairs([(clean, corrupted, [5], [6])])
    with pytest.raises(CircuitkitError) as info:
        task.tokenize(bridge)
    assert f"is {len(auto(clean)['input_ids'])} tokens and the corrupted prompt {len(auto(corrupted)['input_ids'])}" \
        in str(info.value)


def test_marks_follow_the_special_tokens(saved):
    kind, directory, bridge = saved
    auto = _auto(directory)
    text = auto(PROMPTS[0], add_special_tokens=False)["input_ids"]
    marks = ({"io": 5, "s1": 2},) * 2
    task = Task("marked", _pairs().pairs, marks=marks, attention_scores=(("io_attention", "io", "s1"),))
    for rule in (None, True, False):
        batch = task.tokenize(bridge, prepend_bos=rule)
        at = int(batch.prefix[0]) + 5
        assert int(batch.clean[0, at]) == text[5]


def test_the_scan_states_the_rule_and_shows_the_tokens_run(saved):
    kind, directory, bridge = saved
    auto = _auto(directory)
    result = scan_task(bridge, _pairs(), edges=False, n_resamples=20)
    expected = auto(PROMPTS[0])["input_ids"]
    assert list(result.tokens) == [auto.decode([t]) for t in expected]
    assert result.settings["prepend_bos"] == "auto"
    said = result.settings["tokenization"]
    assert ("1 special token(s)" in said) == (kind == "llama") and ("no token before" in said) == (kind != "llama")
    assert said in result.answer()
    data = result.to_json()
    assert data["settings"]["prepend_bos"] == "auto" and data["task"]["tokens"] == list(result.tokens)
    forced = scan_task(bridge, _pairs(), edges=False, n_resamples=20, prepend_bos=True)
    assert forced.settings["prepend_bos"] == "yes" and forced.tokens[0] == auto.decode([auto.bos_token_id])


def test_bad_prepend_bos_is_refused(saved):
    _, _, bridge = saved
    with pytest.raises(CircuitkitError, match="prepend_bos"):
        _pairs().tokenize(adapt(bridge), prepend_bos="sometimes")


def test_the_cli_passes_the_rule_through(tmp_path, capsys):
    """The bundled model's word tokenizer prepends ``<bos>`` by default; ``--prepend-bos no`` runs the words alone."""
    import json

    from circuitkit import cli
    from tests.test_tasks import copy_next_task

    words = lambda ids: " ".join("<bos>" if t == 0 else f"t{t}" for t in ids)  # noqa: E731  (no word t0: id 0 is <bos>)
    lines = [json.dumps({"clean": words(p.clean), "corrupted": words(p.corrupted), "answer": list(p.answers),
                         "wrong": list(p.wrongs)}) for p in copy_next_task(n=8, d_vocab=60).pairs]
    path = tmp_path / "copy.jsonl"
    path.write_text("\n".join(lines) + "\n")
    seen = {}
    for flag in ("auto", "no"):
        out = tmp_path / flag
        assert cli.main(["scan", "--task", str(path), "--prepend-bos", flag, "--resamples", "20", "--out",
                         str(out)]) == 0
        seen[flag] = json.loads((out / "scores.json").read_text())
    assert seen["auto"]["settings"]["prepend_bos"] == "auto" and seen["auto"]["task"]["tokens"][0] == "<bos>"
    shown = seen["no"]["task"]["tokens"]  # the first discovery prompt's words, nothing before them
    assert seen["no"]["settings"]["prepend_bos"] == "no" and shown[0].startswith("t")
    assert len(shown) == len(seen["auto"]["task"]["tokens"]) - 1
    assert "Tokens: prepend_bos=False" in capsys.readouterr().out
    assert cli.main(["scan", "--prepend-bos", "yes", "--out", str(tmp_path / "i")]) == 2
    assert "--prepend-bos" in capsys.readouterr().err


def test_the_induction_scan_takes_no_prepend_bos():
    import circuitkit as ck

    with pytest.raises(CircuitkitError, match="prepend_bos"):
        ck.scan(None, prepend_bos=True)


def test_a_bridge_booted_from_a_hub_name_reads_its_tokenizer_from_the_local_cache(saved, tmp_path, monkeypatch):
    """A tokenizer whose ``name_or_path`` is a hub id (as ``boot_transformers("gpt2")`` leaves it): its default is
    read from the cache snapshot (a cache laid out here as huggingface_hub lays it out; no network)."""
    import shutil

    from huggingface_hub import constants
    from transformers import AutoTokenizer

    from circuitkit.models.tokenizer import default_tokenizer

    kind, directory, _ = saved
    snapshot = tmp_path / f"models--acme--tiny-{kind}" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    for file in directory.iterdir():
        if "token" in file.name or file.suffix == ".jinja":
            shutil.copy(file, snapshot / file.name)
    (tmp_path / f"models--acme--tiny-{kind}" / "refs").mkdir()
    (tmp_path / f"models--acme--tiny-{kind}" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    forced = AutoTokenizer.from_pretrained(str(snapshot), add_bos_token=True)
    forced.name_or_path = f"acme/tiny-{kind}"
    default = default_tokenizer(forced)
    assert default(PROMPTS[0])["input_ids"] == _auto(directory)(PROMPTS[0])["input_ids"]
    if kind != "llama":  # the forced tokenizer prepends a BOS the default does not
        assert forced(PROMPTS[0])["input_ids"] != default(PROMPTS[0])["input_ids"]
