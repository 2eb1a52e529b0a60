"""The calibrate rows for upstream SAE features: on an SAE at layer 0 of each truth organism, with one latent planted
that writes nothing directly (orthogonal to every read-out) but moves the margin through layer 1, the latent whose
measured ablation moves the margin most is the first-order total ranking's #1; the direct ranking puts the planted
one last."""

import numpy as np
import pytest

from rewardlens.calibrate._core import OrganismBench
from rewardlens.calibrate._upstream import upstream


@pytest.fixture(scope="module")
def rows(organisms):
    bench = OrganismBench(seed=0, n_pairs=60, organisms=["list", "keyword"])
    return {name: upstream(bench, name) for name in ("list", "keyword")}


@pytest.mark.parametrize("name", ["list", "keyword"])
def test_the_most_effective_layer0_latent_is_the_total_rankings_first(rows, name):
    by_total, by_direct, planted, direct = rows[name]
    assert all(r.passed for r in rows[name]), [(r.check, r.value) for r in rows[name]]
    assert by_total.check.startswith("rank of the most effective layer-0 latent") and by_total.value == 1
    assert direct.value < 1e-6  # the plant writes nothing directly onto the read-out
    assert np.isfinite(planted.value) and planted.value > 0


def test_on_keyword_the_planted_latent_is_the_most_effective_and_last_by_direct_attribution(rows):
    by_total, by_direct, planted, _ = rows["keyword"]
    assert "(0, planted)" in by_total.check and planted.value > 0.3
    assert by_direct.value == by_direct.threshold  # last of the latents that fire
