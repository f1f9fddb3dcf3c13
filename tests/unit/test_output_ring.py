"""A detached pool's run output on disk (``output_ring.py``): each rank's lines in a ring of its
own bounded bytes, the oldest dropped and counted; every piece read once, in order, from any
number on; rich displays in order with the text."""

from __future__ import annotations

import os
import threading

from notebook_accel.launch.detached.output_ring import RingOutput
from notebook_accel.wire import Kind


def _texts(items):
    return "".join(text for _, text in items)


def test_every_piece_is_read_once_in_order_from_any_number(tmp_path):
    output = RingOutput(tmp_path / "out")
    output.stdout.write("[rank 0] a\n[rank 1] b\n")  # one write of the relay: two ranks' lines
    output.stderr.write("[notebook_accel] a note\n")
    output.display({"data": 1})
    output.stdout.write("[rank 0] c\n")
    items, following, dropped = output.since(0, 0)
    assert items == [("stdout", "[rank 0] a\n"), ("stdout", "[rank 1] b\n"),
                     ("stderr", "[notebook_accel] a note\n"), (Kind.DISPLAY, {"data": 1}),
                     ("stdout", "[rank 0] c\n")]
    assert (following, dropped, output.count) == (5, 0, 5)
    assert output.since(3, 0) == (items[3:], 5, 0)
    assert sorted(os.listdir(tmp_path / "out")) == ["run.notes.1", "run.rank0.1", "run.rank1.1"]
    assert oct(os.stat(tmp_path / "out" / "run.rank0.1").st_mode & 0o777) == "0o600"


def test_a_cluster_ranks_lines_go_to_its_own_ring(tmp_path):
    output = RingOutput(tmp_path / "out")  # a cluster's prefix names the node too
    output.stdout.write("[node 0 rank 0] a\n[node 1 rank 1] b\n[node 1] not a rank\n")
    assert sorted(os.listdir(tmp_path / "out")) == ["run.notes.1", "run.rank0.1", "run.rank1.1"]
    assert output.since(0, 0)[0][1] == ("stdout", "[node 1 rank 1] b\n")


def test_each_rank_keeps_its_newest_bytes_and_counts_what_it_dropped(tmp_path):
    output = RingOutput(tmp_path / "out", keep=1000)
    for i in range(200):  # ~14 bytes a line on rank 0: far past its 1000
        output.stdout.write(f"[rank 0] {i:04d}\n")
    output.stdout.write("[rank 1] only\n")  # another rank's ring is its own
    items, following, dropped = output.since(0, 0)
    kept = [text for _, text in items if text.startswith("[rank 0]")]
    assert kept[-1] == "[rank 0] 0199\n" and "[rank 1] only\n" in _texts(items)
    numbers = [int(text.split()[-1]) for text in kept]
    assert numbers == list(range(numbers[0], 200))  # the newest, none missing in between
    assert dropped == output.dropped_lines == numbers[0] > 100
    on_disk = sum(os.path.getsize(tmp_path / "out" / name) for name in os.listdir(tmp_path / "out")
                  if name.startswith("run.rank0."))
    assert on_disk <= 1000


def test_a_watcher_waits_for_the_next_piece_and_the_end(tmp_path):
    output = RingOutput(tmp_path / "out")
    seen: list = []

    def watch():
        number = 0
        while True:
            items, number, _ = output.since(number, 5)
            seen.extend(items)
            if output.ended and number == output.count:
                return

    watcher = threading.Thread(target=watch)
    watcher.start()
    for i in range(50):
        output.stdout.write(f"[rank {i % 2}] {i}\n")
    output.end()
    watcher.join(10)
    assert not watcher.is_alive()
    assert [text for _, text in seen] == [f"[rank {i % 2}] {i}\n" for i in range(50)]
    output.remove()  # a later run's output replaces it
    assert os.listdir(tmp_path / "out") == []
