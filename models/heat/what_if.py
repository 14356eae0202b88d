"""`preheat simulate heat` asked of the lake: one tenant's key heat rolled forward by a heat GAN,
with and without events, and how the tenant's warm-up plan moves (`models.heat.simulate`).

The GAN is a saved file or the registry's champion; it is simulated on the demand series of the
granularity it was trained on, over as many keys as it was trained with (`top_k` in its
metadata). One tenant at a time, never several at once: one tenant's plan must not be shaped by
another's keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from data_contracts.derived import read_demand
from models.heat.gan import HeatGan
from models.heat.simulate import Event, Simulation


def load_simulator(model: Path | None, tracking_uri: str) -> tuple[HeatGan, dict[str, Any], str]:
    """A saved GAN file, else the registry's champion: (module, metadata, where from).

    Raises:
        ValueError: `model` is not a file, or not a saved heat GAN.
        LookupError: no champion is registered (the message says what to run).
    """
    from models.heat.gan import load_gan
    from models.heat.registry import MODEL_NAME, load_champion_gan

    if model is not None:
        if not model.is_file():
            raise ValueError(f"--model {model}: no such file")
        try:
            module, meta = load_gan(model)
        except (OSError, RuntimeError, KeyError, TypeError) as err:
            raise ValueError(f"--model {model}: not a saved heat GAN ({err})") from None
        return module, meta, str(model)
    module, meta, version = load_champion_gan(tracking_uri)
    return module, meta, f"models:/{MODEL_NAME}@champion (version {version})"


def one_tenant(demand: pd.DataFrame, tenant: str | None, where: str) -> str:
    """The tenant to simulate: the one asked for, or the only one there is.

    Raises:
        LookupError: no tenant at all, several and none asked for, or the asked one is missing.
    """
    tenants = sorted(str(t) for t in demand["tenant"].unique())
    if not tenants:
        raise LookupError(f"no {where}: run `preheat ingest` and `preheat features` first")
    if tenant is None:
        if len(tenants) > 1:
            raise LookupError(f"{where} has several tenants ({', '.join(tenants)}): pick --tenant")
        return tenants[0]
    if tenant not in tenants:
        raise LookupError(f"no tenant {tenant!r} in {where}; there are: {', '.join(tenants)}")
    return tenant


def simulate_tenant(
    module: HeatGan, meta: dict[str, Any], data_dir: Path, tenant: str | None,
    events: Sequence[Event], paths: int, horizon: int | None, top_k: int, seed: int,
) -> tuple[Simulation, dict[str, Any]]:  # fmt: skip
    """Simulate `tenant`'s keys (see `one_tenant`) from the lake's features under `data_dir`;
    returns the simulation and what `preheat simulate heat --json` prints of it (all but the
    model's source and the plot, which are the caller's).

    Raises:
        LookupError: no such tenant, or several to choose from (`one_tenant`).
        ValueError: an event on a key that is not simulated, or bad sizes (`simulate`).
    """
    from models.heat.registry import heat_panel
    from models.heat.simulate import simulate

    granularity = str(meta.get("granularity", "3min"))
    demand = read_demand(Path(data_dir) / "features", granularity)
    tenant = one_tenant(demand, tenant, f"{granularity} demand under {data_dir}")
    demand = demand[demand["tenant"] == tenant]
    panel = heat_panel(demand, module.config.half_life_buckets, int(meta.get("top_k", 100)))
    result = simulate(module, panel.heat, panel.keys, paths, horizon, list(events), top_k, seed)
    width = panel.starts[1] - panel.starts[0] if len(panel.starts) > 1 else None
    return result, {
        "tenant": tenant, "granularity": granularity,
        "from_bucket": str(panel.starts[-1] + width) if width is not None else None,
        "keys": len(panel.keys), "paths": paths, "horizon": result.baseline.shape[2],
        "events": [{"at": e.at, "key": e.key, "delta": e.delta} for e in events],
        "sensitivity": result.summary,
    }  # fmt: skip
