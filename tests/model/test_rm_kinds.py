"""Process reward models, LLM judges and DPO rewards: every read-out equals the model's own output and
closes exactly, on every decoder architecture; patching at the set of reads equals a naive loop.

The yardsticks are independent of rewardlens' read rules: positions are found here from the chat
template's own token ids, and every reward is read off the Hugging Face model's own logits from one
unpadded forward per sequence.
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import numpy as np
import pytest
import torch
import transformers as tf

import rewardlens as rl
from rewardlens.errors import DataError, HeadError, TokenizationError
from rewardlens.model.internal import ReadSet
from rewardlens.zoo import build_tokenizer
from tests.helpers.tiny import configs, perturb_

DECODERS = [a for a in ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3", "gemma3-mm",
                        "olmo2", "gpt2", "gpt_neox", "mixtral", "qwen2_moe", "qwen3_moe")
            if a in configs(build_tokenizer())]
STEPS = [
    rl.Pair("What is 2+3?", "Step 1: 2+3=5.\nStep 2: so it is 5.\n", "Step 1: 2+3=6.\nStep 2: so it is 6.\n"),
    rl.Pair("What is 4+4?", "Step 1: 4+4=8.\nStep 2: done.\nStep 3: 8.\n",
            "Step 1: 4+4=9.\nStep 2: hmm.\nStep 3: 9.\n"),
]
SEP = "\n"
TOL = 1e-4
PATCH_TOL = 1e-6  # fp32 patching against fp64-read naive forwards differs by ~1e-7 here


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


_CACHE: dict[tuple[str, str, int], torch.nn.Module] = {}


def build(tok, arch: str, kind: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random `arch` as a causal LM ('lm') or a two-label token classifier ('tc'), cached."""
    key = (arch, kind, seed)
    if key not in _CACHE:
        config = copy.deepcopy(configs(tok)[arch][1])
        if kind == "tc":
            config.num_labels = 2
        auto = tf.AutoModelForCausalLM if kind == "lm" else tf.AutoModelForTokenClassification
        torch.manual_seed(seed)
        eager = {"attn_implementation": "eager"} if arch == "gemma2" else {}
        try:
            model = auto.from_config(config, **eager).eval()
        except ValueError:
            pytest.skip(f"transformers has no {auto.__name__} for {arch}")
        perturb_(model, seed)
        _CACHE[key] = model
    return _CACHE[key]


def saved_kinds(tok, root) -> dict[str, str]:
    """Folders of a token-classifier PRM ('tc'), an LM ('lm') and a second LM ('ref', a DPO reference)
    saved under `root`, for the loaders' from_pretrained path: {name: folder}."""
    folders = {}
    for name, model in {"tc": build(tok, "llama", "tc"), "lm": build(tok, "llama", "lm"),
                        "ref": build(tok, "llama", "lm", seed=1)}.items():
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        folders[name] = str(root / name)
    return folders


def conversations(pairs):
    return [conv for p in pairs for conv in (p.conversation("chosen"), p.conversation("rejected"))]


def template_ids(tok, conv) -> tuple[list[int], int, int]:
    """(ids, first token of the assistant's content, tokens after it), found by characters: the
    content's place in the template's text, mapped to tokens through the tokenizer's offsets."""
    ids, offsets = _ids_and_offsets(tok, conv)
    text = tok.apply_chat_template(conv, tokenize=False)
    at = text.rindex(conv[-1]["content"])
    start = next(i for i, (a, _) in enumerate(offsets) if a >= at)
    end = next(i for i, (a, _) in enumerate(offsets) if a >= at + len(conv[-1]["content"]))
    return ids, start, len(ids) - end


def generation_start(tok, conv) -> int:
    """The first token after the generation prompt (what a DPO trainer calls the completion), by characters."""
    _, offsets = _ids_and_offsets(tok, conv)
    at = len(tok.apply_chat_template(conv[:-1], tokenize=False, add_generation_prompt=True))
    return next(i for i, (a, _) in enumerate(offsets) if a >= at)


