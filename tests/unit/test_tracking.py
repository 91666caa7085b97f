"""Credentials never leave the process through params or tags: tasks.tracking.redact/flatten."""

from tasks.config import load_settings
from tasks.tracking import flatten, redact


def test_secret_like_keys_are_redacted_and_url_userinfo_is_removed():
    assert redact("aws_secret_access_key", "abc") == "***"
    assert redact("mlflow.token", "t0k") == "***"
    assert redact("db.password", None) is None
    assert redact("tracking.uri", "http://user:pass@host:5000/x") == "http://***@host:5000/x"
    assert redact("grpo.lr", 0.001) == 0.001
    # figures whose names contain "token" are not secrets
    assert redact("env.max_tokens_per_turn", 96) == 96 and redact("trained_tokens", 5354) == 5354
    assert redact("github_token", "x") == "***" and redact("s3.api_token", "x") == "***"


def test_flatten_settings_keeps_every_field_under_a_dotted_name():
    flat = flatten(load_settings(environ={}).model_dump(mode="json"))
    assert flat["grpo.lr"] == load_settings(environ={}).grpo.lr
    assert "drift.alpha" in flat and "promotion.min_gain" in flat
    assert flat["env.max_tokens_per_turn"] == load_settings(environ={}).env.max_tokens_per_turn
    assert not any(isinstance(v, dict) for v in flat.values())
    nested = flatten({"s3": {"endpoint": "https://k:s@minio:9000", "secret_key": "s"}})
    assert nested == {"s3.endpoint": "https://***@minio:9000", "s3.secret_key": "***"}
