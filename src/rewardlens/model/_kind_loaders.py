"""Reward models beyond one scalar head at one token: process reward models, LLM judges, DPO policies.

Each is a `RewardModel` whose read-out stays affine in the final residual at the positions it reads
(model/_readout.py, model/_reads.py), so every instrument that accepts multi-position read-outs
decomposes it exactly (docs/rm-kinds.md):
- `load_prm`: a head read at every step separator (a token-classification PRM's log-odds of its two
  labels, a scalar head, or an LM's "+" against "−" rows), the steps combined by sum, mean, min or last;
- `load_judge`: an LM's log-odds of two answer tokens ("Yes"/"No", "A"/"B") at the last token;
- `load_dpo`: the implicit reward `β Σ_t [log π(y_t | y_<t) − log π_ref(y_t | y_<t)]` over the
  response, each log-probability exact once its log-sum-exp is frozen; the reference's term is a
  constant per token (computed by one reference forward per batch) or left to its own decomposition.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from ..errors import HeadError, UsageError
from ..types import Readout, Truncation
from ._arch import find_map, get_module
from ._core import RewardModel
from ._kind import REFERENCE_TERMS, ReferenceTerm, RewardKind
from ._load import load_pretrained, refuse_untrained
from ._placement import execution_device, onloaded
from ._readout import Head
from ._reads import Combine, LastStep, Reads
from ._tokens import Tokenized
from ._verify import check_structure, verify

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def lm_head_path(model: nn.Module) -> str:
    """The module path of an LM's output embedding (its vocabulary head)."""
    head = _output_embeddings(model)
    name = next((n for n, m in model.named_modules() if m is head), None) if head is not None else None
    if not name:
        raise HeadError(f"{type(model).__name__} has no language-model head (get_output_embeddings() is None); "
                        "LM read-outs need a *ForCausalLM model")
    return name


