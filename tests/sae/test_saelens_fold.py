"""A SAELens TopK SAE saved with `rescale_acts_by_decoder_norm: true` loads with SAELens' own features.

The yardstick is SAELens' TopKSAE written out from its definition (sae_lens/saes/topk_sae.py,
`encode`/`decode`): `hidden = (x − b_dec·apply_b_dec_to_input) @ W_enc + b_enc`, scaled by `‖W_dec_i‖`
when `rescale_acts_by_decoder_norm` is set, then TopK and ReLU of the kept values; the decoder divides
each feature by `‖W_dec_i‖` again before `@ W_dec + b_dec`.
"""

import json

import pytest
import torch
from safetensors.torch import save_file

from rewardlens.sae import load_sae


def _saelens_encode(x, w, k, apply_b_dec=True):
    hidden = (x - w["b_dec"] * apply_b_dec) @ w["W_enc"] + w["b_enc"]
    hidden = hidden * w["W_dec"].norm(dim=-1)
    top = hidden.topk(k, dim=-1)
    return torch.zeros_like(hidden).scatter_(-1, top.indices, torch.relu(top.values))


def _saelens_decode(f, w):
    return (f / w["W_dec"].norm(dim=-1)) @ w["W_dec"] + w["b_dec"]


def _folder(path, d, n, k, seed, apply_b_dec=True, zero_rows=()):
    """A SAELens folder (cfg.json + sae_weights.safetensors) whose decoder rows have norms 0.2 to 3: far from
    unit, so ignoring the rescale changes both the values and the active set."""
    g = torch.Generator().manual_seed(seed)
    w_dec = torch.randn(n, d, generator=g)
    w_dec = w_dec / w_dec.norm(dim=1, keepdim=True) * (0.2 + 2.8 * torch.rand(n, 1, generator=g))
    w_dec[list(zero_rows)] = 0.0
    w = {"W_enc": torch.randn(d, n, generator=g) / d**0.5, "b_enc": 0.1 * torch.randn(n, generator=g),
         "W_dec": w_dec, "b_dec": 0.3 * torch.randn(d, generator=g)}
    path.mkdir()
    save_file(w, str(path / "sae_weights.safetensors"))
    (path / "cfg.json").write_text(json.dumps({
        "architecture": "topk", "d_in": d, "d_sae": n, "k": k, "rescale_acts_by_decoder_norm": True,
        "apply_b_dec_to_input": apply_b_dec, "normalize_activations": "none", "dtype": "float32",
        "hook_name": "blocks.1.hook_resid_post"}))
    return w


@pytest.mark.parametrize("apply_b_dec", [True, False])
def test_a_rescaled_saelens_sae_gives_saelens_features_and_reconstruction(tmp_path, apply_b_dec):
    d, n, k = 32, 256, 12
    w = _folder(tmp_path / "s", d, n, k, seed=3, apply_b_dec=apply_b_dec)
    x = 2 * torch.randn(200, d, generator=torch.Generator().manual_seed(4))
    want = _saelens_encode(x, w, k, apply_b_dec)
    sae = load_sae(tmp_path / "s")
    with torch.no_grad():
        got = sae.codes(x)
        recon = sae.decode(*sae.encode(x))
    assert torch.equal(got != 0, want != 0)  # the same active set
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(recon, _saelens_decode(want, w), rtol=1e-5, atol=1e-5)
    # Folded as SAELens folds: unit decoder rows, whose features then write what SAELens' decoder writes.
    torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(n), rtol=1e-6, atol=1e-6)
    # The rescale matters here: the plain rule on the stored weights picks other latents.
    plain = torch.relu((x - w["b_dec"] * apply_b_dec) @ w["W_enc"] + w["b_enc"])
    top = plain.topk(k, dim=-1)
    unscaled = torch.zeros_like(plain).scatter_(-1, top.indices, top.values)
    assert not torch.equal(unscaled != 0, want != 0)


def test_a_zero_decoder_row_folds_to_a_latent_that_never_writes(tmp_path):
    d, n, k = 16, 64, 4
    w = _folder(tmp_path / "s", d, n, k, seed=5, zero_rows=(0, 7))
    sae = load_sae(tmp_path / "s")
    assert torch.isfinite(sae.W_dec).all() and sae.W_dec[[0, 7]].abs().max() == 0
    x = torch.randn(50, d, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        got = sae.codes(x)
    assert got[:, [0, 7]].abs().max() == 0
    torch.testing.assert_close(got, _saelens_encode(x, w, k), rtol=1e-5, atol=1e-5)
