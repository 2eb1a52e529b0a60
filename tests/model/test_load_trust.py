"""What loading trusts: finite weights and a finite check forward, safetensors unless pickle is
allowed, custom code (`auto_map`) only when trusted and never after a prompt; each refusal is one
`ModelLoadError` line naming the tensor, file or module and the fix.

Every model here is a tiny random Llama saved with `save_pretrained` and then edited on disk (a
tensor set to NaN, the weights re-saved as a pickle, an `auto_map` added): the loaders see exactly
what a user's damaged or unusual folder would hold.
"""

from __future__ import annotations

import builtins
import copy
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as tf
from safetensors.torch import load_file, save_file

import rewardlens as rl
from rewardlens.data import save_pairs
from rewardlens.errors import ModelLoadError, RewardLensWarning
from tests.helpers import tiny

NAN, INF = float("nan"), float("inf")
STEPS = [rl.Pair("What is 2+3?", "Step 1: 2+3=5.\nStep 2: so 5.\n", "Step 1: 2+3=6.\nStep 2: so 6.\n")]


@pytest.fixture(scope="module")
def llama(tokenizer, tmp_path_factory) -> Path:
    """A tiny random Llama reward model (safetensors), built once for this module."""
    return tiny.build("llama", tokenizer, tmp_path_factory.mktemp("trust"))


@pytest.fixture(scope="module")
def causal(tokenizer, tmp_path_factory) -> dict[str, Path]:
    """A tiny random Llama causal LM and a two-label token classifier, saved (safetensors) once."""
    root, out = tmp_path_factory.mktemp("trust_kinds"), {}
    for name, auto, labels in (("lm", tf.AutoModelForCausalLM, 1), ("tc", tf.AutoModelForTokenClassification, 2)):
        config = copy.deepcopy(tiny.configs(tokenizer)["llama"][1])
        config.num_labels = labels
        torch.manual_seed(0)
        model = auto.from_config(config).eval()
        tiny.perturb_(model, 0)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        out[name] = root / name
    return out


