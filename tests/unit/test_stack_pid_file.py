"""A stack's pid file names its process by pid and start time: a pid the kernel has given to
another process since is never taken for the service, nor signalled (real processes)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eoguard.errors import StackError
from eoguard.stack.process import ManagedProcess

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


class Sleeper(ManagedProcess):
    name = "sleeper"

    def prepare(self) -> None:
        pass

    def command(self) -> list[str]:
        return SLEEP

    def is_ready(self) -> bool:
        return self._child is not None and self._child.poll() is None

    @property
    def address(self) -> str:
        return "sleeper:0"


def start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[19])


@pytest.fixture
def bystander(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Another process, leading its own process group as a service would."""
    (tmp_path / "elsewhere").mkdir()
    proc = subprocess.Popen(SLEEP, start_new_session=True, cwd=tmp_path / "elsewhere")
    yield proc
    proc.kill()
    proc.wait()


def test_a_launched_service_is_found_again_and_killed(tmp_path: Path) -> None:
    started = Sleeper(tmp_path)
    assert started.launch()
    assert started._child is not None
    pid = started._child.pid
    assert (tmp_path / "pid").read_text().split() == [str(pid), str(start_ticks(pid))]
    again = Sleeper(tmp_path)  # another command of the stack, reading the pid file
    assert again.pid() == pid
    again.kill()
    assert again.pid() is None
    assert started._child.wait(timeout=10) == -9
    assert not (tmp_path / "pid").exists()


def test_a_reused_pid_is_never_signalled(tmp_path: Path, bystander: subprocess.Popen[bytes]) -> None:
    # The service's process ended and the kernel gave its pid to the bystander: same pid,
    # another start time.
    (tmp_path / "pid").write_text(f"{bystander.pid} {start_ticks(bystander.pid) - 1}")
    service = Sleeper(tmp_path)
    assert service.pid() is None
    service.stop()
    service.kill()
    assert bystander.poll() is None, "the bystander was signalled"


def test_an_older_pid_file_names_only_a_process_in_the_services_workdir(
        tmp_path: Path, bystander: subprocess.Popen[bytes]) -> None:
    (tmp_path / "pid").write_text(str(bystander.pid))
    assert Sleeper(tmp_path).pid() is None
    Sleeper(tmp_path).kill()
    assert bystander.poll() is None, "the bystander was signalled"
    ours = subprocess.Popen(SLEEP, start_new_session=True, cwd=tmp_path)
    try:
        (tmp_path / "pid").write_text(str(ours.pid))
        assert Sleeper(tmp_path).pid() == ours.pid
    finally:
        ours.kill()
        ours.wait()


def test_a_service_started_elsewhere_is_not_killed_and_the_fault_says_so(
        tmp_path: Path, bystander: subprocess.Popen[bytes]) -> None:
    # Another checkout's service answers on this stack's port: its pid file is not ours.
    class Answering(Sleeper):
        def is_ready(self) -> bool:
            return bystander.poll() is None

    service = Answering(tmp_path)
    assert service.pid() is None
    with pytest.raises(StackError, match="did not start it"):
        service.kill()
    service.stop()  # stopping a stack leaves what it did not start, quietly
    assert bystander.poll() is None, "the bystander was signalled"
    bystander.kill()
    bystander.wait()
    service.kill()  # nothing answers any more: nothing to kill, no error
