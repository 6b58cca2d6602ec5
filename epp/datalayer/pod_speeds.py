"""A pod's smoothed speed figures (epp/datalayer/pool.py keeps one set per pod): TTFT and TPOT
from this EPP's requests and the scrapes' histograms, and the prefill figures of
epp/datalayer/prefill_pace.py. Each figure ages: its weight halves every half-life without
observations and it is forgotten after SPEED_EXPIRY_HALF_LIVES of them (`Pool.snapshot` reads
it so, inline), so a pod that was slow once and then got no traffic is unknown again, not slow
forever."""

from __future__ import annotations

from dataclasses import dataclass, field

from epp.datalayer.endpoint_records import MAX_COUNT, MIN_PREFILL_TPS, usable_speed

# Weight of the newest sample in the smoothed per-pod speed figures.
SPEED_EWMA_ALPHA = 0.2
# Speed observations lose half their weight per half-life (configurable: scrape.speedHalfLifeMs)
# and are forgotten after this many half-lives without a new one.
DEFAULT_SPEED_HALF_LIFE_S = 10.0
SPEED_EXPIRY_HALF_LIVES = 4.0
# A pod's prefill pace is the best recent one, halving every this many speed half-lives.
PACE_PEAK_HALF_LIVES = 3.0


@dataclass(slots=True)
class Speed:
    """One smoothed speed figure whose weight halves every half-life without observations."""

    value: float | None = None
    at: float = 0.0  # monotonic time of the last observation

    def observe(self, sample: float, now: float, half_life_s: float) -> None:
        old, age = self.value, now - self.at
        if old is None or age >= SPEED_EXPIRY_HALF_LIVES * half_life_s:
            self.value = sample
        else:
            keep = (1.0 - SPEED_EWMA_ALPHA) * 0.5 ** (max(0.0, age) / half_life_s)
            self.value = sample + keep * (old - sample)
        self.at = now


@dataclass(slots=True)
class Peak(Speed):
    """A pod's prefill pace: the best recent sample, decaying by half every
    PACE_PEAK_HALF_LIVES speed half-lives, forgotten like a speed.

    An interval's tokens / prefill seconds follows its prompt mix: short prompts each take a
    whole engine step whatever their length (the step is bound by the batch's decode, not by
    their few tokens), long ones run at the GPU's compute pace. Identical H100 pods read 3.6k to
    14.4k tokens/s by their last second's mix (bursty, /debug/pool), and the smoothed figure
    drew the long prompts to the pod that had just had long prompts. The best recent sample is
    that GPU's compute pace on long prompts, which the scorer wants for the tokens; a short
    prompt's floor of one engine step is the scorer's too (`predicted-ttft`)."""

    def observe(self, sample: float, now: float, half_life_s: float) -> None:
        old, age = self.value, now - self.at
        if old is None or age >= SPEED_EXPIRY_HALF_LIVES * half_life_s:
            self.value = sample
        else:
            decayed = old * 0.5 ** (max(0.0, age) / (PACE_PEAK_HALF_LIVES * half_life_s))
            self.value = sample if sample > decayed else decayed
        self.at = now


@dataclass(slots=True)
class PodSpeeds:
    """One pod's figures; unusable samples are ignored (a NaN folded into an EWMA would poison
    it for good)."""

    ttft: Speed = field(default_factory=Speed)
    tpot: Speed = field(default_factory=Speed)
    prefill_tps: Peak = field(default_factory=Peak)
    uncached: Speed = field(default_factory=Speed)
    prompt_tokens: Speed = field(default_factory=Speed)

    def observe(self, ttft: float | None, tpot: float | None, now: float, half_life_s: float) -> None:
        ttft, tpot = usable_speed(ttft), usable_speed(tpot)
        if ttft is not None:
            self.ttft.observe(ttft, now, half_life_s)
        if tpot is not None:
            self.tpot.observe(tpot, now, half_life_s)

    def observe_prefill(
        self,
        tokens_per_s: float,
        uncached_fraction: float | None,
        mean_prompt_tokens: float | None,
        now: float,
        half_life_s: float,
    ) -> None:
        if MIN_PREFILL_TPS <= tokens_per_s <= MAX_COUNT:  # False for NaN
            self.prefill_tps.observe(tokens_per_s, now, half_life_s)
        if uncached_fraction is not None and 0.0 <= uncached_fraction <= 1.0:
            self.uncached.observe(uncached_fraction, now, half_life_s)
        if mean_prompt_tokens is not None and 0.0 <= mean_prompt_tokens <= MAX_COUNT:  # False for NaN
            self.prompt_tokens.observe(mean_prompt_tokens, now, half_life_s)
