"""Weight transfer from the trainer into the rollout engines, through vLLM's weight-transfer API.

    sync = CollectiveWeightSync(actors, "gloo", host="127.0.0.1")   # or "nccl" with the weights on a GPU
    sync.send(state_dict, version=3)      # every engine holds the new weights, policy_version 3
    sync.close()

The trainer (rank 0) and every engine's worker (rank 1 + i) form one process group; each round the
trainer broadcasts the weights while every engine receives them into vLLM's layerwise reload
(`start_weight_update` / `update_weights` / `finish_weight_update` on the engine). Three backends, chosen
by `rollout.weight_transfer_backend` (engines are built for one): "nccl" is vLLM's own NCCL engine (GPU
to GPU, packed buffers; trainer and engines on different GPUs); "ipc" is vLLM's CUDA IPC engine (trainer
and engines on one GPU: the engines map the trainer's tensors, no process group); "gloo", registered here,
is vLLM's NCCL engine with the NCCL communicator replaced by a torch gloo group and the weights sent as one
flat CPU buffer per dtype (one broadcast instead of one per tensor); it serves CPU engines, and GPU engines
fed by a CPU trainer. nccl and ipc have not run here (no GPU machine with vLLM).

Departure from vLLM's Ray client: vLLM numbers an engine's rank from its data-parallel index, which
assumes the engines are DP replicas of one deployment; ours are independent engines (one per Ray actor,
each data-parallel index 0), so `ActorGroupClient` gives each engine its own `rank_offset`.

The other path (`rollout.weight_sync: object_store`) puts the state dict into the Ray object store once
and every engine reloads it with `collective_rpc("reload_weights")`; `bench/rl_step.py` times both.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from tasks.net import free_port

if TYPE_CHECKING:
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

GLOO = "gloo"


class GlooGroup:
    """A torch gloo process group of its own (not the default group: Ray Train's workers already have
    one), with the one collective the engines need."""

    def __init__(self, store: torch.distributed.Store, rank: int, world_size: int, timeout_s: float) -> None:
        import torch.distributed as dist

        self.rank, self.world_size = rank, world_size
        self._store = store  # the master's store must outlive the group
        self._pg = dist.ProcessGroupGloo(
            dist.PrefixStore("evergreen-weights", store), rank, world_size, datetime.timedelta(seconds=timeout_s)
        )

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream: Any = None) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        self._pg.broadcast([tensor], opts).wait()

    def destroy(self) -> None:
        self._pg, self._store = None, None


def open_store(host: str, port: int, world_size: int, is_master: bool, timeout_s: float) -> torch.distributed.TCPStore:
    """The group's TCPStore. The master's listening socket is made here, bound to `host`, and handed to the
    store (master_listen_fd): torch's own would listen on every interface whatever `host` says."""
    import socket

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if not is_master:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)
    port = listener.getsockname()[1]
    return dist.TCPStore(
        host,
        port,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=timeout,
        master_listen_fd=listener.detach(),
    )


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _flat_layout(
    names: list[str], dtypes: list[torch.dtype], shapes: list[list[int]]
) -> tuple[dict[torch.dtype, list[tuple[str, int, list[int]]]], dict[torch.dtype, int]]:
    """Parameters grouped by dtype, in order: {dtype: [(name, offset, shape), ...], total numel}."""
    layout: dict[torch.dtype, list[tuple[str, int, list[int]]]] = {}
    totals: dict[torch.dtype, int] = {}
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        numel = _numel(shape)
        layout.setdefault(dtype, []).append((name, totals.get(dtype, 0), list(shape)))
        totals[dtype] = totals.get(dtype, 0) + numel
    return layout, totals


