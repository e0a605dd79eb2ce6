"""What ``sim plan`` searches for a strategy: the vocabulary of its hook, and the core layouts.

A strategy that can be planned declares its knobs to search and, per device, its *knob
families* (:meth:`~sim.engine.strategies.base.Strategy.plan_space`): each family a list of
partial knob settings that replace one another (a family's knobs are the keys its
settings set; a setting without one of them leaves that knob at the strategy's default).
:func:`core_layouts` is the family of thread placements any strategy with
``compute_cores``/``io_cores`` knobs can offer.
"""

from __future__ import annotations

import json
from typing import Any

from sim.profiles.device import DeviceProfile

Setting = dict[str, Any]  # a partial knob setting
Family = tuple[str, list[Setting]]  # a family's name and its settings, the strategy's default first


def family_knobs(settings: list[Setting]) -> set[str]:
    """The knobs a family sets: choosing one of its settings replaces all of them."""
    return {knob for setting in settings for knob in setting}


def core_layouts(device: DeviceProfile) -> list[Setting]:
    """Thread layouts worth trying: the strategy default, then one I/O core per speed class.

    The I/O thread runs on a core of its own ([PI2 §5]); 4 KiB reads are as fast as the
    issuing core ([PI2 §2.3]), so for each distinct I/O speed the cluster whose cores
    compute slowest gives up one core, and the slowest (little) cluster either computes
    too or stays out.
    """
    clusters = device.cpu.clusters
    slowest = min(clusters, key=lambda c: c.int8_gops)
    by_speed: dict[float, Any] = {}
    for c in clusters:
        cur = by_speed.get(c.io_4k_gbps)
        if cur is None or c.int8_gops < cur.int8_gops:
            by_speed[c.io_4k_gbps] = c
    layouts: list[Setting] = [{}]
    seen: set[str] = set()
    for io in sorted(by_speed.values(), key=lambda c: -c.io_4k_gbps):
        for with_slowest in (False, True):
            compute: list[str] = []
            for c in clusters:
                if c is slowest and not with_slowest and c is not io:
                    continue
                n = c.cores - (1 if c is io else 0)
                if c is slowest and not with_slowest:
                    n = 0
                compute += [c.name] * n
            key = json.dumps([compute, io.name])
            if compute and key not in seen:
                seen.add(key)
                layouts.append({"compute_cores": compute, "io_cores": [io.name]})
    return layouts
