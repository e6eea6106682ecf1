"""The network of the performance model: links in the alpha-beta (Hockney) model, and the time each
communication pattern of our algorithms takes on them.

A message of m bytes over a link costs ``alpha + m / beta`` (Hockney 1994): alpha the per-message
latency, beta the bandwidth, per direction (links are full duplex, so a rank sends and receives at
once). A cluster has two kinds of link: between ranks on one node (NVLink, PCIe, shared memory) and a
node's network card, which its ranks share. The collective costs are the standard ones (Thakur,
Rabenseifner and Gropp 2005, "Optimization of Collective Communication Operations in MPICH"; Patarasuk
and Yuan 2009 for the bandwidth-optimal ring):

- ring allreduce over n ranks: ``2(n-1) alpha + 2(n-1)/n * M / beta`` (a reduce-scatter, then an
  allgather; the bytes are ``traffic.ring_share``'s, the bus factor of nccl-tests). A ring that
  spans nodes is as fast as its slowest hop: each node's card carries one ring hop in, one out.
- tree allreduce (pipelined binary trees, as NCCL's double binary tree): ``2 log2(n) alpha + 2 M /
  beta``: latency grows with log n, the bandwidth term does not shrink with n.
- halving-doubling (Rabenseifner; Thakur et al. 2005): the ring's bytes in ``2 log2(n)`` steps.
- hierarchical allreduce (g ranks per node, k nodes): reduce-scatter inside the node, the g slices
  allreduced across nodes at once (together the card carries 2(k-1)/k of M), allgather inside; what
  our mpi backend does across nodes.
- ``auto``: what NCCL's own tuner would run for each message (``nccl_allreduce_s``): its model of
  every algorithm (ring, tree) under every protocol (LL, LL128, Simple), with the links' latencies
  and rates for the hardware's, and the least of them.
- parameter server: each of S server shards receives M/S from each of N workers (and sends as much
  back), so a server's card carries N*M/S each way and is the bottleneck once N > S.
- gossip: a worker sends its model to ``peers`` others and receives as many (SGP's one peer per step).

Pure functions, no ``torch.distributed``: ``perfmodel`` composes them into a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from ..traffic import ring_share

#: bytes per second of one Gbit/s
GBIT = 1e9 / 8


@dataclass(frozen=True)
class Link:
    """One direction of a full-duplex link in the alpha-beta model."""

    alpha_s: float  # latency of one message, seconds
    bandwidth_Bps: float  # bytes per second

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha_s) and self.alpha_s >= 0):
            raise ConfigError("alpha_s", self.alpha_s, "a latency in seconds >= 0, e.g. 5e-6")
        if not (math.isfinite(self.bandwidth_Bps) and self.bandwidth_Bps > 0):
            raise ConfigError("bandwidth_Bps", self.bandwidth_Bps,
                              "a bandwidth in bytes/s > 0, e.g. 3.125e9 for 25 Gbit/s")

    def transfer_s(self, nbytes: float, messages: int = 1) -> float:
        """Seconds to move ``nbytes`` in ``messages`` messages, one after another."""
        return messages * self.alpha_s + nbytes / self.bandwidth_Bps

    def slower(self, other: Link) -> Link:
        """The link a path over both behaves like: the larger latency, the smaller bandwidth."""
        return Link(max(self.alpha_s, other.alpha_s), min(self.bandwidth_Bps, other.bandwidth_Bps))


@dataclass(frozen=True)
class Network:
    """Where the workers are and what joins them."""

    intra: Link  # between ranks on one node
    inter: Link  # a node's network card, shared by its ranks
    per_node: int = 1  # workers (GPUs) per node
    #: seconds per byte a rank takes to reduce (sum) a received buffer into its own: what a CPU
    #: backend spends beyond the transfer (0 for GPUs, whose reduction hides in the transfer)
    gamma_s_per_byte: float = 0.0
    #: a node's memory throughput, bytes/s, that its ranks' shared-memory transfers share (the
    #: host's memcpy rate, ``bench collectives``' ``memcpy`` row); None: not limiting
    node_Bps: float | None = None
    #: cores of a node: ranks beyond them time-share, each message and reduction takes that much
    #: longer (issue 34: 32 ranks on 2 cores); None: not limiting
    cores: int | None = None
    #: seconds each hop of a pattern costs a rank beyond its latency when the node's ranks exceed
    #: its cores: a rank that sleeps in a barrier must be woken and wait its turn on a core
    #: (``calibrate.fit_wake``, from allreduce rows at more ranks than cores; 0: not measured)
    wake_s: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.per_node, int) and self.per_node >= 1):
            raise ConfigError("per_node", self.per_node, "workers per node, an integer >= 1")
        if not (math.isfinite(self.gamma_s_per_byte) and self.gamma_s_per_byte >= 0):
            raise ConfigError("gamma_s_per_byte", self.gamma_s_per_byte, "seconds per byte >= 0")
        if self.node_Bps is not None and not self.node_Bps > 0:
            raise ConfigError("node_Bps", self.node_Bps, "bytes/s > 0, or None")
        if self.cores is not None and not (isinstance(self.cores, int) and self.cores >= 1):
            raise ConfigError("cores", self.cores, "an integer >= 1, or None")
        if not (math.isfinite(self.wake_s) and self.wake_s >= 0):
            raise ConfigError("wake_s", self.wake_s, "seconds per hop >= 0, e.g. 1e-4")

    def crowding(self, workers: int) -> float:
        """How many ranks share each core of a node when ``workers`` run (1: none)."""
        busy = min(workers, self.per_node)
        return max(1.0, busy / self.cores) if self.cores else 1.0

    def shared(self, workers: int) -> Link:
        """``path(workers)`` as each rank sees it with its node's others busy: the node's memory
        throughput split among them (inside a node). Past the cores, a rank has a core
        ``1 / crowding`` of the time, and its copies and hops (each with a wake-up, ``wake_s``)
        take ``crowding`` times as long: the node's cores move the bytes of all its ranks."""
        link, busy, crowd = self.path(workers), min(workers, self.per_node), self.crowding(workers)
        bandwidth = link.bandwidth_Bps / crowd
        if self.node_Bps is not None and workers <= self.per_node:
            bandwidth = min(bandwidth, self.node_Bps / busy)
        wake = self.wake_s if crowd > 1 else 0.0
        return Link((link.alpha_s + wake) * crowd, bandwidth)

    def time_shared_s(self, seconds: float, workers: int) -> float:
        """``seconds`` of one rank's CPU work that every rank of the node does at the same moment
        (a synchronous step's data, update and loop) past the cores: ``crowding`` times as long."""
        return seconds * self.crowding(workers)

    def nodes(self, workers: int) -> int:
        return math.ceil(workers / self.per_node)

    def path(self, workers: int) -> Link:
        """The link a pattern among ``workers`` ranks is limited by: intra-node while they fit on
        one node, else the slower of the two."""
        if workers <= self.per_node:
            return self.intra
        # one worker per node: no hop stays inside a node
        return self.inter if self.per_node == 1 else self.intra.slower(self.inter)


