"""A stand-in `nvidia-smi` for the engine evaluator's GPU-memory wait (this machine has no GPU, so the
real one cannot run here): `nvidia-smi --query-compute-apps=pid --format=csv,noheader,nounits` lists
the fake engine's processes (the pids it wrote to FAKE_ENGINE_PIDS) as holding GPU memory while they
live, and for FAKE_GPU_HOLD_S seconds after each one died ("never": forever), as a driver that frees a
dead process's memory late would. Each answer is appended to FAKE_GPU_LOG as "held PID..." or "free"."""

import os
import sys
import time
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def main() -> int:
    if "--query-compute-apps=pid" not in sys.argv[1:]:
        print("fake nvidia-smi: only --query-compute-apps=pid is answered", file=sys.stderr)
        return 2
    pids_file = Path(os.environ["FAKE_ENGINE_PIDS"])
    pids = [int(x) for x in pids_file.read_text().split()] if pids_file.exists() else []
    hold = os.environ.get("FAKE_GPU_HOLD_S", "0")
    deaths = pids_file.with_name(pids_file.name + ".died")  # pid → when this tool first saw it dead
    died = dict(line.split() for line in deaths.read_text().splitlines()) if deaths.exists() else {}
    held, now = [], time.time()
    for pid in pids:
        if alive(pid):
            held.append(pid)
            continue
        if str(pid) not in died:
            died[str(pid)] = str(now)
            with deaths.open("a") as f:
                f.write(f"{pid} {now}\n")
        if hold == "never" or now - float(died[str(pid)]) < float(hold):
            held.append(pid)
    for pid in held:
        print(pid)
    with open(os.environ["FAKE_GPU_LOG"], "a") as f:
        dead = [pid for pid in held if not alive(pid)]
        f.write((f"held {' '.join(map(str, held))}{' (dead ones too)' if dead else ''}" if held else "free") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
