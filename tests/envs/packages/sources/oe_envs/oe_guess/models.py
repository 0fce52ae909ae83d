"""The action and observation of the guessing env (OpenEnv's pydantic types)."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class GuessAction(Action):
    guess: int = Field(description="Your guess, an integer from 1 to 100")


class GuessObservation(Observation):
    hint: str = Field(default="", description="'higher', 'lower', 'correct', or the rules at reset")
    guesses: int = Field(default=0, description="Guesses so far")
