"""Corpus documents: bytes checked and decoded, HTML reduced to text, text cut into chunks.

Design decisions:

* A bad file is a rejection with a reason, never an exception out of the pipeline:
  `decode_document` returns either a `Document` or a `Rejection` (empty, binary, not UTF-8, too
  large, an unsupported type). Size is checked by the caller before reading (a 50 MB file is
  never read whole), and again here.
* Formats: plain text, Markdown, HTML (tags stripped by the standard library's parser, headings
  kept as Markdown headings, scripts and styles dropped) and PDF-as-text (the output of a PDF
  text extractor: form feeds are page breaks). A binary `.pdf` is refused with the reason: this
  module extracts no PDF text itself.
* Chunks are counted in tokens of a simple word tokenizer (`\\w+` runs and single punctuation
  marks: no model tokenizer is downloaded), `chunk_tokens` long with `overlap_tokens` shared with
  the previous chunk, never crossing a section: each chunk carries its heading trail
  (``Title > Section``), written on its first line, so a passage read alone still says what it
  is about.
* Ids are stable: a document's id is its path relative to the corpus root (or key relative to
  the S3 prefix), a chunk's is ``<doc id>#<index>``, and `char_start` locates it in the text the
  search env's `read` tool serves.
"""

from __future__ import annotations

import hashlib
import re
from html.parser import HTMLParser
from pathlib import PurePosixPath

from pydantic import Field

from gymflow.envs.contract import Wire

TEXT_SUFFIXES = frozenset({".txt", ".text", ".md", ".markdown", ".rst", ".html", ".htm", ".pdftxt"})
"""File types read as documents (anything else in a corpus is rejected as unsupported)."""
DEFAULT_MAX_BYTES = 10 * 1024 * 1024
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_HEADING_RE = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_SNIFF_BYTES = 8192
_SKIPPED = frozenset({"script", "style", "noscript", "template", "title", "head"})


class Document(Wire):
    """One corpus document, decoded to text."""

    id: str
    title: str
    text: str
    sha256: str
    """Digest of the file's bytes (the manifest lists it per document)."""
    bytes: int = Field(ge=0)


class Rejection(Wire):
    """An input that was not used, and why."""

    item: str
    """What was rejected: a document id, ``traces.jsonl:12``, a candidate id."""
    stage: str
    """Where: ``scan``, ``generate``, ``guard``, ``judge``, ``too_easy``, ``dedup``, ``quota``, ..."""
    reason: str
    """A short, countable reason (``binary``, ``not_utf8``, ``answer_not_in_source``...)."""
    detail: str = ""
    """Human-readable specifics."""


class Chunk(Wire):
    """A passage of a document: what questions are generated from and what search returns."""

    id: str
    doc_id: str
    index: int
    heading: str
    """The heading trail, ``Title > Section`` ('' when the document has none)."""
    text: str
    """The passage, its heading trail on the first line when it has one."""
    char_start: int
    """Offset of the passage body in the document's text."""
    split: str = ""
    """``train`` or ``eval``: the split of its document."""


def reject(item: str, stage: str, reason: str, detail: str = "") -> Rejection:
    return Rejection(item=item, stage=stage, reason=reason, detail=detail)