def ring_allreduce_s(n: int, nbytes: float, link: Link) -> float:
    if n <= 1:
        return 0.0
    share = float(ring_share("allreduce", n))  # 2(n-1)/n: the bytes, written once in traffic
    return 2 * (n - 1) * link.alpha_s + share * nbytes / link.bandwidth_Bps


def tree_allreduce_s(n: int, nbytes: float, link: Link) -> float:
    if n <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * link.alpha_s + 2 * nbytes / link.bandwidth_Bps


def halving_doubling_allreduce_s(n: int, nbytes: float, link: Link) -> float:
    """Rabenseifner's reduce-scatter by recursive halving, then allgather by recursive doubling
    (Thakur et al. 2005, section 4.4; Gloo's allreduce_halving_doubling, which Goyal et al. 2017
    ran across 32 servers): ``2 log2(p) alpha + 2 (p-1)/p M / beta`` for the largest power of two
    p <= n; the n - p ranks beyond it first fold into a partner and get the result back after
    (two more whole-buffer steps, Thakur et al.'s non-power-of-two case)."""
    if n <= 1:
        return 0.0
    p = 1 << (n.bit_length() - 1)
    t = 2 * math.log2(p) * link.alpha_s + 2 * (p - 1) / p * nbytes / link.bandwidth_Bps
    return t + (2 * link.transfer_s(nbytes) if p < n else 0.0)


