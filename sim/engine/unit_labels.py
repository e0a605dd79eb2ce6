"""The units of a simulated phone by name: thread labels and the accelerator a name means.

Busy time, spans and utilisation are keyed by a unit label (``cpu:big0``, ``io0:mid-hi``,
``npu``, ``storage``); energy and a sweep's per-kind columns must read a thread's CPU
cluster back from its label, and strategies' unit knobs (``cpu``, ``gpu``, ``npu``) must
find the profile they mean. Both live here so neither needs the simulation machine.
"""

from __future__ import annotations

import re

from sim.profiles.device import Accelerator, DeviceProfile


def compute_label(cluster: str, index: int) -> str:
    """A compute thread's unit label, ``cpu:big0``; a cluster whose name ends in a digit or a
    dash gets a dash before the index (``cpu:x4-0``), so :func:`unit_kind` can read it back."""
    return f"cpu:{cluster}{'-' if cluster[-1:].isdigit() or cluster.endswith('-') else ''}{index}"


def io_label(index: int, cluster: str) -> str:
    return f"io{index}:{cluster}"


_COMPUTE = re.compile(r"cpu:(.+?)-?(\d+)")
_IO = re.compile(r"io(\d+):(.+)")


def unit_kind(unit: str) -> tuple[str, str | None]:
    """(the kind of a unit label, its CPU cluster or None): ``cpu:mid-hi2`` -> (``cpu:mid-hi``,
    ``mid-hi``), ``io0:big`` -> (``io:big``, ``big``), ``npu`` -> (``npu``, None). Thread
    labels carry an index per thread; a kind groups the threads of one cluster."""
    m = _COMPUTE.fullmatch(unit)
    if m:
        return f"cpu:{m.group(1)}", m.group(1)
    m = _IO.fullmatch(unit)
    if m:
        return f"io:{m.group(2)}", m.group(2)
    return unit, None


def accelerator(device: DeviceProfile, unit: str) -> Accelerator | None:
    """The profile of accelerator ``unit`` (``gpu`` or ``npu``) on ``device``; None for the CPU
    or a unit the phone lacks."""
    return {"gpu": device.gpu, "npu": device.npu}.get(unit)
