"""Scheduling: pure functions from (request, pool snapshot) to ranked endpoints.

The seam the EPP servicer calls is `Scheduler.pick` (see `decision.py`); `WeightedScheduler`
is the score-based implementation; every filter, scorer and picker is one row of the plugin
catalogue (gateway/plugin_catalogue.py, bound to its function by `registry.py`), their
parameters in gateway/scheduling_params.py, profiles (weights per scorer) in gateway/profiles.py.
"""

from epp.datalayer.prefix_index import PrefixIndex, prompt_hashes
from epp.scheduling.decision import Decision, Scheduler
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import BUILTIN_PROFILES, Profile, ProfileError, profile, profiles_from_dict
from gateway.scheduling_params import Thresholds

__all__ = [
    "BUILTIN_PROFILES",
    "Decision",
    "PrefixIndex",
    "Profile",
    "ProfileError",
    "Scheduler",
    "Thresholds",
    "WeightedScheduler",
    "profile",
    "profiles_from_dict",
    "prompt_hashes",
]
