"""`rewardlens sae` refuses values it cannot use in one line before the model loads, and `sae report` writes its
page into folders that do not exist yet (as the audit does) and names a page path that is a folder."""

import pytest

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import Pair, save_pairs
from rewardlens.errors import DataError
from rewardlens.sae import SAEConfig, TopKSAE, attribute_features, feature_report, write_feature_page
from rewardlens.zoo import DEMO_PAIRS


@pytest.fixture
def no_loading(monkeypatch):
    """The model loader, replaced by one that fails the test: a refusal must come before any model loads."""
    import rewardlens.model

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(rewardlens.model, "load", loaded)


def _one_line(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("value", ["nan", "inf", "-0.5"])
def test_a_bad_auxk_alpha_is_refused_by_name_before_the_model_loads(capsys, no_loading, tmp_path, tiny_root, value):
    pairs_file = str(save_pairs(DEMO_PAIRS[:2], tmp_path / "p.jsonl"))
    line = _one_line(capsys, "sae", "train", str(tiny_root["llama"]), "--layer", "0", "--pairs", pairs_file,
                     "--out", str(tmp_path / "saes"), f"--auxk-alpha={value}")
    assert line.startswith(f"rewardlens: error: --auxk-alpha {value} is not a loss weight (a finite number >= 0)")
    assert "0 to train without the dead-latent AuxK loss" in line


def test_negative_contexts_are_refused_by_name_before_the_model_loads(capsys, no_loading, tmp_path, tiny_root):
    pairs_file = str(save_pairs(DEMO_PAIRS[:2], tmp_path / "p.jsonl"))
    (tmp_path / "saes").mkdir()
    line = _one_line(capsys, "sae", "attribute", str(tiny_root["llama"]), "--pairs", pairs_file, "--sae",
                     str(tmp_path / "saes"), "--contexts", "-1")
    assert line == ("rewardlens: error: --contexts -1 is a count of token windows per feature; pass 0 (none) or "
                    "more (default 3)")


def test_the_page_goes_into_missing_folders_and_a_folder_is_named(capsys, tmp_path, tiny_root):
    model = str(tiny_root["llama"])
    TopKSAE(rl.load(model).d_model, SAEConfig(expansion_factor=4, k=8), seed=1).save(tmp_path / "saes" / "layers.0")
    pairs_file = str(save_pairs([Pair("Hi.", "Hello there.", "No."), *DEMO_PAIRS[:2]], tmp_path / "p.jsonl"))
    out = tmp_path / "not" / "yet" / "features.html"
    assert main(["sae", "report", model, "--sae", str(tmp_path / "saes" / "layers.0"), "--pairs", pairs_file,
                 "--top", "2", "--contexts", "1", "--sae-any-model", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8").count('<section class="card"') == 2
    capsys.readouterr()
    # In Python, a folder as the page's path is named (it used to end in '[Errno 21] Is a directory').
    m = rl.load(model)
    sae = TopKSAE(m.d_model, SAEConfig(expansion_factor=4, k=8), seed=1)
    report = feature_report(m, sae, attribute_features(m, sae, DEMO_PAIRS[:2], layer=0, fit=None), DEMO_PAIRS[:2],
                            top=1, n_contexts=1)
    with pytest.raises(DataError, match=r"path .* is a folder; name an HTML file in it, e\.g\. .*features\.html"):
        write_feature_page(report, tmp_path)


@pytest.mark.parametrize("value", ["-3", "nan", "inf", "0.5", "1"])
def test_a_bad_max_norm_ratio_is_refused_by_name_before_the_model_loads(capsys, no_loading, tmp_path, tiny_root,
                                                                        value):
    pairs_file = str(save_pairs(DEMO_PAIRS[:2], tmp_path / "p.jsonl"))
    line = _one_line(capsys, "sae", "train", str(tiny_root["llama"]), "--layer", "0", "--pairs", pairs_file,
                     "--out", str(tmp_path / "saes"), f"--max-norm-ratio={value}")
    assert line.startswith(f"rewardlens: error: --max-norm-ratio {float(value)} is not a multiple of the median norm")
    assert "or 0 to keep every activation" in line
