"""The parts of ``validation/validate.py``: one module per section of the report, the data in ``../data``.

Imported with ``validation/`` on ``sys.path`` (as ``validate.py`` and ``gpu_compare.py`` are), so module names
start with ``validate`` (``validation/regression.py`` records the estimates made from such modules).
"""