def hierarchical_allreduce_s(n: int, nbytes: float, net: Network) -> float:
    g = min(n, net.per_node)
    k = math.ceil(n / g)
    inside = 0.0
    if g > 1:  # reduce-scatter, later allgather: (g-1) steps of M/g each
        inside = ring_allreduce_s(g, nbytes, net.intra)
    if k <= 1:
        return inside
    return inside + ring_allreduce_s(k, nbytes, net.inter)


def _ring_link(n: int, net: Network, intra_scale: float = 1.0, inter_scale: float = 1.0) -> Link:
    """The link a ring of ``n`` ranks ordered by node runs at: its slowest hop's bandwidth, and
    the mean latency of its hops, since a pipelined ring (NCCL's) streams each chunk through every
    hop in turn: of n hops, one per node crosses a card, the others stay inside a node (NCCL's
    tuning model charges them so: intra-node steps at the intra-node latency). A protocol's hops
    take ``intra_scale`` and ``inter_scale`` of the links' latencies (``Protocol``)."""
    link = net.shared(n)
    if not n > net.per_node > 1:
        scale = intra_scale if n <= net.per_node else inter_scale
        return Link(link.alpha_s * scale, link.bandwidth_Bps)
    k = net.nodes(n)
    hop = (k * net.inter.alpha_s * inter_scale + (n - k) * net.intra.alpha_s * intra_scale) / n
    return Link(hop * net.crowding(n), link.bandwidth_Bps)


#: where NCCL's tuning model is read: ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``
NCCL_TUNING_SOURCE = "NVIDIA/nccl src/graph/tuning.cc (commit b6475625fbca, NCCL 2.2x)"


@dataclass(frozen=True)
class Protocol:
    """One of NCCL's protocols as its tuner prices it (``NCCL_TUNING_SOURCE``), against the links:
    a link's latency is what a Simple ring hop pays (its ``hwLat``: 3.4 us on NVLink, 14 across
    nodes), its rate what a Simple ring moves, and each protocol's hops and rate are the shares of
    those that NCCL's tables give. LL sends 4 bytes of data with each 4-byte flag (half the bytes
    on the wire, priced at a quarter of the ring's rate) for the least latency; LL128 keeps 120 of
    each 128 bytes; Simple moves whole chunks behind a fence. A tree's Simple hop is its 28 us
    chunk, twice a network ring hop."""

    name: str
    ring_rate: float  # share of the ring's rate, several ranks a node (``ring_rate_alone``: one)
    ring_rate_alone: float
    tree_rate: float  # share of the ring's rate a tree's bus moves (NCCL's 0.92 included)
    ring_intra: float  # a ring hop inside a node (NVLink), in Simple ring hops
    ring_inter: float  # a ring hop across nodes, in Simple ring hops (the network's)
    tree_intra: float  # a tree hop inside a node (its chain), in Simple ring hops inside one
    tree_inter: float  # a tree level across nodes, in Simple ring hops across them
    ring_base_s: float  # latency of a call, beyond its hops (``baseLat``)
    tree_base_s: float
    #: the tree's rate by message size (``treeCorrectionFactor``): entry i for 64 * 2**i bytes
    #: and up; 1 past the table
    tree_correction: tuple[float, ...]

    def tree_factor(self, nbytes: float) -> float:
        i = max(0, int(math.log2(max(nbytes, 64) / 64)))
        return self.tree_correction[i] if i < len(self.tree_correction) else 1.0


