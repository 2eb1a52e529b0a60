"""Tokenization rules, the read position, and errors that name what was wrong."""

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.errors import HeadError, RewardLensWarning, TokenizationError
from rewardlens.model.internal import Tokenized, collate


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def test_pair_side_is_the_chat_template_tokenized_once(llama, tokenizer):
    pair = rl.Pair("Hi there", "Hello", "Bye")
    seqs, is_pairs = llama.encode([pair])
    expected = tokenizer.apply_chat_template(pair.conversation("chosen"), tokenize=True)["input_ids"]
    assert is_pairs and seqs[0].ids == list(expected)
    # Text rendered by the template and re-tokenized gives the same ids here; the rule is to never do it.
    chat = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"}]
    assert llama.encode([chat])[0][0].ids == seqs[0].ids


def test_inputs_of_every_kind_score_the_same(llama):
    conv = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"}]
    pair = rl.Pair("Hi there", "Hello", "Bye")
    s_conv, s_pair, s_text = llama.score(conv), llama.score(pair), llama.score("plain text input")
    assert s_conv.shape == (1,) and s_pair.shape == (2,) and s_text.shape == (1,)
    assert s_pair[0] == pytest.approx(s_conv[0], rel=1e-6)
    with pytest.raises(TypeError, match="mix"):
        llama.score([pair, "text"])


def test_read_position_follows_huggingface_for_both_padding_sides():
    seqs = [Tokenized([5, 6, 7]), Tokenized([5, 6, 7, 8, 9])]
    for side in ("left", "right"):
        b = collate(seqs, pad_id=0, side=side, first=False, device=torch.device("cpu"))
        ids = b.input_ids.tolist()
        assert [ids[r][c] for r, c in enumerate(b.read_index.tolist())] == [7, 9]
        assert b.position_ids[0, b.read_index[0]] == 2  # real positions, whatever the padding
    enc = collate(seqs, pad_id=0, side="left", first=True, device=torch.device("cpu"))
    assert enc.input_ids[0, enc.read_index[0]] == 5


def test_pad_equal_to_eos_warns_and_reads_like_the_model(tiny_root, tokenizer):
    eos = tokenizer.eos_token_id
    model = rl.load(str(tiny_root["llama"]), pad_token_id=eos)
    text = "The answer is yes." + tokenizer.eos_token
    with pytest.warns(RewardLensWarning, match="pad = eos"):
        ours = model.score([text])
    ids = tokenizer(text)["input_ids"]
    assert ids[-1] == eos
    # Reading one token early, as the Hugging Face model with pad_token_id = eos does.
    early = rl.load(str(tiny_root["llama"])).score([tokenizer.decode(ids[:-1])])
    np.testing.assert_allclose(ours, early, rtol=1e-5)


def test_no_pad_token_is_announced_and_batches_still_match(tiny_root, pairs):
    base = rl.load(str(tiny_root["llama"]))
    with pytest.warns(RewardLensWarning, match="no pad token"):
        model = rl.load(str(tiny_root["llama"]), pad_token_id=None)
    np.testing.assert_allclose(model.score(pairs, batch_size=6, padding_side="left"), base.score(pairs), rtol=1e-5)


def test_truncation_refuses_or_keeps_the_read_token(tiny_root):
    long = "word " * 200
    strict = rl.load(str(tiny_root["llama"]), max_length=32)
    with pytest.raises(TokenizationError, match=r"input 0 has \d+ tokens, over the limit of 32.*truncation='left'"):
        strict.score([long])
    left = rl.load(str(tiny_root["llama"]), max_length=32, truncation="left")
    ids = left.encode([long])[0][0].ids
    full = left.tokenizer(long)["input_ids"]
    assert len(ids) == 32 and ids == full[-32:]
    enc = rl.load(str(tiny_root["bert"]), max_length=16, truncation="left")
    kept = enc.encode([long])[0][0].ids
    assert len(kept) == 16 and kept[0] == enc.tokenizer(long)["input_ids"][0]


def test_multi_output_head_needs_a_readout(tmp_path, tokenizer):
    from tests.helpers import tiny

    cls, config = tiny.configs(tokenizer)["llama"]
    config.num_labels = 2
    model = cls.from_config(config).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(HeadError, match="2 outputs.*readout="):
        rl.load(str(tmp_path))
    a = rl.load(str(tmp_path), readout=1)
    b = rl.load(str(tmp_path), readout=[0.0, 1.0])
    np.testing.assert_allclose(a.score("hello"), b.score("hello"))
    np.testing.assert_allclose(a.score("hello"), a.objectives("hello")[:, 1])
    att = rl.attribute(rl.load(str(tmp_path), readout=[1.0, -1.0]), "hello there")
    assert att.per_objective.shape[1] == 2
    np.testing.assert_allclose(att.values, att.per_objective[:, 0] - att.per_objective[:, 1], rtol=1e-5, atol=1e-7)


