"""Gossip graphs and mixing weights: pure functions, checked exhaustively on small worlds."""

import numpy as np
import pytest

from downpour_lib.errors import ConfigError
from downpour_lib.mixing import (
    contraction,
    is_column_stochastic,
    is_doubly_stochastic,
    is_symmetric,
    mixing_matrix,
    uniform_weights,
)
from downpour_lib.topology import (
    TOPOLOGIES,
    BipartiteExponential,
    Complete,
    Exponential,
    Ring,
    exponential_offsets,
    make_topology,
    strongly_connected,
)

SIZES = range(1, 17)


def every_graph():
    """Every topology on every world size it fits, with every peers_per_step it allows."""
    for n in SIZES:
        for p in range(1, max(1, len(exponential_offsets(n))) + 1):
            yield Exponential(n, p)
        yield Ring(n)
        yield Complete(n)
        if n == 1 or n % 2 == 0:
            yield BipartiteExponential(n)


def test_exponential_graph_sends_to_i_plus_2_to_the_k_cycling_k():
    g = Exponential(8)
    assert g.period == 3
    assert [g.out_peers(0, t) for t in range(4)] == [(1,), (2,), (4,), (1,)]
    assert [g.out_peers(6, t) for t in range(3)] == [(7,), (0,), (2,)]
    assert [g.in_peers(0, t) for t in range(3)] == [(7,), (6,), (4,)]
    # n not a power of two: hops 1, 2, 4 below 5
    assert [Exponential(5).out_peers(3, t) for t in range(3)] == [(4,), (0,), (2,)]
    # two peers per step: consecutive hops, the window moving by two
    g2 = Exponential(8, peers_per_step=2)
    assert [g2.out_peers(0, t) for t in range(3)] == [(1, 2), (4, 1), (2, 4)]
    assert Exponential(1).out_peers(0, 0) == () and Exponential(2).out_peers(1, 5) == (0,)


def test_ring_complete_and_bipartite_peers():
    assert Ring(5).out_peers(0, 0) == (1, 4) and Ring(5).in_peers(3, 7) == (2, 4)
    assert Ring(2).out_peers(0, 0) == (1,) and Ring(1).out_peers(0, 0) == ()
    assert Complete(4).out_peers(2, 9) == (0, 1, 3)
    b = BipartiteExponential(8)  # hops 1, 3, 5
    assert b.period == 3
    assert [b.out_peers(1, t) for t in range(3)] == [(2,), (4,), (6,)]  # active: forward
    assert [b.out_peers(2, t) for t in range(3)] == [(1,), (7,), (5,)]  # passive: backward
    assert BipartiteExponential(2).out_peers(0, 3) == (1,)


@pytest.mark.parametrize("graph", list(every_graph()), ids=repr)
def test_peers_are_consistent_and_never_the_rank_itself(graph):
    n = graph.world_size
    for t in range(2 * graph.period):
        for i in range(n):
            out = graph.out_peers(i, t)
            assert i not in out and len(set(out)) == len(out)
            # j is an out-peer of i exactly when i is an in-peer of j
            assert set(graph.in_peers(i, t)) == {j for j in range(n) if i in graph.out_peers(j, t)}
            if graph.symmetric:
                assert graph.in_peers(i, t) == out


@pytest.mark.parametrize("n", range(2, 17))
def test_union_over_one_period_is_strongly_connected(n):
    graphs = [Exponential(n), Ring(n), Complete(n)] + ([BipartiteExponential(n)] if n % 2 == 0 else [])
    for g in graphs:
        union = set().union(*(g.edges(t) for t in range(g.period)))
        assert strongly_connected(union, n), g
    # but one step of the exponential graph alone is not (it is a union of cycles of one hop)
    if n in (4, 8, 16):
        assert not strongly_connected(Exponential(n).edges(1), n)


def test_strongly_connected_can_say_no():
    assert not strongly_connected({(0, 1), (1, 0), (2, 3), (3, 2)}, 4)
    assert not strongly_connected({(0, 1), (1, 2)}, 3)  # reachable one way only
    assert strongly_connected({(0, 1), (1, 2), (2, 0)}, 3)