_TREE_SHARE = 0.92  # a tree's bus rate against a ring's on the same channels (NCCL: busBw * .92)
PROTOCOLS = (
    Protocol("LL", 1 / 4, 1 / 4, _TREE_SHARE / 3.8, 0.6 / 3.4, 2.7 / 14, 0.6 / 3.4, 5.0 / 14,
             6.6e-6, 6.8e-6, (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6,
                              .7, .8, .9, 1.0, 1.0, 1.0, 1.0)),
    Protocol("LL128", 0.92, 0.7, _TREE_SHARE * 120 / 128, 1.9 / 3.4, 4.0 / 14, 1.25 / 3.4,
             8.5 / 14, 14e-6, 14e-6, (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6,
                                      .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0)),
    Protocol("Simple", 1.0, 1.0, _TREE_SHARE, 1.0, 1.0, 28 / 3.4, 28 / 14, 8.4e-6, 0.0,
             (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8,
              .9, .9)),
)


def nccl_choices(n: int, nbytes: float, net: Network) -> dict[tuple[str, str], float]:
    """Seconds NCCL's tuner predicts for ``n`` ranks to allreduce ``nbytes`` by each algorithm and
    protocol it would weigh (none for one rank), keyed ``(algorithm, protocol)``, with the links'
    latencies and rates for its hardware tables (``Protocol``). The ring: ``baseLat`` plus each of
    its 2(n-1) steps at its hop's latency, ``2(n-1)/n * M`` at the protocol's share of the ring's
    rate. The tree (across nodes only; inside one NCCL's tree is a chain, and the ring is the rule
    there): ``baseLat`` plus, each way, the node's chain of ``per_node - 1`` hops and
    ``floor(log2 nodes)`` levels across them, ``2 M`` at its share of the slower link's rate,
    corrected by size as NCCL does. Left out, as nothing here knows them: NCCL's channel count and
    the per-channel caps it sets on LL and LL128, the ring's plateau (its latency x1.4-1.9 for
    large messages across nodes, by GPU generation), and the cases where NCCL disables LL128 (no
    NVLink, GPUs before Volta)."""
    out: dict[tuple[str, str], float] = {}
    if n <= 1:  # nothing to run
        return out
    reduce_s = nbytes * net.gamma_s_per_byte * net.crowding(n)
    for p in PROTOCOLS:
        ring = _ring_link(n, net, p.ring_intra, p.ring_inter)
        rate = p.ring_rate if net.per_node >= 2 else p.ring_rate_alone
        moved = ring_allreduce_s(n, nbytes, Link(ring.alpha_s, ring.bandwidth_Bps * rate))
        out["ring", p.name] = p.ring_base_s + moved + (n - 1) / n * reduce_s
    if n <= net.per_node:
        return out
    rate, crowd = net.shared(n).bandwidth_Bps, net.crowding(n)
    levels = net.nodes(n).bit_length() - 1  # floor(log2 nodes)
    for p in PROTOCOLS:
        hops = 2 * ((net.per_node - 1) * net.intra.alpha_s * p.tree_intra
                    + levels * net.inter.alpha_s * p.tree_inter)
        moved = 2 * nbytes / (rate * p.tree_rate * p.tree_factor(nbytes))
        out["tree", p.name] = p.tree_base_s + hops * crowd + moved + reduce_s
    return out


def nccl_choice(n: int, nbytes: float, net: Network) -> tuple[tuple[str, str], float]:
    """What NCCL's tuner would run, the least of ``nccl_choices``: ``((algorithm, protocol),
    seconds)``; ``(("-", "-"), 0.0)`` for one rank, which runs nothing."""
    times = nccl_choices(n, nbytes, net)
    if not times:
        return ("-", "-"), 0.0
    best = min(times, key=times.get)
    return best, times[best]


def nccl_allreduce_s(n: int, nbytes: float, net: Network) -> float:
    """Seconds of what NCCL's tuner would run (``nccl_choice``; 0 for one rank)."""
    return nccl_choice(n, nbytes, net)[1]


#: a size past the tree's correction by size (``Protocol.tree_correction``): its rate, uncorrected
_LARGE = float(1 << 30)


