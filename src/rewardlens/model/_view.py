"""A `RewardModel` in a notebook (`RewardModel._repr_html_`): what it is and how it reads its reward.

The facts are the model's own (architecture map, kind, dtype, device, `Reads`); the HTML is the base
layer's (`rewardlens.plotting`), escaped by construction.
"""

from __future__ import annotations

from typing import Any

from ..plotting import facts, view


def read_rule(model: Any) -> str:
    """Where and how the model's reward is read, in words (`Reads`, the pooling of an encoder)."""
    reads = model.reads
    if model.encoder:
        return "the first token (the encoder's pooled read-out)"
    if reads.at == "last":
        return "one token: the last real token of each sequence"
    where = f"every '{reads.separator}' separator" if reads.at == "separator" else "every response token"
    return f"{where}, combined by {reads.combine} (a last step without separator: {reads.final})"


def model_html(model: Any) -> str:
    """The facts of a `RewardModel` as a notebook view."""
    kind = model.kind
    kind_text = kind.name + (f" (question: {kind.question})" if kind.question else "") + (
        f" (β {kind.beta}, reference term {kind.reference_term})" if kind.beta is not None else "")
    dtype = str(next(model.model.parameters()).dtype).removeprefix("torch.")
    items: list[tuple[str, object]] = [
        ("class", type(model.model).__name__), ("architecture", model.arch.name), ("kind", kind_text),
        ("dtype", dtype), ("device", str(model.device)), ("read rule", read_rule(model)),
        ("layers", model.n_layers), ("heads", model.n_heads), ("d_model", model.d_model),
        ("objectives", model.head.n_objectives), ("pad token id", "none" if model.pad_token_id is None else
                                                   str(model.pad_token_id)),
        ("max length", "none" if model.max_length is None else str(model.max_length)),
        ("truncation", model.truncation), ("verified", "yes" if model.verified else "not yet"),
        ("source", model.source or "wrapped in memory")]
    return view("RewardModel", "A reward model prepared for exact read-outs (rewardlens.load / wrap).", facts(items))
