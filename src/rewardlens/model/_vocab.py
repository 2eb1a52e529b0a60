"""The load-time check that every id the tokenizer can give, and the pad id, index a row of the model's
input embedding.

torch answers an id the embedding has no row for with a bare `IndexError: index out of range in self`
deep in the forward (on an accelerator, a device-side assert that poisons the process), and
transformers answers a config pad id outside the vocabulary with `AssertionError: Padding_idx must be
within num_embeddings` while it builds the model. Both are refused here by name: the ids, the size and
the fix (docs/scoring.md, *What loading guarantees*).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

from ..errors import ModelLoadError, RewardLensError, TokenizationError
from ._arch import text_config

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_SHOWN = 3
"""How many of the tokens beyond the embedding a message names."""


def embedding_rows(model: nn.Module) -> int | None:
    """Rows of `model`'s input embedding (ids 0..rows−1 can be read); None where it names no embedding."""
    try:
        embedding = model.get_input_embeddings()  # type: ignore[operator]  # every Hugging Face model has it
    except (AttributeError, NotImplementedError, TypeError):
        return None
    weight = getattr(embedding, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, Tensor) and weight.ndim == 2 else None


def _prefix(source: str | None) -> str:
    return f"{source}: " if source else ""


def _size(rows: int, config: object) -> str:
    size = getattr(config, "vocab_size", None)
    stated = f"; config.json vocab_size {size}" if isinstance(size, int) else ""
    return f"the model's input embedding has {rows} rows (token ids 0 to {rows - 1}{stated})"


def pad_error(pad_id: int, rows: int, config: object, *, given: bool, tokenizer_pad: int | None,
              source: str | None) -> RewardLensError:
    """The one line for a pad id outside 0..rows−1: given as `pad_token_id=` (`given`), else the config's."""
    where = f"pad_token_id={pad_id}" if given else f"config.json's pad_token_id {pad_id}"
    own = f" ({tokenizer_pad})" if tokenizer_pad is not None else ""
    fix = (f"pass an id in that range (the tokenizer's pad token id{own}), or drop it to read by the model's own"
           if given else f"set config.json's pad_token_id to the tokenizer's pad token id{own}, or to null")
    error = TokenizationError if given else ModelLoadError
    return error(f"{_prefix(source)}{where} is not a token id of this model: {_size(rows, config)}, so every "
                 f"padded batch fails inside torch.embedding; {fix}")


def check_vocabulary(model: nn.Module, tokenizer: PreTrainedTokenizerBase, pad_id: int | None, *,
                     pad_given: bool, source: str | None) -> None:
    """Refuse a tokenizer with ids ≥ the embedding's rows (its vocabulary or its added tokens, such as a
    chat template's special tokens) and a pad id outside 0..rows−1 (`pad_given`: passed as
    `pad_token_id=`, else the config's): `ModelLoadError`, or `TokenizationError` for a given pad id."""
    rows = embedding_rows(model)
    if rows is None:
        return
    config = text_config(model)
    beyond = sorted((i, t) for t, i in tokenizer.get_vocab().items() if i >= rows)
    if beyond:
        shown = ", ".join(f"{t!r} = {i}" for i, t in beyond[:_SHOWN]) + (", ..." if len(beyond) > _SHOWN else "")
        raise ModelLoadError(
            f"{_prefix(source)}the tokenizer has {len(beyond)} token id(s) the model has no embedding row for "
            f"({shown}; the largest {beyond[-1][0]}) but {_size(rows, config)}, so any text holding them fails "
            "inside torch.embedding; load the tokenizer saved with this model, or, if these tokens were added to "
            "it, resize the model's embedding to len(tokenizer) (model.resize_token_embeddings) and save both again")
    if pad_id is not None and not 0 <= pad_id < rows:
        raise pad_error(pad_id, rows, config, given=pad_given, tokenizer_pad=tokenizer.pad_token_id, source=source)
