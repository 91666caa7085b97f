"""One RL step's parts, measured against peers in the same run; prints one JSON line.

    python bench/rl_step.py --quick                     # under a minute
    python bench/rl_step.py --model runs/local/champion --tasks 64 --group 8

- Rollouts on the multi-turn desk environment (registry v2), same model, same tasks, same sampling:
  vLLM (continuous batching across turns, in-process engine) against Hugging Face `generate` batched
  per turn. Keys: vllm_/hf_ episodes_per_s and tokens_per_s, and their ratio.
- One GRPO update on the vLLM batch (grpo_step_s), phase by phase (step_breakdown_s: the rollout, the update's
  batch tensors, no-grad log-probabilities, forward, backward, demonstrations, optimizer, and the sync), beside
  the compute limit (compute_limit_s); `python bench/step_chart.py <json line> <png>` draws it.
- A weight sync into the engine beside one memcpy of the same bytes (weight_sync_s, memcpy_s): the
  default path (a broadcast from the trainer through vLLM's weight-transfer API, its gloo backend;
  weight_sync_collective_s) and the object-store path's reload (`collective_rpc("reload_weights")`,
  weight_sync_object_store_s), each with its prefix-cache reset. Trainer and engine share this process.

With `--device cuda` (bench/gpu.sh) the engine runs on the GPU, the trainer's copy is on the same GPU, the
sync is vLLM's CUDA IPC transfer, the memcpy is a device copy, and the GPU's memory bandwidth (a large
device-to-device copy) is reported beside the sync's GB/s (sync_GBps, device_copy_GBps).

The engine is built once before timing (as a rollout worker does once per run); its build time is
reported separately (engine_build_s). Without --model, the trained champion under runs/local is used
if present, else a random tiny model (which never stops early, so it understates vLLM's advantage).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def timed(fn, cuda: bool) -> float:
    """Seconds `fn` takes, with the device's queued work finished before and after on a GPU."""
    import torch

    if cuda:
        torch.cuda.synchronize()
    t0 = time.time()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.time() - t0


def plain_loop(model, ref_model, optimizer, records, settings, pad_id) -> None:
    """The floor the GRPO update is held to: the same micro-batches of the same records through a reference
    forward, a forward, a backward of the mean completion log-probability and one AdamW step, nothing else."""
    import torch

    from tasks.rl.grpo import pad_batch, sequence_token_logprobs
    from tasks.rl.update import _length, _micro_batches

    t = settings.rollout.temperature
    optimizer.zero_grad(set_to_none=True)
    by_length = sorted(range(len(records)), key=lambda i: _length(records[i]))  # as grpo_step: little padding
    for mb in _micro_batches(by_length, records, settings.grpo.micro_batch_tokens):
        seqs = [records[i]["prompt_ids"] + records[i]["completion_ids"] for i in mb]
        masks = [[0] * len(records[i]["prompt_ids"]) + records[i]["completion_mask"] for i in mb]
        ids, attn, mask = pad_batch(seqs, masks, pad_id, next(model.parameters()).device)
        with torch.no_grad():
            sequence_token_logprobs(ref_model, ids, attn, t)
        logp = sequence_token_logprobs(model, ids, attn, t)
        (-(logp * mask).sum() / mask.sum()).backward()
    optimizer.step()


