"""ArmoRM's gated multi-objective head (`LlamaForRewardModelWithGating`), implemented here.

ArmoRM ships as remote code that does not import under transformers 5.x. This class reproduces its
module names and parameters so its checkpoints load with `from_pretrained`: a Llama backbone,
`regression_layer` (Linear d→k, no bias), a `reward_transform_matrix` buffer (k×k), and a gating
MLP (`gating.layers`: n hidden Linear+ReLU layers, then Linear→k, softmax(·/temperature) times a
learned `logit_scale`) that reads the final hidden state at the start of the last
`<|eot_id|><|start_header_id|>assistant<|end_header_id|>\\n\\n` pattern.
score = Σ_k g_k (r T)_k.

One deliberate difference: the published forward reads the token before the *first* pad id,
which breaks under left padding; this one reads the rightmost non-pad token, as transformers 5
pools. The two agree on right-padded or unpadded inputs. `gating_token_pattern` in the config
overrides the Llama-3 pattern (for checkpoints with another tokenizer, and for tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaModel, LlamaPreTrainedModel
from transformers.utils import ModelOutput

from ..errors import TokenizationError
from ._tokens import Batch

# Llama-3 ids of <|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n
LLAMA3_GATE_PATTERN = [128009, 128006, 78191, 128007, 271]


class GatingNetwork(nn.Module):
    """MLP → softmax(·/temperature) · logit_scale: the prompt-dependent mixture of objectives."""

    def __init__(self, width: int, k: int, *, temperature: float, hidden: int, n_hidden: int) -> None:
        super().__init__()
        self.temperature = temperature
        self.logit_scale = nn.Parameter(torch.ones(1))
        dims = [width] + [hidden] * n_hidden
        self.layers = nn.ModuleList(
            [nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])] + [nn.Linear(dims[-1], k)]
        )

    def forward(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return torch.softmax(x / self.temperature, dim=-1) * self.logit_scale[0]


@dataclass
class GatedRewardOutput(ModelOutput):
    """`score` [n], per-objective `rewards` [n, k], `gating_output` [n, k]."""

    logits: Tensor | None = None
    score: Tensor | None = None
    rewards: Tensor | None = None
    gating_output: Tensor | None = None


def find_gate_position(ids: list[int], pattern: list[int]) -> int:
    """Start of the last occurrence of `pattern` in `ids` (ArmoRM's `find_token_for_gating`)."""
    for j in range(len(ids) - len(pattern), -1, -1):
        if ids[j : j + len(pattern)] == pattern:
            return j
    raise TokenizationError(f"gate token pattern {pattern} not found in the input: ArmoRM's gating reads the "
                            "assistant turn's start, which the chat template writes; pass the pair's prompt and "
                            "response as a conversation, and keep the start (truncation='left' cuts it)")


class LlamaForRewardModelWithGating(LlamaPreTrainedModel):
    """ArmoRM: Llama backbone + regression_layer + reward_transform_matrix + gating network."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config)
        k = getattr(config, "num_objectives", 19)
        config.num_objectives = k
        if getattr(config, "gating_token_pattern", None) is None:
            config.gating_token_pattern = LLAMA3_GATE_PATTERN
        self.model = LlamaModel(config)
        self.regression_layer = nn.Linear(config.hidden_size, k, bias=False)
        # A frozen Parameter, as in the published code, so checkpoints map key for key.
        self.reward_transform_matrix = nn.Parameter(torch.eye(k), requires_grad=False)
        self.gating = GatingNetwork(
            config.hidden_size, k,
            temperature=getattr(config, "gating_temperature", 10.0),
            hidden=getattr(config, "gating_hidden_dim", 1024),
            n_hidden=getattr(config, "gating_n_hidden", 3),
        )
        self.post_init()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs: Any) -> GatedRewardOutput:
        hidden = self.model(input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        pad = self.config.pad_token_id
        cols = torch.arange(input_ids.shape[1], device=input_ids.device)
        if pad is None:
            read = torch.full_like(rows, input_ids.shape[1] - 1)
        else:  # rightmost non-pad token, as transformers 5 pools (handles both padding sides)
            read = (cols * (input_ids != pad).long()).amax(-1)
        gate_at = [find_gate_position(ids, list(self.config.gating_token_pattern)) for ids in input_ids.tolist()]
        gate = self.gating(hidden[rows, torch.tensor(gate_at, device=input_ids.device)])
        rewards = self.regression_layer(hidden[rows, read])
        score = (gate * (rewards @ self.reward_transform_matrix)).sum(-1)
        return GatedRewardOutput(logits=score[:, None], score=score, rewards=rewards, gating_output=gate)


def gate_positions(pattern: list[int], batch: Batch) -> Tensor:
    """Per row of `batch`, where the gate reads: the start of the last occurrence of the token
    `pattern` (the end of the last user turn, in ArmoRM's chat template) [n]."""
    cols = []
    for row, ids in enumerate(batch.input_ids.tolist()):
        hits = [j for j in range(len(ids) - len(pattern), -1, -1) if ids[j : j + len(pattern)] == pattern]
        if not hits or batch.attention_mask[row, hits[0]] == 0:
            label = batch.labels[row] if batch.labels else f"row {row}"
            raise TokenizationError(
                f"{label}: the gate's token pattern {pattern} (end of the last user turn) was not found; "
                "ArmoRM reads its gate there — format inputs with the model's chat template"
            )
        cols.append(hits[0])
    return torch.tensor(cols)