@pytest.mark.parametrize("n", [2, 4, 6, 8, 10, 16])
def test_bipartite_graph_is_a_perfect_matching_across_the_two_sides(n):
    g = BipartiteExponential(n)
    for t in range(2 * g.period):
        for i in range(n):
            (j,) = g.out_peers(i, t)
            assert g.is_active(i) != g.is_active(j)  # the peer is on the other side
            assert g.out_peers(j, t) == (i,)  # and pairs back: a perfect matching


def test_graphs_that_do_not_fit_the_world_say_why_and_what_to_do():
    with pytest.raises(ConfigError) as err:
        make_topology("bipartite_exponential", 5)
    # the number of ranks is what to change: the graph is adpsgd's default, maybe never set
    assert err.value.field == "world_size" and "even number of ranks" in str(err.value)
    assert "its default and only one" in str(err.value)
    assert "launch 4 or 6 ranks" in str(err.value)
    with pytest.raises(ConfigError) as err:
        make_topology("exponential", 4, peers_per_step=3)
    assert err.value.field == "peers_per_step" and "use at most 2" in str(err.value)
    with pytest.raises(ConfigError, match="choose one of bipartite_exponential, complete, "
                                          "exponential, ring"):
        make_topology("torus", 4)
    with pytest.raises(ConfigError, match="peers_per_step"):
        make_topology("ring", 4, peers_per_step=0)
    assert set(TOPOLOGIES) == {"exponential", "ring", "complete", "bipartite_exponential"}


@pytest.mark.parametrize("graph", list(every_graph()), ids=repr)
def test_uniform_mixing_is_column_stochastic_and_doubly_on_regular_graphs(graph):
    for t in range(graph.period):
        m = mixing_matrix(graph, t)
        assert is_column_stochastic(m)  # what push-sum needs, on any graph
        # every graph here is regular (in-degree = out-degree), so uniform weights are doubly
        # stochastic, and symmetric where the graph is undirected (what D-PSGD needs)
        assert is_doubly_stochastic(m)
        if graph.symmetric:
            assert is_symmetric(m)
    if not graph.symmetric and graph.world_size > 2 and graph.peers_per_step == 1:
        assert not is_symmetric(mixing_matrix(graph, 0))  # hop 1 is directed: i -> i + 1 only


def test_uniform_weights_and_the_property_checks_can_fail():
    assert uniform_weights(0) == (1.0, 1.0) and uniform_weights(3) == (0.25, 0.25)
    leaky = np.array([[0.5, 0.5], [0.4, 0.5]])
    assert not is_column_stochastic(leaky)
    # a star where the centre sends to both leaves: columns sum to 1, rows do not
    star = np.array([[1 / 3, 0, 0], [1 / 3, 1, 0], [1 / 3, 0, 1]])
    assert is_column_stochastic(star) and not is_doubly_stochastic(star)
    assert not is_symmetric(star)
    assert not is_column_stochastic(np.array([[1.5, 0], [-0.5, 1]]))  # negative weight


def test_one_uniform_step_on_the_complete_graph_is_the_exact_average():
    for n in (2, 3, 7):
        assert np.allclose(mixing_matrix(Complete(n), 0), np.full((n, n), 1 / n))


@pytest.mark.parametrize("n", range(2, 17))
def test_mixing_contracts_disagreement_every_period(n):
    for g in (Exponential(n), Ring(n), Complete(n)):
        assert contraction(g) < 1 - 1e-3, g
    if n % 2 == 0:
        assert contraction(BipartiteExponential(n)) < 1 - 1e-3
    if n & (n - 1) == 0:  # a power of two: log2(n) steps of the exponential graph average exactly
        assert contraction(Exponential(n)) < 1e-12
    # a single step of the exponential graph does not, beyond 2 ranks (it only reaches one hop)
    if n > 2:
        assert contraction(Exponential(n), steps=1) > 0.1