def _ids_and_offsets(tok, conv) -> tuple[list[int], list[tuple[int, int]]]:
    ids = list(tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"])
    enc = tok(tok.apply_chat_template(conv, tokenize=False), add_special_tokens=False, return_offsets_mapping=True)
    assert list(enc["input_ids"]) == ids  # the text re-tokenizes to the template's ids (no BOS here)
    return ids, list(enc["offset_mapping"])


def logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].double()


def combine(scores: torch.Tensor, how: str) -> float:
    return float({"sum": scores.sum(), "mean": scores.mean(), "min": scores.min(), "last": scores[-1]}[how])


def own_steps(tok, model, pairs, row, how: str) -> np.ndarray:
    """The model's own step scores at every separator of the response, combined."""
    sep = tok.encode(SEP, add_special_tokens=False)[0]
    out = []
    for conv in conversations(pairs):
        ids, start, suffix = template_ids(tok, conv)
        at = [t for t in range(start, len(ids) - suffix) if ids[t] == sep]
        out.append(combine(row(logits(model, ids)[at]), how))
    return np.array(out)


def own_dpo(tok, policy, reference, pairs, beta: float) -> np.ndarray:
    """β Σ_t [log π(y_t) − log π_ref(y_t)] over the response tokens (end of turn included)."""
    out = []
    for conv in conversations(pairs):
        ids, start = template_ids(tok, conv)[0], generation_start(tok, conv)
        t = torch.arange(start - 1, len(ids) - 1)
        y = torch.tensor(ids)[t + 1]
        lp = torch.log_softmax(logits(policy, ids), -1)[t, y] - torch.log_softmax(logits(reference, ids), -1)[t, y]
        out.append(beta * float(lp.sum()))
    return np.array(out)


def assert_closes(rm, pairs, own: np.ndarray, level: str = "sublayer", **kwargs) -> rl.Attribution:
    scale = max(float(np.abs(own).max()), 1.0)
    np.testing.assert_allclose(rm.score(pairs), own, atol=TOL * scale, rtol=0)
    att = rl.attribute(rm, pairs, level=level, **kwargs)
    np.testing.assert_allclose(att.values.sum(1) + att.constant, own, atol=TOL * scale, rtol=0)
    return att


@pytest.mark.parametrize("arch", DECODERS)
def test_judge_reads_two_vocabulary_rows_where_its_answer_starts(tok, arch):
    lm = build(tok, arch, "lm")
    a, b = 11, 17
    question = "Q: {prompt}\nA: {response}\nGood?"
    rm = rl.model.wrap_judge(lm, tok, tokens=(a, b), question=question)
    own = []
    for pair in STEPS:
        for response in (pair.chosen, pair.rejected):
            asked = [{"role": "user", "content": f"Q: {pair.prompt}\nA: {response}\nGood?"}]
            ids = tok.apply_chat_template(asked, tokenize=True, add_generation_prompt=True, return_dict=True)
            z = logits(lm, list(ids["input_ids"]))[-1]
            own.append(float(z[a] - z[b]))
    assert_closes(rm, STEPS, np.array(own), level="head")


@pytest.mark.parametrize("arch", DECODERS)
@pytest.mark.parametrize("how", ["sum", "min"])
def test_prm_reading_lm_rows_at_every_step(tok, arch, how):
    lm = build(tok, arch, "lm")
    plus, minus = 23, 29
    rm = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(plus, minus), combine=how)
    own = own_steps(tok, lm, STEPS, lambda z: z[:, plus] - z[:, minus], how)
    att = assert_closes(rm, STEPS, own, level="head")
    steps = att.steps.to_frame()
    assert steps.groupby("sequence").size().tolist() == [2, 2, 3, 3]  # the template's own "\n" is no step
    per_step = steps[[c for c in steps.columns if c in att.names]].sum(1) + steps["constant"]
    np.testing.assert_allclose(per_step, steps["reward"], atol=1e-4)


