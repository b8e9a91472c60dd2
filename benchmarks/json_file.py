"""A JSON file for the benchmark scripts (kernel_table.py, torch_peer.py): its document, or one line
naming the file and what is wrong with it, raised as the caller's error type."""
import json


def read_json(path, error=SystemExit, what=""):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise error("%s%s: %s" % (what, path, e))
