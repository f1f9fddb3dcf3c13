"""Where snapshots go without ``dir=`` (the launch option ``snapshot_dir``), and the listing of a
snapshot directory: ``notebook-accel snapshots [DIR]`` and ``%accelerate snapshots [DIR]``
(issue 45), in one process."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from notebook_accel import cli, contract, save_config
from notebook_accel.checkpoint import snapshot_dir, snapshot_place
from notebook_accel.cli import snapshots as listing
from notebook_accel.config import LaunchConfig


def _commit(directory, step, saved_at, size=1000):
    tmp = directory / (snapshot_dir.snapshot_name(step) + ".tmp")
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"x" * size)
    snapshot_dir.mark_done(tmp, 0, "t")
    snapshot_dir.commit(tmp, directory / snapshot_dir.snapshot_name(step), {"step": step, "saved_at": saved_at})


@pytest.fixture
def snaps(tmp_path):
    directory = tmp_path / "run7"
    now = time.time()
    _commit(directory, 4200, now - 180, size=2_500_000)
    _commit(directory, 4000, now - 3 * 3600)
    half = directory / (snapshot_dir.snapshot_name(4250) + ".tmp")
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"x" * 10)
    return directory


def _rows(text):
    return {int(m.group(1).replace(",", "")): line for line in text.splitlines()
            if (m := re.match(r"\s+([\d,]+)\s", line))}


def test_the_listing_says_step_age_date_size_completeness_and_what_resume_loads(snaps, capsys):
    assert cli.main(["snapshots", str(snaps)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"snapshots in {snaps} (resume() goes on from step 4,200)")
    rows = _rows(text)
    assert set(rows) == {4200, 4000, 4250}
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() - 180))
    assert "3 min ago (" + stamp in rows[4200] and "2.5 MB" in rows[4200]
    assert rows[4200].endswith("complete  <- resume() loads this one")
    assert "3.0 h ago" in rows[4000] and rows[4000].endswith("complete") and "1.0 kB" in rows[4000]
    assert rows[4250].endswith(listing.INCOMPLETE) and "10 B" in rows[4250]
    assert listing.INCOMPLETE == "incomplete: being written or left by a crash"
    lines = text.splitlines()
    assert lines.index(rows[4200]) < lines.index(rows[4000]) < lines.index(rows[4250])  # newest first


def test_a_missing_or_empty_directory_says_so(tmp_path, capsys):
    assert cli.main(["snapshots", str(tmp_path / "nope")]) == 1
    assert f"{tmp_path / 'nope'} does not exist: no snapshots there" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["snapshots", str(tmp_path / "empty")]) == 0
    assert "no snapshots in" in capsys.readouterr().out
    (tmp_path / "only_tmp" / "snapshot_000000005.tmp").mkdir(parents=True)
    assert listing.describe(tmp_path / "only_tmp")[1].startswith(
        f"snapshots in {tmp_path / 'only_tmp'} (none complete: resume() would start at step 0)")


def test_the_default_directory_is_the_snapshot_dir_in_force(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert listing.default_directory() == tmp_path / "snapshots" / "default"
    monkeypatch.setenv("NOTEBOOK_ACCEL_RUN_NAME", "run3")
    assert listing.default_directory() == tmp_path / "snapshots" / "run3"
    config = tmp_path / "c.yaml"
    save_config(LaunchConfig(snapshot_dir=str(tmp_path / "drive" / "run7")), config)
    assert listing.default_directory(config) == tmp_path / "drive" / "run7"
    monkeypatch.setenv(contract.SNAPSHOT_DIR_ENV, "from_env")  # the environment wins over the file
    assert listing.default_directory(config) == tmp_path / "from_env"
    assert cli.main(["snapshots", "--config-file", str(config)]) == 1
    assert f"{tmp_path / 'from_env'} does not exist" in capsys.readouterr().err
    monkeypatch.setenv(contract.SNAPSHOT_DIR_ENV, "")
    config.write_text("snapshot_dir: 7\n")
    assert cli.main(["snapshots", "--config-file", str(config)]) == 1
    assert "snapshot_dir=7 must be a folder path" in capsys.readouterr().err


def test_the_workers_default_reads_the_launch_option(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert snapshot_place.snapshot_directory(None) == tmp_path / "snapshots" / "default"
    assert snapshot_place.snapshot_directory("proj") == tmp_path / "proj" / "snapshots"
    monkeypatch.setenv(contract.SNAPSHOT_DIR_ENV, "~/drive/run7")
    expanded = Path(os.path.expanduser("~/drive/run7"))
    assert snapshot_place.snapshot_directory("proj") == expanded  # the option wins over project_dir
    assert snapshot_place.snapshot_directory("proj", "mine") == tmp_path / "mine"  # dir= wins over both


def test_the_line_magic_lists_a_directory_and_refuses_stray_words(snaps, tmp_path, capsys, monkeypatch):
    from magics.accelerate_magic import AccelerateMagics

    magic = AccelerateMagics(None)
    magic.accelerate(f"snapshots {snaps}")
    assert "<- resume() loads this one" in _rows(capsys.readouterr().out)[4200]
    magic.accelerate(f"snapshots '{tmp_path / 'no such'}'")
    assert f"{tmp_path / 'no such'} does not exist" in capsys.readouterr().out
    monkeypatch.setenv(contract.SNAPSHOT_DIR_ENV, str(snaps))
    magic.accelerate("snapshots")  # the snapshot_dir in force
    assert f"snapshots in {snaps}" in capsys.readouterr().out
    with pytest.raises(UsageError, match="snapshots: unexpected 'b'; give one directory"):
        magic.accelerate("snapshots a b")
    with pytest.raises(UsageError, match="env: unexpected 'somewhere'"):
        magic.accelerate("env somewhere")
    with pytest.raises(UsageError, match="snapshots does not use --num-processes"):
        magic.accelerate(f"snapshots {snaps} -n 2")


def test_a_file_url_is_its_path_and_urls_fsspec_cannot_open_are_refused_naming_why(snaps, tmp_path, monkeypatch,
                                                                                   capsys):
    from notebook_accel import Accelerator

    monkeypatch.chdir(tmp_path)
    assert cli.main(["snapshots", f"file://{snaps}"]) == 0 and "<- resume() loads" in capsys.readouterr().out
    assert snapshot_place.snapshot_directory(None, f"file://{tmp_path}") == tmp_path
    with pytest.raises(ValueError, match=r"dir='nope://run7': fsspec cannot open it \(Protocol not known: nope\)"):
        Accelerator(cpu=True).snapshot_every(steps=1, dir="nope://run7")
    assert not (tmp_path / "nope:").exists()  # never a local folder named after the scheme
    monkeypatch.setenv(contract.SNAPSHOT_DIR_ENV, "gs://bucket/run7")  # gcsfs is not installed here
    with pytest.raises(ValueError, match="environment variable NOTEBOOK_ACCEL_SNAPSHOT_DIR.*Please install gcsfs"):
        Accelerator(cpu=True).resume()
    assert cli.main(["snapshots"]) == 1
    assert "snapshot_dir='gs://bucket/run7': fsspec cannot open it (Please install gcsfs" in capsys.readouterr().err


def test_snapshots_to_an_fsspec_url_go_through_a_mirror_and_resume_on_a_machine_without_it(tmp_path, monkeypatch,
                                                                                          capsys):
    import fsspec
    import torch

    from notebook_accel import Accelerator

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fsspec.filesystem("memory").store.clear()

    def prepared():
        accelerator = Accelerator(cpu=True)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return (accelerator, *accelerator.prepare(model, optimizer))

    accelerator, model, optimizer = prepared()
    accelerator.snapshot_every(steps=2, dir="memory://bucket/run7", keep=1)
    for _ in range(5):
        accelerator.backward(model(torch.ones(2, 4)).sum())
        optimizer.step()
        optimizer.zero_grad()
    accelerator.wait_for_snapshots()
    weights = [p.detach().clone() for p in model.parameters()]
    remote = fsspec.filesystem("memory")
    assert sorted(p.rsplit("/", 1)[-1] for p in remote.ls("/bucket/run7", detail=False)) == ["snapshot_000000004"]
    assert remote.exists("/bucket/run7/snapshot_000000004/snapshot.json")  # written last: complete
    assert cli.main(["snapshots", "memory://bucket/run7"]) == 0
    listed = capsys.readouterr().out
    assert "snapshots in memory://bucket/run7 (resume() goes on from step 4)" in listed and "complete" in listed
    import shutil

    shutil.rmtree(tmp_path / "cache")  # a new machine: no mirror
    again, model2, _ = prepared()
    for p in model2.parameters():
        torch.nn.init.zeros_(p)
    assert again.resume("memory://bucket/run7") == 4
    assert "resumed from snapshot step 4" in capsys.readouterr().out
    assert not all(torch.equal(a, b) for a, b in zip(weights, model2.parameters(), strict=True))  # step 5 not in it
    again2, model3, optimizer3 = prepared()
    assert again2.resume("memory://bucket/run7") == 4  # (from the mirror now)
    again2.backward(model3(torch.ones(2, 4)).sum())
    optimizer3.step()
    assert all(torch.equal(a, b) for a, b in zip(weights, model3.parameters(), strict=True))