@pytest.mark.parametrize("arch", DECODERS)
def test_dpo_implicit_reward(tok, arch):
    policy, reference = build(tok, arch, "lm", seed=0), build(tok, arch, "lm", seed=1)
    beta = 0.1
    rm = rl.model.wrap_dpo(policy, reference, tok, beta=beta)
    att = assert_closes(rm, STEPS, own_dpo(tok, policy, reference, STEPS, beta))
    frame = att.steps.to_frame()
    np.testing.assert_allclose(frame.groupby("sequence")["reward"].sum(), att.reward, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2"])
def test_dpo_reference_as_its_own_decomposition(tok, arch):
    policy, reference = build(tok, arch, "lm", seed=0), build(tok, arch, "lm", seed=1)
    rm = rl.model.wrap_dpo(policy, reference, tok, beta=0.5, reference_term="separate")
    ours = rl.attribute(rm, STEPS)
    theirs = rl.attribute(rm.reference, STEPS)
    total = ours.values.sum(1) + ours.constant - theirs.values.sum(1) - theirs.constant
    np.testing.assert_allclose(total, own_dpo(tok, policy, reference, STEPS, 0.5), atol=1e-4)


THINK = (  # Qwen3's way: a finished assistant turn carries an empty think block its generation prompt lacks
    "{% for m in messages %}{% if m['role'] == 'assistant' and loop.last %}<|im_start|>assistant\n<think>\n\n"
    "</think>\n\n{{ m['content'] }}<|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_writes_a_think_block_before_the_content(tok):
    """Steps are searched in the content alone (the think block's newlines are no steps, the content's
    last step is not cut off); a DPO reward reads all the assistant's turn adds to its generation
    prompt, the think block included, as a DPO trainer's completion does."""
    think = copy.deepcopy(tok)
    think.chat_template = THINK
    policy, reference = build(tok, "llama", "lm", seed=0), build(tok, "llama", "lm", seed=1)
    prm = rl.model.wrap_prm(policy, think, separator=SEP, tokens=(23, 29), combine="last")
    att = assert_closes(prm, STEPS, own_steps(think, policy, STEPS, lambda z: z[:, 23] - z[:, 29], "last"))
    n_steps = [response.count("\n") for pair in STEPS for response in (pair.chosen, pair.rejected)]
    assert att.steps.to_frame().groupby("sequence").size().tolist() == n_steps
    dpo = rl.model.wrap_dpo(policy, reference, think, beta=0.1)
    assert_closes(dpo, STEPS, own_dpo(think, policy, reference, STEPS, 0.1))


def test_without_a_chat_template_the_join_belongs_to_the_prompt(tok):
    """A plain decoder reads `prompt + "\\n\\n" + response`; here "\\n\\n" is two "\\n" tokens, which must
    be neither steps of a PRM nor tokens of a DPO response. Yardstick: the prompt-with-join's own ids."""
    plain = copy.deepcopy(tok)
    plain.chat_template = None
    policy, reference = build(tok, "llama", "lm", seed=0), build(tok, "llama", "lm", seed=1)
    sep = tok.encode(SEP, add_special_tokens=False)[0]
    assert plain.encode("\n\n", add_special_tokens=False) == [sep, sep]  # the case the rule must get right
    prm = rl.model.wrap_prm(policy, plain, separator=SEP, tokens=(23, 29), combine="sum")
    dpo = rl.model.wrap_dpo(policy, reference, plain, beta=0.1)
    own_prm, own_dpo_, n_steps = [], [], []
    for pair in STEPS:
        for response in (pair.chosen, pair.rejected):
            head = plain(pair.prompt + "\n\n", add_special_tokens=True)["input_ids"]
            ids = plain(pair.prompt + "\n\n" + response, add_special_tokens=True)["input_ids"]
            assert ids[:len(head)] == head
            at = [t for t in range(len(head), len(ids)) if ids[t] == sep]
            own_prm.append(combine(logits(policy, ids)[at][:, 23] - logits(policy, ids)[at][:, 29], "sum"))
            t = torch.arange(len(head) - 1, len(ids) - 1)
            y = torch.tensor(ids)[t + 1]
            lp = [torch.log_softmax(logits(m, ids), -1)[t, y] for m in (policy, reference)]
            own_dpo_.append(0.1 * float((lp[0] - lp[1]).sum()))
            n_steps.append(response.count("\n"))
    att = assert_closes(prm, STEPS, np.array(own_prm))
    assert att.steps.to_frame().groupby("sequence").size().tolist() == n_steps
    assert_closes(dpo, STEPS, np.array(own_dpo_))


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "gpt2", "gpt_neox"])
@pytest.mark.parametrize("how", ["mean", "last"])
def test_two_label_token_classification_prm(tok, arch, how):
    tc = build(tok, arch, "tc")
    rm = rl.model.wrap_prm(tc, tok, separator=SEP, combine=how)
    own = own_steps(tok, tc, STEPS, lambda z: z[:, 1] - z[:, 0], how)
    assert_closes(rm, STEPS, own, level="head")


