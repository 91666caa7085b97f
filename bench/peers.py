"""Our GRPO against TRL's `GRPOTrainer`, same model, tasks, tools and hyperparameters; prints one JSON line.

    pip install -r bench/requirements-peers.txt             # TRL, pinned (make bench does this)
    python bench/peers.py                                   # bootstraps a champion, 3 steps each (~10 min)
    python bench/peers.py --init runs/local/champion --steps 5 --tasks 8 --group 8

Both arms start from the same champion (the default model directory: its tokenizer, chat template and
`hermes` tool calls) and train on the same multi-turn desk tasks of the target toolset: step s gets
`tasks.rl.train.training_tasks(settings, s)` in both (TRL's dataset is those tasks in order, unshuffled).
Shared: group size, tasks per step, learning rate, KL coefficient, clip range (0.2 / 0.28), AdamW betas
and no weight decay, gradient clipping, temperature 1, seeds. Ours runs as the loop runs it (`python -m
tasks train`: Ray Train, vLLM rollout actors, weight sync); TRL runs as a team on this machine would run
it: `GRPOTrainer` on the CPU with transformers' `generate`, its multi-turn tool loop (`environment_factory`:
one environment class per task family, whose method is the family's tool, answered by the same desk
session). The reward of a TRL rollout is our verifier's: its messages are replayed into our `Episode`
(each assistant message as the ids our template renders for it, the tools answering again, deterministic),
so both arms optimise the same number. Off in both: guard tasks and PPO-ptx demonstrations (ours only).

Where the arms differ, because each system does it its own way: TRL caps a rollout's whole completion
(`max_completion_length` = turns x tokens per turn) where ours caps each turn; TRL shows a tool's error
as its own text, ours as `error: ...` (the env method returns our text, so the same here); TRL's loss
normalisation is its default (`dapo`). Reported: seconds per step for each (model load and engine start
excluded in both), their ratio, each arm's mean training reward at its last step, and each final model's
greedy success on the gate's held-out v2 tasks against the champion (`python -m tasks eval --against`).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path

from seeds import ROOT, run_cli

# TRL parses an assistant turn with the tokenizer's `response_template` (transformers' response parsing);
# it ships them only for the templates it knows, so ours is given here: `<|assistant|>` content, then
# `<tool_call>{json}</tool_call>` calls, ending with `<|end|>` (tasks/policy/templates/evergreen.jinja).
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|end\|>\s*", "content": "text"},
    },
}
PY_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict, "array": list}


def tool_method(tool: dict):
    """A method for TRL's environment class whose JSON schema (transformers' `get_json_schema`: signature,
    type hints, Google docstring) renders like the task's own tool, and whose call answers as our episode
    would: argument errors and the session's answer as the same text."""
    from tasks.envs.base import check_arguments

    fn = tool["function"]
    props = fn.get("parameters", {}).get("properties", {})
    required = set(fn.get("parameters", {}).get("required", []))

    def call(self, **arguments):
        problem = check_arguments(tool, arguments)
        return f"error: {problem}" if problem else self.session.call(fn["name"], arguments).text

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name, spec in props.items():
        default = inspect.Parameter.empty if name in required else None
        hint = PY_TYPES.get(spec.get("type", "string"), str)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))
    call.__signature__ = inspect.Signature(params)
    call.__annotations__ = {p.name: p.annotation for p in params[1:]}
    lines = []
    for name, spec in props.items():
        choices = f" (choices: {json.dumps(spec['enum'])})" if "enum" in spec else ""
        lines.append(f"    {name}: {spec.get('description', name)}{choices}")
    call.__doc__ = fn.get("description", fn["name"]) + "\n\nArgs:\n" + "\n".join(lines)
    call.__name__ = call.__qualname__ = fn["name"]
    return call


def environment_classes(tasks: list) -> dict:
    """{family: environment class} for TRL's `environment_factory`: reset opens the task's desk session."""
    from tasks.envs import get_env
    from tasks.envs.base import Task

    classes = {}
    for task in tasks:
        if task.family in classes:
            continue

        def reset(self, task: str, **_):
            t = Task.from_dict(json.loads(task))
            self.session = get_env(t.env).open_session(t)

        members = {"reset": reset, **{t["function"]["name"]: tool_method(t) for t in task.tools}}
        classes[task.family] = type(f"Desk_{task.family}", (), members)
    return classes


def replay_reward(chat, limits: dict):
    """TRL reward function: each rollout's messages replayed into our Episode, scored by our verifier."""
    from tasks.envs import new_episode
    from tasks.envs.base import Task

    def evergreen_reward(prompts, completions, task, **_):
        rewards = []
        for messages, row in zip(completions, task, strict=True):
            ep = new_episode(Task.from_dict(json.loads(row)), chat, **limits)
            for message in messages:
                if ep.done:
                    break
                if message["role"] == "assistant":
                    turn = {k: message.get(k) for k in ("role", "content", "tool_calls") if message.get(k)}
                    ep.add_completion(chat.turn_ids(ep.messages, ep.tools, {"content": "", **turn}))
            if not ep.done:  # TRL stopped the loop (length or turns) before a final answer
                ep.messages.append({"role": "assistant", "content": ""})
                ep._finish("stopped by TRL before a final answer")
            rewards.append(ep.score()["reward"])
        return rewards

    return evergreen_reward


