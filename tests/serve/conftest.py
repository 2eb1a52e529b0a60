import pytest


@pytest.fixture(scope="session")
def demo_dir():
    from rewardlens.zoo import demo_model_dir

    return demo_model_dir()


@pytest.fixture(scope="session")
def demo(demo_dir):
    import rewardlens as rl

    return rl.load(demo_dir)


@pytest.fixture(scope="session")
def samples():
    """(prompt, response) samples with distinct texts: the demo's audit pairs, both sides, and variations."""
    from rewardlens.zoo import AUDIT_PAIRS

    base = [(p.prompt, r) for p in AUDIT_PAIRS for r in (p.chosen, p.rejected)]
    return [(p, r if k == 0 else f"{r} Note {k}.") for k in range(4) for p, r in base]
