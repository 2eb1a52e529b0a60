"""A model whose embedding has no row for some of its tokenizer's ids, or for its pad id, is refused at
load with one line naming the ids, the size and the fix, never a torch traceback at the first forward.

Three folders, each a tiny random Llama saved with `save_pretrained` and a tokenizer beside it:
(a) `config.vocab_size` smaller than the tokenizer's vocabulary; (b) a tokenizer whose chat template
uses an added special token the embedding has no row for; (c) `config.json`'s `pad_token_id` outside
the vocabulary. The yardstick that each refusal is warranted is the model's own forward, which fails
on those ids.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import transformers as tf

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import ModelLoadError, TokenizationError
from rewardlens.zoo import build_tokenizer
from tests.helpers import tiny

ADDED = "<|system_turn|>"
PAIR = rl.Pair("Is the sky blue?", "Yes, on a clear day.", "No.")


def _save(tokenizer, root: Path, name: str, *, model_class=tf.LlamaConfig, **config) -> Path:
    """A tiny random reward model with `config` overrides and `tokenizer`, saved under root/name."""
    cls, base = tiny.configs(tokenizer)["llama" if model_class is tf.LlamaConfig else "gpt2"]
    settings = {**base.to_dict(), **config}
    torch.manual_seed(0)
    model = cls.from_config(model_class.from_dict(settings)).eval()
    model.save_pretrained(root / name)
    tokenizer.save_pretrained(root / name)
    return root / name


def _with_added_token():
    """The tiny tokenizer plus one added special token (id len(tok)), which its chat template writes first."""
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [ADDED]})
    tok.chat_template = ADDED + tok.chat_template
    return tok


@pytest.fixture(scope="module")
def folders(tokenizer, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vocab")
    out = {"short": _save(tokenizer, root, "short", vocab_size=300),
           "added": _save(_with_added_token(), root, "added", vocab_size=len(tokenizer)),
           "pad": _save(tokenizer, root, "pad", vocab_size=len(tokenizer)),
           "gpt2_pad": _save(tokenizer, root, "gpt2_pad", model_class=tf.GPT2Config, vocab_size=len(tokenizer))}
    for name in ("pad", "gpt2_pad"):  # a config edited on disk: pad_token_id past the vocabulary
        path = out[name] / "config.json"
        config = json.loads(path.read_text())
        config["pad_token_id"] = len(tokenizer) + 100
        path.write_text(json.dumps(config))
    return out


def _own_forward_fails(model: torch.nn.Module, ids: list[int]) -> bool:
    """The yardstick: the model's own forward on `ids` fails in its embedding (an id with no row)."""
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    except IndexError:
        return True
    return False


def test_a_config_vocabulary_smaller_than_the_tokenizer_is_refused_at_load(folders, tokenizer):
    beyond = sorted(i for i in tokenizer.get_vocab().values() if i >= 300)  # independent of rewardlens
    own = tf.AutoModelForSequenceClassification.from_pretrained(folders["short"])
    assert beyond and _own_forward_fails(own, [beyond[0]]) and not _own_forward_fails(own, [5, 6])
    with pytest.raises(ModelLoadError) as info:
        rl.load(str(folders["short"]))
    message = str(info.value)
    assert "\n" not in message
    assert f"{len(beyond)} token id(s)" in message and f"the largest {beyond[-1]}" in message
    assert "300 rows (token ids 0 to 299; config.json vocab_size 300)" in message
    assert "load the tokenizer saved with this model" in message


def test_an_added_chat_token_without_an_embedding_row_is_refused_at_load_and_wrap(folders, tokenizer):
    tok = _with_added_token()
    added = tok.convert_tokens_to_ids(ADDED)
    assert added == len(tokenizer)  # one past the embedding's last row
    own = tf.AutoModelForSequenceClassification.from_pretrained(folders["added"])
    assert _own_forward_fails(own, tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True,
                                                           return_dict=True)["input_ids"])
    with pytest.raises(ModelLoadError, match=rf"1 token id\(s\) .*\({re.escape(repr(ADDED))} = {added}; "
                                             rf"the largest {added}\).* {len(tokenizer)} rows"):
        rl.load(str(folders["added"]))
    with pytest.raises(ModelLoadError, match="resize the model's embedding to len"):
        rl.wrap(own, tok)


def test_a_pad_id_outside_the_vocabulary_is_refused_at_load(folders, tokenizer):
    rows = len(tokenizer)
    # transformers itself refuses to build a Llama with that padding_idx (an AssertionError today) ...
    with pytest.raises(ModelLoadError, match=rf"config.json's pad_token_id {rows + 100} is not a token id of "
                                             rf"this model: .*{rows} rows .*set config.json's pad_token_id to "):
        rl.load(str(folders["pad"]))
    # ... GPT-2 builds, and its first padded batch would fail in the embedding.
    own = tf.AutoModelForSequenceClassification.from_pretrained(folders["gpt2_pad"])
    assert _own_forward_fails(own, [5, rows + 100])
    with pytest.raises(ModelLoadError, match=rf"pad_token_id {rows + 100} is not a token id .*\(0\), or to null"):
        rl.load(str(folders["gpt2_pad"]))


def test_a_pad_token_id_argument_outside_the_vocabulary_is_refused(tokenizer, tiny_root):
    rows = len(tokenizer)
    with pytest.raises(TokenizationError, match=rf"pad_token_id={rows} is not a token id of this model: .*{rows} "
                                                r"rows .*pass an id in that range \(the tokenizer's pad token id "
                                                r"\(0\)\)"):
        rl.load(str(tiny_root["llama"]), pad_token_id=rows)
    with pytest.raises(TokenizationError, match="pad_token_id=-1 is not a token id"):
        rl.load(str(tiny_root["llama"]), pad_token_id=-1)


@pytest.mark.parametrize("name, words", [
    ("short", "token id(s) the model has no embedding row for"),
    ("added", repr(ADDED)),
    ("pad", "pad_token_id"),
])
def test_the_command_line_says_one_line(folders, tmp_path, capsys, name, words):
    pairs = save_pairs([PAIR], tmp_path / "pairs.jsonl")
    assert main(["score", str(folders[name]), "--pairs", str(pairs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rewardlens: error: ") and words in err[0], err
