"""One StreamGroups call on the learner's side: a reader thread admits each incoming group and buffers
its ack; the call's own thread sends the buffered acks, and the later ones (CONSUMED, STALE at
dequeue) that the service offers while the actor is connected.

The buffer holds at most ACK_BUFFER acks, each bounded in size (the admission table cuts what it
echoes), so a client that never reads its acks costs a bounded amount of memory: once the buffer is
full the reader stops reading, and the idle reaper (tandem_wire/idle.py) cancels the call.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator

import grpc

from learner.service.actor_registry import CredentialRefused
from learner.service.tolerant_handlers import Undecodable
from tandem_wire import pb
from tandem_wire.idle import Progress

log = logging.getLogger(__name__)

ACK_BUFFER = 1024  # acks waiting for a slow reader, per stream; beyond it the reader blocks
_END = object()  # closes the buffer
POLL_S = 0.2


class GroupStream:
    """The ack buffer of one actor's group stream, and the two loops that fill and drain it."""

    def __init__(self, actor_id: str, progress: Progress) -> None:
        self.actor_id = actor_id
        self._progress = progress
        self._acks: queue.Queue = queue.Queue(maxsize=ACK_BUFFER)
        self._finished = threading.Event()

    def serve(
        self,
        requests: Iterator[pb.ScoredGroup | Undecodable],
        context: grpc.ServicerContext,
        admit: Callable[[pb.ScoredGroup | Undecodable, GroupStream], pb.GroupAck],
        on_end: Callable[[GroupStream], None],
    ) -> Iterator[pb.GroupAck]:
        """The call's responses: every admitted group's ack, then the offered ones, until the actor
        half-closes or the call ends. A CredentialRefused from `admit` is raised here."""
        context.add_callback(self._finished.set)
        reader = threading.Thread(target=self._read, args=(requests, admit, on_end), name="tandem-group-reader",
                                  daemon=True)
        reader.start()
        while not self._finished.is_set():
            try:
                item = self._acks.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if item is _END:
                return
            if isinstance(item, CredentialRefused):
                raise item
            yield item
            self._progress.touch()

    def offer(self, ack: pb.GroupAck) -> None:
        """Buffer a later ack without blocking; a full buffer means the actor stopped reading, and it
        learns the group's fate when it re-sends the group after reconnecting."""
        _offer(self._acks, ack)

    def close(self) -> None:
        _offer(self._acks, _END)

    def _read(
        self,
        requests: Iterator[pb.ScoredGroup | Undecodable],
        admit: Callable[[pb.ScoredGroup | Undecodable, GroupStream], pb.GroupAck],
        on_end: Callable[[GroupStream], None],
    ) -> None:
        """Admit each incoming group and buffer its ack (waiting while the buffer is full)."""
        try:
            for msg in requests:
                self._progress.touch()
                self._put(admit(msg, self))
        except CredentialRefused as refusal:  # the actor's registration ended: so does its stream
            self._put(refusal)
        except Exception as error:  # a broken or cancelled call
            log.debug("group stream of %r ended: %r", self.actor_id, error)
        finally:
            on_end(self)
            self._put(_END)

    def _put(self, item: object) -> None:
        """Buffer `item`, waiting for room while the call is alive."""
        while not self._finished.is_set():
            try:
                self._acks.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue


def _offer(acks: queue.Queue, item: object) -> None:
    try:
        acks.put_nowait(item)
    except queue.Full:
        pass