def decode_document(doc_id: str, data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Document | Rejection:
    """Check and decode one file of a corpus.

    Args:
        doc_id: The file's path relative to the corpus root.
        data: Its bytes.
        max_bytes: Larger files are rejected.

    Returns:
        The document, or the reason it cannot be used.
    """
    suffix = PurePosixPath(doc_id).suffix.lower()
    if len(data) > max_bytes:
        return reject(doc_id, "scan", "too_large", f"{len(data)} bytes > limit {max_bytes}")
    if suffix == ".pdf" or data[:5] == b"%PDF-":
        return reject(doc_id, "scan", "pdf_binary", "a PDF file: extract its text first (e.g. pdftotext) as .pdftxt")
    if suffix not in TEXT_SUFFIXES:
        return reject(doc_id, "scan", "unsupported_type", f"suffix {suffix or '(none)'!r}")
    if b"\x00" in data[:_SNIFF_BYTES]:
        return reject(doc_id, "scan", "binary", "NUL bytes in the first 8 KB")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return reject(doc_id, "scan", "not_utf8", f"byte {data[exc.start]:#04x} at offset {exc.start}")
    controls = sum(1 for ch in text[:_SNIFF_BYTES] if ord(ch) < 32 and ch not in "\n\r\t\f")
    if controls > 0.05 * max(len(text[:_SNIFF_BYTES]), 1):
        return reject(doc_id, "scan", "binary", f"{controls} control characters in the first 8 KB")
    if suffix in {".html", ".htm"}:
        text = html_to_text(text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n\n")
    if not text.strip():
        return reject(doc_id, "scan", "empty", "no text")
    if not _TOKEN_RE.search(text):
        return reject(doc_id, "scan", "empty", "no words")
    return Document(
        id=doc_id, title=_title(doc_id, text), text=text, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data)
    )


def _title(doc_id: str, text: str) -> str:
    for line in text.splitlines():
        match = _HEADING_RE.match(line)
        if match:
            return match.group(2).strip()
        if line.strip():
            break
    return PurePosixPath(doc_id).stem.replace("_", " ").replace("-", " ")


class _HtmlText(HTMLParser):
    _BLOCKS = frozenset({"p", "div", "br", "li", "tr", "section", "article", "header", "footer", "table", "ul", "ol"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        del attrs
        if tag in _SKIPPED:
            self._skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self._skip = max(self._skip - 1, 0)
        elif re.fullmatch(r"h[1-6]", tag) or tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data if self.parts and self.parts[-1].startswith("#") else " ".join(data.split(" ")))


def html_to_text(html: str) -> str:
    """The readable text of an HTML page; headings become ``#`` lines."""
    parser = _HtmlText()
    parser.feed(html)
    parser.close()
    lines = [" ".join(line.split()) for line in "".join(parser.parts).splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def tokens(text: str) -> list[str]:
    """The word tokenizer chunk sizes are counted in."""
    return _TOKEN_RE.findall(text)


def _sections(doc: Document) -> list[tuple[str, int, str]]:
    """(heading trail, char offset, body) per section of the document."""
    trail: list[str] = []
    out: list[tuple[str, int, str]] = []
    start, offset = 0, 0
    body: list[str] = []

    def close() -> None:
        text = "".join(body)
        if text.strip():
            out.append((" > ".join(trail), start, text))

    for line in doc.text.splitlines(keepends=True):
        match = _HEADING_RE.match(line.rstrip("\n"))
        if match:
            close()
            level = len(match.group(1))
            trail[level - 1 :] = [match.group(2).strip()]
            body = []
            start = offset + len(line)
        else:
            body.append(line)
        offset += len(line)
    close()
    return out


def chunk_document(doc: Document, *, chunk_tokens: int = 200, overlap_tokens: int = 40) -> list[Chunk]:
    """Cut a document into overlapping passages within its sections.

    Args:
        doc: The document.
        chunk_tokens: Tokens per passage at most (the heading line not counted).
        overlap_tokens: Tokens a passage shares with the one before it in the same section.

    Returns:
        The passages in order.
    """
    if chunk_tokens < 8 or not 0 <= overlap_tokens < chunk_tokens:
        raise ValueError("need chunk_tokens >= 8 and 0 <= overlap_tokens < chunk_tokens")
    chunks: list[Chunk] = []
    for heading, offset, body in _sections(doc):
        spans = [(m.start(), m.end()) for m in _TOKEN_RE.finditer(body)]
        step = chunk_tokens - overlap_tokens
        first = 0
        while first < len(spans):
            last = min(first + chunk_tokens, len(spans)) - 1
            start, end = spans[first][0], spans[last][1]
            passage = body[start:end].strip()
            text = f"{heading}\n{passage}" if heading else passage
            chunks.append(
                Chunk(
                    id=f"{doc.id}#{len(chunks)}",
                    doc_id=doc.id,
                    index=len(chunks),
                    heading=heading,
                    text=text,
                    char_start=offset + start,
                )
            )
            if last == len(spans) - 1:
                break
            first += step
    return chunks