def test_steps_are_read_where_they_are_even_when_the_separator_is_the_pad_id(tok):
    """A set of reads has explicit positions: a pad id equal to the separator (and to the template's last
    token) moves no read and earns no warning about reading early."""
    lm = copy.deepcopy(build(tok, "llama", "lm"))
    lm.config.pad_token_id = tok.encode(SEP, add_special_tokens=False)[0]
    rm = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29), combine="mean")
    assert rm.pad_token_id == lm.config.pad_token_id
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for side in ("left", "right"):
            np.testing.assert_allclose(rm.score(STEPS, padding_side=side),
                                       own_steps(tok, lm, STEPS, lambda z: z[:, 23] - z[:, 29], "mean"), atol=TOL)


def test_a_judges_fits_is_the_rule_its_encode_refuses_by(tok):
    """A judge reads each input as its question (longer than the input): `fits` must say what `encode`
    takes, or the built-in probe items would crash it instead of being skipped."""
    lm = build(tok, "llama", "lm")
    texts = [p.chosen for p in STEPS] + ["Step 1: " + "long " * 30 + "\n"]
    asked = [len(s.ids) for s in rl.model.wrap_judge(lm, tok, tokens=("A", "B")).encode(texts)[0]]
    limit = min(asked)
    raw = [len(tok(t)["input_ids"]) for t in texts]
    assert any(r <= limit < a for r, a in zip(raw, asked))  # a text that fits as it is, not as a question
    judge = rl.model.wrap_judge(lm, tok, tokens=("A", "B"), max_length=limit)
    takes = []
    for text in texts:
        try:
            judge.encode([text])
            takes.append(True)
        except TokenizationError:
            takes.append(False)
    assert judge.fits(texts) == takes and takes == [n <= limit for n in asked]


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_side_and_batch_size_change_nothing(tok, side):
    rm = rl.model.wrap_prm(build(tok, "llama", "lm"), tok, separator=SEP, tokens=(23, 29), combine="min")
    one = rl.attribute(rm, STEPS, batch_size=1)
    att = rl.attribute(rm, STEPS, batch_size=4, padding_side=side)
    np.testing.assert_allclose(att.values, one.values, atol=1e-5)
    np.testing.assert_array_equal(att.steps.position, one.steps.position)


def _naive_patched(rm, lm, tok, pairs, row, how, *, direct=False, ablate=False, side=0):
    """Noising at the set of reads by brute force: per (pair, sublayer site) one hooked unpadded forward
    of the chosen side (the rejected one with `side=1`) whose site output at its k-th step is the other
    side's at its k-th step (zero when `ablate`); `direct` also holds every later site's output at the
    steps at its clean value."""
    sides, modules = _step_sides(tok, pairs), _sublayers(rm)
    out = np.zeros((len(pairs), len(modules)))
    for p in range(len(pairs)):
        (ids_c, at_c), (ids_r, at_r) = sides[2 * p + side], sides[2 * p + 1 - side]
        clean, other = _grab(lm, modules, ids_c), _grab(lm, modules, ids_r)
        for s in range(len(modules)):
            put = {s: torch.zeros_like(other[s][0, at_r]) if ablate else other[s][0, at_r]}
            if direct:
                put.update({t: clean[t][0, at_c] for t in range(s + 1, len(modules))})
            with contextlib.ExitStack() as stack:
                for t, value in put.items():
                    stack.enter_context(_hook(*modules[t], _writer(at_c, value)))
                z = logits(lm, ids_c)
            out[p, s] = combine(row(z[at_c]), how)
    return out


