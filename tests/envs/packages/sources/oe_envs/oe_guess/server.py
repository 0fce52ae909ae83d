"""The env's OpenEnv server app (what `uvicorn oe_guess.server:app` serves)."""

from openenv.core.env_server.http_server import create_app

from oe_guess.environment import GuessEnvironment
from oe_guess.models import GuessAction, GuessObservation

app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess")
