"""`audit --sae` checks the SAE against the model as `sae attribute` and `sae report` do (`load_sae_for`:
width, layer, hook kind, base model, `--sae-any-model`), before any pair is computed.

Before, the audit loaded the folder with `load_sae` and checked nothing: an SAE recorded for another base
model was used silently, and one of another width or for a layer the model lacks failed only after every
per-pair instrument had run. The audit workflow is replaced here by a stub that stops the run where it
would start: a refusal must come before it.
"""

from __future__ import annotations

import importlib
import json

import pytest

from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import StoreError
from rewardlens.sae import SAEConfig, TopKSAE
from tests.helpers import tiny

OTHER = "EleutherAI/pythia-70m"


@pytest.fixture
def started(monkeypatch) -> list[TopKSAE | None]:
    """The SAEs the audit workflow was started with; the stub stops the run there (one line, exit 2)."""
    seen: list[TopKSAE | None] = []

    def audit(*_args, sae=None, **_kwargs):
        seen.append(sae)
        raise StoreError("the audit started")

    # The module, not `rewardlens.audit`: the package's face names the function so.
    monkeypatch.setattr(importlib.import_module("rewardlens.audit"), "audit", audit)
    return seen


def _sae(root, d_in: int, base_model: str | None = None):
    """A TopK SAE folder `root/saes/layers.0` of width `d_in`, its cfg.json naming `base_model` if given."""
    folder = TopKSAE(d_in, SAEConfig(expansion_factor=2, k=4), seed=1).save(root / "saes" / "layers.0")
    if base_model is not None:
        cfg = json.loads((folder / "cfg.json").read_text())
        (folder / "cfg.json").write_text(json.dumps({**cfg, "model_name": base_model}))
    return folder


def _audit(tiny_root, tmp_path, capsys, sae, *flags: str) -> str:
    pairs = save_pairs(tiny.PAIRS[:2], tmp_path / "pairs.jsonl")
    code = main(["audit", str(tiny_root["llama"]), "--pairs", str(pairs), "--out", str(tmp_path / "out"),
                 "--sae", str(sae), "--quiet", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("rewardlens: error: "), err
    return err[0].removeprefix("rewardlens: error: ")


def test_an_sae_of_another_base_model_is_refused_unless_accepted(tiny_root, tmp_path, capsys, started):
    folder = _sae(tmp_path, tiny.D, OTHER)
    line = _audit(tiny_root, tmp_path, capsys, folder, "--sae-layer", "0")
    assert line.startswith(f"the SAE in {folder} was trained on {OTHER!r} but this model is ")
    assert "--sae-any-model" in line and started == []
    assert _audit(tiny_root, tmp_path, capsys, folder, "--sae-layer", "0", "--sae-any-model") == "the audit started"
    assert len(started) == 1 and started[0] is not None and started[0].d_in == tiny.D


def test_an_sae_of_another_width_is_refused_before_the_audit_starts(tiny_root, tmp_path, capsys, started):
    folder = _sae(tmp_path, tiny.D // 2)
    line = _audit(tiny_root, tmp_path, capsys, folder, "--sae-layer", "0")
    assert line.startswith(f"the SAE in {folder} reads vectors of width {tiny.D // 2} but this model's resid_0 "
                           f"has width {tiny.D}") and started == []


def test_a_layer_the_model_lacks_is_refused_before_the_audit_starts(tiny_root, tmp_path, capsys, started):
    line = _audit(tiny_root, tmp_path, capsys, _sae(tmp_path, tiny.D).parent, "--sae-layer", str(tiny.L + 3))
    assert f"the model has no hook point 'resid_{tiny.L + 3}'" in line and started == []


def test_sae_any_model_needs_sae(tiny_root, tmp_path, capsys):
    pairs = save_pairs(tiny.PAIRS[:2], tmp_path / "pairs.jsonl")
    assert main(["audit", str(tiny_root["llama"]), "--pairs", str(pairs), "--sae-any-model"]) == 2
    assert capsys.readouterr().err.strip() == "rewardlens: error: --sae-any-model needs --sae PATH"
