"""The content view of `rl.tokens` (model/_roles.py, exact/_token_view.py): every token of the prompt's and
the response's text is classified as theirs and the rest as the template's, against the texts themselves
tokenized alone and the template rendered with empty contents; the grouped rows close on the model's own
reward; the CLI prints the template row with its share; and the same without a chat template."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.model._roles import token_roles
from rewardlens.model._tokens import JOIN, judge_question, tokenize
from tests.helpers import tiny
from tests.helpers.tiny import own_scores


def _texts(ta: rl.TokenAttribution, row: int, role: str) -> str:
    return "".join(t for t, r in zip(ta.tokens[row], ta.role_names(row)) if r == role)


def _sides(pairs: list[rl.Pair]) -> list[list[dict[str, str]]]:
    return [p.conversation(side) for p in pairs for side in ("chosen", "rejected")]


@pytest.fixture(scope="module")
def chatml(tiny_root):
    return rl.load(str(tiny_root["llama"]))


@pytest.fixture(scope="module")
def plain(tmp_path_factory, tokenizer):
    """A decoder and an encoder whose tokenizer has no chat template: plain concatenation / a text pair."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    root = tmp_path_factory.mktemp("plain")
    return {name: rl.load(str(tiny.build(name, tok, root))) for name in ("llama", "bert")}


