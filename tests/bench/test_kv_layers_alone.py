"""The order in which the layer lag's reference pushes layers alone."""

from __future__ import annotations

import itertools

import pytest

from hixl_bench.kvshape import alone_order


@pytest.mark.parametrize("layers", [1, 2, 32, 80, 126])
def test_every_layer_once_per_round_the_last_first(layers: int) -> None:
    pushed = list(itertools.islice(alone_order(layers), 3 * layers))
    assert pushed[0] == layers - 1
    for start in range(0, 3 * layers, layers):
        assert sorted(pushed[start:start + layers]) == list(range(layers))


def test_a_few_pushes_spread_over_the_whole_model() -> None:
    # A row's budget may allow only 28 pushes of an 80-layer model: they reach
    # both ends of it, not only its first layers.
    pushed = list(itertools.islice(alone_order(80), 28))
    assert min(pushed) < 10 and max(pushed) == 79
    assert sum(layer >= 40 for layer in pushed) >= 12
