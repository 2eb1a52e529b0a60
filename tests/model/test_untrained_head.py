"""A folder without trained head weights is refused at load: transformers would initialise the head at
random and every score would be noise (issue 20's first guard rail)."""

import shutil

import pytest
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import HeadError


def _without(src, dst, drop):
    """A copy of folder `src` whose safetensors lack every weight whose name starts with one of `drop`."""
    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    gone = [k for k in weights if k.startswith(drop)]
    assert gone, f"no weight of {drop} in {sorted(weights)[:8]}"
    save_file({k: v for k, v in weights.items() if k not in gone}, dst / "model.safetensors", metadata={"format": "pt"})
    return gone


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("causal")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_causal_lm_folder_is_refused_naming_the_head_and_what_the_folder_is(causal_lm):
    with pytest.raises(HeadError) as info:
        rl.load(str(causal_lm))
    message = str(info.value)
    assert "score.weight" in message and "LlamaForCausalLM" in message and "causal language model" in message
    assert str(causal_lm) in message


@pytest.mark.parametrize(("arch", "drop"), [("llama", ("score.",)), ("bert", ("classifier.",)),
                                            ("armorm", ("gating.",)), ("armorm", ("regression_layer.",))])
def test_a_folder_whose_head_weights_were_deleted_is_refused(tiny_root, tmp_path, arch, drop):
    gone = _without(tiny_root[arch], tmp_path / arch, drop)
    with pytest.raises(HeadError, match="initialised them at random") as info:
        rl.load(str(tmp_path / arch))
    assert gone[0] in str(info.value)
    rl.load(str(tiny_root[arch]))  # the intact folder still loads


def test_the_command_line_refuses_it_too(causal_lm, pairs, tmp_path, capsys):
    pairs_file = save_pairs(pairs, tmp_path / "pairs.jsonl")
    assert main(["score", str(causal_lm), "--pairs", str(pairs_file)]) == 2
    assert "score.weight" in capsys.readouterr().err


def test_a_prm_loaded_without_tokens_from_a_causal_lm_is_refused_naming_the_fix(causal_lm):
    """A causal-LM PRM (Math-Shepherd's kind) loaded as a token classifier would read a random `score`."""
    with pytest.raises(HeadError, match="initialised them at random") as info:
        rl.model.load_prm(str(causal_lm), separator="\n")
    assert "score.weight" in str(info.value) and "tokens=(" in str(info.value)
    rl.model.load_prm(str(causal_lm), separator="\n", tokens=("+", "-"))  # its LM head is trained: it loads


def test_judges_and_dpo_rewards_refuse_a_folder_without_an_lm_head(causal_lm, tiny_root):
    classifier = str(tiny_root["llama"])  # a sequence classifier: no lm_head in the folder
    with pytest.raises(HeadError, match="lm_head.weight") as info:
        rl.model.load_judge(classifier, tokens=("A", "B"))
    assert "ForCausalLM" in str(info.value) and classifier in str(info.value)
    with pytest.raises(HeadError, match="lm_head.weight"):
        rl.model.load_dpo(str(causal_lm), classifier)
    with pytest.raises(HeadError, match="lm_head.weight"):
        rl.model.load_dpo(classifier, str(causal_lm))
    rl.model.load_judge(str(causal_lm), tokens=("A", "B"))