def _output_embeddings(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    out = get() if callable(get) else None
    return out if isinstance(out, nn.Module) else None


def _vocab_size(model: nn.Module) -> int:
    head = _output_embeddings(model)
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise HeadError(f"{type(model).__name__} has no language-model head; a DPO reward reads *ForCausalLM models")
    return int(weight.shape[0])


def token_id(tokenizer: PreTrainedTokenizerBase, token: str | int) -> int:
    """A read-out token's id: an id as given, or a string that is exactly one token."""
    if isinstance(token, int):
        return token
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise HeadError(f"the read-out token {token!r} is {len(ids)} tokens {ids} for this tokenizer, not one; "
                        "pass a single-token string (often with its leading space, e.g. ' Yes') or its id")
    return int(ids[0])


def _lm_model(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase, head: Head, path: str, reads: Reads,
    max_length: int | None, truncation: Truncation, kind: RewardKind[RewardModel], source: str | None,
) -> RewardModel:
    arch = replace(find_map(model), head=path, head_kind="linear", pooler=None, gate=None)
    return RewardModel(model, tokenizer, arch, reads=reads, head=head, max_length=max_length,
                       truncation=truncation, kind=kind, source=source)


def _finish(rm: RewardModel, check: bool) -> RewardModel:
    check_structure(rm)
    if check:
        verify(rm)
    return rm


QUESTION = ("Here is a request and a response to it.\n\nRequest: {prompt}\n\nResponse: {response}\n\n"
            "Is the response a good one? Answer Yes or No.")
"""The default judge question: `{prompt}` and `{response}` come from each input."""


_NOT_AN_LM = "not as a language model with its LM head. Point at the causal LM's own folder (…ForCausalLM)"


def _lm_head(model: nn.Module, path: str, **kwargs: Any) -> Head:
    """`Head.from_lm_head` on the execution device of the LM head at `path`; an offloaded head's weights
    are read where they are real (`onloaded`)."""
    module = get_module(model, path)
    with onloaded(module):
        return Head.from_lm_head(model, path, execution_device(model, module), **kwargs)


def _classifier_path(model: nn.Module) -> str | None:
    """The token classifier's linear head (`score` or `classifier`), if the model has one."""
    return next((p for p in ("score", "classifier") if isinstance(getattr(model, p, None), nn.Linear)), None)


def wrap_judge(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase, *, tokens: tuple[str | int, str | int] = ("Yes", "No"),
    question: str = QUESTION, max_length: int | None = None, truncation: Truncation = "error", check: bool = True,
    source: str | None = None,
) -> RewardModel:
    """An LLM judge: each input (a Pair's side, a conversation, a text as the response) is put to it as
    `question` in one user turn, and the reward is `logit(tokens[0]) − logit(tokens[1])` where its
    answer starts (after the chat template's opening of the assistant turn): the log-odds of the first
    answer against the second, decomposed exactly over the LM's parts. `question='{response}'` passes
    texts that are already the whole question."""
    # Built first: it refuses a question without {response} before any head is read.
    kind: RewardKind[RewardModel] = RewardKind("judge", question=question)
    ids = (token_id(tokenizer, tokens[0]), token_id(tokenizer, tokens[1]))
    path = lm_head_path(model)
    head = _lm_head(model, path, tokens=ids, labels=[str(t) for t in tokens])
    return _finish(_lm_model(model, tokenizer, head, path, Reads(), max_length, truncation, kind, source), check)


def load_judge(path_or_id: str, *, tokens: tuple[str | int, str | int] = ("Yes", "No"), question: str = QUESTION,
               dtype: str | torch.dtype | None = None, device: str | torch.device | None = None,
               max_length: int | None = None, truncation: Truncation = "error", check: bool = True,
               allow_pickle: bool = False, **from_pretrained_kwargs: Any) -> RewardModel:
    """Load a causal LM as a judge (see `wrap_judge`) through `from_pretrained` (`allow_pickle`: as `load`)."""
    model, tokenizer, missing = load_pretrained(path_or_id, dtype, device, None, None, from_pretrained_kwargs,
                                                AutoModelForCausalLM, allow_pickle=allow_pickle)
    refuse_untrained(path_or_id, model, [lm_head_path(model)], missing, _NOT_AN_LM)
    return wrap_judge(model, tokenizer, tokens=tokens, question=question, max_length=max_length,
                      truncation=truncation, check=check, source=path_or_id)


def wrap_prm(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase, *, separator: str | int, combine: Combine = "min",
    readout: Readout = None, tokens: tuple[str | int, str | int] | None = None, max_length: int | None = None,
    truncation: Truncation = "error", check: bool = True, source: str | None = None, final: LastStep = "append",
) -> RewardModel:
    """A process reward model read at every step separator of the response, steps combined by `combine`;
    a response whose last step does not end with the separator is read as `final` says (`Reads.final`).

    Its head: an LM's `logit(tokens[0]) − logit(tokens[1])` when `tokens` is given ("+" against "−");
    a two-label token classifier's log-odds of label 1 against label 0 (or `readout=` weights);
    a one-output head as it is."""
    reads = Reads(at="separator", separator=separator, combine=combine, final=final)
    if tokens is not None:
        ids = (token_id(tokenizer, tokens[0]), token_id(tokenizer, tokens[1]))
        path = lm_head_path(model)
        head = _lm_head(model, path, tokens=ids, labels=[str(t) for t in tokens])
        rm = _lm_model(model, tokenizer, head, path, reads, max_length, truncation, RewardKind("prm"), source)
        return _finish(rm, check)
    if type(model).__name__.endswith("ForSequenceClassification"):
        raise HeadError(f"{type(model).__name__} is a sequence classifier: its output is one score per sequence, "
                        "so no step's own score can be checked against it. A PRM is a token classifier (load it "
                        "with AutoModelForTokenClassification, or rl.model.load_prm) or an LM read with "
                        "tokens=('+', '-')")
    found = _classifier_path(model)
    if found is None:
        raise HeadError(f"{type(model).__name__} has no `score` or `classifier` linear head; pass tokens=('+', '-') "
                        "for a PRM that reads its LM head")
    path, width = found, getattr(model, found).out_features
    if readout is None and width == 2:
        readout = [-1.0, 1.0]  # log-odds of label 1 ("good step") against label 0
    arch = replace(find_map(model), head=path, head_kind="linear", pooler=None, gate=None)
    rm = RewardModel(model, tokenizer, arch, readout=readout, reads=reads, max_length=max_length,
                     truncation=truncation, kind=RewardKind("prm"), source=source)
    return _finish(rm, check)


def load_prm(path_or_id: str, *, separator: str | int, combine: Combine = "min", readout: Readout = None,
             tokens: tuple[str | int, str | int] | None = None, dtype: str | torch.dtype | None = None,
             device: str | torch.device | None = None, max_length: int | None = None,
             truncation: Truncation = "error", check: bool = True, allow_pickle: bool = False,
             final: LastStep = "append", **from_pretrained_kwargs: Any) -> RewardModel:
    """Load a process reward model (see `wrap_prm`): a causal LM when `tokens` is given, else a token
    classifier (`allow_pickle`: as `load`)."""
    auto = AutoModelForCausalLM if tokens is not None else AutoModelForTokenClassification
    model, tokenizer, missing = load_pretrained(path_or_id, dtype, device, None, None, from_pretrained_kwargs, auto,
                                                allow_pickle=allow_pickle)
    if tokens is not None:
        refuse_untrained(path_or_id, model, [lm_head_path(model)], missing, _NOT_AN_LM)
    else:
        refuse_untrained(path_or_id, model, [p for p in (_classifier_path(model),) if p], missing,
                         "not as a token-classification PRM. A PRM that scores steps with its LM head (\"+\" against "
                         "\"-\" at each step tag) is read with tokens=('+', '-') (--prm-tokens '+,-')")
    return wrap_prm(model, tokenizer, separator=separator, combine=combine, readout=readout, tokens=tokens,
                    max_length=max_length, truncation=truncation, check=check, source=path_or_id, final=final)


def _log_prob_model(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase, beta: float, max_length: int | None,
    truncation: Truncation, kind: RewardKind[RewardModel] | None = None, source: str | None = None,
) -> RewardModel:
    """`β log π` read at every response token; `kind` None: alone (a DPO reward's reference, read the same way)."""
    path = lm_head_path(model)
    head = _lm_head(model, path, scale=beta)
    return _lm_model(model, tokenizer, head, path, Reads(at="response"), max_length, truncation,
                     RewardKind("dpo", beta=beta) if kind is None else kind, source)


def read_values(model: RewardModel, seqs: list[Tokenized], batch_size: int = 8) -> list[tuple[float, ...]]:
    """Every read's own score, per sequence in step order (one batched forward per batch)."""
    out: list[list[float]] = [[0.0] * len(s.reads or ()) for s in seqs]
    for rows, batch in model.batches(seqs, batch_size):
        assert batch.reads is not None  # a multi-position model's sequences carry their reads
        values, coef = model.head_readout(model.run(batch, model.final_points(batch)), batch)
        scores = (values * coef).sum(-1).cpu().numpy()
        for row, step, score in zip(batch.reads.rows.tolist(), batch.reads.steps.tolist(), scores):
            out[int(np.asarray(rows)[row])][step] = float(score)
    return [tuple(v) for v in out]


class ReferenceTerms:
    """`−β log π_ref(y_t)` at every read of each sequence, from batched reference forwards; remembered by
    token ids, so the instruments of one audit chunk (trace, patching, attribution patching) run the
    reference once per sequence, not once per instrument."""

    def __init__(self, reference: RewardModel, batch_size: int, keep: int = 4096) -> None:
        self.reference, self.batch_size, self.keep = reference, batch_size, keep
        self.memo: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[float, ...]] = {}

    def __call__(self, seqs: list[Tokenized]) -> list[tuple[float, ...]]:
        key = [(tuple(s.ids), s.reads or ()) for s in seqs]
        todo = [i for i, k in enumerate(key) if k not in self.memo]
        if len(self.memo) + len(todo) > self.keep:  # a bound on memory over a long run
            self.memo.clear()
            todo = list(range(len(seqs)))
        for i, values in zip(todo, read_values(self.reference, [seqs[i] for i in todo], self.batch_size)):
            self.memo[key[i]] = tuple(-v for v in values)
        return [self.memo[k] for k in key]


