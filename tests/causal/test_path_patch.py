"""Path patching against a naive loop of hooked Hugging Face forwards (Wang et al.'s three runs).

The yardstick shares nothing with the engine but the part names: per (pair, sender) it runs (A) clean
and corrupted forwards to read the sender's corrupted activation and every sublayer's clean write,
(B) a forward of the target with the sender patched and every other sublayer's write frozen to its
clean value, recording what each receiver's *reader module* (its input norm; a post-norm encoder's
self-attention or intermediate) and query/key/value projection get, then (C) per receiver a clean
forward in which only that reader gets run B's input (or, for a head, only its columns of run B's
projection), everything after it free. Receiver 'reward' is run B's own logit (every part frozen).
"""

import contextlib
import warnings

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens import path_patch
from rewardlens.errors import ArchitectureError, CircuitError, RewardLensWarning
from rewardlens.model import Part

# arch -> (layers, attn write raw, attn write added, mlp write raw, mlp write added, attn reader, mlp reader, qkv)
MAPS = {
    "llama": ("model.layers", "self_attn.o_proj", None, "mlp.down_proj", None, "input_layernorm",
              "post_attention_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    "gpt2": ("transformer.h", "attn.c_proj", None, "mlp.c_proj", None, "ln_1", "ln_2", None),
    "gpt_neox": ("gpt_neox.layers", "attention.dense", None, "mlp.dense_4h_to_h", None, "input_layernorm",
                 "post_attention_layernorm", None),
    "gemma2": ("model.layers", "self_attn.o_proj", "post_attention_layernorm", "mlp.down_proj",
               "post_feedforward_layernorm", "input_layernorm", "pre_feedforward_layernorm",
               ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    "bert": ("bert.encoder.layer", "attention.output.dense", None, "output.dense", None, "attention.self",
             "intermediate", ("attention.self.query", "attention.self.key", "attention.self.value")),
    # d_head = 24 ≠ d / H, per-head q/k norms
    "armorm": ("model.layers", "self_attn.o_proj", None, "mlp.down_proj", None, "input_layernorm",  # a gated head
               "post_attention_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    "qwen3": ("model.layers", "self_attn.o_proj", None, "mlp.down_proj", None, "input_layernorm",
              "post_attention_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    # the MLP is a sparse block
    "mixtral": ("model.layers", "self_attn.o_proj", None, "mlp", None, "input_layernorm", "post_attention_layernorm",
                ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    # post-norms only: the sublayers read the stream itself
    "olmo2": ("model.layers", "self_attn.o_proj", "post_attention_layernorm", "mlp.down_proj",
              "post_feedforward_layernorm", "self_attn", "mlp", None),
    # relative attention
    "deberta-v2": ("deberta.encoder.layer", "attention.output.dense", None, "output.dense", None, "attention.self",
                   "intermediate", ("attention.self.query_proj", "attention.self.key_proj",
                                    "attention.self.value_proj")),
}
SENDERS = ["embed", "attn_L0", "attn_L0_H1", "mlp_L0"]
RECEIVERS = {
    "llama": ["attn_L1", "mlp_L1", "attn_L1_H2_q", "reward"],
    "gpt2": ["attn_L1", "mlp_L1", "reward"],
    "gpt_neox": ["attn_L1", "mlp_L1", "reward"],
    "gemma2": ["attn_L1", "mlp_L1", "attn_L1_H3_q", "reward"],
    "bert": ["attn_L1", "mlp_L1", "attn_L1_H0", "attn_L1_H2_k", "attn_L1_H3_v", "reward"],
    "armorm": ["attn_L1", "mlp_L1", "attn_L1_H1_q", "reward"],
    "qwen3": ["attn_L1", "mlp_L1", "attn_L1_H1_q", "reward"],
    "mixtral": ["attn_L1", "mlp_L1", "attn_L1_H0_q", "reward"],
    "olmo2": ["attn_L1", "mlp_L1", "reward"],
    "deberta-v2": ["attn_L1", "mlp_L1", "attn_L1_H1", "reward"],
}
ENCODERS = ("bert", "deberta-v2")


def close(got, want):
    """Equal to float precision: fp32 rounding of the rewards (~5e-7 here) or 1e-4 of the largest effect
    (the tiny encoder's paths carry little), and not a comparison of zeros: some path carries over
    200 times that tolerance."""
    scale = np.abs(want).max()
    assert scale > 1e-4
    np.testing.assert_allclose(got, want, atol=max(1e-4 * scale, 5e-7), rtol=1e-4)


@contextlib.contextmanager
def hooks(pairs_of_module_fn):
    """(module, 'in' | 'out', fn(tensor) -> tensor | None) hooks on the first input / first output."""
    handles = []

    def pre(fn):
        def hook(m, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            new = fn(x)
            if new is None:
                return None
            return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})
        return hook

    def post(fn):
        def hook(m, args, out):
            new = fn(out[0] if isinstance(out, tuple) else out)
            return None if new is None else ((new, *out[1:]) if isinstance(out, tuple) else new)
        return hook

    try:
        for module, where, fn in pairs_of_module_fn:
            if where == "in":
                handles.append(module.register_forward_pre_hook(pre(fn), with_kwargs=True))
            else:
                handles.append(module.register_forward_hook(post(fn)))
        yield
    finally:
        for h in handles:
            h.remove()


class Naive:
    """The three runs of path patching, one unpadded forward of one sequence at a time."""

    def __init__(self, model, arch):
        self.hf, self.spec = model.model, MAPS[arch]
        self.encoder = arch in ENCODERS
        self.layers = self.hf.get_submodule(self.spec[0])
        self.heads = model.n_heads

    def mod(self, layer, path):
        return self.layers[layer].get_submodule(path)

    def writes(self):
        """(key, module): every sublayer's write as it enters the residual (frozen in run B)."""
        s = self.spec
        for layer in range(len(self.layers)):
            yield ("attn", layer), self.mod(layer, s[2] or s[1])
            yield ("mlp", layer), self.mod(layer, s[4] or s[3])

    def sender_point(self, sender):
        """(module, where, column slice) of the activation patch() overwrites for a sender."""
        if sender == "embed":
            return self.layers[0], "in", slice(None)
        part = Part.parse(sender)
        raw = self.mod(part.layer, self.spec[1] if part.kind == "attn" else self.spec[3])
        if part.head is None:
            return raw, "out", slice(None)
        size = raw.weight.shape[1 if type(raw).__name__ != "Conv1D" else 0] // self.heads
        return raw, "in", slice(part.head * size, (part.head + 1) * size)

    def forward(self, ids, hooks_=()):
        with torch.no_grad(), hooks(hooks_):
            out = self.hf(input_ids=torch.tensor([ids]))
        score = getattr(out, "score", None)  # ArmoRM: the gated total, its gate computed in this run
        return float(out.logits[0, 0] if score is None else score.reshape(-1)[0])

    def capture(self, ids, points):
        got = {}

        def keep(key):
            def fn(x):
                got[key] = x.detach().clone()
            return fn
        self.forward(ids, [(m, w, keep(k)) for k, (m, w) in points.items()])
        return got

    def read(self, ids):
        return 0 if self.encoder else len(ids) - 1

    def reader_points(self, recv):
        s = self.spec
        out = {}
        for r in recv:
            if r == "reward":
                continue
            part = Part.parse(r.rstrip("qkv").rstrip("_") if r.count("_") == 3 else r)
            if part.head is None:
                out[r] = (self.mod(part.layer, s[5] if part.kind == "attn" else s[6]), "in")
            else:
                for path in s[7]:
                    out[(r, path)] = (self.mod(part.layer, path), "out")
        return out

    def run(self, tgt, src, sender, recv, cols):
        """Patched reward of `tgt` per receiver; `src` None = zero ablation, `cols` (target, source) lists."""
        module, where, sl = self.sender_point(sender)
        clean_w = self.capture(tgt, dict((k, (m, "out")) for k, m in self.writes()))
        source = None if src is None else self.capture(src, {"s": (module, where)})["s"]
        own = None if sender == "embed" else Part.parse(sender)

        def overwrite(x):
            x = x.clone()
            for ct, cs in zip(*cols):
                x[0, ct, sl] = 0 if source is None else source[0, cs, sl]
            return x

        frozen = [(m, "out", (lambda v: lambda _x: v)(clean_w[k])) for k, m in self.writes()
                  if own is None or k != (own.kind, own.layer)]
        got = {}

        def keep(key):
            def fn(x):
                got[key] = x.detach().clone()
            return fn
        points = self.reader_points(recv)
        direct = self.forward(tgt, [(module, where, overwrite), *frozen,
                                    *[(m, w, keep(k)) for k, (m, w) in points.items()]])
        clean_qkv = self.capture(tgt, {k: v for k, v in points.items() if isinstance(k, tuple)})
        out = []
        for r in recv:
            if r == "reward":
                out.append(direct)
                continue
            if r in points:
                hook = [(points[r][0], "in", (lambda v: lambda x: v)(got[r]))]
            else:
                part = Part.parse(r if r.count("_") == 2 else r[:-2])
                which = "qkv" if r.count("_") == 2 else r[-1]
                hook = []
                for x, path in zip("qkv", self.spec[7]):
                    size = got[(r, self.spec[7][0])].shape[-1] // self.heads
                    cs = slice(part.head * size, (part.head + 1) * size)
                    new = clean_qkv[(r, path)].clone()
                    if x in which:
                        new[..., cs] = got[(r, path)][..., cs]
                    hook.append((points[(r, path)][0], "out", (lambda v: lambda _x: v)(new)))
            out.append(self.forward(tgt, hook))
        return out


def _columns(read, shared, spans):
    """Patched columns: the read token, positions 0 .. min_len − 1 ('prefix'), or a span up to the read."""
    if spans == "prefix":
        return list(range(shared))
    return [read] if spans is None else list(range(read + 1))[slice(*spans)]


def naive_path_patch(model, arch, pairs, senders, recv, mode="noising", spans=None):
    """[n, S, R] effects (clean margin − patched margin) by the naive three runs."""
    naive = Naive(model, arch)
    seqs = [s.ids for s in model.encode(pairs)[0]]
    effects = np.zeros((len(pairs), len(senders), len(recv)))
    for p in range(len(pairs)):
        c, r = seqs[2 * p], seqs[2 * p + 1]
        clean_c, clean_r = naive.forward(c), naive.forward(r)

        shared = min(len(c), len(r))
        cc, cr = _columns(naive.read(c), shared, spans), _columns(naive.read(r), shared, spans)
        for s, sender in enumerate(senders):
            if mode == "noising":
                got = naive.run(c, r, sender, recv, (cc, cr))
                effects[p, s] = (clean_c - clean_r) - (np.array(got) - clean_r)
            else:  # zero ablation on both sides
                gc = naive.run(c, None, sender, recv, (cc, cc))
                gr = naive.run(r, None, sender, recv, (cr, cr))
                effects[p, s] = (clean_c - clean_r) - (np.array(gc) - np.array(gr))
    return effects


@pytest.mark.parametrize("arch", list(MAPS))
def test_path_patching_equals_the_naive_loop(tiny_root, pairs, arch):
    model = rl.load(str(tiny_root[arch]))
    recv = RECEIVERS[arch]
    # The encoder reads [CLS], the same token on both sides: patch the shared prefix, where they differ.
    positions = "prefix" if arch in ENCODERS else "read"
    got = path_patch(model, pairs, senders=SENDERS, receivers=recv, positions=positions)
    want = naive_path_patch(model, arch, pairs, SENDERS, recv, spans=None if arch not in ENCODERS else "prefix")
    assert got.senders == SENDERS and got.receivers == recv
    close(got.effect, want)


def test_spans_ablation_and_same_layer_receivers_equal_the_naive_loop(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    senders, recv = ["attn_L0", "attn_L1_H0", "mlp_L0"], ["mlp_L1", "reward"]
    got = path_patch(model, pairs, senders=senders, receivers=recv, positions=[(-2, None)])
    close(got.effect, naive_path_patch(model, "llama", pairs, senders, recv, spans=(-2, None)))
    got = path_patch(model, pairs, senders=["attn_L0_H3"], receivers=["mlp_L0"], mode="ablation")
    close(got.effect, naive_path_patch(model, "llama", pairs, ["attn_L0_H3"], ["mlp_L0"], mode="ablation"))


@pytest.mark.parametrize(("arch", "positions"), [
    ("llama", "read"), ("llama", "prefix"), ("gemma2", "read"), ("gpt_neox", "prefix"), ("bert", "prefix"),
    ("gpt2", ((-3, None),)), ("armorm", "read"),
])
def test_the_reward_receiver_is_direct_patching(tiny_root, pairs, arch, positions):
    model = rl.load(str(tiny_root[arch]))
    senders = ["embed", "attn_L0_H1", "attn_L1_H2", "mlp_L0", "mlp_L1"]
    with warnings.catch_warnings():  # prefix names the pairs whose read token it leaves unpatched
        warnings.simplefilter("ignore", RewardLensWarning)
        got = path_patch(model, pairs, senders=senders, receivers=["reward"], positions=positions)
        direct = rl.patch(model, pairs, level="head", estimand="direct", positions=positions)
    want = direct.effect[:, [direct.names.index(s) for s in senders]]
    close(got.effect[:, :, 0], want)


@pytest.mark.parametrize("arch", ["gpt_neox", "bert"])
def test_full_forwards_where_layers_cannot_be_stepped(tiny_root, pairs, arch, monkeypatch):
    model = rl.load(str(tiny_root[arch]))
    recv = RECEIVERS[arch]
    positions = "prefix" if arch == "bert" else "read"
    stepped = path_patch(model, pairs, senders=SENDERS, receivers=recv, positions=positions)
    monkeypatch.setattr("rewardlens.causal._path.stepping_works", lambda *_: False)
    whole = path_patch(model, pairs, senders=SENDERS, receivers=recv, positions=positions)
    np.testing.assert_allclose(whole.effect, stepped.effect, atol=max(1e-4 * np.abs(stepped.effect).max(), 5e-7))


def test_bad_input_is_refused_naming_the_fix(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    with pytest.raises(CircuitError, match="reads the residual stream before sender 'mlp_L0'.*later layer"):
        path_patch(model, pairs, senders=["mlp_L0"], receivers=["attn_L0"])
    with pytest.raises(CircuitError, match="before sender 'attn_L1'"):
        path_patch(model, pairs, senders=["attn_L1"], receivers=["attn_L1_H0_q"])
    with pytest.raises(CircuitError, match="non-empty lists"):
        path_patch(model, pairs, senders=[], receivers=["reward"])
    with pytest.raises(CircuitError, match="non-empty lists"):
        path_patch(model, pairs, senders=["embed"], receivers="reward")
    with pytest.raises(ValueError, match="'attn_L9x' is not a part name"):
        path_patch(model, pairs, senders=["attn_L9x"], receivers=["reward"])
    with pytest.raises(ValueError, match="'mlp_L1_N3' is not a receiver"):
        path_patch(model, pairs, senders=["embed"], receivers=["mlp_L1_N3"])
    with pytest.raises(CircuitError, match="'attn_L5' is not a patchable part"):
        path_patch(model, pairs, senders=["attn_L5"], receivers=["reward"])
    with pytest.raises(ArchitectureError, match="grouped-query attention.*input='q'"):
        path_patch(model, pairs, senders=["embed"], receivers=["attn_L1_H0_k"])


def test_layouts_that_cannot_separate_an_input_are_refused(tiny_root, pairs):
    gpt2 = rl.load(str(tiny_root["gpt2"]))
    with pytest.raises(ArchitectureError, match="fused qkv.*'attn_L1'"):
        path_patch(gpt2, pairs, senders=["embed"], receivers=["attn_L1_H0_q"])
    neox = rl.load(str(tiny_root["gpt_neox"]))  # parallel: the MLP reads beside the attention, not after it
    with pytest.raises(CircuitError, match="'mlp_L0' reads .* before sender 'attn_L0'.*parallel"):
        path_patch(neox, pairs, senders=["attn_L0"], receivers=["mlp_L0"])
    olmo2 = rl.load(str(tiny_root["olmo2"]))
    with pytest.raises(ArchitectureError, match="q_norm over all heads"):
        path_patch(olmo2, pairs, senders=["embed"], receivers=["attn_L1_H0_q"])


def test_nothing_modifies_the_model(tiny_root, pairs):
    model = rl.load(str(tiny_root["gemma2"]))
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    path_patch(model, pairs, senders=["attn_L0_H1", "mlp_L0"], receivers=["attn_L1_H0_q", "mlp_L1", "reward"],
               mode="ablation", ablation="mean")
    after = model.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.model.modules())
    assert not any(p.grad is not None for p in model.model.parameters())


def test_result_views(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    got = path_patch(model, pairs, senders=["attn_L0", "mlp_L0"], receivers=["attn_L1", "reward"])
    frame = got.to_frame()
    assert list(frame.columns[:4]) == ["pair", "sender", "receiver", "effect"] and len(frame) == 3 * 2 * 2
    row = frame[(frame.pair == got.pair_ids[1]) & (frame.sender == "mlp_L0") & (frame.receiver == "attn_L1")]
    assert float(row.effect.iloc[0]) == pytest.approx(got.effect[1, 1, 0])
    top = got.top(2)
    size = np.abs(got.effect).mean(0)
    assert [(s, r) for s, r, _ in top] == [got.edges[i] for i in np.argsort(-size.ravel(), kind="stable")[:2]]
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    assert got.plot(ax=ax) is fig
    plt.close(fig)