def nccl_table(n: int, net: Network) -> dict[tuple[str, str], tuple[float, float]]:
    """NCCL's own table of an allreduce over ``n`` ranks, as ``nccl_choices`` models it: for each
    (algorithm, protocol), its latency in seconds and its algorithm bandwidth in bytes/s (what
    NCCL prints at init as ``Latency/AlgBw`` with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING, in us
    and GB/s). A message of M bytes takes the latency plus M over the bandwidth (a tree's
    corrected by size below 256 MiB)."""
    empty, large = nccl_choices(n, 0.0, net), nccl_choices(n, _LARGE, net)
    return {key: (empty[key], _LARGE / (large[key] - empty[key])) for key in empty}


COLLECTIVES = ("ring", "tree", "hierarchical", "halving_doubling", "auto")


def allreduce_s(n: int, nbytes: float, net: Network, collective: str = "ring") -> float:
    """Seconds for ``n`` workers to allreduce ``nbytes`` each. ``auto`` is NCCL's rule: for each
    message its tuner predicts every algorithm's time under every protocol from the size, the
    node count, the devices per node and the links, and runs the least (``nccl_allreduce_s``;
    S. Jeaugey in NVIDIA/nccl#754: "tree/LL -> ring/LL -> ... ring/simple" as the size grows).
    Trees are NCCL's across nodes only (since 2.4; within a node a tree is a chain,
    NVIDIA/nccl-tests#196), so on one node ``auto`` is the ring. The others are the textbook
    algorithms above, each message at the links' latency and rate."""
    if collective not in COLLECTIVES:
        raise ConfigError("collective", collective, "choose from " + ", ".join(COLLECTIVES))
    if collective == "auto":
        return nccl_allreduce_s(n, nbytes, net)
    if n <= 1:
        return 0.0
    # a ring's rank reduces (n-1)/n of the buffer; a tree's, up to the whole of it
    reduce_s = nbytes * net.gamma_s_per_byte * net.crowding(n)
    if collective == "ring":
        return ring_allreduce_s(n, nbytes, _ring_link(n, net)) + (n - 1) / n * reduce_s
    if collective == "tree":
        return tree_allreduce_s(n, nbytes, net.shared(n)) + reduce_s
    if collective == "halving_doubling":
        return halving_doubling_allreduce_s(n, nbytes, net.shared(n)) + (n - 1) / n * reduce_s
    return hierarchical_allreduce_s(n, nbytes, net) + (n - 1) / n * reduce_s


def ps_transfer_s(workers: int, nbytes: float, servers: int, net: Network) -> float:
    """Seconds for every worker to push ``nbytes`` to S server shards (or pull them back: the same,
    the other direction). Servers on their own nodes: each card carries ``workers * nbytes / S`` in
    ``workers`` messages; each worker's card sends ``nbytes`` in S messages; the slower side wins."""
    if workers < 1 or servers < 1:
        raise ConfigError("servers", servers, "at least one server and one worker")
    link = net.shared(workers + servers)
    server = link
    if net.crowding(workers + servers) > 1:
        # past the cores a server's bytes are already every worker's: what limits them is the
        # node's cores copying both sides (workers sending, servers receiving), not a 1/crowding
        # share of a core for each
        wide = net.path(workers + servers).bandwidth_Bps / max(1.0, 2 * servers / net.cores)
        server = Link(link.alpha_s, wide)
    server_side = server.transfer_s(workers * nbytes / servers, messages=workers)
    worker_side = link.transfer_s(nbytes, messages=servers)
    return max(server_side, worker_side)


def gossip_s(nbytes: float, peers: int, link: Link) -> float:
    """Seconds for a worker to send its ``nbytes`` model to ``peers`` others (receiving as many at
    the same time, on the other direction of its link)."""
    return peers * link.transfer_s(nbytes)


def pipeline_exposed_s(comm_s: float, buckets: int, backward_s: float) -> float:
    """Communication left after backward when gradients are sent in ``buckets`` as they become
    ready (DDP's and Horovod's bucketing): bucket i of B is ready at i/B of backward, buckets go one
    after another on the link, each taking comm_s / B. What is still in flight when backward ends
    is exposed; at least the last bucket always is."""
    if comm_s <= 0:
        return 0.0
    buckets = max(1, buckets)
    each = comm_s / buckets
    done = 0.0
    for i in range(1, buckets + 1):
        done = max(done, i * backward_s / buckets) + each
    return max(each, done - backward_s)
