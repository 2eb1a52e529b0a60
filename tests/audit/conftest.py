"""Fixtures the audit tests share: the tiny Llama, loaded once per module, and its first four pairs."""

from __future__ import annotations

import pytest

import rewardlens as rl


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


@pytest.fixture(scope="module")
def data(pairs):
    return list(pairs[:4])