def _step_sides(tok, pairs) -> list[tuple[list[int], list[int]]]:
    """Each side's (ids, step-separator positions in its response), from the chat template itself."""
    sep = tok.encode(SEP, add_special_tokens=False)[0]
    sides = []
    for conv in conversations(pairs):
        ids, start, suffix = template_ids(tok, conv)
        sides.append((ids, [t for t in range(start, len(ids) - suffix) if ids[t] == sep]))
    return sides


def _sublayers(rm) -> list[tuple[torch.nn.Module, str]]:
    """The embeddings (the first layer's input), then each layer's attention and MLP outputs."""
    return [(rm.layers[0], "in")] + [
        (rm.layer_module(layer, path), "out") for layer in range(rm.n_layers)
        for path in (rm.arch.attn_out, rm.arch.mlp_out)]


def _naive_head_direct(rm, lm, tok, pairs, row, how) -> np.ndarray:
    """Path-frozen noising of every head by brute force: the head's slice of the output projection's
    input at the chosen side's k-th step is the rejected side's, and every sublayer output after the
    head's attention holds its clean value at the steps; columns in `patch(level='head')`'s order."""
    sides, modules = _step_sides(tok, pairs), _sublayers(rm)
    n_heads = lm.config.num_attention_heads
    projections = [(rm.layer_module(layer, rm.arch.attn_out), "in") for layer in range(rm.n_layers)]
    out = []
    for p in range(len(pairs)):
        (ids_c, at_c), (ids_r, at_r) = sides[2 * p], sides[2 * p + 1]
        clean, other = _grab(lm, modules, ids_c), _grab(lm, modules + projections, ids_r)
        runs = [({0: other[0][0, at_r]}, 1, None)]
        for layer in range(rm.n_layers):
            mixed = other[len(modules) + layer][0, at_r]
            width = mixed.shape[-1] // n_heads
            runs += [({len(modules) + layer: mixed}, 2 + 2 * layer, slice(h * width, (h + 1) * width))
                     for h in range(n_heads)]
            runs.append(({2 + 2 * layer: other[2 + 2 * layer][0, at_r]}, 3 + 2 * layer, None))
        row_out = []
        for put, frozen_from, sl in runs:
            with contextlib.ExitStack() as stack:
                for t, value in put.items():
                    stack.enter_context(_hook(*(modules + projections)[t], _writer(at_c, value, sl)))
                for t in range(frozen_from, len(modules)):
                    stack.enter_context(_hook(*modules[t], _writer(at_c, clean[t][0, at_c])))
                z = logits(lm, ids_c)
            row_out.append(combine(row(z[at_c]), how))
        out.append(row_out)
    return np.array(out)


def _grab(lm, modules, ids) -> list[torch.Tensor]:
    """Every site's activation [1, T, d] in one unpadded forward of `ids`."""
    grabbed: list[torch.Tensor] = [torch.empty(0)] * len(modules)

    def keeper(i):
        def keep(x):
            grabbed[i] = x.detach().clone()
            return x
        return keep

    with contextlib.ExitStack() as stack:
        for i, (module, where) in enumerate(modules):
            stack.enter_context(_hook(module, where, keeper(i)))
        logits(lm, ids)
    return grabbed


def _writer(at, value, sl=None):
    def put(x):
        x = x.clone()
        if sl is None:
            x[0, at] = value
        else:
            x[0, at, sl] = value[:, sl]
        return x
    return put


