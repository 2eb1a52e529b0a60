import pytest


@pytest.fixture(scope="session")
def small_loop():
    """The closed loop's reduced config: the list organism, 2 seeds, 5 GRPO steps (every model cached on disk)."""
    from rewardlens.loop import Recipe, verify_edit

    return verify_edit(("list",), seeds=(0, 1), recipe=Recipe(grpo_steps=5))