def _register_gloo() -> None:
    """Add the "gloo" engine to vLLM's two weight-transfer registries (idempotent).

    The classes are defined here, on first use, because they subclass vLLM's: importing vLLM takes seconds,
    and this module is imported wherever a rollout pool is, including pools that never use this path."""
    from vllm.distributed.weight_transfer.base import TrainerInitInfo, WeightTransferInitInfo
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerWeightTransferEngine,
        NCCLWeightTransferEngine,
        NCCLWeightTransferUpdateInfo,
    )

    if GLOO in WeightTransferEngineFactory._registry and GLOO in WeightTransferTrainerFactory._registry:
        return

    @dataclass(kw_only=True)
    class GlooWeightTransferInitInfo(WeightTransferInitInfo):
        master_address: str
        master_port: int
        rank_offset: int
        world_size: int
        timeout_s: float = 300.0

    @dataclass(kw_only=True)
    class GlooTrainerInitInfo(TrainerInitInfo):
        backend: ClassVar[str] = GLOO
        master_address: str
        world_size: int
        timeout_s: float = 300.0

    class GlooWeightTransferEngine(NCCLWeightTransferEngine):
        """Engine side: vLLM's dense NCCL engine (layerwise reload kept) over a gloo group."""

        init_info_cls = GlooWeightTransferInitInfo
        update_info_cls = NCCLWeightTransferUpdateInfo

        def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
            p = self.parallel_config
            rank = init_info.rank_offset + p.data_parallel_index * p.world_size + p.rank
            store = open_store(
                init_info.master_address, init_info.master_port, init_info.world_size, False, init_info.timeout_s
            )
            self.model_update_group = GlooGroup(store, rank, init_info.world_size, init_info.timeout_s)

        def update_weights(self, update_info: dict[str, Any]) -> None:
            # the base class ends with torch.accelerator.synchronize(); gloo's broadcast has completed
            # when it returns, and a CPU-only process has no accelerator to synchronize
            self.receive_weights(self.parse_update_info(update_info))

        def receive_weights(self, update_info: NCCLWeightTransferUpdateInfo) -> None:
            if self.model_update_group is None:
                raise RuntimeError("gloo weight transfer not initialised: call init_weight_transfer_engine first")
            dtypes = [getattr(torch, d) for d in update_info.dtype_names]
            layout, totals = _flat_layout(update_info.names, dtypes, update_info.shapes)
            for dtype, entries in layout.items():
                flat = torch.empty(totals[dtype], dtype=dtype)
                self.model_update_group.broadcast(flat, src=0)
                self.model.load_weights(
                    [(name, flat[off : off + _numel(shape)].view(shape)) for name, off, shape in entries]
                )

    class GlooTrainerWeightTransferEngine(NCCLTrainerWeightTransferEngine):
        """Trainer side: the NCCL trainer engine's round trip (start, receive while broadcasting, finish)."""

        init_info_cls = GlooTrainerInitInfo

        @classmethod
        def trainer_init(
            cls,
            init_info: GlooTrainerInitInfo,
            *,
            client: ActorGroupClient,
            source: WeightSource | None = None,
        ) -> GlooTrainerWeightTransferEngine:
            if source is None:
                raise ValueError("gloo weight transfer needs a WeightSource")
            engine = cls(client=client, source=source, is_sender=init_info.is_sender, packed=False)
            if not engine.is_sender:
                return engine
            # the store listens first, on a port the OS picks, so no port is guessed or raced for
            store = open_store(init_info.master_address, 0, init_info.world_size, True, init_info.timeout_s)
            worker_info = {
                "master_address": init_info.master_address,
                "master_port": store.port,
                "rank_offset": 1,
                "world_size": init_info.world_size,
                "timeout_s": init_info.timeout_s,
            }
            # the engines block in their group's rendezvous until the trainer joins it: start them first
            with ThreadPoolExecutor(max_workers=1) as pool:
                joined = pool.submit(client.init_weight_transfer_engine, worker_info)
                engine.model_update_group = GlooGroup(store, 0, init_info.world_size, init_info.timeout_s)
                joined.result()
            return engine

        def _broadcast(self, source: WeightSource, meta: list[ParamMeta]) -> None:
            if not self.is_sender:
                for _ in source:
                    pass
                return
            tensors = dict(self._checked_iter(source, meta))
            layout, totals = _flat_layout(
                [m.name for m in meta], [m.dtype for m in meta], [list(m.shape) for m in meta]
            )
            for entries in layout.values():
                flat = torch.cat([tensors[name].reshape(-1) for name, _, _ in entries])
                self.model_update_group.broadcast(flat, src=0)

    WeightTransferEngineFactory.register_engine(GLOO, GlooWeightTransferEngine)
    WeightTransferTrainerFactory.register_engine(GLOO, GlooTrainerWeightTransferEngine)


