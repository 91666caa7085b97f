"""Cost ledger and price table (tasks/promotion/cost.py), checked against hand-computed figures."""

import json
import re

import pytest

from tasks.config import load_settings
from tasks.promotion.cost import PriceKeyError, PriceTableError, ServingProjection, StageUsage, ledger, load_prices

TABLE = """
currency: USD
cpu:
  test-cpu: {price: 0.05, unit: USD per vCPU-hour, source: "https://example.com/cpu", read_on: "2025-06"}
gpu:
  test-h200: {gpu: H200, price: 4.0, unit: USD per GPU-hour, source: "https://example.com/gpu", read_on: "2025-06"}
  test-h100: {gpu: H100, price: 2.0, unit: USD per GPU-hour, source: "https://example.com/gpu", read_on: "2025-06"}
serving:
  test-serve: {price: 0.10, unit: USD per million tokens, source: "https://example.com/serve", read_on: "2025-06-01"}
"""


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(TABLE)
    return load_prices(path)


def cost_settings(table, **over):
    cost = {
        "prices_file": table.path,
        "cpu_price": "test-cpu",
        "gpu_price": "test-h200",
        "serving_price": "test-serve",
        "traffic_episodes_per_day": 100_000,
        "horizon_days": 30,
        **over,
    }
    return load_settings(environ={}, overrides={"cost": cost}).cost


STAGES = [
    StageUsage("rollout", wall_s=1800, cpus=4, tokens_generated=1_000_000),
    StageUsage("train", wall_s=3600, cpus=2, gpus=1, gpu_type="NVIDIA H200", tokens_trained=400_000),
]


def test_shipped_price_table_has_the_default_keys_and_dated_sources():
    settings = load_settings(environ={}).cost
    prices = load_prices(settings.prices_file)
    assert prices.currency == "USD"
    assert prices.choose("cpu", settings.cpu_price).unit == "USD per vCPU-hour"
    assert prices.choose("gpu", settings.gpu_price).gpu == "H200"
    assert prices.choose("serving", settings.serving_price).price > 0
    every = [p for kind in prices.entries.values() for p in kind.values()]
    assert all(p.source.startswith("https://") and re.match(r"^\d{4}-\d{2}", p.read_on) for p in every)
    gpus = prices.entries["gpu"].values()
    assert {p.gpu for p in gpus} >= {"H100", "H200", "B200"}
    # several list prices for the same GPU, and they differ: which one is chosen matters
    assert len({p.price for p in gpus if p.gpu == "H100"}) >= 3


def test_ledger_matches_hand_computed_figures(table):
    report = ledger(STAGES, cost_settings(table), table, ServingProjection(500, 520), success_gain_points=5.0)
    rollout, train = report["stages"]
    # rollout: 0.5 h x 4 vCPU = 2 vCPU-h x $0.05 = $0.10
    assert rollout["cpu_core_hours"] == pytest.approx(2.0) and rollout["usd"] == pytest.approx(0.10)
    assert rollout["gpu_hours"] == 0 and rollout["gpu_usd"] == 0
    # train: 1 h x 2 vCPU = $0.10, plus 1 GPU-h x $4 = $4.10
    assert train["cpu_core_hours"] == pytest.approx(2.0) and train["gpu_hours"] == pytest.approx(1.0)
    assert train["gpu_usd"] == pytest.approx(4.0) and train["usd"] == pytest.approx(4.10)
    assert report["run_usd"] == pytest.approx(4.20)
    assert report["tokens"] == {"generated": 1_000_000, "trained": 400_000, "total": 1_400_000}
    assert report["usd_per_million_tokens"] == pytest.approx(3.00)  # $4.20 / 1.4M tokens
    # +20 tokens/episode x 100k episodes/day x 30 days = 60M tokens x $0.10/M = $6.00 more to serve
    assert report["serving"]["episodes"] == pytest.approx(3_000_000)
    assert report["serving_delta_usd"] == pytest.approx(6.00)
    assert report["total_usd"] == pytest.approx(10.20)
    assert report["usd_per_success_point"] == pytest.approx(2.04)  # $10.20 / 5 points
    assert report["prices"]["gpu"]["key"] == "test-h200" and report["prices"]["serving"]["read_on"] == "2025-06-01"


def test_serving_savings_are_reported_but_not_credited(table):
    report = ledger(STAGES, cost_settings(table), table, ServingProjection(500, 480), success_gain_points=5.0)
    assert report["serving_delta_usd"] == pytest.approx(-6.00)  # reported: the challenger is cheaper
    assert report["total_usd"] == pytest.approx(report["run_usd"]) == pytest.approx(4.20)  # floored at the run
    assert report["usd_per_success_point"] == pytest.approx(0.84)


