"""Calibration: named unknowns (unknowns.py), fitted on published points (fit.py,
calibration.py), applied to runs (apply.py)."""
