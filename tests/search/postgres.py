"""A throwaway PostgreSQL server for the two-worker search test: Debian's server binaries
(/usr/lib/postgresql/*/bin), a data directory in /tmp, a free localhost port, trust auth.
initdb refuses root, so as root the server runs as the `postgres` system user (runuser)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def server_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("initdb")
    return Path(which).parent if which else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    def __init__(self):
        self.bin = server_bin()
        if self.bin is None:
            raise RuntimeError("no PostgreSQL server binaries (apt-get install postgresql)")
        self.root = Path(tempfile.mkdtemp(prefix="moetune-pg-", dir="/tmp"))
        self.data, self.port = self.root / "data", _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                raise RuntimeError("running as root without runuser: cannot start PostgreSQL")
            self.as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> str:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w",
                  "start")
        self._run(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "optuna")
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/optuna"

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        except (subprocess.SubprocessError, OSError):
            pass
        time.sleep(0.2)
        shutil.rmtree(self.root, ignore_errors=True)