def engine_transfer_config(backend: str) -> WeightTransferConfig:
    """The `weight_transfer_config` an engine is built with: vLLM's own "nccl", or our "gloo"."""
    from vllm.config.weight_transfer import WeightTransferConfig

    if backend == GLOO:
        _register_gloo()
    return WeightTransferConfig(backend=backend)


class StateDictSource:
    """A vLLM `WeightSource` over the current state dict: `update()` swaps in each round's weights."""

    def __init__(self, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        self.tensors = state_dict or {}

    def update(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.tensors = state_dict

    def metadata(self) -> list[ParamMeta]:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.tensors.items()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.tensors.items())


class ActorGroupClient:
    """vLLM's `VLLMWeightSyncClient` over our rollout actors: each call fans out to every actor and waits.

    Each engine gets its own rank (`rank_offset` + its index); see the module docstring."""

    def __init__(self, actors: list[Any]) -> None:
        self.actors = list(actors)
        self.version: int | None = None  # the policy version the round in flight installs

    def _call_all(self, method: str, args_per_actor: list[tuple[Any, ...]]) -> None:
        import ray

        ray.get([getattr(a, method).remote(*args) for a, args in zip(self.actors, args_per_actor, strict=True)])

    def _all(self, method: str, *args: Any) -> None:
        self._call_all(method, [args] * len(self.actors))

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        if "rank_offset" not in init_info:  # no process group to join (ipc): every engine gets the same
            self._all("init_weight_transfer", init_info)
            return
        self._call_all(
            "init_weight_transfer",
            [({**init_info, "rank_offset": init_info["rank_offset"] + i},) for i in range(len(self.actors))],
        )

    def start_weight_update(self) -> None:
        self._all("start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._all("update_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        # vLLM's trainer engines finish without a version; the round's policy version goes to every actor
        self._all("finish_weight_update", self.version if weight_version is None else int(weight_version))

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown_weight_transfer")


class LocalWorkerClient(ActorGroupClient):
    """The same over `RolloutWorker`s in this process (benchmarks, notebooks): plain calls, no Ray."""

    def _call_all(self, method: str, args_per_actor: list[tuple[Any, ...]]) -> None:
        for worker, args in zip(self.actors, args_per_actor, strict=True):
            getattr(worker, method)(*args)


class CollectiveWeightSync:
    """Trainer side of the collective path: one group with the given actors' engines, one broadcast per
    round. `close()` releases the group (the engines keep serving); a changed actor set needs a new one."""

    def __init__(
        self,
        actors: list[Any],
        backend: str,
        host: str,
        timeout_s: float = 300.0,
        client_cls: type[ActorGroupClient] = ActorGroupClient,
    ) -> None:
        self.client = client_cls(actors)
        self.source = StateDictSource()
        self.backend, self.host, self.timeout_s = backend, host, timeout_s
        self.engine: Any = None  # the group forms at the first send, after the weights' device is checked

    def _open(self) -> None:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        host, timeout_s, world = self.host, self.timeout_s, 1 + len(self.client.actors)
        if self.backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            info = NCCLTrainerInitInfo(master_address=host, master_port=free_port(host), world_size=world, rank=0)
        elif self.backend == "ipc":  # same GPU: the engines map the trainer's tensors through CUDA IPC handles
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            info = IPCTrainerInitInfo(rank=0)
        else:
            _register_gloo()
            info = WeightTransferTrainerFactory._registry[GLOO]().init_info_cls(
                master_address=host, world_size=world, timeout_s=timeout_s, rank=0
            )
        self.engine = WeightTransferTrainerFactory.trainer_init(info, client=self.client, source=self.source)

    def send(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        if self.backend != GLOO and not all(t.is_cuda for t in state_dict.values()):
            raise ValueError(
                f"rollout.weight_transfer_backend={self.backend} sends CUDA tensors: the trainer's weights "
                "are on the CPU here; train on a GPU (grpo.gpus_per_train_worker > 0), or use "
                "weight_transfer_backend=gloo"
            )
        self.source.update(state_dict)
        self.client.version = version
        if self.engine is None:
            self._open()
        self.engine.send_weights()

    def close(self) -> None:
        if self.engine is None:
            return
        try:
            self.client.shutdown_weight_transfer_engine()
        finally:
            self.engine.shutdown()
