"""The loop's stages: each Airflow task of `continuous_post_training` (and the other DAGs) is one of these
functions, with the task id its name; `python -m tasks demo` calls the same functions in the same order.

    signals     validate_data, should_train, skip, monitor, retrain_request_extra
    models      bootstrap (SFT of the first champion), champion_dir (the one champion resolver)
    rollouts    toolsets, build_tasks, probe_rollouts
    training    grpo_command (the Ray job), record_training
    evaluation  evaluate, validate_evals
    promotion   cost, gate, move_aliases, rollback
    report      open_run, summarize, format_summary
    simulate    simulate_production (the demo's traffic)
    demo        run_demo: the whole loop in one process, without Airflow

A stage takes `(settings, rd, ...)`: the run's typed settings and its RunDir (tasks.rundir). It never
imports Airflow, so it runs the same in a worker, a Ray job, a test or a notebook; what it returns is
small JSON for the Airflow UI, what it hands the next stage is a file in the run directory. Every stage
that spends compute writes `timings/<stage>.json`, which `cost` prices; every stage that has something
to show logs a nested MLflow run under the pipeline run that `open_run` opens and `summarize` closes.
"""