def matmul_gflops(device: str, n: int = 2048, reps: int = 10) -> float:
    """The machine's fp32 matmul rate, the compute limit's denominator."""
    import torch

    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a @ b  # warm-up
    return 2 * n**3 * reps / timed(lambda: [a @ b for _ in range(reps)], device == "cuda") / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="16 tasks x 4 samples, one repetition")
    ap.add_argument("--model", default=None)
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()
    n_tasks, group = (16, 4) if args.quick else (args.tasks, args.group)

    import torch

    from tasks.config import load_settings
    from tasks.envs import desk, new_episode
    from tasks.envs.toolset import load_toolset
    from tasks.policy.backends import HFBackend, Sampling
    from tasks.policy.model import build_model, load_model, save_model, state_dict_cpu
    from tasks.rl.records import episode_record
    from tasks.rl.rollout_worker import RolloutWorker
    from tasks.rl.update import grpo_step
    from tasks.rl.weight_transfer import CollectiveWeightSync, LocalWorkerClient

    settings = load_settings()
    model_dir = args.model or (settings.run_dir / "champion")
    if not (Path(model_dir) / "config.json").exists():
        model, tok = build_model(settings.model)
        model_dir = save_model(model, tok, settings.run_dir / "bench-random-model")
    model, tok, model_dir = load_model(model_dir)
    torch.set_num_threads(os.cpu_count())
    tasks = desk.generate_tasks(n_tasks, 4242, load_toolset(settings.env.target_toolset), split="train")
    limits = {
        "max_turns": settings.env.max_turns,
        "max_tokens_per_turn": settings.env.max_tokens_per_turn,
        "max_len": settings.model.max_len,
    }
    sampling = Sampling(temperature=settings.rollout.temperature, seed=1)

    def episodes():
        return [new_episode(t, tok, **limits) for t in tasks for _ in range(group)]

    def timed_rollout(backend):
        """(episodes, generated tokens, seconds, success) after a small warm-up batch."""
        backend.run_episodes(episodes()[:8], sampling)
        eps = episodes()
        t0 = time.time()
        stats = backend.run_episodes(eps, sampling)
        return eps, stats["generated_tokens"], time.time() - t0, sum(e.score()["success"] for e in eps) / len(eps)

    t0 = time.time()
    worker = RolloutWorker(
        str(model_dir),
        max_len=settings.model.max_len,
        kv_cache_mb=settings.rollout.kv_cache_mb,
        threads=os.cpu_count(),
        weight_transfer="ipc" if args.device == "cuda" else "gloo",
    )
    engine = worker.backend
    build_s = time.time() - t0
    eps, v_tokens, v_s, v_success = timed_rollout(engine)
    records = [episode_record(e, i // group, i % group, 0) for i, e in enumerate(eps)]
    h_eps, h_tokens, h_s, h_success = timed_rollout(HFBackend(model.to(args.device), tok))

    train_model = load_model(model_dir)[0].to(args.device)
    ref_model = load_model(model_dir)[0].to(args.device).requires_grad_(False)
    opt = torch.optim.AdamW(train_model.parameters(), lr=settings.grpo.lr, weight_decay=0.0, betas=(0.9, 0.99))
    on_gpu = args.device == "cuda"
    m: dict = {}
    grpo_s = timed(lambda: m.update(grpo_step(train_model, opt, records, settings, tok.pad_id, ref_model)), on_gpu)
    plain_model = load_model(model_dir)[0].to(args.device)
    plain = torch.optim.AdamW(plain_model.parameters(), lr=settings.grpo.lr, weight_decay=0.0, betas=(0.9, 0.99))
    plain_s = timed(lambda: plain_loop(plain_model, ref_model, plain, records, settings, tok.pad_id), on_gpu)
    params = sum(p.numel() for p in train_model.parameters())
    tokens = sum(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in records)
    # forward 2 FLOPs per parameter per token, backward 4; the reference's forward 2 more
    step_flops = 8 * params * tokens
    gflops = matmul_gflops(args.device)

    sd = state_dict_cpu(train_model)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    t0 = time.time()
    engine.load_weights(sd)
    object_store_s = time.time() - t0
    sent = {k: v.to(args.device) for k, v in sd.items()}
    backend = "ipc" if on_gpu else "gloo"
    sync = CollectiveWeightSync([worker], backend, host="127.0.0.1", client_cls=LocalWorkerClient)
    sync.send(sent, version=1)  # the first round also forms the group: time the second
    sync_s = timed(lambda: sync.send(sent, version=2), on_gpu)
    sync.close()
    dst = {k: torch.empty_like(v) for k, v in sent.items()}
    memcpy_s = timed(lambda: [dst[k].copy_(v) for k, v in sent.items()], on_gpu)
    device_copy_gbps = None
    if on_gpu:  # the accelerator's memory bandwidth: read + write of a 1 GiB buffer
        big = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
        copy = torch.empty_like(big)
        device_copy_gbps = 2 * big.numel() * 4 / timed(lambda: copy.copy_(big), True) / 1e9

    out = {
        "bench": "rl_step",
        "quick": args.quick,
        "model_dir": str(model_dir),
        "episodes": len(eps),
        "vllm_episodes_per_s": len(eps) / v_s,
        "hf_episodes_per_s": len(h_eps) / h_s,
        "vllm_tokens_per_s": v_tokens / v_s,
        "hf_tokens_per_s": h_tokens / h_s,
        "episodes_per_s_ratio_vllm_over_hf": (len(eps) / v_s) / (len(h_eps) / h_s),
        "vllm_success": v_success,
        "hf_success": h_success,
        "engine_build_s": build_s,
        "grpo_step_s": grpo_s,
        "grpo_trained_tokens": m["trained_tokens"],
        "plain_loop_s": plain_s,
        "grpo_over_plain_loop": grpo_s / plain_s,
        "step_tokens": tokens,
        "matmul_gflops": gflops,
        "compute_limit_s": step_flops / (gflops * 1e9),
        "grpo_over_compute_limit": grpo_s / (step_flops / (gflops * 1e9)),
        "weight_bytes": nbytes,
        "weight_sync_s": sync_s,
        "weight_sync_collective_s": sync_s,
        "weight_sync_object_store_s": object_store_s,
        "weight_sync_backend": backend,
        "memcpy_s": memcpy_s,
        "weight_sync_over_memcpy": sync_s / max(memcpy_s, 1e-9),
        "sync_GBps": nbytes / sync_s / 1e9,
        "device_copy_GBps": device_copy_gbps,
        "device": args.device,
        "threads": torch.get_num_threads(),
    }
    # one synchronous step, phase by phase (bench/step_chart.py draws it beside the compute limit)
    phases = {k.removeprefix("update_").removesuffix("_s"): v for k, v in m.items() if k.startswith("update_")}
    out["step_breakdown_s"] = {
        "rollout": v_s,
        **phases,
        "update_other": max(grpo_s - sum(phases.values()), 0.0),  # advantages, metrics, the rest of grpo_step
        "weight_sync": sync_s,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
