"""The option and input types the public functions take: one place, so a type checker holds every call.

String options are `Literal`s (docs/design.md §2): a typo is caught by the checker before it is caught
by the function's own `ValueError`. Input aliases name what the instruments accept in place of a
bare `object`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

Message: TypeAlias = dict[str, str]
"""One chat message: {"role": ..., "content": ...}."""
Prompt: TypeAlias = str | list[Message]
"""A plain string, or a list of chat messages ending with a user turn."""
Conversation: TypeAlias = list[Message]
"""A whole chat: messages ending with the assistant's response."""
Text: TypeAlias = str | Conversation
"""One sequence to score: a plain string (tokenized as it is) or a conversation (chat-templated)."""

Level = Literal["sublayer", "head", "neuron"]
"""How finely a decomposition splits the residual stream: sublayers, attention heads, MLP neurons."""
PatchLevel = Literal["sublayer", "head", "neuron"]
"""The parts patching sweeps ('neuron': chosen MLP neurons, or every one by attribution patching)."""
Mode = Literal["noising", "denoising", "ablation"]
"""Patching direction: chosen run with rejected activations, the reverse, or zero/mean ablation."""
Ablation = Literal["zero", "mean"]
"""What `mode='ablation'` writes in place of a part's output."""
Positions = Literal["read", "all", "prefix"]
"""Where a patch applies: the read token only, every token (token-aligned pairs), or the first
`min(len(chosen), len(rejected))` tokens aligned from the start (the seed paper's whole-prefix rule)."""
Estimand = Literal["total", "direct"]
"""Whether a patch flows through later layers (total) or later parts are held at their clean values (direct)."""
PaddingSide = Literal["left", "right"]
"""Which side a batch is padded on; results do not depend on it."""
Truncation = Literal["error", "left"]
"""What an input longer than `max_length` gets: an error, or its first tokens dropped."""
LensKind = Literal["linear", "normed"]
"""The two reward lenses: cumulative exact parts, or the head on the re-normalised partial residual."""
CrystallizationRule = Literal["stays", "first"]
"""Crystallization depth: the first depth after which the margin stays past the threshold, or the first
that reaches it (the seed paper's rule)."""
EditMethod = Literal["project", "leace"]
"""How `edit` removes a concept from the read-out: project it out, or erase it with LEACE."""
SaePositions = Literal["read", "all"]
"""Which tokens' activations an SAE trains on."""
Readout: TypeAlias = int | str | Sequence[float] | None
"""Which scalar of a multi-output head to explain: an objective index, a label, or one weight per output."""
Spans: TypeAlias = Sequence[tuple[int | None, int | None]]
"""Patch positions as `(start, stop)` slices of the positions up to the read token (negative: back from it)."""
Ranking = Literal["mean_abs", "margin"]
"""How `Attribution.top` ranks parts: by mean |contribution|, or by mean chosen − rejected margin."""
Versus = Literal["direct", "total", "indirect", "attribution_patching"]
"""What `Faithfulness` sets attribution against: the three causal estimands and attribution patching."""
NormKind = Literal["rms", "rms_offset", "layer"]
"""A norm's kind: RMSNorm, Gemma's RMSNorm with a (1 + γ) scale, or LayerNorm."""
Layout = Literal["pre_norm", "parallel", "post_norm"]
"""Residual layout: x + f(N(x)), GPT-NeoX's parallel sublayers, or BERT's N(x + f(x))."""
HeadKind = Literal["linear", "pooler", "gated"]
"""Reward head: w·h + b, classifier(act(dense(h))) (encoders), or ArmoRM's gated objectives."""
Pooling = Literal["last", "first"]
"""Read position: the last non-pad token (decoders) or the first token (encoders' [CLS])."""
Split = Literal["all", "train", "test"]
"""Which of the real-model pairs: every one, the training pairs or the held-out ones."""


@dataclass(frozen=True)
class Stored:
    """How a per-pair result declares its storage in the audit's store: which fields are cut by chunk
    (`per_row`: two rows a pair; `per_pair`: one), which are left out because the store rebuilds them
    (`derived`), which say how each chunk was computed (`per_chunk`); every other field is the same for the whole
    run and goes into the run's metadata.
    The store's schema version is a digest of these declarations and the fields (`audit.VERSION`)."""

    per_row: tuple[str, ...] = ()
    """Fields indexed by input row (rows alternate chosen, rejected)."""
    per_pair: tuple[str, ...] = ()
    """Fields indexed by pair (a field left None in a run, such as an optional statistic, is metadata)."""
    derived: tuple[str, ...] = ()
    """Fields not stored: rebuilt when the result is read back (row labels, pair ids) or kept elsewhere."""
    per_chunk: tuple[str, ...] = ()
    """Fields that say how a chunk was computed (which patching engine ran, `causal.Provenance`): kept as plain
    data in the record of every pair of the chunk (chunks of one run may differ), handed back to the result as
    the list of its pairs' values, pair by pair, which the result folds into one (its `__post_init__`)."""



SEED_PAPER = "Nadaf, reward-lens: A Mechanistic Interpretability Library for Reward Models (arXiv:2604.26130)"
"""The paper rewardlens started from (the first reward-lens release), named with its arXiv id wherever its
statistic, its rules or its numbers are quoted ("the seed paper")."""
SEED_PAPER_RHO = {"Skywork-Reward-Llama-3.1-8B": -0.256, "ArmoRM": -0.027}
"""The seed paper's reported statistic (mean per-pair Spearman ρ of |attribution| against |noising effect|)."""
