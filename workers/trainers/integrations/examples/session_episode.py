from gymflow.activities.session_schema import SessionInput
from gymflow.envs.contract import Task
from gymflow.workers.client import connect
from gymflow.workers.sdk.sessions import start_session


async def play_one_episode(address: str, *, task_queue: str = "gymflow") -> float:
    """The trainer generates; gymflow runs the tools and scores. Returns the episode's reward."""
    client = await connect(address)
    task = Task(id="add-2-3", prompt="What is 2 + 3?", ground_truth="5")
    session = await start_session(client, SessionInput(env="math", task=task), task_queue=task_queue)
    first = await session.reset()  # the tools, the system prompt, the first observation
    assert first.messages[-1].content == "What is 2 + 3?"
    # ... your inference engine generates from first.messages and first.tools ...
    step = await session.step(text='<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')
    assert step.observations[0].content == "5" and not step.done
    step = await session.step(text="<answer>5</answer>")
    trajectory = await session.close()  # the whole episode, as any rollout's trajectory
    assert step.done and step.reward is not None and trajectory.reward == step.reward
    return step.reward.total
