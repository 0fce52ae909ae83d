"""The search env's MCP server: BM25 search over a corpus and a reader of its documents.

Run it over stdio with ``python -m gymflow.envs.builtin.search.servers.search [--corpus FILE]``. In a rollout it
starts (possibly from the warm pool) before its corpus is known, so the corpus is loaded on the
first tool call from the file named in ``./corpus.path`` of its working directory (the rollout's
workspace, written by `SearchEnv.init_rollout`), or from ``--corpus``. No network: the corpus is
a local file.

Tools:

* ``search(query, k)``: the `k` best passages (BM25, `gymflow.envs.datagen.index`): document id, title,
  character offset of the passage in the document, score and the passage text.
* ``read(doc_id, offset, length)``: `length` characters of a document from `offset` (at most
  `MAX_READ_CHARS`), with the document's total length, so an agent can page through it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from gymflow.envs.builtin.search.data import read_corpus
from gymflow.envs.datagen.corpus import Chunk, Document, chunk_document
from gymflow.envs.datagen.index import Bm25Index

MAX_K = 20
MAX_READ_CHARS = 8000
CORPUS_POINTER = "corpus.path"

server = MCPServer(
    "search",
    instructions="Search a document collection (search) and read documents (read). Cite the doc_id you used.",
)


@dataclass
class _Corpus:
    docs: dict[str, dict[str, str]]
    chunks: list[Chunk]
    index: Bm25Index


_state: dict[str, Any] = {"path": None, "corpus": None}


def load(path: Path) -> _Corpus:
    """Index a corpus.jsonl (passages of 200 tokens, 40 shared)."""
    docs = {d["id"]: d for d in read_corpus(path)}
    chunks: list[Chunk] = []
    for doc in docs.values():
        document = Document(id=doc["id"], title=doc["title"], text=doc["text"], sha256="", bytes=0)
        chunks += chunk_document(document, chunk_tokens=200, overlap_tokens=40)
    return _Corpus(docs, chunks, Bm25Index([c.text for c in chunks]))


def _corpus() -> _Corpus:
    if _state["corpus"] is None:
        path = _state["path"]
        if path is None:
            pointer = Path(CORPUS_POINTER)
            if not pointer.is_file():
                raise ToolError("no corpus is loaded for this rollout")
            path = Path(pointer.read_text().strip())
        _state["corpus"] = load(path)
    corpus: _Corpus = _state["corpus"]
    return corpus


@server.tool()
def search(query: str, k: int = 5) -> dict[str, Any]:
    """Search the collection; returns the best passages with their document ids.

    Args:
        query: Keywords or a question.
        k: How many passages (1-20).
    """
    if not query.strip():
        raise ToolError("query is empty")
    if not 1 <= k <= MAX_K:
        raise ToolError(f"k must be between 1 and {MAX_K}")
    corpus = _corpus()
    hits = []
    for hit in corpus.index.search(query, k):
        chunk = corpus.chunks[hit.position]
        hits.append(
            {
                "doc_id": chunk.doc_id,
                "title": corpus.docs[chunk.doc_id]["title"],
                "offset": chunk.char_start,
                "score": round(hit.score, 4),
                "text": chunk.text,
            }
        )
    return {"query": query, "hits": hits}


@server.tool()
def read(doc_id: str, offset: int = 0, length: int = 2000) -> dict[str, Any]:
    """Read part of a document.

    Args:
        doc_id: A document id from search results.
        offset: First character to read.
        length: Characters to read (at most 8000).
    """
    corpus = _corpus()
    doc = corpus.docs.get(doc_id)
    if doc is None:
        raise ToolError(f"unknown doc_id {doc_id!r}: use an id from search results")
    text = doc["text"]
    if not 0 <= offset <= len(text):
        raise ToolError(f"offset must be between 0 and {len(text)}")
    if length < 1:
        raise ToolError("length must be at least 1")
    length = min(length, MAX_READ_CHARS)
    return {
        "doc_id": doc_id,
        "title": doc["title"],
        "offset": offset,
        "text": text[offset : offset + length],
        "total_chars": len(text),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, help="corpus.jsonl to serve (default: ./corpus.path names it)")
    args = parser.parse_args(argv)
    _state["path"] = args.corpus
    server.run()


if __name__ == "__main__":
    main()
