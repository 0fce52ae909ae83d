"""A BM25 index over passages: the search env's `search` tool and the generator's too-easy check.

bm25s (sparse-matrix BM25, pure Python over numpy/scipy, both already gymflow dependencies) rather
than tantivy: no compiled extension of its own to install on every worker, an index of a few
thousand passages builds in well under a second, and it can be saved and memory-mapped. Lucene's
BM25 variant with k1=1.5, b=0.75, English stopwords, no stemmer (a stemmer would be another
compiled package); queries are tokenized exactly like the passages. Hits with score 0 (no query
term in the passage) are never returned, and ties keep passage order, so a search is a pure
function of the corpus and the query.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Hit:
    """One search result: the passage's position in the index and its score."""

    position: int
    score: float


class Bm25Index:
    """BM25 over a fixed list of texts.

    Args:
        texts: The passages, in the order `Hit.position` refers to.
    """

    def __init__(self, texts: Sequence[str]) -> None:
        import bm25s

        # bm25s sets its logger to DEBUG when imported ("Building index from IDs objects" on every
        # index): back to the level the process configured, as every other library's.
        logging.getLogger("bm25s").setLevel(logging.NOTSET)
        self.size = len(texts)
        self._bm25s = bm25s
        self._retriever = bm25s.BM25(k1=1.5, b=0.75)
        if texts:
            corpus_tokens = bm25s.tokenize(list(texts), stopwords="en", show_progress=False, allow_empty=True)
            self._retriever.index(corpus_tokens, show_progress=False)
            self._vocab = corpus_tokens.vocab

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The best `k` passages for `query` (fewer when fewer contain a query term)."""
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        """`search` for many queries at once (one vectorised retrieval)."""
        if not self.size or not queries:
            return [[] for _ in queries]
        k = max(1, min(k, self.size))
        ids = [self._query_ids(q) for q in queries]
        documents, scores = self._retriever.retrieve(ids, k=k, show_progress=False, n_threads=1)
        out: list[list[Hit]] = []
        for row_docs, row_scores in zip(np.asarray(documents), np.asarray(scores), strict=True):
            hits = [Hit(int(d), float(s)) for d, s in zip(row_docs, row_scores, strict=True) if s > 0]
            hits.sort(key=lambda h: (-h.score, h.position))  # ties in passage order
            out.append(hits)
        return out

    def _query_ids(self, query: str) -> list[str]:
        words = self._bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)[0]
        # Words the corpus never had cannot score; dropping them keeps the query in the vocabulary.
        known = [w for w in words if w in self._vocab]
        return known or ["\x00"]

    def __len__(self) -> int:
        return self.size
