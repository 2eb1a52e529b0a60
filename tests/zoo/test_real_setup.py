"""The README's real-model command after the README's setup: a missing gguf package is one line naming
the extra (before anything downloads), and building prints no transformers load report about the
reward head rewardlens attaches itself.

No real model is built here: the gguf check runs first in the SmolLM2 build, and the quiet load is
shown on a tiny causal LM folder, which lacks a score head exactly as the GGUF checkpoint does.
"""

from __future__ import annotations

import copy
import io
import logging
import sys

import pytest
import torch
import transformers as tf
from transformers.utils import logging as hf_logging

from rewardlens.errors import MissingDependencyError
from rewardlens.zoo import _realbuild, realmodels
from tests.helpers import tiny


@pytest.fixture
def no_gguf(monkeypatch, tmp_path):
    """gguf made unimportable, and an empty cache, so the SmolLM2 folder has to be built."""
    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setenv("REWARDLENS_TEST_CACHE", str(tmp_path))
    monkeypatch.setenv("REWARDLENS_REAL_CACHE", str(tmp_path))  # the newer name wins over the old one
    return tmp_path


def test_the_real_model_command_without_gguf_is_one_line_naming_the_extra(no_gguf, capsys):
    with pytest.raises(SystemExit) as exc:
        realmodels.main(["smollm2-dpo"])
    assert exc.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith("python -m rewardlens.zoo.realmodels: error: the real SmolLM2 reward model is built "
                               "from a GGUF checkpoint (bash scripts/setup.sh installs the runtime only), which "
                               "needs the 'gguf' package, not installed")
    assert "pip install 'rewardlens[gguf]', or bash scripts/setup.sh real" in lines[0]
    assert not list(no_gguf.rglob("*.whl")), "nothing may download before the check"


def test_the_library_raises_an_import_error_that_names_the_extra(no_gguf):
    with pytest.raises(MissingDependencyError, match=r"pip install 'rewardlens\[gguf\]'") as exc:
        _realbuild.smollm2_reward_dir()
    assert isinstance(exc.value, ImportError)


@pytest.fixture
def transformers_log():
    """What transformers logs at warning level (the suite runs at error level), restored after."""
    stream, level = io.StringIO(), hf_logging.get_verbosity()
    handler = logging.StreamHandler(stream)
    hf_logging.add_handler(handler)
    hf_logging.set_verbosity_warning()
    yield stream
    hf_logging.remove_handler(handler)
    hf_logging.set_verbosity(level)


def test_building_a_head_rewardlens_attaches_prints_no_load_report(tokenizer, tmp_path, transformers_log):
    config = copy.deepcopy(tiny.configs(tokenizer)["llama"][1])
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "lm")
    tf.AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=1)
    assert "MISSING" in transformers_log.getvalue()  # what a plain load prints: the test can see it
    transformers_log.seek(0)
    transformers_log.truncate()
    model = _realbuild.headless_classifier(tmp_path / "lm")
    assert model.score.weight.shape == (1, config.hidden_size) and model.score.weight.dtype == torch.float32
    report = transformers_log.getvalue()
    assert "MISSING" not in report and "newly initialized" not in report, report
    assert hf_logging.get_verbosity() == logging.WARNING  # restored after the quiet load


def test_the_real_models_live_in_the_package_cache_not_under_a_tests_name(monkeypatch, tmp_path):
    for name in ("REWARDLENS_REAL_CACHE", "REWARDLENS_TEST_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REWARDLENS_CACHE", str(tmp_path / "pkg"))
    assert _realbuild.cache_root() == tmp_path / "pkg" / "real-models"
    monkeypatch.setenv("REWARDLENS_TEST_CACHE", str(tmp_path / "old"))  # the old name still works
    assert _realbuild.cache_root() == tmp_path / "old"
    monkeypatch.setenv("REWARDLENS_REAL_CACHE", str(tmp_path / "new"))  # and the new one wins
    assert _realbuild.cache_root() == tmp_path / "new" and (tmp_path / "new").is_dir()


def test_realmodels_pairs_says_what_it_fetches_before_fetching_and_that_it_is_cached_after(monkeypatch, tmp_path,
                                                                                          capsys):
    """The first `realmodels pairs` spends about a minute and a half in pip: it says so before pip starts; once
    the pairs are cached it says that instead (on stderr: stdout is the path a shell command reads)."""
    monkeypatch.setenv("REWARDLENS_REAL_CACHE", str(tmp_path))

    def offline(requirement, dest, *, source=False):
        raise RuntimeError(f"this test fetches nothing ({requirement})")

    monkeypatch.setattr(realmodels, "pip_download", offline)
    with pytest.raises(RuntimeError, match="fetches nothing"):
        realmodels.main(["pairs", "--limit", "4"])
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.startswith("realmodels: first use: fetching the llamafactory==0.9.5 source archive from PyPI")
    assert "minutes" in said.err and str(tmp_path / realmodels.DPO_DIRNAME) in said.err
    folder = tmp_path / realmodels.DPO_DIRNAME  # as a finished fetch leaves it
    folder.mkdir()
    (folder / _realbuild.READY).write_text('{"built_in_s": 86.8}\n')
    assert realmodels.pairs_note() == f"realmodels: the dpo_en_demo pairs are cached in {folder}, fetched in 87 s " \
                                      "on first use"