@pytest.mark.parametrize("gain", [None, 0.0, -3.0])
def test_no_projection_and_no_gain(table, gain):
    report = ledger(STAGES, cost_settings(table), table, serving=None, success_gain_points=gain)
    assert report["serving"] is None and report["serving_delta_usd"] is None and report["prices"]["serving"] is None
    assert report["total_usd"] == pytest.approx(4.20)
    assert report["usd_per_success_point"] is None


def test_cpu_only_run_needs_no_gpu_price_and_may_have_no_tokens(table):
    settings = cost_settings(table, gpu_price="not-in-the-table")
    report = ledger([StageUsage("eval", wall_s=360, cpus=10)], settings, table)
    assert report["run_usd"] == pytest.approx(0.05)  # 1 vCPU-h
    assert report["prices"]["gpu"] is None and report["usd_per_million_tokens"] is None
    with pytest.raises(PriceKeyError, match=r"no gpu price 'not-in-the-table'.*\['test-h100', 'test-h200'\]"):
        ledger([StageUsage("train", wall_s=60, gpus=1)], settings, table)


def test_gpu_type_that_disagrees_with_the_price_is_refused(table):
    with pytest.raises(ValueError, match=r"held 'NVIDIA H100.*prices a H200.*\['test-h100'\]"):
        ledger([StageUsage("train", wall_s=60, gpus=1, gpu_type="NVIDIA H100 80GB HBM3")], cost_settings(table), table)


def test_choose_unknown_key_lists_the_available_ones(table):
    with pytest.raises(KeyError) as err:
        table.choose("serving", "gpt-9")
    assert str(err.value).startswith("no serving price 'gpt-9'") and "['test-serve']" in str(err.value)
    with pytest.raises(KeyError, match="price kind 'tpu'"):
        table.choose("tpu", "v5e")


def test_load_prices_reports_every_bad_entry(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text("""
currency: EUR
cpu:
  free: {price: 0, unit: USD per vCPU-hour, source: "https://example.com", read_on: "2025-06"}
  per-core: {price: 0.09, unit: USD per core-hour, source: "https://example.com", read_on: "2025-06"}
gpu:
  no-source: {gpu: H100, price: 3.0, unit: USD per GPU-hour, read_on: "2025-06"}
  not-a-url: {gpu: H100, price: 3.0, unit: USD per GPU-hour, source: "the AWS page", read_on: "2025-06"}
  undated: {gpu: H100, price: 3.0, unit: USD per GPU-hour, source: "https://example.com"}
  which-gpu: {price: 3.0, unit: USD per GPU-hour, source: "https://example.com", read_on: "June"}
""")
    with pytest.raises(PriceTableError) as err:
        load_prices(path)
    msg = str(err.value)
    for expected in [
        "currency: must be USD",
        "cpu.free: price must be a number > 0",
        "cpu.per-core: unit must be 'USD per vCPU-hour'",
        "divide an instance-hour price",
        "gpu.no-source: source must be the public URL",
        "gpu.not-a-url: source",
        "gpu.undated: read_on must be the date",
        "gpu.which-gpu: gpu must name the GPU model",
        "gpu.which-gpu: read_on",
        "serving: missing or empty",
    ]:
        assert expected in msg, expected
    assert "has 9 problem(s)" in msg and msg.count("\n  ") == 9  # every problem at once, one per line


def test_load_prices_bad_files(tmp_path):
    with pytest.raises(PriceTableError, match="does not exist: fix cost.prices_file"):
        load_prices(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(PriceTableError, match="must be a mapping"):
        load_prices(tmp_path / "list.yaml")


def test_unquoted_date_is_accepted(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(TABLE.replace('read_on: "2025-06"}', "read_on: 2025-06-15}"))
    assert load_prices(path).choose("cpu", "test-cpu").read_on == "2025-06-15"


@pytest.mark.parametrize(
    "field, value", [("wall_s", -1), ("cpus", float("nan")), ("gpus", -0.5), ("tokens_generated", -10)]
)
def test_stage_usage_rejects_impossible_usage(field, value):
    with pytest.raises(ValueError, match=f"stage 'train': {field} must be"):
        StageUsage("train", **{"wall_s": 10, field: value})


def test_report_is_plain_json_with_the_shipped_table():
    settings = load_settings(environ={}).cost
    prices = load_prices(settings.prices_file)
    report = ledger(STAGES, settings, prices, ServingProjection(310, 295), success_gain_points=6.0)
    assert json.loads(json.dumps(report, allow_nan=False)) == report
    # defaults: c7i at $0.044625/vCPU-h x 4 vCPU-h + p5en-rate H200 at $7.912/GPU-h x 1 GPU-h
    assert report["run_usd"] == pytest.approx(4 * 0.044625 + 7.912)
    assert report["serving_delta_usd"] < 0 and report["total_usd"] == report["run_usd"]
    assert report["prices"]["gpu"]["source"].startswith("https://") and report["prices"]["gpu"]["read_on"]
