"""Cost ledger of a training run: what the run's stages held, priced from a dated price table.

    from tasks.config import load_settings
    from tasks.promotion.cost import StageUsage, ServingProjection, load_prices, ledger
    s = load_settings()
    report = ledger([StageUsage("rollout", wall_s=1800, cpus=8, tokens_generated=2_000_000),
                     StageUsage("train", wall_s=3600, cpus=2, gpus=1, gpu_type="NVIDIA H200", tokens_trained=2_000_000)],
                    s.cost, load_prices(s.cost.prices_file),
                    serving=ServingProjection(champion_tokens_per_episode=310, challenger_tokens_per_episode=295),
                    success_gain_points=6.0)

The price table (include/config/prices.yaml) has three kinds: `cpu` ($ per vCPU-hour), `gpu` ($ per GPU-hour,
each entry naming its GPU) and `serving` ($ per million generated tokens); every entry carries its public
source and the month it was read. The ledger prices *held* resources, not used ones: a stage that holds 4
CPUs on Ray for an hour costs 4 vCPU-hours whether or not they were busy, because that is what a cluster
sized for the run is billed for.

Design choices:
- A "CPU" is one Ray logical CPU = one vCPU (hardware thread), so the table accepts only per-vCPU-hour CPU
  prices; a per-core price would silently be off by the SMT factor.
- The serving projection is signed: (challenger - champion) generated tokens per episode x episodes a day x
  horizon days x price per token. Negative means the challenger is cheaper to serve.
- `total_usd` = run_usd + max(serving_delta_usd, 0). A projected *increase* in serving cost is a real
  liability of promoting and is charged; a projected *saving* is reported but not credited. Three reasons:
  the projection rests on a traffic forecast and on today's episode lengths, which are less certain than
  money already spent; shorter episodes are as often a symptom (the agent gives up sooner) as a virtue, and
  crediting them would pay the gate to promote that; and crediting could take the total to zero or below,
  where "gain per dollar" stops meaning anything. So total_usd >= run_usd always.
- `usd_per_success_point` = total_usd / gain points (percentage points of the target metric); None when the
  gain is missing or not positive (no gain has no price).

Pure Python (yaml only); nothing runs at import time.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from tasks.config_deployment import CostSettings

KINDS = ("cpu", "gpu", "serving")
# One accepted unit per kind: the ledger multiplies the price by exactly this quantity, so a price in any
# other unit (per instance-hour, per core-hour, per thousand tokens) would be silently wrong.
UNITS = {"cpu": "USD per vCPU-hour", "gpu": "USD per GPU-hour", "serving": "USD per million tokens"}
_READ_ON = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")


class PriceTableError(ValueError):
    """The price table cannot be used; the message lists every bad entry and how to fix it."""


class PriceKeyError(KeyError):
    """A price key the table does not have; the message lists the keys it does have."""

    def __str__(self) -> str:  # KeyError would print the message wrapped in quotes
        return str(self.args[0])


@dataclass(frozen=True)
class Price:
    kind: str
    key: str
    price: float
    unit: str
    source: str
    read_on: str
    note: str = ""
    gpu: str | None = None  # GPU model, gpu entries only

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PriceTable:
    currency: str
    entries: dict[str, dict[str, Price]]  # kind -> key -> Price
    path: str = ""

    def choose(self, kind: str, key: str) -> Price:
        if kind not in self.entries:
            raise PriceKeyError(f"price kind {kind!r} is not one of {list(self.entries)}")
        table = self.entries[kind]
        if key not in table:
            raise PriceKeyError(
                f"no {kind} price {key!r} in {self.path or 'the price table'}; available: "
                f"{sorted(table)} (set cost.{kind}_price to one of them, or add the entry)"
            )
        return table[key]


def load_prices(path: str | Path) -> PriceTable:
    """Read and validate a price table; every problem is reported at once, each naming the entry and the fix."""
    path = Path(path)
    if not path.exists():
        raise PriceTableError(f"price table {path} does not exist: fix cost.prices_file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise PriceTableError(f"price table {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise PriceTableError(f"price table {path} must be a mapping with currency, cpu, gpu and serving")
    errors: list[str] = []
    if data.get("currency") != "USD":
        # every figure downstream (gate thresholds, reports) is in dollars; mixing currencies would be silent
        errors.append(f"currency: must be USD (got {data.get('currency')!r}); convert the prices and set currency: USD")
    entries: dict[str, dict[str, Price]] = {}
    for kind in KINDS:
        section = data.get(kind)
        if not isinstance(section, dict) or not section:
            errors.append(f"{kind}: missing or empty; add a `{kind}:` mapping of named entries")
            continue
        entries[kind] = {}
        for key, entry in section.items():
            price = _entry(kind, str(key), entry, errors)
            if price is not None:
                entries[kind][str(key)] = price
    if errors:
        raise PriceTableError(f"price table {path} has {len(errors)} problem(s):\n  " + "\n  ".join(errors))
    return PriceTable(currency="USD", entries=entries, path=str(path))


def _entry(kind: str, key: str, entry: Any, errors: list[str]) -> Price | None:
    where = f"{kind}.{key}"
    if not isinstance(entry, dict):
        errors.append(f"{where}: must be a mapping with price, unit, source, read_on")
        return None
    n = len(errors)
    price: Any = entry.get("price")  # a YAML value, checked below
    # bool is an int in Python; `price: yes` is a typo, not a price
    if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price <= 0:
        errors.append(f"{where}: price must be a number > 0 (got {price!r}); write the list price in {UNITS[kind]}")
    unit: Any = entry.get("unit")
    if unit != UNITS[kind]:
        errors.append(
            f"{where}: unit must be {UNITS[kind]!r} (got {unit!r}); convert the price (e.g. divide an "
            f"instance-hour price by its vCPUs or GPUs) and write that unit"
        )
    source: Any = entry.get("source")
    if not isinstance(source, str) or not re.match(r"^https?://\S+$", source):
        errors.append(f"{where}: source must be the public URL the price was read from (got {source!r})")
    read_on: Any = entry.get("read_on")
    if isinstance(read_on, (_dt.date, _dt.datetime)):  # an unquoted 2025-06-01 arrives as a date
        read_on = read_on.isoformat()[:10]
    if not isinstance(read_on, str) or not _READ_ON.match(read_on):
        errors.append(f"{where}: read_on must be the date the price was read, YYYY-MM or YYYY-MM-DD (got {read_on!r})")
    gpu = entry.get("gpu")
    if kind == "gpu" and (not isinstance(gpu, str) or not gpu.strip()):
        errors.append(f"{where}: gpu must name the GPU model (e.g. gpu: H200) so usage on another GPU is caught")
    if len(errors) > n:
        return None
    return Price(
        kind=kind,
        key=key,
        price=float(price),
        unit=unit,
        source=source,
        read_on=read_on,
        note=str(entry.get("note", "")),
        gpu=gpu if kind == "gpu" else None,
    )


@dataclass
class StageUsage:
    """Resources one stage held: wall time x CPUs (Ray logical CPUs = vCPUs) and GPUs reserved on Ray."""

    stage: str
    wall_s: float
    cpus: float = 0
    gpus: float = 0
    gpu_type: str | None = None  # as the device reports it, e.g. "NVIDIA H200"; checked against the GPU price
    tokens_generated: int = 0
    tokens_trained: int = 0

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpus", "gpus", "tokens_generated", "tokens_trained"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(
                    f"stage {self.stage!r}: {name} must be a finite number >= 0 (got {v!r}); "
                    f"record what the stage actually held"
                )


@dataclass
class ServingProjection:
    """Generated tokens per production episode, measured on the same eval tasks for both models."""

    champion_tokens_per_episode: float
    challenger_tokens_per_episode: float

    def __post_init__(self) -> None:
        for name in ("champion_tokens_per_episode", "challenger_tokens_per_episode"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"serving projection: {name} must be a finite number >= 0 (got {v!r})")


def ledger(
    stages: list[StageUsage],
    cost_settings: CostSettings,
    prices: PriceTable,
    serving: ServingProjection | None = None,
    success_gain_points: float | None = None,
) -> dict:
    """Price the run's stages and the projected serving change; returns a JSON-serialisable report.

    `cost_settings` is `Settings.cost` (price keys, traffic, horizon). `success_gain_points` is the target
    metric's gain in percentage points (difference mean x 100), used only for `usd_per_success_point`.
    """
    cpu_price = prices.choose("cpu", cost_settings.cpu_price)
    # the GPU price is looked up only when a stage held a GPU: a CPU-only deployment needs no GPU entry
    gpu_price = prices.choose("gpu", cost_settings.gpu_price) if any(s.gpus > 0 for s in stages) else None
    rows: list[dict[str, Any]] = []
    for s in stages:
        if s.gpus > 0 and s.gpu_type:
            # looked up above (a stage holds a GPU); a gpu entry names its GPU (load_prices checks it)
            assert gpu_price is not None and gpu_price.gpu is not None
            if gpu_price.gpu.lower() not in s.gpu_type.lower():
                same = sorted(
                    k
                    for k, p in prices.entries["gpu"].items()
                    if p.gpu is not None and p.gpu.lower() in s.gpu_type.lower()
                )
                raise ValueError(
                    f"stage {s.stage!r} held {s.gpu_type!r} GPUs but cost.gpu_price={cost_settings.gpu_price!r} "
                    f"prices a {gpu_price.gpu}; set cost.gpu_price to one of {same or 'a new entry for that GPU'}"
                )
        hours = s.wall_s / 3600
        cpu_core_hours, gpu_hours = s.cpus * hours, s.gpus * hours
        cpu_usd = cpu_core_hours * cpu_price.price
        gpu_usd = gpu_hours * gpu_price.price if gpu_price else 0.0
        rows.append(
            {
                "stage": s.stage,
                "wall_s": float(s.wall_s),
                "cpus": float(s.cpus),
                "gpus": float(s.gpus),
                "gpu_type": s.gpu_type,
                "cpu_core_hours": cpu_core_hours,
                "gpu_hours": gpu_hours,
                "cpu_usd": cpu_usd,
                "gpu_usd": gpu_usd,
                "usd": cpu_usd + gpu_usd,
                "tokens_generated": int(s.tokens_generated),
                "tokens_trained": int(s.tokens_trained),
            }
        )
    run_usd = sum(r["usd"] for r in rows)
    generated = sum(r["tokens_generated"] for r in rows)
    trained = sum(r["tokens_trained"] for r in rows)
    tokens = generated + trained

    serving_report: dict[str, float] | None = None
    serving_delta_usd: float | None = None
    serving_price: Price | None = None
    if serving is not None:
        serving_price = prices.choose("serving", cost_settings.serving_price)
        delta_tokens = serving.challenger_tokens_per_episode - serving.champion_tokens_per_episode
        episodes = cost_settings.traffic_episodes_per_day * cost_settings.horizon_days
        serving_delta_usd = delta_tokens * episodes * serving_price.price / 1e6
        serving_report = {
            "champion_tokens_per_episode": float(serving.champion_tokens_per_episode),
            "challenger_tokens_per_episode": float(serving.challenger_tokens_per_episode),
            "delta_tokens_per_episode": float(delta_tokens),
            "traffic_episodes_per_day": float(cost_settings.traffic_episodes_per_day),
            "horizon_days": float(cost_settings.horizon_days),
            "episodes": float(episodes),
            "usd_per_million_tokens": serving_price.price,
            "serving_delta_usd": serving_delta_usd,
        }
    # savings are reported, not credited (module docstring): total_usd >= run_usd
    total_usd = run_usd + max(serving_delta_usd or 0.0, 0.0)
    gain = None if success_gain_points is None else float(success_gain_points)
    return {
        "currency": prices.currency,
        "stages": rows,
        "cpu_core_hours": sum(r["cpu_core_hours"] for r in rows),
        "gpu_hours": sum(r["gpu_hours"] for r in rows),
        "tokens": {"generated": generated, "trained": trained, "total": tokens},
        "run_usd": run_usd,
        "usd_per_million_tokens": run_usd / tokens * 1e6 if tokens else None,
        "serving": serving_report,
        "serving_delta_usd": serving_delta_usd,
        "total_usd": total_usd,
        "total_rule": "run_usd + max(serving_delta_usd, 0): projected serving savings are reported, not credited",
        "success_gain_points": gain,
        "usd_per_success_point": total_usd / gain if gain is not None and math.isfinite(gain) and gain > 0 else None,
        "prices": {
            "cpu": cpu_price.to_dict(),
            "gpu": gpu_price.to_dict() if gpu_price else None,
            "serving": serving_price.to_dict() if serving_price else None,
        },
        "prices_file": prices.path,
    }
