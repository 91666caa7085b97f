"""The multi-node drill's driver (tests/integration/test_multinode.py runs it as a process of its own: a Python
process joins one Ray cluster, and the test session's is another).

    python -m tests.integration.multinode OUT_DIR

Ray's own multi-node-on-one-machine primitive (`ray.cluster_utils.Cluster`, what Ray's tests use): a head (1 CPU,
the `train` resource) and two worker nodes, each its own raylet with 1 CPU and 2 `rollout`, all on loopback
(`ray start --address` cannot join a loopback head: it swaps 127.0.0.1 for the machine's address). Rollout
actors need `rollout`, the trainer `train`. A batch runs clean, then again while the node that holds actor 0 is
killed (all its processes, SIGKILL) at the first finished shard; then one GRPO step trains on the head against
engines on the worker nodes (the weight sync crosses nodes). Prints one JSON line: node ids per role, records of
both batches, the GRPO step's metrics.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tasks.rl.cluster import new_token, private_dir

# before anything imports ray: a token-auth, loopback cluster (as tasks/rl/cluster.py's local heads)
TEMP_DIR = f"/tmp/eg-mn-{os.getpid()}"
os.environ.update(
    {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(new_token(private_dir(Path(TEMP_DIR + ".auth")) / "auth_token")),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "GLOO_SOCKET_IFNAME": "lo",
    }
)


def main(out: Path) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from tasks.config import load_settings
    from tasks.envs import desk
    from tasks.envs.toolset import load_toolset
    from tasks.policy.model import build_model, save_model
    from tasks.rl import rollout
    from tasks.rl.train import run_grpo

    settings = load_settings(
        environ={},
        overrides={
            "run_dir": str(out / "runs"),
            "rollout": {"num_workers": 2, "cpus_per_worker": 0.5, "group_size": 4, "node_resource": "rollout"},
            "grpo": {"steps": 1, "tasks_per_step": 2, "checkpoint_every": 1, "node_resource": "train"},
            "env": {"max_tokens_per_turn": 32},
        },
    )
    model, tok = build_model(settings.model)
    model_dir = save_model(model, tok, out / "model")
    # Cluster writes the head's address to Ray's default temp dir (/tmp/ray), whatever temp_dir the head has;
    # on a machine where no Ray ever ran, that directory does not exist yet
    from ray._common.utils import get_default_ray_temp_dir

    Path(get_default_ray_temp_dir()).mkdir(parents=True, exist_ok=True)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"train": 1},
            "temp_dir": TEMP_DIR,
            "include_dashboard": False,
            # a lost node declared dead in about 3 s rather than Ray's default of about 15 s
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3},
        },
    )
    workers = [cluster.add_node(num_cpus=1, resources={"rollout": 2}) for _ in range(2)]
    cluster.wait_for_nodes()
    os.environ["RAY_ADDRESS"] = cluster.address  # for Ray's own helpers in this driver's processes
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        pool = rollout.RolloutPool(model_dir, settings)
        infos = [ray.get(a.info.remote()) for a in pool.actors]
        tasks = desk.generate_tasks(6, 9, load_toolset("2"))
        clean = pool.run_batch(tasks, group_size=4, out_dir=out / "clean", seed=21)
        victim = next(n for n in workers if n.node_id == infos[0]["node_id"])
        killed: list[str] = []

        class KillNodeAtFirstShardDone:
            """`ray` as the pool sees it, except that its first observed shard completion kills actor 0's node
            (a machine lost): its actors die with it while the batch still needs them."""

            def __getattr__(self, name: str):
                return getattr(ray, name)

            def wait(self, refs, *args, **kwargs):
                ready = ray.wait(refs, *args, **kwargs)
                if not killed:
                    cluster.remove_node(victim, allow_graceful=False)
                    killed.append(victim.node_id)
                    cluster.wait_for_nodes()  # until the head has declared it dead (health checks)
                return ready

        rollout.ray = KillNodeAtFirstShardDone()
        try:
            lost = pool.run_batch(tasks, group_size=4, out_dir=out / "killed", seed=21)
        finally:
            rollout.ray = ray
        after = [ray.get(a.info.remote()) for a in pool.actors]
        result = run_grpo(settings, model_dir, out / "grpo", actors=pool.actors)
        return {
            "train_node": cluster.head_node.node_id,
            "rollout_nodes": [n.node_id for n in workers],
            "victim": victim.node_id,
            "killed": killed,
            "actors_before": [i["node_id"] for i in infos],
            "actors_after": [i["node_id"] for i in after],
            # the trainer holds `train`, which only the head offers: it can have run nowhere else
            "train_offered_by": [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("train")],
            "clean": [(r["task_index"], r["rollout_index"], r["completion_ids"]) for r in clean],
            "lost": [(r["task_index"], r["rollout_index"], r["completion_ids"]) for r in lost],
            "metrics": result.metrics,
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), default=str))