def trl_arm(args, settings, champion: Path, out: Path) -> dict:
    """GRPOTrainer for --steps steps; its model saved as ours saves one (checksummed, for `eval`)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tasks.policy.model import load_model, save_model
    from tasks.rl.train import training_tasks

    torch.set_num_threads(args.threads)
    _, chat, _ = load_model(champion)
    tokenizer = chat.tokenizer
    tokenizer.response_template = RESPONSE_TEMPLATE
    steps = [training_tasks(settings, s) for s in range(args.steps)]
    flat = [t for step in steps for t in step]
    rows = [
        {
            "prompt": [{"role": "user", "content": t.question}],
            "environment": t.family,
            "task": json.dumps(t.to_dict()),
        }
        for t in flat
    ]
    env = settings.env
    limits = {
        "max_turns": env.max_turns,
        "max_tokens_per_turn": env.max_tokens_per_turn,
        "max_len": settings.model.max_len,
    }
    g = settings.grpo
    config = GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        per_device_train_batch_size=args.tasks * args.group,
        num_generations=args.group,
        max_completion_length=env.max_turns * env.max_tokens_per_turn,
        max_tool_calling_iterations=env.max_turns - 1,
        learning_rate=g.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=g.kl_coef,
        epsilon=g.eps_low,
        epsilon_high=g.eps_high,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=g.max_grad_norm,
        temperature=settings.rollout.temperature,
        max_steps=args.steps,
        shuffle_dataset=False,
        seed=g.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,
    )
    model = AutoModelForCausalLM.from_pretrained(champion, dtype=torch.float32)
    model.generation_config.eos_token_id = sorted(chat.stop_ids)
    model.generation_config.pad_token_id = chat.pad_id
    factories = environment_classes(flat)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[replay_reward(chat, limits)],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        environment_factory=factories,
    )
    # the template TRL renders must give the ids ours does (the same prompts for the same tasks)
    first = flat[0]
    tools = [{"type": "function", "function": t["function"]} for t in first.tools]
    ours = chat.prompt([{"role": "user", "content": first.question}], tools)
    probe = factories[first.family]()
    theirs = tokenizer.apply_chat_template(
        rows[0]["prompt"],
        tools=[getattr(probe, t["function"]["name"]) for t in tools],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    if list(theirs) != list(ours):
        raise SystemExit(f"TRL's prompt differs from ours:\n{tokenizer.decode(theirs)!r}\n{tokenizer.decode(ours)!r}")
    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.t0 = time.time()

        def on_step_end(self, *_, **__):
            times.append(time.time() - self.t0)

    trainer.add_callback(StepTimer())
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    model_dir = save_model(trainer.model, chat, out / "trl" / "model")
    return {"steps": len(times), "step_s": [round(t, 2) for t in times], "rewards": rewards, "model": model_dir}


def our_arm(args, champion: Path, out: Path, sets: list[str]) -> dict:
    run = out / "ours"
    extra = [x for pair in sets for x in ("--set", pair)]
    run_cli(args, *extra, "train", "--init", str(champion), "--run-dir", str(run), threads=args.threads)
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    times = [m["rollout_s"] + m["train_s"] + m.get("ahead_wait_s", 0.0) + m["weight_sync_s"] for m in steps]
    return {
        "steps": len(steps),
        "step_s": [round(t, 2) for t in times],
        "rewards": [m["reward_mean"] for m in steps],
        "model": run / "model",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--init", help="the champion both arms start from (default: bootstrap one into --out)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument(
        "--bootstrap-steps",
        type=int,
        default=300,
        help="SFT steps of the champion bootstrapped without --init (the demo's 900 take ~8 min here)",
    )
    ap.add_argument("--tasks", type=int, default=8, help="tasks per step (grpo.tasks_per_step)")
    ap.add_argument("--group", type=int, default=8, help="samples per task (rollout.group_size)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=str(ROOT / "runs" / "peers"))
    args = ap.parse_args(argv)
    args.set = [
        f"grpo.steps={args.steps}",
        f"grpo.tasks_per_step={args.tasks}",
        f"rollout.group_size={args.group}",
        "grpo.guard_share=0",
        "grpo.demo_coef=0",
        "grpo.validation_tasks=0",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    champion = Path(args.init) if args.init else out / "champion"
    if not (champion / "config.json").exists():
        sft = ["--set", f"bootstrap.steps={args.bootstrap_steps}"]
        run_cli(args, *sft, "bootstrap", "--out", str(champion), threads=args.threads)
    sys.path.insert(0, str(ROOT))
    from tasks.config import load_settings, nest

    settings = load_settings(overrides=nest(dict(pair.split("=", 1) for pair in args.set)))
    ours = our_arm(args, champion, out, args.set)
    trl = trl_arm(args, settings, champion, out)
    result: dict = {"bench": "peers", "peer": "trl", "steps": args.steps, "tasks": args.tasks, "group": args.group}
    for name, arm in (("ours", ours), ("trl", trl)):
        diff = run_cli(
            args,
            "eval",
            "--model",
            str(arm["model"]),
            "--against",
            str(champion),
            "--toolset",
            "2",
            threads=args.threads,
        )
        result[name] = {
            "step_s_mean": round(statistics.fmean(arm["step_s"]), 2),
            "step_s": arm["step_s"],
            "last_reward": round(arm["rewards"][-1], 4),
            "v2_greedy_vs_champion": diff["2"]["greedy_success"]["difference"],
        }
    result["steps_per_s_ratio_ours_over_trl"] = round(result["trl"]["step_s_mean"] / result["ours"]["step_s_mean"], 2)
    result["threads"] = args.threads
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
