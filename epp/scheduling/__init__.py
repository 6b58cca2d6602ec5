"""Scheduling: pure functions from (request, pool snapshot) to ranked endpoints.

The seam the EPP servicer calls is `Scheduler.pick` (see `base.py`); `WeightedScheduler`
is the score-based implementation, `RoundRobinScheduler` the baseline.
"""

from epp.scheduling.base import Decision, RoundRobinScheduler, Scheduler
from epp.scheduling.prefix import PrefixIndex, prompt_hashes
from epp.scheduling.profiles import BUILTIN_PROFILES, Profile, ProfileError, Thresholds, profiles_from_dict
from epp.scheduling.saturation import saturation
from epp.scheduling.weighted import WeightedScheduler

__all__ = [
    "BUILTIN_PROFILES",
    "Decision",
    "PrefixIndex",
    "Profile",
    "ProfileError",
    "RoundRobinScheduler",
    "Scheduler",
    "Thresholds",
    "WeightedScheduler",
    "profiles_from_dict",
    "prompt_hashes",
    "saturation",
]
