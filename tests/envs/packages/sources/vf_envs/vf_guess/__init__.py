"""Multi-turn: an `Env` whose `run()` answers each guess "higher" or "lower" until it is right."""

import re

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def found(self, task: GuessData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == str(task.secret))

    @vf.reward(weight=0.1)
    async def quick(self, trace: vf.Trace) -> float:
        return max(0.0, 1.0 - 0.1 * (trace.num_turns - 1))


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    """Guess the number between 1 and 100; the env says higher or lower."""

    def load(self):
        for secret in (37, 81, 5):
            prompt = "I am thinking of a number between 1 and 100. Reply with one guess, the number only."
            yield GuessTask(GuessData(id=f"guess-{secret}", prompt=prompt, secret=secret), self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as chat:
            segment = await chat.turn()
            while chat.trace.num_turns < 8:  # the live trace: the exchange so far
                found = re.search(r"-?\d+", chat.trace.last_reply)
                if found is None or int(found.group()) == task.data.secret:
                    return
                segment = await chat.turn("higher" if int(found.group()) < task.data.secret else "lower")
                if segment.terminated:
                    return


__all__ = ["GuessEnv", "GuessTaskset"]
