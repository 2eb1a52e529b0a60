"""One flag floor everywhere (issue 42, item 1): on the demo model `rl.probe(model)` (all 72 items at once),
`rewardlens probe` (the staged budget) and the audit of the demo's 8 pairs flag the same axes under the same
scale, the sd of the 72 base items' rewards, printed with the flags; the audit also computes each flag under
its pairs' mean |margin| and marks, without headlining, the axes whose flag that scale changes."""

import json

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.audit import Plan, Store, audit
from rewardlens.audit.report import summary
from rewardlens.cli import main
from rewardlens.cli import probes as cli_probes
from rewardlens.zoo import AUDIT_PAIRS, demo_model_dir


@pytest.fixture(scope="module")
def model():
    return rl.load(str(demo_model_dir()))


def test_the_demo_flags_the_same_axes_in_probe_the_cli_and_the_audit(model, capsys):
    direct = rl.probe(model)
    sd = float(np.std(direct.base_reward, ddof=1))  # the yardstick: numpy on the model's own rewards
    assert direct.scale == pytest.approx(sd, rel=1e-12) and len(direct.item_ids) == 72
    flagged = {a for a, f in zip(direct.axes, direct.flagged) if f}
    assert "sycophancy" in flagged, "the planted organism's bias"

    assert main(["probe", str(demo_model_dir()), "--json", "--quiet"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert {r["axis"] for r in cli["axes"] if r["flagged"]} == flagged
    assert cli["scale"] == pytest.approx(sd, rel=1e-5)  # the staged run's floor: all 72 items' sd at every stage
    cli_probes._show(cli)
    shown = capsys.readouterr().out
    assert f"reward scale {cli['scale']:.4g} (sd of the rewards of 72 base items)" in shown

    res = audit(model, AUDIT_PAIRS, store=Store(":memory:"), plan=Plan(concepts=False, divergence=False, tokens=False))
    p = res.probes
    assert p.stages == (18, 36, 72) and {a for a, f in zip(p.axes, p.flagged) if f} == flagged
    assert p.scale == pytest.approx(sd, rel=1e-5)
    reward = model.score(list(AUDIT_PAIRS))
    pairs_scale = float(np.mean(np.abs(reward[0::2] - reward[1::2])))
    assert p.alt_scale == pytest.approx(pairs_scale, rel=1e-5)
    under_pairs = (p.q < p.level) & (np.abs(p.mean) >= p.min_effect * pairs_scale)
    np.testing.assert_array_equal(p.fragile, p.flagged != under_pairs)
    info = summary(res)["probes"]
    robust = [a for a, f, w in zip(p.axes, p.flagged, p.fragile) if f and not w]
    assert info["findings"] == robust and "sycophancy" in robust
    assert set(info["fragile"]) == {a for a, w in zip(p.axes, p.fragile) if w}
    assert info["headline"].startswith(", ".join(robust))
    assert f"x scale {p.scale:.3g}, sd of the rewards of 72 base items" in info["headline"]
    for axis, why in info["fragile"].items():
        assert "fragile" in info["headline"] and axis in info["headline"].split("fragile")[1]
        assert "mean |margin| of 8 reference pairs" in why and "sd of the rewards of 72 base items" in why
