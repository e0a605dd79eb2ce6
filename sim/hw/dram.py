"""Shared DRAM bandwidth: what each agent gets when several stream at once.

[PI2 §2.3] measured, on the OnePlus 12 running a 7B model, 43.9 GB/s for the CPU alone,
56 GB/s for the NPU alone and 59.6 GB/s for both together: agents do not add up. Here an
agent alone gets its own measured figure; when several agents are active they share the
device's ``combined_gbps`` in proportion to their solo figures. Within the CPU, active
threads share the CPU's figure, each capped by its core's own reach.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.profiles.device import DeviceProfile


@dataclass(frozen=True)
class DramModel:
    device: DeviceProfile
    _memo: dict[tuple[str, frozenset[str]], float] = field(default_factory=dict, compare=False, repr=False)

    def solo_gbps(self, agent: str) -> float:
        unit = {"cpu": self.device.cpu, "npu": self.device.npu, "gpu": self.device.gpu}[agent]
        if unit is None:
            raise KeyError(agent)
        return unit.mem_gbps

    def agent_gbps(self, agent: str, active: frozenset[str]) -> float:
        """Bandwidth ``agent`` gets while the agents in ``active`` (including it) stream."""
        key = (agent, active)
        if key not in self._memo:  # asked for at every job start: remember the few combinations
            agents = sorted(set(active) | {agent})  # a fixed order keeps the float sum reproducible
            solo = {a: self.solo_gbps(a) for a in agents}
            if len(agents) == 1:
                self._memo[key] = solo[agent]
            else:
                total = min(self.device.dram.combined_gbps, sum(solo.values()))
                self._memo[key] = total * solo[agent] / sum(solo.values())
        return self._memo[key]

    def cpu_thread_shares(self, demands: Sequence[float], active: frozenset[str]) -> list[float]:
        """Bandwidth of each streaming CPU thread, given what each would use (its demand).

        The CPU's figure is split max-min fairly: a thread whose kernel is compute-bound
        (or whose core reaches less) takes only its demand and the rest goes to the
        others. With equal demands this is the equal split of :meth:`cpu_thread_gbps`; an
        equal split regardless of demand would let an extra, slower core take bandwidth a
        faster one needs, so adding cores could slow a phase down.
        """
        return water_fill(self.agent_gbps("cpu", active), demands)

    def cpu_thread_gbps(self, core_gbps: float, active_threads: int, active: frozenset[str]) -> float:
        """One CPU thread's bandwidth with ``active_threads`` CPU threads streaming."""
        cpu_total = self.agent_gbps("cpu", active)
        return min(core_gbps, cpu_total / max(1, active_threads))

    @property
    def peak_gbps(self) -> float:
        return self.device.dram.peak_gbps


def water_fill(total: float, demands: Sequence[float]) -> list[float]:
    """Max-min fair shares of ``total``: nobody gets more than its demand, the rest split evenly."""
    if sum(demands) <= total:
        return list(demands)
    shares = [0.0] * len(demands)
    remaining = total
    order = sorted(range(len(demands)), key=lambda i: demands[i])
    for k, i in enumerate(order):
        share = min(demands[i], remaining / (len(demands) - k))
        shares[i] = share
        remaining -= share
    return shares