def test_non_linear_head_is_refused(tokenizer, tmp_path):
    from tests.helpers import tiny

    cls, config = tiny.configs(tokenizer)["llama"]
    model = cls.from_config(config).eval()
    model.score = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    with pytest.raises(HeadError, match="not nn.Linear"):
        rl.RewardModel.from_model(model, tokenizer)


def test_armorm_gate_pattern_missing_is_explained(tiny_root):
    model = rl.load(str(tiny_root["armorm"]))
    with pytest.raises(TokenizationError, match="gate's token pattern"):
        model.score("no chat formatting here")


def test_armorm_gated_total_and_objectives(tiny_root, pairs):
    model = rl.load(str(tiny_root["armorm"]))
    seqs, _ = model.encode(pairs)
    with torch.no_grad():
        out = [model.model(input_ids=torch.tensor([s.ids])) for s in seqs]
    np.testing.assert_allclose(model.objectives(pairs), np.concatenate([o.rewards.numpy() for o in out]),
                               rtol=1e-5, atol=1e-6)
    att = rl.attribute(model, pairs)
    gate = np.concatenate([o.gating_output.numpy() for o in out])
    T = model.model.reward_transform_matrix.detach().numpy()
    np.testing.assert_allclose(att.values, np.einsum("nkp,nk->np", att.per_objective, gate @ T.T), rtol=1e-4, atol=1e-6)


def test_tracing_restores_every_modules_training_flag(llama, pairs):
    llama.model.train()
    llama.model.model.layers[0].eval()  # the user's mixed state must survive
    try:
        llama.score(pairs[:1])
        rl.attribute(llama, pairs[:1], level="neuron")
        assert llama.model.training and llama.model.model.layers[1].training
        assert not llama.model.model.layers[0].training and not llama.model.model.layers[0].mlp.training
    finally:
        llama.model.eval()


def test_a_sequence_of_only_pad_ids_reads_the_same_under_both_paddings(tiny_root, tokenizer):
    model = rl.load(str(tiny_root["llama"]), pad_token_id=tokenizer.eos_token_id)
    texts = [tokenizer.eos_token, "a longer input that pads the other one"]
    with pytest.warns(RewardLensWarning):
        left = model.score(texts, batch_size=2, padding_side="left")
        right = model.score(texts, batch_size=2, padding_side="right")
        alone = model.score(texts[:1])
    np.testing.assert_allclose(left, right, rtol=1e-5)
    np.testing.assert_allclose(left[:1], alone, rtol=1e-5)


def test_readout_types_are_checked(tiny_root):
    with pytest.raises(HeadError, match="bool"):
        rl.load(str(tiny_root["armorm"]), readout=True)
    by_numpy_int = rl.load(str(tiny_root["armorm"]), readout=np.int64(1))
    assert by_numpy_int.head.labels == ["objective_0", "objective_1", "objective_2"]
    # A fixed readout on a gated head needs no gate, so plain text works.
    np.testing.assert_allclose(by_numpy_int.score("plain text"), by_numpy_int.objectives("plain text")[:, 1])


def test_gate_error_names_the_input(tiny_root):
    model = rl.load(str(tiny_root["armorm"]))
    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    with pytest.raises(TokenizationError, match="input 2: the gate"):
        model.score([conv, conv, "no template"])


def test_weights_on_meta_without_an_offload_hook_are_refused_with_the_fix():
    from rewardlens.errors import ArchitectureError
    from rewardlens.model._norms import resident_fp32

    # Offloaded weights are read through accelerate's hook (tests/model/test_scale.py); bare meta ones cannot be.
    with pytest.raises(ArchitectureError, match="meta device.*no device_map='meta'"):
        resident_fp32(torch.empty(4, device="meta"), torch.device("cpu"), "a test weight")


def test_neuron_level_contracts_objectives_early_and_exactly(tiny_root, pairs):
    model = rl.load(str(tiny_root["armorm"]))
    lean = rl.attribute(model, pairs, level="neuron")
    full = rl.attribute(model, pairs, level="neuron", per_objective=True)
    assert lean.per_objective.shape[1] == 1 and full.per_objective.shape[1] == 3
    np.testing.assert_allclose(lean.values, full.values, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(lean.reward, full.reward, rtol=1e-6)
    assert np.abs(lean.residual_error).max() < 1e-5


def test_a_model_in_training_mode_with_dropout_wraps_and_stays_in_training_mode(tiny_root, pairs):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = str(tiny_root["llama"])
    hf = AutoModelForSequenceClassification.from_pretrained(folder, attention_dropout=0.9)
    hf.train()  # what a training loop hands a monitor: dropout on
    model = rl.wrap(hf, AutoTokenizer.from_pretrained(folder))  # the check must compare like with like
    assert hf.training
    hf.eval()
    np.testing.assert_allclose(model.score(pairs), rl.load(folder).score(pairs), rtol=1e-5, atol=1e-6)