@contextlib.contextmanager
def _hook(module, where, fn):
    if where == "in":
        handle = module.register_forward_pre_hook(
            lambda m, a, k: ((fn(a[0]), *a[1:]), k) if a else (a, {**k, "hidden_states": fn(k["hidden_states"])}),
            with_kwargs=True)
    else:
        handle = module.register_forward_hook(lambda m, a, o: (fn(o[0]), *o[1:]) if isinstance(o, tuple) else fn(o))
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize("engine", ["stepped", "whole forwards"])
@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt_neox", "qwen2_moe"])
def test_patching_at_the_set_of_reads_equals_a_naive_loop(tok, arch, engine, monkeypatch):
    if engine == "whole forwards":  # the fallback for models whose layers cannot be stepped
        import rewardlens.causal._reads_patch as reads_patch

        monkeypatch.setattr(reads_patch, "stepped_sweep", lambda *args, **kwargs: None)
    lm = build(tok, arch, "lm")
    rm = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29), combine="min")
    got = rl.patch(rm, STEPS, mode="noising", level="sublayer")
    naive = _naive_patched(rm, lm, tok, STEPS, lambda z: z[:, 23] - z[:, 29], "min")
    np.testing.assert_allclose(got.patched_chosen, naive, atol=PATCH_TOL)
    np.testing.assert_allclose(got.patched_rejected, got.rejected[:, None].repeat(naive.shape[1], 1), atol=0)


@pytest.mark.parametrize("mode", ["noising", "ablation"])
@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt_neox", "qwen2_moe"])
def test_path_frozen_patching_at_the_set_of_reads_equals_a_naive_loop(tok, arch, mode):
    lm = build(tok, arch, "lm")
    rm = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29), combine="min")
    got = rl.patch(rm, STEPS, mode=mode, level="sublayer", estimand="direct")
    naive = _naive_patched(rm, lm, tok, STEPS, lambda z: z[:, 23] - z[:, 29], "min", direct=True,
                           ablate=mode == "ablation")
    np.testing.assert_allclose(got.patched_chosen, naive, atol=PATCH_TOL)
    total = rl.patch(rm, STEPS, mode=mode, level="sublayer")
    # The last sublayer has no later part to freeze: its direct and total effects are one run ...
    np.testing.assert_allclose(got.patched_chosen[:, -1], total.patched_chosen[:, -1], atol=PATCH_TOL)
    # ... while elsewhere freezing bites by far more than the tolerance, so the loop tells them apart.
    assert np.abs(got.patched_chosen - total.patched_chosen).max() > 20 * PATCH_TOL
    if mode == "ablation":  # both sides are ablated, as at one read token (docs/patching.md)
        rejected = _naive_patched(rm, lm, tok, STEPS, lambda z: z[:, 23] - z[:, 29], "min", direct=True,
                                  ablate=True, side=1)
        np.testing.assert_allclose(got.patched_rejected, rejected, atol=PATCH_TOL)
        assert np.abs(got.patched_rejected - got.rejected[:, None]).max() > 20 * PATCH_TOL
        through = _naive_patched(rm, lm, tok, STEPS, lambda z: z[:, 23] - z[:, 29], "min", ablate=True, side=1)
        np.testing.assert_allclose(total.patched_rejected, through, atol=PATCH_TOL)


def test_path_frozen_patching_of_heads_at_the_set_of_reads_equals_a_naive_loop(tok):
    lm = build(tok, "llama", "lm")
    rm = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29), combine="min")
    got = rl.patch(rm, STEPS, mode="noising", level="head", estimand="direct")
    naive = _naive_head_direct(rm, lm, tok, STEPS, lambda z: z[:, 23] - z[:, 29], "min")
    np.testing.assert_allclose(got.patched_chosen, naive, atol=PATCH_TOL)


def test_reads_weights_by_hand():
    reads = ReadSet(torch.tensor([0, 0, 0, 1, 1]), torch.tensor([3, 5, 9, 2, 4]),
                             torch.tensor([0, 1, 2, 0, 1]), None, None)
    scores = torch.tensor([0.5, -1.0, -1.0, 2.0, 3.0])
    expect = {"sum": [[1, 1, 1, 0, 0], [0, 0, 0, 1, 1]], "mean": [[1 / 3] * 3 + [0, 0], [0, 0, 0, 0.5, 0.5]],
              "min": [[0, 1, 0, 0, 0], [0, 0, 0, 1, 0]], "last": [[0, 0, 1, 0, 0], [0, 0, 0, 0, 1]]}
    for how, want in expect.items():  # min's tie (-1, -1) goes to the earlier step
        np.testing.assert_allclose(reads.weights(2, scores, how).numpy(), want, atol=1e-7, err_msg=how)


