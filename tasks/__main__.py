"""Evergreen's command line: each step of the loop without Airflow.

    python -m tasks bootstrap --out runs/local/champion            # SFT the first champion (toolset v1)
    python -m tasks eval --model runs/local/champion --toolset 1 2 [--against OTHER_MODEL]
    python -m tasks --set eval.split=dev eval --model M             # the dev split (tuning), not the gate's
    python -m tasks rollout --model runs/local/champion --toolset 2 --tasks 8 --out runs/local/rollouts
    python -m tasks train --init runs/local/champion --run-dir runs/local/grpo
    python -m tasks demo                                           # the DAGs' stages in one process
    python -m tasks timeline [--out DIR]                           # a simulated month, four retraining policies
    python -m tasks serve [--port 8000] [--model URI]              # vLLM's OpenAI server on the champion
    python -m tasks --set grpo.steps=5 settings                    # the effective settings, as JSON
    python -m tasks ingest --input PATH --output DIR               # traces -> accepted + quarantine + GX docs
    python -m tasks drift --reference REF --current CUR            # drift report (JSON)
    python -m tasks tooldiff OLD NEW                               # tool-registry diff (JSON)
    python -m tasks simulate --out DIR --start D --end D --change-at D   # simulated production traces

Settings come from include/config/pipeline.yaml and EVERGREEN_<SECTION>__<FIELD> variables; `--set
grpo.steps=5` overrides one field for this command (JSON for lists and null: `--set grpo.guard_kl_coef=null`);
`--settings FILE` takes a run's resolved settings as they are (the Ray job of a DAG run). Progress goes to stderr as log lines; results
are printed as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.rl.rollout import RolloutPool


def _overrides(pairs: list[str]) -> dict:
    """--set SECTION.FIELD=VALUE pairs as nested overrides (JSON for lists, objects and null)."""
    from tasks.config import nest, parse_value

    flat = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep:
            from tasks.config import SettingsError

            raise SettingsError(f"--set {pair!r}: expected SECTION.FIELD=VALUE, e.g. grpo.steps=5")
        flat[key] = parse_value(value)
    return nest(flat)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    parser = argparse.ArgumentParser(prog="python -m tasks", description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--config", help="pipeline YAML (default include/config/pipeline.yaml), EVERGREEN_* applied")
    where.add_argument(
        "--settings",
        help="a run's resolved settings (JSON or YAML), taken as they are: no "
        "EVERGREEN_* variable changes them (the Ray job's, tasks.stages.training)",
    )
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bootstrap", help="SFT the tiny model into a toolset-v1 champion")
    p.add_argument("--out", required=True)
    p = sub.add_parser("eval", help="held-out success (greedy and sampled) with bootstrap intervals")
    p.add_argument("--model", required=True)
    p.add_argument("--against", help="second model: paired-bootstrap difference model - against")
    p.add_argument("--toolset", nargs="+", default=["1", "2"])
    p = sub.add_parser("rollout", help="one rollout batch on Ray; records written under --out")
    p.add_argument("--model", required=True)
    p.add_argument("--toolset", default="2")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--out", required=True)
    p = sub.add_parser("train", help="GRPO on Ray Train from --init; resumes from --run-dir's checkpoints")
    p.add_argument("--init", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--fail-at-step", type=int, help="raise at this step (fault-injection tests)")
    p.add_argument(
        "--engines",
        metavar="NAMESPACE",
        help="use the running rollout engines named rollout-<i> in this Ray namespace (started if "
        "missing) and leave them running; by default the job starts its own and stops them",
    )
    p = sub.add_parser("serve", help="serve the champion (or --model) with vLLM's OpenAI-compatible server")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (loopback unless you mean otherwise)")
    p.add_argument("--model", help="a model URI or directory (default models:/<promotion.model_name>@champion)")
    sub.add_parser("settings", help="print the effective settings (file, EVERGREEN_* variables, --set) as JSON")
    sub.add_parser("demo", help="the DAGs' stages in one process: bootstrap, simulate, signals, GRPO, evals, gate")
    p = sub.add_parser("timeline", help="a simulated month: never / nightly / nightly gated / Evergreen retraining")
    p.add_argument("--out", help="where its files go (default <run_dir>/timeline); a rerun resumes after the last day")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from the days written so far")
    from tasks.signals import cli as signals_cli

    signals_cli.add_parsers(sub)
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    from tasks.config import SettingsError, load_settings

    try:
        settings = load_settings(
            _local_settings(args.settings) or args.config,
            overrides=_overrides(args.set),
            environ={} if args.settings else None,
        )
    except (SettingsError, OSError) as e:
        print(e, file=sys.stderr)
        return 2

    try:
        return _command(args, settings)
    except (SettingsError, ValueError, OSError) as e:
        # bad input (a file that is no registry, a directory for a file, a value out of range): one line
        # naming it, exit 2; -v shows where it was raised
        if args.verbose:
            raise
        print(f"python -m tasks {args.command}: {e} (-v for the traceback)", file=sys.stderr)
        return 2


def _local_settings(uri: str | None) -> str | None:
    """A run's settings file kept on S3 (a Ray job of a run whose run_dir is there), copied to a local file."""
    from tasks import storage

    if not uri or not storage.is_s3(uri):
        return uri
    import tempfile

    with tempfile.NamedTemporaryFile("wb", suffix=".json", prefix="evergreen-settings-", delete=False) as f:
        f.write(storage.read_bytes(uri))
    return f.name