def wrap_dpo(
    policy: nn.Module, reference: nn.Module, tokenizer: PreTrainedTokenizerBase, *, beta: float = 0.1,
    reference_term: ReferenceTerm = "constant", batch_size: int = 8, max_length: int | None = None,
    truncation: Truncation = "error", check: bool = True, source: str | None = None,
) -> RewardModel:
    """A DPO-trained `policy` as the reward model it implicitly is, against its `reference` (one tokenizer).

    The reward `β Σ_t [log π(y_t) − log π_ref(y_t)]` over the response tokens is decomposed over the
    policy's parts; `reference_term='constant'` adds `−β log π_ref(y_t)` to each read as a named
    constant (`Steps.constant`), 'separate' leaves it out, for `model.reference` to decompose."""
    if beta <= 0:
        raise UsageError(f"beta must be positive (DPO's KL weight), got {beta}")
    if reference_term not in REFERENCE_TERMS:
        raise UsageError(f"reference_term must be 'constant' or 'separate', got {reference_term!r}")
    sizes = {_vocab_size(policy), _vocab_size(reference)}
    if len(sizes) != 1:
        raise HeadError(f"policy and reference have different vocabularies {sorted(sizes)}; a DPO reward compares "
                        "their log-probabilities of the same tokens, so they must share one tokenizer")
    # The reference first: the policy's kind names it (and its constant term) from construction on.
    ref = _log_prob_model(reference, tokenizer, beta, max_length, truncation)
    offsets = ReferenceTerms(ref, batch_size) if reference_term == "constant" else None
    kind = RewardKind("dpo", beta=beta, reference=ref, reference_term=reference_term, offsets=offsets)
    rm = _log_prob_model(policy, tokenizer, beta, max_length, truncation, kind, source)
    if check:
        verify(ref)
    return _finish(rm, check)


def load_dpo(policy: str, reference: str, *, beta: float = 0.1, reference_term: ReferenceTerm = "constant",
             dtype: str | torch.dtype | None = None, device: str | torch.device | None = None,
             max_length: int | None = None, truncation: Truncation = "error", check: bool = True,
             allow_pickle: bool = False, **from_pretrained_kwargs: Any) -> RewardModel:
    """Load a DPO policy and its reference (causal LMs) as the implicit reward model (see `wrap_dpo`;
    `allow_pickle`: as `load`, for both)."""
    model, tokenizer, missing = load_pretrained(policy, dtype, device, None, None, from_pretrained_kwargs,
                                                AutoModelForCausalLM, allow_pickle=allow_pickle)
    refuse_untrained(policy, model, [lm_head_path(model)], missing, _NOT_AN_LM)
    ref, _, missing = load_pretrained(reference, dtype, device, None, None, from_pretrained_kwargs,
                                      AutoModelForCausalLM, allow_pickle=allow_pickle)
    refuse_untrained(reference, ref, [lm_head_path(ref)], missing, _NOT_AN_LM)
    return wrap_dpo(model, ref, tokenizer, beta=beta, reference_term=reference_term, max_length=max_length,
                    truncation=truncation, check=check, source=policy)
