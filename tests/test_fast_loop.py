"""The fast loop's architecture rule (tests/conftest.py `_arch_sweep_extras`) rests on `tiny.FAMILIES`."""

from tests.helpers import tiny


def test_the_families_partition_the_tiny_architectures():
    """Every tiny architecture is in exactly one family, so every sweep keeps one of each family in the loop."""
    members = [arch for family in tiny.FAMILIES.values() for arch in family]
    assert sorted(members) == sorted(tiny.ARCHS) and len(set(members)) == len(members)
    assert tiny.FAMILY_OF.keys() == set(tiny.ARCHS)
