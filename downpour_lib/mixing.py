"""Mixing weights for gossip, and the properties each algorithm relies on. Pure (numpy only).

Uniform mixing, as in Assran et al., "Stochastic Gradient Push for Distributed Deep Learning"
(ICML 2019): a rank with d out-peers keeps 1/(d + 1) of its message and sends 1/(d + 1) to each
out-peer. Written as a matrix P with P[j, i] the share rank i gives rank j, per step:

- push-sum (SGP, Overlap-SGP) needs P column-stochastic (every sender gives away exactly what it
  has), which uniform weights always are; the push-sum weight then corrects any bias;
- D-PSGD (Lian et al., NeurIPS 2017) averages without a weight, so it needs P doubly stochastic
  (and symmetric for its analysis): uniform weights on a regular undirected graph (ring, complete).
"""

from __future__ import annotations

import numpy as np

from .topology import Topology


def uniform_weights(out_degree: int) -> tuple[float, float]:
    """(kept by the sender, given to each of its ``out_degree`` peers)."""
    share = 1.0 / (out_degree + 1)
    return share, share


def mixing_matrix(topology: Topology, step: int) -> np.ndarray:
    """P with P[j, i] = the share of rank i's message that rank j receives at ``step``."""
    n = topology.world_size
    matrix = np.zeros((n, n))
    for i in range(n):
        peers = topology.out_peers(i, step)
        keep, give = uniform_weights(len(peers))
        matrix[i, i] = keep
        for j in peers:
            matrix[j, i] += give
    return matrix


def is_column_stochastic(matrix: np.ndarray, tol: float = 1e-12) -> bool:
    """Non-negative, every column sums to 1: mass is conserved (push-sum's requirement)."""
    return bool((matrix >= 0).all() and np.allclose(matrix.sum(axis=0), 1.0, atol=tol))


def is_doubly_stochastic(matrix: np.ndarray, tol: float = 1e-12) -> bool:
    """Columns and rows sum to 1: the average is conserved without a push-sum weight (D-PSGD)."""
    return is_column_stochastic(matrix, tol) and bool(np.allclose(matrix.sum(axis=1), 1.0, atol=tol))


def is_symmetric(matrix: np.ndarray, tol: float = 1e-12) -> bool:
    return bool(np.allclose(matrix, matrix.T, atol=tol))


def contraction(topology: Topology, start: int = 0, steps: int | None = None) -> float:
    """How much one period of mixing shrinks disagreement: the spectral norm of the product of the
    mixing matrices of ``steps`` steps (one period by default) on the subspace orthogonal to the
    all-ones vector. Below 1 means the ranks' de-biased values converge to consensus."""
    n = topology.world_size
    if n == 1:
        return 0.0
    product = np.eye(n)
    for t in range(start, start + (steps or topology.period)):
        product = mixing_matrix(topology, t) @ product
    # Push-sum de-biases by the weights; with uniform weights on these regular graphs every
    # matrix is doubly stochastic, so the plain projection measures the contraction exactly.
    centring = np.eye(n) - np.full((n, n), 1.0 / n)
    return float(np.linalg.norm(centring @ product @ centring, 2))
