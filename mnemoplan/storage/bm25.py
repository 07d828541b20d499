"""BM25 overlay in Tantivy: one small index per user. The only module that imports tantivy.

One index per user keeps isolation structural (a query can only see its user's
directory; the ``user_id`` term is required as well, as a second fence) and makes
forgetting real: Tantivy cannot be told to merge segments from Python, so deleting a
user removes the directory, and deleting some records rebuilds that user's index
from the log into a fresh directory that replaces the old one. A rebuild, slow on a
large user, runs beside writes: what they add or delete meanwhile is carried over
into the fresh index before it is swapped in.

Queries are never parsed: the text goes through the same analyzer as the documents
and becomes a disjunction of term queries, so ``"``, ``:``, ``AND``, ``*`` or
``user_id:x`` in a question are just words.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import tantivy
from tantivy import Filter, Occur, Query, TextAnalyzerBuilder, Tokenizer

from mnemoplan.model.records import BM25Doc  # what the index takes, named here too
from mnemoplan.storage.locks import KeyedLocks

log = logging.getLogger(__name__)

_ANALYZER_NAME = "mnemo_en"
_WRITER_HEAP = 32_000_000


def _analyzer() -> tantivy.TextAnalyzer:
    return (
        TextAnalyzerBuilder(Tokenizer.simple())
        .filter(Filter.remove_long(40))
        .filter(Filter.lowercase())
        .filter(Filter.ascii_fold())
        .filter(Filter.stopword("english"))
        .filter(Filter.stemmer("english"))
        .build()
    )


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw")
    builder.add_text_field("user_id", tokenizer_name="raw")
    builder.add_text_field("kind", tokenizer_name="raw")
    builder.add_text_field("session", tokenizer_name="raw")
    builder.add_text_field("project", tokenizer_name="raw")
    builder.add_text_field("body", tokenizer_name=_ANALYZER_NAME, index_option="freq")
    return builder.build()


class _UserIndex:
    def __init__(self, path: Path, schema: tantivy.Schema, *, read_only: bool = False) -> None:
        # Tantivy takes a lock file in the index's directory even to read it, so an index in a
        # directory that cannot be written is read from a private copy (it never changes there).
        self.copy = Path(tempfile.mkdtemp(prefix="mnemoplan-bm25-")) if read_only else None
        if self.copy is not None:
            shutil.copytree(path, self.copy, dirs_exist_ok=True)
        else:
            path.mkdir(parents=True, exist_ok=True)
        self.index = tantivy.Index(schema, path=str(self.copy or path), reuse=True)
        self.index.register_tokenizer(_ANALYZER_NAME, _analyzer())
        self.read_only = read_only
        # Opened at the first write: a writer holds ~3 MB and seven threads, a reader 0.4 MB and one
        self._writer: tantivy.IndexWriter | None = None
        self.lock = threading.Lock()
        self.dirty = False
        self.closed = False  # by eviction or a swap: whoever waited for its lock opens it again

    @property
    def writer(self) -> tantivy.IndexWriter:
        """The index's writer, opened now if it has none (under ``lock``)."""
        if self.read_only:
            raise OSError(errno.EROFS, "the BM25 index was opened read-only")
        if self._writer is None:
            self._writer = self.index.writer(heap_size=_WRITER_HEAP, num_threads=1)
        return self._writer

    @property
    def writing(self) -> bool:
        """Whether it holds a writer."""
        return self._writer is not None

    def release_writer(self) -> None:
        """Close the writer of an index with nothing uncommitted (under ``lock``); the next write opens one."""
        if self._writer is not None and not self.dirty:
            self._writer.wait_merging_threads()
            self._writer = None

    def commit(self) -> None:
        self.writer.commit()
        self.index.reload()
        self.dirty = False

    def if_idle(self, act: Callable[[], None]) -> bool:
        """``act()`` under ``lock`` if no one holds it (never waited for); whether it ran."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            act()
        finally:
            self.lock.release()
        return True

    def close(self) -> None:
        if self.dirty:
            self.commit()
        self.release_writer()
        if self.copy is not None:
            shutil.rmtree(self.copy, ignore_errors=True)
        self.closed = True


class BM25Index:
    """Per-user Tantivy indexes under ``root``.

    Args:
        root: Directory holding one sub-directory per user.
        max_open: Indexes kept open (16 were too few for 50 users at once: ~5 ms to open one per recall).
        max_writers: Of those, how many keep a writer (the least recently used idle ones close first).
        read_only: Read the indexes without writing anything in ``root`` (a data directory that
            cannot be written): each is read from a copy, and a write fails with ``OSError``.
    """

    def __init__(self, root: Path, *, max_open: int = 128, max_writers: int = 16, read_only: bool = False) -> None:
        self.root = root
        self.read_only = read_only
        if not read_only:
            root.mkdir(parents=True, exist_ok=True)
        self._schema = _schema()
        self._analyzer = _analyzer()
        self._open: OrderedDict[str, _UserIndex] = OrderedDict()
        self._max_open = min(max_open, 16) if read_only else max_open  # read-only: each one a copy on disk
        self._max_writers = max_writers
        self._lock = threading.RLock()
        self._rebuilds = KeyedLocks()  # one rebuild of a user at a time
        self._touched: dict[str, set[str]] = {}  # ids written while a user's rebuild runs
        self._dropped: set[str] = set()  # users dropped while their rebuild ran
        self._closed = False
        if not read_only:
            self._recover_swaps()

    # -- paths and handles -------------------------------------------------------------

    def _dir(self, user_id: str) -> Path:
        return self.root / hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:32]

    def _recover_swaps(self) -> None:
        """Finish or undo a rebuild that a crash interrupted."""
        for path in self.root.glob("*.new"):
            target = path.with_suffix("")
            if target.exists():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.rename(target)
        for path in self.root.glob("*.old"):
            shutil.rmtree(path, ignore_errors=True)

    def _handle(self, user_id: str, create: bool) -> _UserIndex | None:
        with self._lock:
            handle = self._open.get(user_id)
            if handle is not None:
                self._open.move_to_end(user_id)
                return handle
            path = self._dir(user_id)
            if not create and not path.exists():
                return None
            if self.read_only and not path.exists():
                return None  # nothing to read, and nothing can be written
            handle = _UserIndex(path, self._schema, read_only=self.read_only)
            self._open[user_id] = handle
            while len(self._open) > self._max_open and self._close_idle(but=user_id):
                pass
            return handle

    def _close_idle(self, but: str) -> bool:
        """Close the least recently used open index but ``but``'s that no one uses (one in use, a write
        under way, stays open past ``max_open`` for a while). Under ``_lock``; False if all are in use."""
        for user_id, handle in self._open.items():
            if user_id != but and handle.if_idle(handle.close):
                del self._open[user_id]
                return True
        return False

    def _room_for_writer(self, user_id: str) -> None:
        """Before a write of the user (holding no lock): past ``max_writers`` writers, close those of
        the least recently used indexes with nothing to commit that no one is using (none waited
        for: the bound may be exceeded for a while)."""
        with self._lock:
            if (mine := self._open.get(user_id)) is not None and mine.writing:
                return
            others = [h for u, h in self._open.items() if u != user_id and h.writing]
        for handle in others[: max(0, len(others) - self._max_writers + 1)]:
            handle.if_idle(handle.release_writer)  # a closed one has none left to release

    @contextmanager
    def _locked(self, user_id: str, create: bool) -> Iterator[_UserIndex | None]:
        """A user's open index, its lock held; never one closed while this waited for the lock."""
        while True:
            handle = self._handle(user_id, create)
            if handle is None:
                yield None
                return
            with handle.lock:
                if not handle.closed:
                    yield handle
                    return

    def _close_user(self, user_id: str) -> None:
        with self._lock:
            handle = self._open.pop(user_id, None)
        if handle is not None:
            with handle.lock:
                handle.close()

    def _note(self, user_id: str, ids: Iterable[str]) -> None:
        """Ids written while the user's index is rebuilt (under the handle's lock)."""
        touched = self._touched.get(user_id)
        if touched is not None:
            touched.update(ids)

    # -- writes ------------------------------------------------------------------------

    def _document(self, doc: BM25Doc) -> tantivy.Document:
        return tantivy.Document(
            id=doc.id,
            user_id=doc.user_id,
            kind=doc.kind,
            session=doc.session_id,
            project=doc.project_id,
            body=doc.body,
        )

    def add(self, docs: list[BM25Doc], *, commit: bool = True) -> None:
        """Index documents (replacing any with the same id).

        With ``commit`` they are searchable on return; without, after the next ``commit()``
        (a Tantivy commit costs far more than adding a document).
        """
        by_user: dict[str, list[BM25Doc]] = {}
        for doc in docs:
            by_user.setdefault(doc.user_id, []).append(doc)
        for user_id, user_docs in by_user.items():
            self._room_for_writer(user_id)
            with self._locked(user_id, create=True) as handle:
                assert handle is not None
                for doc in user_docs:
                    handle.writer.delete_documents_by_term("id", doc.id)
                    handle.writer.add_document(self._document(doc))
                handle.dirty = True
                self._note(user_id, (doc.id for doc in user_docs))
                if commit:
                    handle.commit()

    def commit(self, user_id: str) -> None:
        """Make a user's added documents searchable."""
        with self._lock:
            handle = self._open.get(user_id)
        if handle is not None:
            with handle.lock:
                if handle.dirty:
                    handle.commit()

    def delete(self, user_id: str, ids: list[str], *, commit: bool = True) -> int:
        """Delete documents by id (soft: segments keep the bytes until ``rebuild``)."""
        if not ids:
            return 0
        self._room_for_writer(user_id)
        with self._locked(user_id, create=False) as handle:
            if handle is None:
                with self._lock:  # a rebuild may have read them before they left the log
                    self._note(user_id, ids)
                return 0
            searcher = handle.index.searcher()
            present = sum(searcher.doc_freq("id", rid) for rid in ids)
            for rid in ids:
                handle.writer.delete_documents_by_term("id", rid)
            handle.dirty = True
            self._note(user_id, ids)
            if commit:
                handle.commit()
        return present

    def drop_user(self, user_id: str) -> None:
        """Remove a user's index directory entirely (a rebuild running meanwhile is dropped)."""
        with self._lock:
            if user_id in self._touched:
                self._dropped.add(user_id)
        self._close_user(user_id)
        shutil.rmtree(self._dir(user_id), ignore_errors=True)

    def rebuild(self, user_id: str, docs: Callable[[set[str] | None], Iterable[BM25Doc]]) -> int:
        """Replace a user's index with a fresh one holding exactly the user's documents.

        Args:
            user_id: Whose index.
            docs: ``docs(None)`` gives every document of the user; ``docs(ids)`` the current
                documents of those ids (none for a record gone). Both read the source of truth
                when called.

        Writes go on meanwhile, to the old index. The ids they touch are noted from the
        start, before ``docs(None)`` is read; before the swap, under the locks every write
        takes, the fresh index replaces its documents of those ids with ``docs(ids)``. So
        nothing written during a rebuild is lost, and reads see the old index until the
        swap. The new index is written beside the old one and swapped in, so a crash leaves
        either the old or the new index, never a mix. One rebuild of a user runs at a time.
        Returns the documents in the new index (0 when the store closed or the user was
        dropped meanwhile: the old state stands).
        """
        with self._rebuilds.hold(user_id):
            with self._lock:
                if self._closed:
                    return 0
                self._touched[user_id] = set()
            target = self._dir(user_id)
            fresh = target.with_name(target.name + ".new")
            try:
                shutil.rmtree(fresh, ignore_errors=True)
                fresh.mkdir(parents=True)
                index = tantivy.Index(self._schema, path=str(fresh), reuse=False)
                index.register_tokenizer(_ANALYZER_NAME, _analyzer())
                self._write(index, [], docs(None))
                self._carry(index, self._taken(user_id), docs)  # most of them, off the locks
                return self._swap(user_id, index, fresh, docs)
            finally:
                with self._lock:
                    self._touched.pop(user_id, None)
                    self._dropped.discard(user_id)
                shutil.rmtree(fresh, ignore_errors=True)

    def _write(self, index: tantivy.Index, gone: Iterable[str], docs: Iterable[BM25Doc]) -> None:
        writer = index.writer(heap_size=_WRITER_HEAP, num_threads=1)
        for rid in gone:
            writer.delete_documents_by_term("id", rid)
        for doc in docs:
            writer.add_document(self._document(doc))
        writer.commit()
        writer.wait_merging_threads()

    def _taken(self, user_id: str) -> set[str]:
        """The ids noted since the rebuild began or last took them; noting goes on afresh."""
        with self._lock:
            handle = self._open.get(user_id)
            with handle.lock if handle is not None else nullcontext():
                touched, self._touched[user_id] = self._touched[user_id], set()
        return touched

    def _carry(self, index: tantivy.Index, touched: set[str], docs: Callable[[set[str] | None], Iterable[BM25Doc]]) -> None:
        """Replace the fresh index's documents of ids written meanwhile with their current ones."""
        if touched:
            self._write(index, sorted(touched), docs(touched))

    def _swap(
        self, user_id: str, index: tantivy.Index, fresh: Path, docs: Callable[[set[str] | None], Iterable[BM25Doc]]
    ) -> int:
        """Carry the writes made during a rebuild into its fresh index and swap it in."""
        target = self._dir(user_id)
        old = target.with_name(target.name + ".old")
        with self._lock:  # no handle opens meanwhile, and the open one's writes are done
            handle = self._open.get(user_id)
            with handle.lock if handle is not None else nullcontext():
                if self._closed or user_id in self._dropped:
                    return 0
                self._carry(index, self._touched.pop(user_id), docs)  # noting ends
                index.reload()
                count = index.searcher().num_docs
                if handle is not None:
                    del self._open[user_id]
                    handle.close()
                if target.exists():
                    target.rename(old)
                fresh.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        if count == 0:
            self._drop_if_empty(user_id)
        return count

    def _drop_if_empty(self, user_id: str) -> None:
        with self._lock:
            if user_id not in self._open:  # nobody wrote to it since
                shutil.rmtree(self._dir(user_id), ignore_errors=True)

    def ids(self, user_id: str) -> set[str]:
        """Every record id indexed for a user (for repair checks)."""
        handle = self._handle(user_id, create=False)
        if handle is None:
            return set()
        searcher = handle.index.searcher()
        if searcher.num_docs == 0:
            return set()
        hits = searcher.search(Query.all_query(), limit=searcher.num_docs, count=False).hits
        return {searcher.doc(addr)["id"][0] for _, addr in hits}

    def close(self) -> None:
        """Finish merges and release every writer (a rebuild still running is dropped, once
        it stops writing)."""
        with self._lock:
            self._closed = True
            users = list(self._open)
        self._rebuilds.wait_idle()
        for user_id in users:
            self._close_user(user_id)

    # -- reads -------------------------------------------------------------------------

    def terms(self, text: str) -> list[str]:
        """The distinct index terms of a text, in order (stemmed, stop words removed)."""
        seen: dict[str, None] = {}
        for term in self._analyzer.analyze(text):
            seen.setdefault(term, None)
        return list(seen)

    def word_idf(self, user_id: str, words: list[str]) -> list[float]:
        """How rare each word is among a user's documents: BM25's idf, ``ln((N + 1) / (df + 0.5))``
        over its index term(s), 0 for a word the index ignores (a stop word, punctuation).

        A word no document holds gets the highest weight, as it should for the reader of the
        weights: it is the part of the query that only a match in meaning can find.
        """
        handle = self._handle(user_id, create=False)
        searcher = handle.index.searcher() if handle is not None else None
        n = searcher.num_docs if searcher is not None else 0
        out: list[float] = []
        for word in words:
            terms = self.terms(word)
            if not terms:
                out.append(0.0)
                continue
            df = max(searcher.doc_freq("body", t) for t in terms) if searcher is not None else 0
            out.append(max(math.log((n + 1) / (df + 0.5)), 0.0))
        return out

    def score_unindexed(self, user_id: str, text: str, docs: list[BM25Doc]) -> list[tuple[str, float]]:
        """BM25 scores of documents not in the index yet (accepted, still waiting to be stored), on
        the scale of ``search``'s: each query term's idf from the user's index, Tantivy's formula
        (k1 1.2, b 0.75), the documents' own mean length for the average. (record id, score) of
        those that match, best first."""
        terms = self.terms(text)
        if not terms or not docs:
            return []
        handle = self._handle(user_id, create=False)
        searcher = handle.index.searcher() if handle is not None else None
        n = searcher.num_docs if searcher is not None else 0
        idf = {t: math.log(1 + (n - df + 0.5) / (df + 0.5))
               for t in terms for df in [searcher.doc_freq("body", t) if searcher is not None else 0]}  # fmt: skip
        analysed = [list(self._analyzer.analyze(doc.body)) for doc in docs]
        mean = max(sum(map(len, analysed)) / len(analysed), 1.0)
        out = []
        for doc, words in zip(docs, analysed, strict=True):
            norm = 1.2 * (0.25 + 0.75 * len(words) / mean)
            score = sum(idf[t] * tf * 2.2 / (tf + norm) for t in terms for tf in [words.count(t)] if tf)
            if score > 0:
                out.append((doc.id, score))
        return sorted(out, key=lambda hit: -hit[1])

    def search(
        self,
        user_id: str,
        text: str,
        k: int,
        *,
        kinds: list[str] | None = None,
        session_id: str | None = None,
        project_id: str | None = None,
    ) -> list[tuple[str, float]]:
        """BM25 search over one user's documents; (record id, score), best first."""
        handle = self._handle(user_id, create=False)
        terms = self.terms(text)
        if handle is None or not terms or k <= 0:
            return []
        schema = self._schema
        should = [(Occur.Should, Query.term_query(schema, "body", t, index_option="freq")) for t in terms]
        must: list[tuple[Occur, Query]] = [
            (Occur.Must, Query.const_score_query(Query.term_query(schema, "user_id", user_id), 0.0)),
            (Occur.Must, Query.boolean_query(should)),
        ]
        if kinds:
            kind_q = Query.boolean_query([(Occur.Should, Query.term_query(schema, "kind", kd)) for kd in kinds])
            must.append((Occur.Must, Query.const_score_query(kind_q, 0.0)))
        if session_id:
            must.append((Occur.Must, Query.const_score_query(Query.term_query(schema, "session", session_id), 0.0)))
        if project_id:
            must.append((Occur.Must, Query.const_score_query(Query.term_query(schema, "project", project_id), 0.0)))
        searcher = handle.index.searcher()
        hits = searcher.search(Query.boolean_query(must), limit=k, count=False).hits
        return [(searcher.doc(addr)["id"][0], float(score)) for score, addr in hits]