def test_chatml_contents_are_prompt_and_response_and_the_rest_is_the_template(chatml, pairs):
    ta = rl.tokens(chatml, pairs, approx=False)
    for row, conv in enumerate(_sides(pairs)):
        assert _texts(ta, row, "response") == conv[-1]["content"]
        assert _texts(ta, row, "prompt") == "".join(m["content"] for m in conv[:-1])
        # the template's tokens are exactly what ChatML writes around empty contents
        empty = chatml.tokenizer.apply_chat_template([{**m, "content": ""} for m in conv], tokenize=False)
        assert _texts(ta, row, "template") == empty
        # each content tokenizes alone to the same number of tokens it has in the sequence
        for role, texts in (("response", [conv[-1]["content"]]), ("prompt", [m["content"] for m in conv[:-1]])):
            alone = sum(len(chatml.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
            assert ta.role_names(row).count(role) == alone
        assert ta.role_names(row)[int(ta.read_index[row])] == "template"  # ChatML's final newline


def test_grouped_rows_close_on_the_models_own_reward(chatml, pairs):
    ta = rl.tokens(chatml, pairs)
    theirs = own_scores(chatml, pairs)
    for row in range(len(ta.rows)):
        frame = ta.content(row)
        assert frame["value"].sum() == pytest.approx(theirs[row], rel=1e-4, abs=1e-5)
        assert frame["share"].sum() == pytest.approx(1.0, rel=1e-4)
        template = frame[frame["role"] == "template"]
        assert len(template) == 1  # one grouped row
        names = np.array(ta.role_names(row))
        assert float(template["value"].iloc[0]) == pytest.approx(ta.values[row][names == "template"].sum())
        # every content token is listed one by one, none of the template's
        listed = frame[frame["role"].isin(["response", "prompt"])]
        assert sorted(listed["position"]) == sorted(np.flatnonzero(names != "template"))
        assert sum(ta.groups(row).values()) == pytest.approx(theirs[row], rel=1e-4, abs=1e-5)
        assert all(r == "response" for r in np.array(ta.role_names(row))[[p for p, _, _ in ta.top(row, 3, "response")]])
    with pytest.raises(ValueError, match="role must be one of"):
        ta.top(0, 3, "answer")


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_without_a_chat_template_the_join_and_special_tokens_are_the_template(plain, pairs, name):
    model = plain[name]
    ta = rl.tokens(model, pairs, approx=False)
    theirs = own_scores(model, pairs)
    for row, conv in enumerate(_sides(pairs)):
        assert _texts(ta, row, "response") == conv[-1]["content"]
        assert _texts(ta, row, "prompt") == "".join(m["content"] for m in conv[:-1])
        # a decoder reads "\n".join(prompt messages) + JOIN + response: the separators are the template's
        seps = "\n" * (len(conv) - 2) + (JOIN if name == "llama" else "")
        special = set(model.tokenizer.all_special_ids)
        assert _texts(ta, row, "template") == seps + "".join(
            t for t, i in zip(ta.tokens[row], ta.token_ids[row]) if i in special)
        assert ta.content(row)["value"].sum() == pytest.approx(theirs[row], rel=1e-4, abs=1e-5)
    if name == "llama":  # a plain concatenation ends on the response's last word, read there
        assert all(ta.role_names(r)[int(ta.read_index[r])] == "response" for r in range(len(ta.rows)))


def test_a_template_that_trims_contents_and_adds_a_system_prompt(tokenizer):
    """SmolLM2's kind: a default system turn when none is given, and contents trimmed (the splice check fails,
    each message is found alone)."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant"
                         "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                         "{{ m['content'] | trim }}<|im_end|>\n{% endfor %}")
    conv = [{"role": "user", "content": "  user assistant "}, {"role": "assistant", "content": " assistant\n"}]
    ids = tokenize(tok, conv, encoder=False).ids
    roles = token_roles(tok, conv, ids, encoder=False)
    assert roles is not None
    text = {code: "".join(tok.decode([i]) for i, r in zip(ids, roles) if r == code) for code in range(3)}
    assert text[1] == "user assistant" and text[2] == "assistant"
    assert text[0] == tok.apply_chat_template([{**m, "content": ""} for m in conv], tokenize=False)
    cut = ids[5:]  # a left cut keeps the end: the roles of the tokens kept
    np.testing.assert_array_equal(token_roles(tok, conv, cut, encoder=False), roles[5:])


def test_a_judges_question_is_the_template_around_the_prompt_and_response(tokenizer):
    question = "Rate the answer. Q: {prompt}\nA: {response}\nIs it good?"
    conv = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue"}]
    ids = tokenize(tokenizer, judge_question(conv, question), encoder=False, generation=True).ids
    roles = token_roles(tokenizer, conv, ids, encoder=False, question=question)
    assert roles is not None
    text = {code: "".join(tokenizer.decode([i]) for i, r in zip(ids, roles) if r == code) for code in range(3)}
    assert text[1].strip() == "Name a colour." and text[2].strip() == "Blue"
    assert "Rate the answer." in text[0] and "Blue" not in text[0]


def test_cli_prints_the_template_row_with_its_share(chatml, tiny_root, pairs, tmp_path, capsys):
    path = str(save_pairs(pairs[:2], tmp_path / "pairs.jsonl"))
    folder = str(tiny_root["llama"])
    assert main(["tokens", folder, "--pairs", path, "--top", "3", "--quiet", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    theirs = own_scores(chatml, pairs[:2])
    for row, conv, mine in zip(result["rows"], _sides(pairs[:2]), theirs):
        assert sum(row["groups"].values()) == pytest.approx(mine, rel=1e-4, abs=1e-5)
        n = len(tokenize(chatml.tokenizer, conv, encoder=False).ids)
        content = sum(len(chatml.tokenizer(m["content"], add_special_tokens=False)["input_ids"]) for m in conv)
        assert row["group_tokens"]["template"] == n - content
        assert all(t["token"] in conv[-1]["content"] for t in row["top_response"])
    assert main(["tokens", folder, "--pairs", path, "--top", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "exact direct: what the token writes" in out and "total ≈ (grad×emb): a first-order estimate" in out
    for row in result["rows"]:
        share = 100 * row["groups"]["template"] / row["reward"]
        line = f"template tokens ({row['group_tokens']['template']}: headers, special ids, separators)"
        assert any(s.startswith(line) and s.rstrip().endswith(f"{share:+.1f} %") for s in out.splitlines()), out
    assert main(["tokens", folder, "--pairs", path, "--top", "3", "--quiet", "--view", "all"]) == 0
    assert "template tokens (" not in capsys.readouterr().out
