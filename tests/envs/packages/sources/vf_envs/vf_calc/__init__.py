"""Tool use: a verifiers taskset whose task brings an MCP toolset (`@vf.tool` methods)."""

import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.ToolsetConfig, vf.State]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class CalcData(vf.TaskData):
    answer: str


class CalcTask(vf.Task[CalcData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, task: CalcData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.25)
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages) > 0)


class CalcTaskset(vf.Taskset[CalcTask, vf.TasksetConfig]):
    """Add two numbers with the calculator tool; answer with the number only."""

    def load(self):
        for a, b in [(123, 456), (1000, 2024), (-5, 12)]:
            yield CalcTask(
                CalcData(id=f"calc-{a}-{b}", prompt=f"Use the tool: what is {a} + {b}?", answer=str(a + b)),
                self.config.task,
            )


__all__ = ["CalcTaskset"]
