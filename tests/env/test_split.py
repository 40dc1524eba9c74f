"""Stable task hashes: the same key lands on the same side of a split in every run."""

from arborl.env.split import held_out, stable_unit


def test_stable_unit_is_the_first_8_bytes_of_sha256_as_a_share():
    # sha256(b"a") = ca978112ca1bbdca fac231b3...: 0xca978112ca1bbdca / 2**64
    assert stable_unit("a") == 0xCA978112CA1BBDCA / 2**64
    assert 0.7913 < stable_unit("a") < 0.7914


def test_held_out_is_a_threshold_on_the_share_and_covers_about_that_share():
    assert held_out("a", 0.8) and not held_out("a", 0.79)
    assert not held_out("a", 0.0) and held_out("a", 1.0)
    share = sum(held_out(f"k{i}", 0.2) for i in range(10_000)) / 10_000
    assert 0.19 < share < 0.21