def test_bad_inputs_get_clear_errors(tok):
    lm = build(tok, "llama", "lm")
    with pytest.raises(HeadError, match="not one"):
        rl.model.wrap_prm(lm, tok, separator="Step 1", tokens=(23, 29))
    rm = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29))
    ignore = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29), final="ignore")
    with pytest.raises(TokenizationError, match="no step separator.*final=.ignore."):
        ignore.score([rl.Pair("q?", "one step without a break", "another")])
    with pytest.raises(DataError, match="different numbers of positions"):
        rl.patch(rm, [rl.Pair("q?", "a.\nb.\n", "a.\n")], mode="noising")
    with pytest.raises(HeadError, match="set of positions"):
        rl.tokens(rm, STEPS)
    with pytest.raises(HeadError, match="set of positions"):
        rl.probe(rm)
    with pytest.raises(ValueError, match="positions='read'"):
        rl.patch(rm, STEPS, positions="all")
    dpo = rl.model.wrap_dpo(lm, build(tok, "llama", "lm", seed=1), tok)
    with pytest.raises(TokenizationError, match="no prompt/response split"):
        dpo.score(["a plain text has no response to read"])
    with pytest.raises(ValueError, match="beta"):
        rl.model.wrap_dpo(lm, lm, tok, beta=0.0)
    with pytest.raises(ValueError, match="separator"):
        rl.model.Reads(at="separator")
    config = copy.deepcopy(configs(tok)["llama"][1])
    classifier = tf.AutoModelForSequenceClassification.from_config(config)
    with pytest.raises(HeadError, match="sequence classifier"):
        rl.model.wrap_prm(classifier, tok, separator=SEP)
    with pytest.raises(TokenizationError, match="ends with a 'user' turn"):
        rm.score([[{"role": "user", "content": "Step 1: a.\nStep 2: b.\n"}]])


def test_soft_capped_logits_are_read_with_their_gain_frozen(tok):
    """Gemma-2's final soft-cap `c·tanh(z/c)`, made to bite (c = 0.2): judge and DPO still close."""
    config = copy.deepcopy(configs(tok)["gemma2"][1])
    config.final_logit_softcapping = 0.2
    torch.manual_seed(0)
    lm = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    perturb_(lm, 0)
    ref = copy.deepcopy(lm)
    perturb_(ref, 1)
    own = []
    for conv in conversations(STEPS):  # the question '{response}': the conversation's answer is what is judged
        ids = tok.apply_chat_template([{"role": "user", "content": conv[-1]["content"]}], tokenize=True,
                                      add_generation_prompt=True, return_dict=True)["input_ids"]
        z = logits(lm, list(ids))[-1]
        own.append(float(z[11] - z[17]))
    assert max(abs(x) for x in own) < 0.4  # the cap is active: raw logit differences are far larger
    judge = rl.model.wrap_judge(lm, tok, tokens=(11, 17), question="{response}")
    assert_closes(judge, STEPS, np.array(own), level="head")
    assert_closes(rl.model.wrap_dpo(lm, ref, tok, beta=1.0), STEPS, own_dpo(tok, lm, ref, STEPS, 1.0))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_attribution_patching_at_the_set_of_reads_equals_autograd(tok, arch):
    """The first-order estimate Σ_k (a_rejected,k − a_chosen,k)·∂r/∂a_chosen,k, recomputed here through
    the model's own forward and its own logits (torch.min routes the gradient to the lowest step)."""
    lm = build(tok, arch, "lm")
    rm = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29), combine="min")
    got = rl.causal.attribution_patch(rm, STEPS, level="sublayer")
    sep = tok.encode(SEP, add_special_tokens=False)[0]
    modules = [(rm.layers[0], "in")] + [
        (rm.layer_module(layer, path), "out") for layer in range(rm.n_layers)
        for path in (rm.arch.attn_out, rm.arch.mlp_out)]
    convs = conversations(STEPS)
    for p in range(len(STEPS)):
        sides = []
        for conv in (convs[2 * p], convs[2 * p + 1]):
            ids, start, suffix = template_ids(tok, conv)
            sides.append((ids, [t for t in range(start, len(ids) - suffix) if ids[t] == sep]))
        (ids_c, at_c), (ids_r, at_r) = sides
        for s, (module, where) in enumerate(modules):
            kept = {}

            def keep(x, kept=kept):
                kept["x"] = x.detach().clone()
                return x

            with _hook(module, where, keep), torch.no_grad():
                lm(input_ids=torch.tensor([ids_r]))
            source = kept["x"][0, at_r]

            def probe(x, kept=kept):
                kept["a"] = x.detach().clone()
                kept["d"] = torch.zeros_like(x, requires_grad=True)
                return x + kept["d"]

            with _hook(module, where, probe), torch.enable_grad():
                z = lm(input_ids=torch.tensor([ids_c])).logits[0]
                reward = (z[at_c, 23] - z[at_c, 29]).min()
                (grad,) = torch.autograd.grad(reward, kept["d"])
            estimate = float(((source - kept["a"][0, at_c]) * grad[0, at_c]).sum())
            assert got.patched_chosen[p, s] - got.chosen[p] == pytest.approx(estimate, abs=1e-4)


