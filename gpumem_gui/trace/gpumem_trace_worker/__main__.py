"""``python -m gpumem_trace_worker``: one JSON request on stdin, one JSON result on stdout.

Exit status 0 with the result; 2 with ``{"error": ...}`` for a request the worker cannot run (one line naming
the cause); 3 when torch or transformers cannot be imported.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    try:
        from . import SCHEMA, TraceError, handle
    except ImportError as e:  # torch/transformers are imported lazily; this is the package itself
        json.dump({"error": f"the trace worker cannot start: {e}"}, sys.stdout)
        return 3
    try:
        request = json.load(sys.stdin)
    except ValueError as e:
        json.dump({"schema": SCHEMA, "error": f"the request is not JSON: {e}"}, sys.stdout)
        return 2
    try:
        result = handle(request)
    except TraceError as e:
        json.dump({"schema": SCHEMA, "error": str(e), "field": e.field}, sys.stdout)
        return 2
    except ImportError as e:
        json.dump(
            {"schema": SCHEMA, "error": f"cannot import {e.name or e}: torch and transformers are needed"},
            sys.stdout,
        )
        return 3
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
