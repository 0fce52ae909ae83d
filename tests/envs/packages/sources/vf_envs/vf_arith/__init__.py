"""Single-turn arithmetic: a verifiers taskset whose reward reads the model's one reply."""

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: ArithData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.5)
    async def brief(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) <= 8)


class ArithTaskset(vf.Taskset[ArithTask, vf.TasksetConfig]):
    """Add two numbers; answer with the number only."""

    def load(self):
        for a, b in [(2, 3), (17, 25), (40, 2), (9, 99)]:
            yield ArithTask(
                ArithData(
                    id=f"add-{a}-{b}",
                    prompt=f"What is {a} + {b}? Answer with the number only.",
                    answer=str(a + b),
                    system_prompt="You are a careful calculator.",
                ),
                self.config.task,
            )


__all__ = ["ArithTaskset"]
