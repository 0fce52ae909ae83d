"""The README stays short and the docs site stays whole.

`mkdocs build --strict` (run by .ci/run after the tests) catches broken links, anchors, snippets
and pages left out of the nav; these checks are the fast part of that, run with every suite, plus
what the build cannot see: the README's length and its command 2, the generated reference pages
covering everything they are generated from, the docs' example programs running as written, and
no development-log wording in what a user reads.
"""

from __future__ import annotations

import asyncio
import os
import re
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import gymflow
from gymflow.envs.envfile import EnvFile
from gymflow.workers.config import Settings
from gymflow.workers.worker import RunningWorker

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MAX_README_LINES = 250
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/python -m pytest"
GENERATED = {
    "reference/configuration.md",
    "reference/cli.md",
    "reference/api.md",
    "reference/file-formats.md",
    "code-map.md",
}
"""Pages docs/gen_reference.py writes at build time (they are in the nav, not in the tree)."""
SNIPPET = re.compile(r'^\s*--8<--\s+"(?P<path>[^"]+)"\s*$', re.MULTILINE)
LOG_WORDING = re.compile(r"\b(this stop|previous stop|the last stop|I changed|I fixed|we changed|this session)\b", re.I)
EXAMPLES = sorted((DOCS / "examples").glob("*.py"))
reference = runpy.run_path(str(DOCS / "gen_reference.py"), run_name="gen_reference")


def nav_pages(entries: Any) -> list[str]:
    """Every page the mkdocs nav names, flattened."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in nav_pages(value)]
    return []


def docs_pages() -> set[str]:
    return {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}


def test_the_readme_is_short_and_keeps_the_test_command() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES, f"README.md has {len(text.splitlines())} lines"
    assert f"```bash\n{TEST_COMMAND}\n```" in text
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert TEST_COMMAND in ci, ".ci/run must run exactly the README's test command"


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), "a page is listed twice"
    assert sorted(docs_pages() - set(listed)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(listed) - docs_pages() - GENERATED) == [], "nav entries without a page"


def test_snippets_name_files_that_exist() -> None:
    included = [
        (page, match["path"]) for page in sorted(DOCS.rglob("*.md")) for match in SNIPPET.finditer(page.read_text())
    ]
    assert included, "no snippet found: the pattern is broken"
    assert [(str(p), path) for p, path in included if not snippet_exists(path)] == []


def snippet_exists(snippet: str) -> bool:
    """A snippet's file exists, and so does its named section (``path:name``, pymdownx.snippets' sections)."""
    path, _, section = snippet.partition(":")
    if not (ROOT / path).is_file():
        return False
    if not section or section.replace(":", "").isdigit():  # whole file, or a line range
        return True
    text = (ROOT / path).read_text()
    return f"--8<-- [start:{section}]" in text and f"--8<-- [end:{section}]" in text


@pytest.mark.parametrize("path", [README, *sorted(DOCS.rglob("*.md"))], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_development_log_wording(path: Path) -> None:
    found = LOG_WORDING.findall(path.read_text())
    assert not found, f"{path.relative_to(ROOT)}: write for a user, not a log of the work: {found}"


def test_the_configuration_reference_has_every_setting() -> None:
    page = reference["config_reference"]()
    for name in Settings.model_fields:
        assert f"### `GYMFLOW_{name.upper()}`" in page


def test_the_cli_reference_has_every_command() -> None:
    page = reference["cli_reference"]()
    for path in ["gymflow train launch", "gymflow dataset generate", "gymflow envs show", "gymflow eval"]:
        assert f" {path}\n" in page and f"usage: {path} " in page
    assert page.count("usage: gymflow") == len(list(reference["subcommands"](reference_parser(), "gymflow")))


def reference_parser() -> Any:
    from gymflow.workers.cli.main import build_parser

    return build_parser()


def test_the_api_reference_has_every_public_name() -> None:
    page = reference["api_reference"]()
    for name in gymflow.__all__:
        value = getattr(gymflow, name)
        assert f"::: {value.__module__}.{value.__qualname__}\n" in page or f"### {name}\n" in page, name


def test_the_file_formats_reference_has_every_env_file_key() -> None:
    page = reference["formats_reference"]()
    for name, field in EnvFile.model_fields.items():
        assert f"| `{field.alias or name}` |" in page


def test_the_docs_examples_are_shown_in_the_docs() -> None:
    text = "".join(page.read_text() for page in DOCS.rglob("*.md"))
    for path in EXAMPLES:
        assert f'--8<-- "{path.relative_to(ROOT)}"' in text, f"{path.name} is shown nowhere"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
@pytest.mark.heavy
async def test_docs_example_runs_as_written(
    path: Path, worker: RunningWorker, temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    environ = {
        **os.environ,
        "GYMFLOW_TEMPORAL_ADDRESS": temporal_address,
        "GYMFLOW_TASK_QUEUE": worker.task_queue,
        "GYMFLOW_MODEL_URL": calculator_policy_url,
        "GYMFLOW_DATA_DIR": str(tmp_path / "data"),
    }
    # Asynchronously: the worker and the policy server answer from this event loop meanwhile.
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(path), cwd=tmp_path, env=environ,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 100)
    assert process.returncode == 0, (
        f"{path.name} exited {process.returncode}:\n{out.decode()[-1000:]}\n{err.decode()[-3000:]}"
    )
    assert "Traceback" not in err.decode(), err.decode()[-3000:]