def _command(args: argparse.Namespace, settings: Settings) -> int:
    from tasks.signals import cli as signals_cli

    if args.command == "settings":
        print(settings.model_dump_json(indent=1))
        return 0
    if args.command in signals_cli.COMMANDS:
        return signals_cli.run(args, settings)
    if args.command == "serve":
        from tasks.serving import serve

        return serve(settings, args.port, args.model, args.host)
    if args.command == "bootstrap":
        from tasks.stages.models import sft_champion

        print(json.dumps(sft_champion(settings, args.out)))
    elif args.command == "timeline":
        from tasks.timeline.run import run_timeline

        print(json.dumps(run_timeline(settings, args.out, report_only=args.report_only), default=str))
    elif args.command == "demo":
        from tasks.stages.demo import run_demo

        return 0 if run_demo(settings).status in ("promoted", "not_promoted", "skipped") else 1
    else:
        import ray

        from tasks.rl.cluster import connect

        connect(settings)
        try:
            return _ray_command(args, settings)
        finally:
            ray.shutdown()
    return 0


def _ray_command(args: argparse.Namespace, settings: Settings) -> int:
    from tasks.rl.rollout import RolloutPool

    if args.command == "train":
        from tasks.rl.rollout import start_rollout_actors
        from tasks.rl.train import run_grpo
        from tasks.rundir import working_copy

        # a run kept on S3: the champion and the GRPO directory (checkpoints to resume from) pulled into this
        # machine's copy; the rank-0 worker pushes each checkpoint and the model back (tasks.rl.train)
        init, run_dir = working_copy(settings, args.init), working_copy(settings, args.run_dir)
        actors = start_rollout_actors(init, settings, namespace=args.engines) if args.engines else None
        result = run_grpo(settings, init, run_dir, fail_at_step=args.fail_at_step, actors=actors, run_uri=args.run_dir)
        print(json.dumps({"metrics": result.metrics, "model": f"{args.run_dir}/model"}, default=str))
    elif args.command == "rollout":
        from tasks.envs import get_env

        env = get_env(settings.env.name)
        pool = RolloutPool(args.model, settings)
        tasks = env.generate_tasks(args.tasks, settings.grpo.seed, env.load_toolset(args.toolset), split="train")
        records = pool.run_batch(tasks, settings.rollout.group_size, args.out, seed=settings.grpo.seed)
        print(
            json.dumps(
                {
                    "episodes": len(records),
                    "success_rate": sum(r["success"] for r in records) / len(records),
                    "mean_reward": sum(r["reward"] for r in records) / len(records),
                    "out": args.out,
                }
            )
        )
    elif args.command == "eval":
        from safetensors.torch import load_file

        from tasks.evals.harness import compare

        pool = RolloutPool(args.model, settings)
        first = _evaluate_pool(pool, settings, args.toolset)
        out = {
            reg: first[reg].summary("sampled_success") | {"greedy": first[reg].summary("greedy_success")["mean"]}
            for reg in args.toolset
        }
        if args.against:
            pool.load_weights(load_file(Path(args.against) / "model.safetensors"), version=-1)
            second = _evaluate_pool(pool, settings, args.toolset)
            out = {
                reg: {key: compare(first[reg], second[reg], key) for key in ("greedy_success", "sampled_success")}
                for reg in args.toolset
            }
        print(json.dumps(out))
    return 0


def _evaluate_pool(pool: RolloutPool, settings: Settings, toolsets: list[str]) -> dict:
    """{toolset: EvalResult} for the weights currently in the pool, on the tasks build_tasks would build."""
    import time

    from tasks.stages.rollouts import eval_tasks

    out = {}
    for toolset in toolsets:
        t0 = time.time()
        out[toolset] = pool.score_attempts(
            eval_tasks(settings, toolset), settings.eval.samples, settings.rollout.temperature, settings.eval.seed
        )
        s = out[toolset].summary("sampled_success", settings.eval.interval_resamples, settings.eval.confidence)
        logging.getLogger("tasks").info(
            "eval v%s policy v%d: sampled success %.3f [%.3f, %.3f], greedy %.3f (%.1fs)",
            toolset,
            pool.policy_version,
            s["mean"],
            s["low"],
            s["high"],
            out[toolset].summary("greedy_success")["mean"],
            time.time() - t0,
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
