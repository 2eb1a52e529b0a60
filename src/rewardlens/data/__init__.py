"""Preference data in, and the row layout every result shares.

`Pair` and `load_pairs` read JSONL, JSON, CSV, Parquet and saved HF datasets. A list of `n` pairs is
scored as `2n` rows alternating chosen, rejected; `chosen`, `rejected`, `margin`, `side` and
`row_labels` (the index plumbing in `data.internal`) are the one owner of that layout, and `effect`
of an effect's sign (clean margin − patched margin; docs/design.md §2). `check_pairs` finds degenerate
pairs (empty responses, identical sides, duplicate ids, repeats); `load_pairs` runs it on every load.
`check_tokens` finds what only token ids show (sides encoded alike, a response the template drops, a
read token before the response's end); the model layer runs it on every encoding of pairs.
RewardBench 2 records (lists of responses) load as grouped pairs (`Pair.group`); `sample_path`
gives the shipped RewardBench-schema sample files. A record's other fields ride along in `Pair.extra`;
`record_fields` and `record_columns` name a pair in every per-pair result (id, subset, group, extra).
The progress plumbing the instruments share (the one tqdm bar, the batch counter) is `rewardlens.data.internal`.
"""

from .._deprecated import moved as _moved
from ._checks import CHECK_KINDS as CHECK_KINDS
from ._checks import TOKEN_CHECK_KINDS as TOKEN_CHECK_KINDS
from ._checks import CheckKind as CheckKind
from ._checks import PairChecks as PairChecks
from ._checks import TokenCheckKind as TokenCheckKind
from ._checks import TokenChecks as TokenChecks
from ._checks import check_pairs as check_pairs
from ._checks import check_tokens as check_tokens
from ._extra import IDENTITY as IDENTITY
from ._extra import Extra as Extra
from ._pair import Inputs as Inputs
from ._pair import Pair as Pair
from ._pair import flatten_pairs as flatten_pairs
from ._pair import pair_ids as pair_ids
from ._pairs import SUPPORTED as SUPPORTED
from ._pairs import load_pairs as load_pairs
from ._pairs import pairs_from_records as pairs_from_records
from ._pairs import save_pairs as save_pairs
from ._record import record_columns as record_columns
from ._record import record_fields as record_fields
from ._rows import SIDES as SIDES
from ._rows import Side as Side
from ._rows import chosen as chosen
from ._rows import effect as effect
from ._rows import margin as margin
from ._rows import pair_of as pair_of
from ._rows import rejected as rejected
from ._rows import row_labels as row_labels
from ._rows import side as side
from ._samples import SAMPLES as SAMPLES
from ._samples import sample_path as sample_path

# The progress plumbing moved to `rewardlens.data.internal` (0.2); the old names work for one release.
__getattr__ = _moved(__name__, dict.fromkeys(
    ("UnitMeter", "batch_work", "counting", "metered", "metering", "part", "progress_bar", "stage", "tick"),
    "rewardlens.data.internal"))

__all__ = [
    "Extra",
    "flatten_pairs",
    "pair_ids",
    "IDENTITY",
    "Inputs",
    "CHECK_KINDS",
    "SAMPLES",
    "SIDES",
    "SUPPORTED",
    "TOKEN_CHECK_KINDS",
    "CheckKind",
    "Pair",
    "PairChecks",
    "Side",
    "TokenCheckKind",
    "TokenChecks",
    "check_pairs",
    "check_tokens",
    "chosen",
    "effect",
    "load_pairs",
    "pairs_from_records",
    "margin",
    "pair_of",
    "record_columns",
    "record_fields",
    "rejected",
    "row_labels",
    "sample_path",
    "save_pairs",
    "side",
]
