"""Concept files: a line is scored as a pair's response is (through the chat template)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.data import chosen
from rewardlens.errors import DataError
from rewardlens.hacking import read_concept_file

LINES = ["- first point\n", "A plain sentence about the weather.", "Sure! Here you go."]


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def test_a_txt_line_scores_as_the_same_text_in_a_conversation(llama, tmp_path) -> None:
    path = tmp_path / "with.txt"
    path.write_text("\n".join(x.strip() for x in LINES) + "\n\n", encoding="utf-8")
    items = read_concept_file(path)
    texts = [x.strip() for x in LINES]
    assert len(items) == 3  # the blank line is skipped
    conversations = [[{"role": "user", "content": ""}, {"role": "assistant", "content": t}] for t in texts]
    as_pairs = [rl.Pair("", t, "other") for t in texts]
    from_file = llama.score(items)
    np.testing.assert_array_equal(from_file, llama.score(conversations))
    # the same tokens as a pair's chosen side (scores differ only by the batch's padding)
    np.testing.assert_allclose(from_file, chosen(llama.score(as_pairs)), rtol=0, atol=1e-5)
    pair_ids = [s.ids for s in llama.encode(as_pairs)[0]]
    assert [s.ids for s in llama.encode(items)[0]] == [pair_ids[2 * i] for i in range(len(texts))]
    assert llama.encode(items)[0][0].ids == llama.encode(conversations)[0][0].ids
    # bare text skips the template: different tokens (what the file reader used to score)
    assert llama.encode(texts)[0][0].ids != llama.encode(items)[0][0].ids
    # a fixed user turn, and the opt-out for already templated lines
    asked = read_concept_file(path, prompt="Tell me something.")
    assert asked[0] == rl.Pair("Tell me something.", texts[0], "x").conversation("chosen")
    assert read_concept_file(path, prompt=None) == texts


def test_json_and_jsonl_strings_become_responses_and_conversations_stay(tmp_path) -> None:
    conv = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
    (tmp_path / "s.json").write_text(json.dumps(["A.", conv]), encoding="utf-8")
    (tmp_path / "s.jsonl").write_text(json.dumps("A.") + "\n\n" + json.dumps(conv) + "\n", encoding="utf-8")
    for name in ("s.json", "s.jsonl"):
        items = read_concept_file(tmp_path / name)
        assert items == [[{"role": "user", "content": ""}, {"role": "assistant", "content": "A."}], conv]


def test_bad_concept_files_name_the_place(tmp_path) -> None:
    (tmp_path / "bad.jsonl").write_text('"ok"\n\n{"x": 1}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl: line 3 is a dict"):
        read_concept_file(tmp_path / "bad.jsonl")
    (tmp_path / "empty.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(DataError, match="non-empty"):
        read_concept_file(tmp_path / "empty.txt")
    with pytest.raises(DataError, match="no such concept file"):
        read_concept_file(tmp_path / "missing.txt")
    (tmp_path / "broken.json").write_text("[1,", encoding="utf-8")
    with pytest.raises(DataError, match="not valid JSON"):
        read_concept_file(tmp_path / "broken.json")
