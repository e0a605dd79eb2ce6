"""Measure the device this runs on and write it as a device profile (`sim profile-device`).

Each module measures one part with Python and numpy (and the numba the simulator already
needs) so that it runs on the device itself (Linux, Android under Termux, macOS):
:mod:`~sim.profiling.topology` reads the CPU clusters, :mod:`~sim.profiling.storage` the
flash's read curves, :mod:`~sim.profiling.dram` the streaming bandwidth,
:mod:`~sim.profiling.cpu` the kernels the engine charges; :mod:`~sim.profiling.runner`
runs them in order and :mod:`~sim.profiling.writer` turns the figures into a profile whose
every number says ``measured: <date>, <method>``.
"""
