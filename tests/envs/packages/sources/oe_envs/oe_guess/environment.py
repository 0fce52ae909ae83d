"""Guess a number from 1 to 100 (drawn from the reset's seed) in at most 10 tries.

Each wrong guess costs 0.05 and gets a hint; the right one pays 1 and ends the episode.
"""

import random
from typing import Any
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata, State

from oe_guess.models import GuessAction, GuessObservation

MAX_GUESSES = 10


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._secret = 50

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._secret = random.Random(seed).randint(1, 100)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(hint="guess a number from 1 to 100", guesses=0, reward=0.0, done=False)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        n = self._state.step_count
        if action.guess == self._secret:
            return GuessObservation(hint="correct", guesses=n, reward=1.0, done=True)
        hint = "higher" if action.guess < self._secret else "lower"
        return GuessObservation(hint=hint, guesses=n, reward=-0.05, done=n >= MAX_GUESSES)

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="guess", description="Guess a number from 1 to 100 in at most 10 tries; hints say higher or lower."
        )
