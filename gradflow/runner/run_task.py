# run_task.py — the rank side of `gradflow.runner.run` (run_func.py): each
# rank loads the pickled function from the job's directory, calls it, and
# writes its return value or its traceback there, named by its rank.
"""``python -m gradflow.runner.run_task DIR``: one rank of gradflow.runner.run."""
from __future__ import annotations

import os
import pickle
import sys
import traceback

from .rank_wrapper import detect_rank
from .run_func import ERROR_FILE, PAYLOAD_FILE, RESULT_FILE, UNPICKLABLE_FILE, _pickler


def _write(path: str, data: bytes) -> None:
    with open(path + ".tmp", "wb") as f:  # atomic: the driver never reads half a file
        f.write(data)
    os.replace(path + ".tmp", path)


def _call(func, args, kwargs):
    try:
        return func(*args, **kwargs)
    except SystemExit as e:
        if e.code:  # sys.exit(3), sys.exit("message"): a failure, as in a script
            raise
        return None  # sys.exit(0) / sys.exit(): the function finished (Horovod: "run finished.")


def main(workdir: str) -> int:
    rank = detect_rank(os.environ)
    payload = os.path.join(workdir, PAYLOAD_FILE)
    if not os.path.exists(payload):
        print(f"gradflow.runner.run: rank {rank}: {payload} is not on this machine "
              f"(run() starts ranks on its own machine only)", file=sys.stderr)
        return 1
    try:
        with open(payload, "rb") as f:
            driver_path, pickled = pickle.load(f)
        # What the driver imports by name (a module beside its script), the
        # rank must import too: add the driver's sys.path entries it lacks, last.
        sys.path.extend(p for p in driver_path if p not in sys.path)
        func, args, kwargs = pickle.loads(pickled)  # (cloudpickle's output loads with pickle)
        value = _call(func, args, kwargs)
    except BaseException:
        _write(os.path.join(workdir, ERROR_FILE.format(rank=rank)),
               traceback.format_exc().encode("utf-8", "replace"))
        raise  # gradflowrun names this rank and tells the others
    try:
        data = _pickler().dumps(value)
    except Exception as e:  # the job itself succeeded: say so, and what could not travel
        _write(os.path.join(workdir, UNPICKLABLE_FILE.format(rank=rank)),
               f"{type(value).__name__} ({type(e).__name__}: {e})".encode("utf-8", "replace"))
        return 1
    _write(os.path.join(workdir, RESULT_FILE.format(rank=rank)), data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
