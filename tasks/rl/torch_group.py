"""The trainer's torch.distributed process group on a one-machine Ray head, without a TCP listener.

Ray Train's TorchConfig rendezvouses through torch's TCPStore, and the TCPStore server listens on every
interface (torch gives it no bind address): the one socket of a local run that was not on loopback. On a
local head every Ray Train worker shares the machine's disk, so the group meets through a FileStore
instead (`init_method=file://...`); gloo's own pair connections go over `lo` (GLOO_SOCKET_IFNAME, set for
the head's processes by tasks/rl/cluster.py). Clusters of several machines keep TorchConfig.

    trainer = TorchTrainer(..., torch_config=torch_config(settings, run_dir))
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.config import Settings


def torch_config(settings: Settings, run_dir: Path) -> Any:
    """FileStoreTorchConfig for a local head on the CPU, else Ray's TorchConfig (gloo on CPU, NCCL on GPUs)."""
    from ray.train.torch import TorchConfig

    on_gpu = settings.grpo.device == "cuda"
    if settings.ray.backend != "local" or on_gpu:
        return TorchConfig(backend="nccl" if on_gpu else "gloo")
    # a fresh file per fit: a FileStore left by an earlier (killed) group must not be joined
    store = Path(run_dir) / "ray_train" / f"process-group-{uuid.uuid4().hex[:12]}"
    store.parent.mkdir(parents=True, exist_ok=True)
    return _file_store_config()(backend="gloo", store_file=str(store))


def _file_store_config() -> type:
    """The config class, built on first use (Ray Train's modules are heavy to import)."""
    import ray
    from ray.train.torch.config import (
        TorchConfig,
        _set_torch_distributed_env_vars,
        _setup_torch_process_group,
        _TorchBackend,
    )

    class _FileStoreBackend(_TorchBackend):
        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            worker_group.execute(_set_torch_distributed_env_vars)  # LOCAL_RANK and the rest, as Ray's does
            ray.get(
                [
                    worker_group.execute_single_async(
                        i,
                        _setup_torch_process_group,
                        backend=backend_config.backend,
                        world_rank=i,
                        world_size=len(worker_group),
                        init_method=f"file://{backend_config.store_file}",
                        timeout_s=backend_config.timeout_s,
                    )
                    for i in range(len(worker_group))
                ]
            )

    @dataclass
    class FileStoreTorchConfig(TorchConfig):
        store_file: str = ""

        @property
        def backend_cls(self) -> type:
            return _FileStoreBackend

    return FileStoreTorchConfig
