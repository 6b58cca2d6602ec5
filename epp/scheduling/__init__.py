"""Scheduling: pure functions from (request, pool snapshot) to ranked endpoints.

The seam the EPP servicer calls is `Scheduler.pick` (decision.py); `WeightedScheduler`
(weighted.py) is the score-based implementation; every filter, scorer and picker is one row of
the plugin catalogue (gateway/plugin_catalogue.py), an object of plugins/ (registry.py builds
them), their parameters in gateway/scheduling_params.py, profiles in gateway/profiles.py.
"""
