"""The calculator MCP server: tools over an in-memory client, and once as a real subprocess."""

import sys
import time

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent

from gymflow.envs.builtin.math.servers.calculator import evaluate_expression

TOOLS = {"add", "subtract", "multiply", "divide", "power", "sqrt", "evaluate"}


def _text(result: CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def test_lists_all_tools_with_descriptions(calculator: Client) -> None:
    listed = await calculator.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    assert all(t.description for t in listed.tools)
    add = next(t for t in listed.tools if t.name == "add")
    assert add.input_schema["required"] == ["a", "b"]
    assert calculator.instructions


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("add", {"a": 1, "b": 2}, 3),
        ("add", {"a": 0.1, "b": 0.2}, 0.3),
        ("subtract", {"a": 3, "b": 10}, -7),
        ("multiply", {"a": 2.5, "b": 4}, 10),
        ("divide", {"a": 7, "b": 2}, 3.5),
        ("divide", {"a": 6, "b": 3}, 2),
        ("divide", {"a": 1, "b": 3}, 1 / 3),
        ("power", {"base": 2, "exponent": 10}, 1024),
        ("power", {"base": 2, "exponent": -2}, 0.25),
        ("power", {"base": 9, "exponent": 0.5}, 3),
        ("sqrt", {"x": 16}, 4),
        ("sqrt", {"x": 2}, 2**0.5),
        ("evaluate", {"expression": "(12 + 7) * 3 - 4"}, 53),
    ],
)
async def test_tool_results(calculator: Client, tool: str, arguments: dict[str, float], expected: float) -> None:
    result = await calculator.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content == {"result": expected}
    assert type(result.structured_content["result"]) is type(expected)
    assert _text(result) == str(expected)


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("divide", {"a": 1, "b": 0}, "division by zero"),
        ("sqrt", {"x": -1}, "negative"),
        ("power", {"base": 9, "exponent": 387420489}, "exponent too large"),
        ("power", {"base": 10, "exponent": 400}, "too large"),
        ("power", {"base": -8, "exponent": 0.5}, "not a real number"),
        ("power", {"base": 0, "exponent": -1}, "division by zero"),
        ("multiply", {"a": 1e200, "b": 1e200}, "too large"),
        ("evaluate", {"expression": "2 +"}, "cannot parse"),
        ("evaluate", {"expression": "9**9**9"}, "exponent too large"),
    ],
)
async def test_model_visible_errors(calculator: Client, tool: str, arguments: dict[str, float], message: str) -> None:
    result = await calculator.call_tool(tool, arguments)
    assert result.is_error
    assert message in _text(result)


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("add", {"a": "x", "b": 1}),
        ("add", {"a": [1], "b": 1}),
        ("add", {"a": 1}),
        ("sqrt", {"x": {"v": 1}}),
        ("evaluate", {"expression": 5}),
    ],
)
async def test_wrong_argument_types_are_rejected_by_the_sdk(
    calculator: Client, tool: str, arguments: dict[str, object]
) -> None:
    result = await calculator.call_tool(tool, arguments)
    assert result.is_error
    assert "validation error" in _text(result)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("-(3 - 5)", 2),
        ("+4", 4),
        ("7 / 2", 3.5),
        ("2 ** 3 ** 2", 512),
        ("2 ^ 10", 1024),
        ("sqrt(16) / 2", 2),
        ("sqrt(2) ** 2", 2.0000000000000004),
        ("0.1 + 0.2", 0.3),
        ("1e3 + 1", 1001),
        ("10 ** -400", 0),
    ],
)
def test_evaluate_expression(expression: str, expected: float) -> None:
    assert evaluate_expression(expression) == expected


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "x + 1",
        "abs(-1)",
        "sqrt(1, 2)",
        "'a' * 3",
        "[1, 2]",
        "1 if 1 else 2",
        "(1).real",
        "1 // 2",
        "1j",
        "True + 1",
        "1e400",
        "1 / 0",
        "(-8) ** (1 / 3)",
        "9 ** 9 ** 9",
        "10 ** 10 ** 3",
        "(" * 500 + "1" + ")" * 500,
        "1 + " * 300 + "1",
    ],
)
async def test_evaluate_refuses_quickly(calculator: Client, expression: str) -> None:
    start = time.monotonic()
    result = await calculator.call_tool("evaluate", {"expression": expression})
    assert result.is_error
    # A ToolError message, not the SDK's generic "Error executing tool evaluate" for a crash.
    assert _text(result).startswith("Error executing tool evaluate: ")
    assert time.monotonic() - start < 5


async def test_runs_as_a_stdio_subprocess() -> None:
    params = StdioServerParameters(command=sys.executable, args=["-m", "gymflow.envs.builtin.math.servers.calculator"])
    async with Client(params) as client:
        listed = await client.list_tools()
        assert {t.name for t in listed.tools} == TOOLS
        result = await client.call_tool("multiply", {"a": 6, "b": 7})
        assert not result.is_error
        assert result.structured_content == {"result": 42}
        failed = await client.call_tool("divide", {"a": 1, "b": 0})
        assert failed.is_error
        assert "division by zero" in _text(failed)
