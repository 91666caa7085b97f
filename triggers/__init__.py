"""Evergreen's Airflow triggers: serializable, run by the triggerer for deferred tasks.

    ray_job.RayJobTrigger   follows one Ray job, streams its log lines, fires when it ends (RayJobOperator)

Their kwargs are stored in the metadata database: they carry connection ids, URLs and file paths,
never credentials (the trigger resolves those itself, through hooks/, in the triggerer).
"""
