import pytest

from tests.monitor import grpo


@pytest.fixture(scope="session")
def grpo_runs():
    """{organism: folder} of the GRPO policies trained against the list and keyword organisms (cached on disk)."""
    return {name: grpo.trained(name) for name in ("list", "keyword")}