def test_command_line_reads_each_kind(tok, tmp_path, capsys):
    """`--prm-separator`, `--judge-tokens` and `--dpo-reference` load through from_pretrained and score
    like the API."""
    import json

    from rewardlens.cli import main
    from rewardlens.data import save_pairs

    folders = saved_kinds(tok, tmp_path)
    pairs = str(save_pairs(STEPS, tmp_path / "steps.jsonl"))
    runs = {
        "prm": (["--prm-separator", "\\n", "--prm-combine", "sum"],
                rl.model.wrap_prm(build(tok, "llama", "tc"), tok, separator=SEP, combine="sum"), "tc"),
        "judge": (["--judge-tokens", "A,B"], rl.model.wrap_judge(build(tok, "llama", "lm"), tok, tokens=("A", "B")),
                  "lm"),
        "dpo": (["--dpo-reference", folders["ref"], "--dpo-beta", "0.2"],
                rl.model.wrap_dpo(build(tok, "llama", "lm"), build(tok, "llama", "lm", seed=1), tok, beta=0.2), "lm"),
    }
    for what, (flags, api, folder) in runs.items():
        assert main(["score", folders[folder], "--pairs", pairs, "--json", *flags]) == 0, what
        out = json.loads(capsys.readouterr().out)
        rewards = api.score(STEPS)
        np.testing.assert_allclose([p["margin"] for p in out["pairs"]], rewards[0::2] - rewards[1::2], atol=1e-5)
    assert main(["score", folders["lm"], "--pairs", pairs, "--judge-tokens", "A,B", "--dpo-reference",
                 folders["ref"]]) == 2
    assert "two kinds" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_experts_split_every_step_exactly(tok, arch):
    """A mixture-of-experts PRM at expert level: each step's experts sum to the step's MLP, and close."""
    lm = build(tok, arch, "lm")
    rm = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29), combine="sum")
    own = own_steps(tok, lm, STEPS, lambda z: z[:, 23] - z[:, 29], "sum")
    att = assert_closes(rm, STEPS, own, level="neuron")
    assert any("_E" in name for name in att.names)
    frame = att.steps.to_frame()
    per_step = frame[[c for c in frame.columns if c in att.names]].sum(1) + frame["constant"]
    np.testing.assert_allclose(per_step, frame["reward"], atol=1e-4)


def test_the_reference_runs_once_per_sequence_across_instruments(tok):
    policy, reference = build(tok, "llama", "lm", seed=0), build(tok, "llama", "lm", seed=1)
    rm = rl.model.wrap_dpo(policy, reference, tok, beta=0.1, batch_size=2)
    seen = []
    handle = reference.model.register_forward_hook(lambda m, a, o: seen.append(1))
    try:
        first = rl.attribute(rm, STEPS)
        ran = len(seen)
        again = rl.attribute(rm, STEPS)
        rl.patch(rm, STEPS, mode="ablation")
    finally:
        handle.remove()
    assert ran == 2 and len(seen) == ran  # 4 sequences in batches of 2, then nothing more
    np.testing.assert_array_equal(again.values, first.values)
