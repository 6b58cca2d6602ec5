"""Scheduling: pure functions from (request, pool snapshot) to ranked endpoints.

The seam the EPP servicer calls is `Scheduler.pick`; see `base.py`.
"""
