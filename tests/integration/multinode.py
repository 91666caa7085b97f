"""The multi-node drill's driver (tests/integration/test_multinode.py runs it as a process of its own: a Python
process joins one Ray cluster, and the test session's is another).

    python -m tests.integration.multinode OUT_DIR

One head (1 CPU, the `train` resource) and two worker nodes (separate raylets, 1 CPU and 2 `rollout` each, as
`ray start --address` on two other machines): rollout actors need `rollout`, the trainer `train`. A batch runs
clean, then again while the raylet of the node that holds actor 0 is SIGKILLed at the first finished shard;
then one GRPO step trains on the head against engines on the worker nodes (the weight sync crosses nodes).
Prints one JSON line: node ids per role, records of both batches, the GRPO step's metrics.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(out: Path) -> dict:
    import psutil
    import ray

    from tasks.config import load_settings
    from tasks.envs import desk
    from tasks.envs.toolset import load_toolset
    from tasks.net import free_port
    from tasks.policy.model import build_model, save_model
    from tasks.rl import rollout
    from tasks.rl.cluster import loopback_driver, start_local_head, start_worker_node
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
    temp_dir = f"/tmp/eg-mn-{os.getpid()}"
    head = start_local_head(temp_dir, port=free_port(), num_cpus=1, dashboard_port=None, resources={"train": 1})
    ports = [start_worker_node(head, 1, {"rollout": 2}) for _ in range(2)]
    os.environ.update(head.env)
    loopback_driver(head.address)
    ray.init(address=head.address, logging_level="WARNING")
    try:
        nodes = {n["NodeManagerPort"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
        pool = rollout.RolloutPool(model_dir, settings)
        infos = [ray.get(a.info.remote()) for a in pool.actors]
        tasks = desk.generate_tasks(6, 9, load_toolset("2"))
        clean = pool.run_batch(tasks, group_size=4, out_dir=out / "clean", seed=21)
        victim = next(p for p in ports if nodes[p] == infos[0]["node_id"])
        killed: list[int] = []

        class KillNodeAtFirstShardDone:
            """`ray` as the pool sees it, except that its first observed shard completion SIGKILLs the raylet of
            actor 0's node (a machine lost): its actors die with it while the batch still needs them."""

            def __getattr__(self, name: str):
                return getattr(ray, name)

            def wait(self, refs, *args, **kwargs):
                ready = ray.wait(refs, *args, **kwargs)
                if not killed:
                    for p in psutil.process_iter(["name", "cmdline"]):
                        if p.info["name"] == "raylet" and f"--node_manager_port={victim}" in p.info["cmdline"]:
                            p.kill()
                            killed.append(p.pid)
                return ready

        rollout.ray = KillNodeAtFirstShardDone()
        try:
            lost = pool.run_batch(tasks, group_size=4, out_dir=out / "killed", seed=21)
        finally:
            rollout.ray = ray
        after = [ray.get(a.info.remote()) for a in pool.actors]
        result = run_grpo(settings, model_dir, out / "grpo", actors=pool.actors)
        train_nodes = [
            a.node_id for a in ray.util.state.list_actors(filters=[("class_name", "=", "RayTrainWorker")], limit=100)
        ]
        return {
            "train_node": next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("train")),
            "rollout_nodes": [nodes[p] for p in ports],
            "victim": nodes[victim],
            "killed": killed,
            "actors_before": [i["node_id"] for i in infos],
            "actors_after": [i["node_id"] for i in after],
            "trainer_actors": train_nodes,
            "clean": [(r["task_index"], r["rollout_index"], r["completion_ids"]) for r in clean],
            "lost": [(r["task_index"], r["rollout_index"], r["completion_ids"]) for r in lost],
            "metrics": result.metrics,
        }
    finally:
        ray.shutdown()
        head.stop()


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), default=str))
