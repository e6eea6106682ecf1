"""Parameter-server sharding and placement: pure functions, checked without any process group."""

import pytest
import torch

from downpour_lib import TrainConfig, plan_run
from downpour_lib.algorithms.ps_shards import assign, layout, model_layout
from downpour_lib.data import load_dataset
from downpour_lib.errors import ConfigError
from downpour_lib.models import build_model
from downpour_lib.options import DownpourOptions, SyncPSOptions


def test_assignment_balances_bytes_largest_first():
    sizes = [100, 10, 60, 40, 30, 30, 20]
    owner = assign(sizes, 3)
    loads = [sum(n for n, s in zip(sizes, owner, strict=True) if s == k) for k in range(3)]
    assert sorted(loads) == [90, 100, 100]  # 290 in all: as even as whole tensors allow
    assert owner == assign(sizes, 3)  # the same on every rank
    assert assign(sizes, 1) == (0,) * len(sizes)


def test_layout_of_a_real_model_covers_every_tensor_once():
    model = build_model("lenet", (1, 8, 8), 10)
    for shards in (1, 2, 3, 5):
        lay = model_layout(model, shards)
        params = sorted(i for s in range(shards) for i in lay.params(s))
        assert params == list(range(len(list(model.parameters()))))
        assert all(lay.bytes(s) > 0 for s in range(shards))
        assert sum(lay.bytes(s) for s in range(shards)) == 4 * sum(p.numel() for p in model.parameters())
    # two servers: the biggest tensor (the 64x120 layer) alone is most of one side
    lay = model_layout(model, 2)
    assert max(lay.bytes(0), lay.bytes(1)) / min(lay.bytes(0), lay.bytes(1)) < 1.6


def test_a_server_left_empty_is_refused_with_the_fix():
    params = [torch.zeros(3), torch.zeros(4)]
    with pytest.raises(ConfigError) as err:
        layout(params, [], 3)
    assert err.value.field == "servers" and err.value.value == 3
    assert "only 2 tensor(s)" in str(err.value) and "use at most 2 server(s)" in str(err.value)
    with pytest.raises(ConfigError, match="one floating-point dtype"):
        layout([torch.zeros(3), torch.zeros(3, dtype=torch.float64)], [], 1)


def test_plan_refuses_more_servers_than_the_model_has_tensors():
    digits = load_dataset("digits").train  # mlp: 6 parameter tensors
    config = TrainConfig(algorithm="sync_ps", options={"servers": 7, "server": "dedicated"})
    with pytest.raises(ConfigError, match="servers=7.*6 tensor"):
        plan_run(config, 8, digits)
    plan_run(TrainConfig(algorithm="sync_ps", options={"servers": 6}), 8, digits)


@pytest.mark.parametrize("options, world, message", [
    ({"servers": 3, "server": "dedicated"}, 3, "3 dedicated servers need at least 4 ranks"),
    ({"servers": 1, "server": "dedicated"}, 1, "a dedicated server needs at least 2 ranks"),
    ({"servers": 4, "server": "colocated"}, 3, "4 servers need at least 4 ranks"),
    ({"servers": 2}, 1, "2 servers need at least 2 ranks"),
])
def test_more_servers_than_ranks_allow(options, world, message):
    with pytest.raises(ConfigError, match=message):
        SyncPSOptions(**options).roles(world)


def test_roles_dedicated_colocated_and_auto():
    roles = DownpourOptions(servers=2).roles(5)  # Downpour: the first worker evaluates
    assert (roles.servers, roles.workers, roles.evaluator) == ((0, 1), (2, 3, 4), 2)
    assert roles.dedicated_servers == (0, 1) and roles.role(1) == "server" and roles.worker_index(3) == 1
    roles = SyncPSOptions(servers=2, server="colocated").roles(3)  # sync_ps: server 0 evaluates
    assert (roles.servers, roles.workers, roles.evaluator) == ((0, 1), (0, 1, 2), 0)
    assert roles.dedicated_servers == () and roles.role(1) == "worker"
    # auto: dedicated when a worker is left, else colocated
    assert SyncPSOptions(servers=2).roles(2).workers == (0, 1)
    # the ranks to launch for N workers: servers added unless they compute too
    assert SyncPSOptions(servers=2).roles_for(3) == SyncPSOptions(servers=2).roles(5)
    assert SyncPSOptions(servers=2, server="colocated").roles_for(3).world_size == 3
    with pytest.raises(ConfigError, match="colocated servers are workers too"):
        SyncPSOptions(servers=3, server="colocated").roles_for(2)
    with pytest.raises(ConfigError, match="workers=0"):
        SyncPSOptions().roles_for(0)
    with pytest.raises(ConfigError, match="servers=0"):
        SyncPSOptions(servers=0)
