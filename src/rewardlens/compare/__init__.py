"""`compare`: two reward models on the same pairs, side by side (behaviour always; directions when they
share a residual basis). See docs/compare.md."""

from ._compare import compare as compare
from ._compare import formation_correlation as formation_correlation
from ._compare import shared_basis as shared_basis
from ._result import EMBEDDING_MATCH as EMBEDDING_MATCH
from ._result import Basis as Basis
from ._result import Comparison as Comparison
from ._result import ModelSide as ModelSide

__all__ = ["EMBEDDING_MATCH", "Basis", "Comparison", "ModelSide", "compare", "formation_correlation", "shared_basis"]
