"""The gloo weight-transfer parts that need no engine: the flat layout and the group's broadcast.

The whole path (trainer -> vLLM engines on Ray, token-for-token against HF generate) is in
tests/integration/test_rollouts.py."""

from __future__ import annotations

import threading

import pytest
import torch

from tasks.rl.weight_transfer import GlooGroup, _flat_layout, open_store


def test_flat_layout_groups_by_dtype_with_running_offsets():
    layout, totals = _flat_layout(
        ["a", "b", "c", "d"], [torch.float32, torch.bfloat16, torch.float32, torch.bfloat16], [[2, 3], [4], [5], [1, 1]]
    )
    assert layout[torch.float32] == [("a", 0, [2, 3]), ("c", 6, [5])]
    assert layout[torch.bfloat16] == [("b", 0, [4]), ("d", 4, [1, 1])]
    assert totals == {torch.float32: 11, torch.bfloat16: 5}


def test_gloo_group_broadcasts_from_rank_0_to_every_member():
    world = 3
    master = open_store("127.0.0.1", 0, world, True, 30)
    received: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def member(rank: int):
        try:
            store = master if rank == 0 else open_store("127.0.0.1", master.port, world, False, 30)
            group = GlooGroup(store, rank, world, timeout_s=30)
            t = torch.arange(10, dtype=torch.float32) if rank == 0 else torch.zeros(10)
            group.broadcast(t, src=0)
            received[rank] = t
            group.destroy()
        except BaseException as e:  # surfaced below: a thread's assertion would otherwise vanish
            errors.append(e)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert set(received) == {0, 1, 2}
    for t in received.values():
        assert torch.equal(t, torch.arange(10, dtype=torch.float32))


@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_gpu_backends_refuse_cpu_weights_before_any_rendezvous(backend):
    from tasks.rl.weight_transfer import CollectiveWeightSync

    sync = CollectiveWeightSync([object()], backend, host="127.0.0.1")
    with pytest.raises(ValueError, match="weight_transfer_backend=gloo"):
        sync.send({"w": torch.zeros(2)}, version=1)
    assert sync.engine is None
    sync.close()  # nothing was opened: nothing to release


def test_client_ranks_each_engine_or_sends_one_info_when_there_is_no_group():
    from tasks.rl.weight_transfer import LocalWorkerClient

    class Engine:
        def __init__(self):
            self.infos = []

        def init_weight_transfer(self, info):
            self.infos.append(info)

    engines = [Engine(), Engine()]
    client = LocalWorkerClient(engines)
    client.init_weight_transfer_engine({"master_address": "h", "rank_offset": 1})  # gloo / nccl: one group
    assert [e.infos[-1]["rank_offset"] for e in engines] == [1, 2]
    client.init_weight_transfer_engine({"packed": False})  # ipc: no group, no ranks
    assert [e.infos[-1] for e in engines] == [{"packed": False}] * 2


def test_the_master_store_listens_on_its_host_only():
    import psutil

    before = {c.laddr for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    master = open_store("127.0.0.1", 0, 2, True, 30)
    new = {c.laddr for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN} - before
    assert [(a.ip, a.port) for a in new] == [("127.0.0.1", master.port)]  # torch's own would bind every interface
    client = open_store("127.0.0.1", master.port, 2, False, 30)
    master.set("k", "v")
    assert client.get("k") == b"v"
