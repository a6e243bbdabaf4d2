"""The wrappers' own route: the collectives ``capture.py`` records on the training thread
(wrappers, process-group hooks, DDP's comm hook) reach the ledger as records, which the book
takes in (book.py); a Work without a future (gloo's asynchronous reduce_scatter) tells its
completion only when asked, so each tick asks. Always built; the backends another route
covers (NCCL's, under the plugin or the flight recorder) the capture skips."""

from __future__ import annotations

from otel_train.sources.collectives.book import Book
from otel_train.sources.collectives.route import Parts, Route


class WrapperRoute(Route):
    """Polls the Works without a future the capture recorded; the book does the rest."""

    name = "wrappers"

    def __init__(self, book: Book) -> None:
        self.book = book

    def tick(self, now: int) -> bool:
        self.book.poll_works(now)
        return True


def build(parts: Parts) -> WrapperRoute:
    return WrapperRoute(parts.book)