def edited(base: Path, dest: Path, key: str, index: tuple[int, ...], value: float) -> Path:
    """A copy of the folder `base` at `dest` whose weight `key` holds `value` at `index`."""
    shutil.copytree(base, dest)
    state = load_file(dest / "model.safetensors")
    state[key][index] = value
    save_file(state, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def pickled(base: Path, dest: Path) -> Path:
    """A copy of `base` whose weights are a pickle (`pytorch_model.bin`) and no safetensors file."""
    shutil.copytree(base, dest)
    torch.save(load_file(dest / "model.safetensors"), dest / "pytorch_model.bin")
    (dest / "model.safetensors").unlink()
    return dest


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


# ---- finite by construction ----------------------------------------------------------------------


@pytest.mark.parametrize("check", [True, False])
def test_a_nan_in_the_score_head_is_refused_naming_the_tensor(llama, tmp_path, check):
    folder = edited(llama, tmp_path / "rm", "score.weight", (0, 3), NAN)
    with pytest.raises(ModelLoadError) as exc:
        rl.load(str(folder), check=check)  # the weights are read whether or not the check forward runs
    text = one_line(exc)
    assert text.startswith(f"{folder}: the weight score.weight holds nan at [0, 3] (1 of 64 values non-finite)")
    assert "download it again" in text


def test_an_inf_in_the_final_norm_is_refused_naming_the_tensor(llama, tmp_path):
    folder = edited(llama, tmp_path / "rm", "model.norm.weight", (5,), INF)
    with pytest.raises(ModelLoadError) as exc:
        rl.load(str(folder))
    assert "the weight model.norm.weight holds inf at [5] (1 of 64 values non-finite)" in one_line(exc)


def test_a_nan_down_projection_is_named_by_the_check_forward(llama, tmp_path):
    """Not a weight load reads (the backbone is never scanned): the check forward finds the first part
    it makes non-finite."""
    folder = edited(llama, tmp_path / "rm", "model.layers.0.mlp.down_proj.weight", (1, 2), NAN)
    with pytest.raises(ModelLoadError) as exc:
        rl.load(str(folder))
    text = one_line(exc)
    assert "on the check input, layer 0's MLP output (model.layers.0.mlp.down_proj) is nan at [0, 1]" in text
    assert "torch.isfinite" in text


def test_a_huge_down_projection_is_refused_though_every_score_is_finite(llama, tmp_path):
    """1e30 is finite, but its square overflows float32 in every norm after it: the norm's scale is 0 and
    every reward is the same constant, so no NaN would ever show it."""
    folder = edited(llama, tmp_path / "rm", "model.layers.0.mlp.down_proj.weight", (1, 2), 1e30)
    unchecked = rl.load(str(folder), check=False)
    scores = unchecked.score(["Hello there.", "A completely different text, longer than the first one."])
    assert np.isfinite(scores).all() and scores[0] == scores[1]  # why it must be refused
    with pytest.raises(ModelLoadError) as exc:
        rl.load(str(folder))
    text = one_line(exc)
    assert re.search(r"layer 0's MLP output \(model\.layers\.0\.mlp\.down_proj\) is finite but reaches "
                     r"\|x\| = \d\.\de\+\d\d, beyond 1\.8e\+19 where x² overflows float32", text), text


def test_wrap_refuses_a_non_finite_head_and_leaves_the_model_alone(llama):
    model = tf.AutoModelForSequenceClassification.from_pretrained(llama).eval()
    with torch.no_grad():
        model.score.weight[0, 7] = -INF
    with pytest.raises(ModelLoadError, match=r"the weight score\.weight holds -inf at \[0, 7\]"):
        rl.wrap(model, tf.AutoTokenizer.from_pretrained(llama))
    assert model.score.weight[0, 7].item() == -INF


def test_a_non_finite_readout_is_refused(llama):
    with pytest.raises(ModelLoadError, match=r"^readout= holds nan at \[0\] .*pass finite readout weights$"):
        rl.load(str(llama), readout=[NAN])


def test_a_dpo_reference_with_a_nan_lm_head_is_refused_naming_it(causal, tmp_path):
    """The reference is proven by its own check forward; a NaN head there names its tensor."""
    reference = edited(causal["lm"], tmp_path / "ref", "lm_head.weight", (40, 3), NAN)
    with pytest.raises(ModelLoadError, match=r"the weight lm_head\.weight holds nan at \[40, 3\]"):
        rl.model.load_dpo(str(causal["lm"]), str(reference))


# ---- safetensors by default ----------------------------------------------------------------------


def test_a_pickle_only_folder_is_refused_unless_allowed(llama, tmp_path):
    folder = pickled(llama, tmp_path / "rm")
    with pytest.raises(ModelLoadError) as exc:
        rl.load(str(folder))
    text = one_line(exc)
    assert text.startswith(f"{folder} is pickle-only: it holds pytorch_model.bin and no *.safetensors")
    assert "if you trust the file, pass allow_pickle=True; better, convert it once to safetensors" in text
    allowed = rl.load(str(folder), allow_pickle=True)
    np.testing.assert_allclose(allowed.score(tiny.PAIRS), rl.load(str(llama)).score(tiny.PAIRS), rtol=1e-6)


def test_use_safetensors_false_does_not_bypass_the_refusal(llama):
    with pytest.raises(ModelLoadError, match="pass allow_pickle=True instead"):
        rl.load(str(llama), use_safetensors=False)


def test_every_kind_refuses_pickle_only_and_loads_it_when_allowed(causal, tmp_path):
    lm, tc = pickled(causal["lm"], tmp_path / "lm"), pickled(causal["tc"], tmp_path / "tc")
    loads = {
        "judge": lambda **kw: rl.model.load_judge(str(lm), tokens=("A", "B"), **kw),
        "prm": lambda **kw: rl.model.load_prm(str(tc), separator="\n", **kw),
        "dpo policy": lambda **kw: rl.model.load_dpo(str(lm), str(causal["lm"]), **kw),
        "dpo reference": lambda **kw: rl.model.load_dpo(str(causal["lm"]), str(lm), **kw),
    }
    for what, load in loads.items():
        with pytest.raises(ModelLoadError, match="is pickle-only"):
            load()
        safe = {"judge": rl.model.load_judge(str(causal["lm"]), tokens=("A", "B")),
                "prm": rl.model.load_prm(str(causal["tc"]), separator="\n")}.get(what)
        model = load(allow_pickle=True)
        if safe is not None:
            np.testing.assert_allclose(model.score(STEPS), safe.score(STEPS), rtol=1e-6, err_msg=what)


def test_a_hub_id_without_safetensors_is_refused_unless_allowed(llama, tmp_path, monkeypatch):
    """A hub id cannot be listed in advance: transformers is asked for safetensors only. The hub is a
    local cache here (local_files_only), holding a repository with pickle weights alone."""
    monkeypatch.setenv("DISABLE_SAFETENSORS_CONVERSION", "1")  # never ask the hub's conversion bot
    repo = tmp_path / "hub" / "models--org--pickle-rm"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    pickled(llama, repo / "snapshots" / ("a" * 40))
    hub = dict(cache_dir=str(tmp_path / "hub"), local_files_only=True)
    with pytest.raises(ModelLoadError) as exc:
        rl.load("org/pickle-rm", **hub)
    assert one_line(exc).startswith("org/pickle-rm has no safetensors weights")
    assert "allow_pickle=True" in str(exc.value)
    assert rl.load("org/pickle-rm", allow_pickle=True, **hub).score("Hi").shape == (1,)


class _Payload:
    """Unpickled with weights_only=False, this would call os.getcwd: harmless, but code all the same."""

    def __reduce__(self):
        return os.getcwd, ()


def test_a_pickle_that_calls_code_is_one_line_even_when_pickle_is_allowed(llama, tmp_path):
    folder = pickled(llama, tmp_path / "rm")
    torch.save({"model.norm.weight": _Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError) as exc:
        rl.load(str(folder), allow_pickle=True)
    text = one_line(exc)
    assert text.startswith(f"{folder}: torch's safe unpickler (weights_only) refused pytorch_model.bin: ")
    assert "getcwd" in text and "may be malicious" in text


def test_a_truncated_pickle_is_one_line(llama, tmp_path):
    folder = pickled(llama, tmp_path / "rm")
    data = (folder / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError) as exc:
        rl.load(str(folder), allow_pickle=True)
    assert "pytorch_model.bin is not a readable torch checkpoint" in one_line(exc)
    assert "damaged or truncated" in str(exc.value)


def test_the_command_line_names_allow_pickle_as_its_flag(llama, tmp_path, capsys):
    """Strictly a command-line test (tests/cli): `--allow-pickle` reaches every loader through load_model."""
    from rewardlens.cli import main

    folder = pickled(llama, tmp_path / "rm")
    pairs = str(save_pairs(tiny.PAIRS[:1], tmp_path / "pairs.jsonl"))
    assert main(["score", str(folder), "--pairs", pairs]) == 2
    err = capsys.readouterr().err
    # the library's line, then the flag named from the error's option (cli FLAGS), never a reworded message
    assert "allow_pickle=True" in err and err.rstrip().endswith("(on the command line: --allow-pickle)")
    assert main(["score", str(folder), "--pairs", pairs, "--allow-pickle"]) == 0


# ---- custom code (auto_map) ----------------------------------------------------------------------

_MODELING = """from transformers import LlamaForSequenceClassification


class CustomRewardModel(LlamaForSequenceClassification):
    pass
"""


def with_auto_map(base: Path, dest: Path, *, model_type: str = "llama", code: bool = True,
                  auto_map: dict[str, str] | None = None) -> Path:
    """A copy of `base` whose config.json names custom code (by default for its sequence classifier)
    and, with `code`, holds the module file of that classifier."""
    shutil.copytree(base, dest)
    config = json.loads((dest / "config.json").read_text())
    config.update(model_type=model_type,
                  auto_map=auto_map or {"AutoModelForSequenceClassification": "modeling_custom.CustomRewardModel"})
    (dest / "config.json").write_text(json.dumps(config))
    if code:
        (dest / "modeling_custom.py").write_text(_MODELING)
    return dest


@pytest.fixture
def no_prompt(monkeypatch) -> list[str]:
    """Every y/N prompt transformers would show (none may be shown): answered 'no' and recorded."""
    asked: list[str] = []
    monkeypatch.setattr(builtins, "input", lambda prompt="": asked.append(prompt) or "")
    return asked


def test_custom_code_left_unrun_is_named_in_a_warning_and_trusted_code_runs_silently(llama, tmp_path, no_prompt):
    folder = with_auto_map(llama, tmp_path / "rm")
    with pytest.warns(RewardLensWarning) as record:
        model = rl.load(str(folder))
    assert type(model.model) is tf.LlamaForSequenceClassification
    text = " ".join(str(w.message) for w in record)
    assert "AutoModelForSequenceClassification → modeling_custom.CustomRewardModel) that was not run" in text
    assert "transformers loaded its own LlamaForSequenceClassification for model_type 'llama'" in text
    assert "--trust-remote-code" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error", RewardLensWarning)  # the code ran: nothing to warn of
        trusted = rl.load(str(folder), trust_remote_code=True)
    assert type(trusted.model).__name__ == "CustomRewardModel"
    assert no_prompt == []


def test_custom_only_code_without_trust_is_one_line_and_never_a_prompt(llama, tmp_path, no_prompt):
    """A model_type transformers lacks: before, transformers asked y/N on a terminal (trust_remote_code
    was None, not False) and then failed with its own paragraph."""
    folder = with_auto_map(llama, tmp_path / "rm", model_type="custom_reward_model",
                           auto_map={"AutoConfig": "configuration_custom.CustomConfig"})
    with pytest.raises(ModelLoadError) as exc:
        rl.load(str(folder))
    text = one_line(exc)
    assert text.startswith(f"{folder}: config.json's auto_map names custom code "
                           "(AutoConfig → configuration_custom.CustomConfig)")
    assert text.endswith("read it, then pass trust_remote_code=True")
    assert no_prompt == []


def test_an_unknown_model_type_without_custom_code_is_one_line(llama, tmp_path):
    folder = tmp_path / "rm"
    shutil.copytree(llama, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "llama_from_the_future"}))
    with pytest.raises(ModelLoadError) as exc:
        rl.load(str(folder))
    assert one_line(exc).startswith(f"{folder}: model type 'llama_from_the_future' is not one transformers "
                                    f"{tf.__version__} knows, and config.json's auto_map names no custom code")


def test_trusted_custom_code_whose_module_is_missing_is_one_line_naming_it(llama, tmp_path, no_prompt):
    folder = with_auto_map(llama, tmp_path / "rm", code=False)
    with pytest.raises(ModelLoadError) as exc:
        rl.load(str(folder), trust_remote_code=True)
    text = one_line(exc)
    assert "names modeling_custom.py, which the folder lacks" in text
    assert "copy the model's own .py files into the folder" in text
    assert no_prompt == []


@pytest.mark.parametrize("config, said", [
    ("not json", "not a valid JSON file"),
    ('{"model_type": "llama", "hidden_size": "x"}', "expected int, got str"),
    ('{"model_type": "llama", "hidden_size": 8, "num_attention_heads": 3}', "validate_architecture"),
])
def test_a_folder_transformers_refuses_is_one_line_of_bad_input(tmp_path, config, said):
    """transformers' (and huggingface_hub's config validation) refusal of a folder is the user's input, not our
    bug: one ModelLoadError line that keeps what transformers said, the chain kept for REWARDLENS_DEBUG."""
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(ModelLoadError, match=said) as caught:
        rl.load(str(tmp_path))
    assert "\n" not in str(caught.value) and str(tmp_path) in str(caught.value)
