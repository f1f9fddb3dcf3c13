"""The kernel's side of the stop button against simulated ranks: the cut it picks, moving it on
when a rank was past it before it watched, and the word to stop once every rank waits there."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from notebook_accel.launch.control.stop_agreement import agree_and_stop
from notebook_accel.wire import StopAsk, StopAt, StopCount


@dataclass
class Rank:
    """A rank whose user's code issues a collective between two of its points and passes
    ``speed`` points per poll (every rank runs the same code); it begins to watch ``lag`` points after it is told a cut, and waits at the first point where
    its count crossed the cut since the point before."""

    rank: int
    count: int
    speed: int = 1
    lag: int = 0
    cut: int | None = None
    seen: int | None = None
    waiting_at: int | None = None
    finished: bool = False
    exited: bool = False
    stop_count: StopCount | None = None
    sent: list = field(default_factory=list)
    stopped_at: int | None = None

    @property
    def handle(self) -> Rank:
        return self

    def command(self, message) -> bool:
        self.sent.append(message)
        if type(message) is StopAsk:
            self._answer()
        elif type(message) is StopAt and message.groups is None:
            self.finished, self.stopped_at = True, self.count
        elif type(message) is StopAt:
            self.cut = message.total
            if self.waiting_at is not None and self.waiting_at != self.cut:
                self.waiting_at = None  # a new cut: go on to it
        return True

    def _answer(self) -> None:
        self.stop_count = StopCount({"0": self.count}, (("<cell>", 1, 2),), False,
                                    seen=self.seen, waiting_at=self.waiting_at)

    def step(self) -> None:
        for _ in range(self.speed):
            self._point()

    def _point(self) -> None:
        """The next point of the user's code, one collective past the last."""
        if self.finished or self.waiting_at is not None:
            return
        self.count += 1
        if self.cut is None:
            return
        if self.seen is None:
            if self.lag:
                self.lag -= 1
            else:
                self.seen = self.count  # the watch begins
            return
        before, self.seen = self.seen, self.count
        if before < self.cut <= self.seen:
            self.waiting_at = self.cut
            self._answer()  # said unasked, as a rank does when it begins to wait


def poller(ranks):
    def poll(seconds: float) -> None:  # one point of each rank's code per poll
        time.sleep(seconds / 4)
        for rank in ranks:
            rank.step()
    return poll


def cuts(rank: Rank) -> list[int]:
    return [m.total for m in rank.sent if type(m) is StopAt and m.groups is not None]


def test_every_rank_runs_on_to_one_collective_past_the_furthest_and_stops_there():
    ranks = [Rank(0, count=10), Rank(1, count=12)]
    assert agree_and_stop(ranks, poller(ranks), stop_wait=5) is None
    assert cuts(ranks[0])[0] == cuts(ranks[1])[0] == 13
    assert ranks[0].stopped_at == ranks[1].stopped_at == cuts(ranks[0])[-1]


def test_a_rank_past_the_cut_before_it_watched_moves_the_cut_on_past_every_rank():
    # rank 1 is told the cut (13) but begins to watch only at 17: where it should have
    # stopped is behind it, so the kernel moves the cut on and rank 0 goes on from 13 to it
    ranks = [Rank(0, count=10), Rank(1, count=12, lag=4)]
    assert agree_and_stop(ranks, poller(ranks), stop_wait=5) is None
    assert cuts(ranks[0]) == cuts(ranks[1]) and len(cuts(ranks[0])) >= 2, cuts(ranks[0])
    final = cuts(ranks[0])[-1]
    assert [r.stopped_at for r in ranks] == [final, final]


def test_a_rank_that_crossed_a_moved_cut_before_it_knew_it_moves_it_on_again():
    # rank 1 runs fast (3 points of its code per poll): by the time a moved
    # cut reaches it, it may have crossed that one too; it must never wait past a cut it
    # crossed unknowing, so every rank ends at the same count
    ranks = [Rank(0, count=10), Rank(1, count=10, speed=3, lag=2)]
    assert agree_and_stop(ranks, poller(ranks), stop_wait=5) is None
    assert ranks[0].stopped_at == ranks[1].stopped_at == cuts(ranks[0])[-1]


def test_a_rank_that_never_reaches_the_cut_is_named_after_stop_wait():
    ranks = [Rank(0, count=10), Rank(1, count=10, speed=0)]  # rank 1 stuck (in compute, say)
    why = agree_and_stop(ranks, poller(ranks), stop_wait=0.3)
    cut = cuts(ranks[0])[-1]
    assert why == "rank 1 did not reach the common stopping point within 0.3 s (stop_wait)"
    assert ranks[0].waiting_at == cut and not ranks[1].finished


@dataclass
class EndsWhenAskedAgain(Rank):
    """A rank whose run ends on its own between the kernel's first and second question: it
    never answers the second (its run is over)."""

    asked: int = 0

    def command(self, message) -> bool:
        if type(message) is StopAsk:
            self.asked += 1
            if self.asked > 1:
                self.sent.append(message)
                self.finished = True
                return True
        return super().command(message)


def test_a_rank_whose_run_ends_while_it_is_asked_leaves_the_others_to_stop_at_the_cut():
    ranks = [Rank(0, count=10), EndsWhenAskedAgain(1, count=10, speed=0)]
    assert agree_and_stop(ranks, poller(ranks), stop_wait=5) is None
    assert ranks[1].asked >= 2 and ranks[1].stopped_at is None
    assert ranks[0].stopped_at == cuts(ranks[0])[-1]
