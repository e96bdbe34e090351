"""The user's calibrations (issue 32): one JSON file in gpumem's settings folder, for the CLI and the window.

The file is ``calibrations.json`` in the user's configuration folder (platformdirs' ``user_config_dir``:
``~/.config/gpumem`` on Linux, the folder where the window's ``QSettings("gpumem", "gpumem")`` keeps
``gpumem.conf``); ``GPUMEM_CALIBRATIONS`` names another file (tests, or a shared team file). Every entry is
validated on load: a file that cannot be read as calibrations is never lost or overwritten, it is kept
aside (``calibrations.json.corrupt-<UTC time>``) with one line saying what was wrong, and the entries that
were valid are written back.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpumem_gui.core import Calibration, GpumemInputError, describe_validation_error, short
from gpumem_gui.files import FileReadError, atomic_write, json_problem, path_kind, read_bytes

STORE_ENV = "GPUMEM_CALIBRATIONS"
FORMAT = "gpumem.calibrations/1"
# the largest store read: one calibration is at most ~6 KB (a 4,000-character excerpt and its figures), so
# 4 MiB holds several hundred; a bound so a wrong file (a model's weights) is refused, not read
MAX_STORE_BYTES = 4 << 20
MAX_CALIBRATIONS = 500  # what MAX_STORE_BYTES holds at the largest entries; the store refuses more


def store_path() -> Path:
    """The calibrations file: ``$GPUMEM_CALIBRATIONS``, else ``calibrations.json`` in the settings folder."""
    env = os.environ.get(STORE_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir  # only the store needs it: not imported at start-up

    return Path(user_config_dir("gpumem", appauthor=False)) / "calibrations.json"


@dataclass(frozen=True)
class Loaded:
    """What a load found: the valid calibrations, and one line about a file that was kept aside (or None)."""

    calibrations: tuple[Calibration, ...]
    problem: str | None = None
    blocked: bool = False  # the file is there but could not be read or kept aside: never write over it


def _entries(doc: Any) -> tuple[list[Calibration], list[str]]:
    """The valid calibrations of a parsed document and a line per entry that is not (position, field)."""
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FORMAT
        or not isinstance(doc.get("calibrations"), list)
    ):
        return [], [f"not a {FORMAT} document (an object with 'format' and a 'calibrations' list)"]
    good: list[Calibration] = []
    bad: list[str] = []
    for i, raw in enumerate(doc["calibrations"][: MAX_CALIBRATIONS + 1]):
        try:
            cal = Calibration.model_validate(raw)
        except ValidationError as e:
            bad.append(f"entry {i + 1}: {describe_validation_error(e)}")
            continue
        if any(c.name == cal.name for c in good):
            bad.append(f"entry {i + 1}: the name {short(cal.name)} is used twice")
        else:
            good.append(cal)
    if len(doc["calibrations"]) > MAX_CALIBRATIONS:
        bad.append(f"more than {MAX_CALIBRATIONS} calibrations")
    return good, bad


class CalibrationStore:
    """The calibrations file at ``path`` (default :func:`store_path`): load, save, remove."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else store_path()
        self._last: tuple[tuple[int, int], Loaded] | None = None  # (mtime_ns, size) of the file, its load

    def fresh(self) -> Loaded:
        """:meth:`load`, read again only when the file changed since this store last read it (the window asks
        on every form change); a missing or unreadable file is read every time."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            return self.load()
        if self._last is None or self._last[0] != stamp:
            loaded = self.load()
            self._last = (stamp, loaded) if not loaded.problem else None
            return loaded
        return self._last[1]

    def load(self) -> Loaded:
        """The calibrations kept (none when there is no file). A file that is not a valid store is kept
        aside (module docstring); its valid entries stay in the store."""
        kind = path_kind(self.path)
        if kind == "missing":
            return Loaded(())
        if kind != "file":
            return Loaded((), f"calibrations file {self.path}: is a {kind}, not a file", blocked=True)
        try:
            doc, problem = json_problem(read_bytes(self.path, MAX_STORE_BYTES, "calibrations file"))
        except FileReadError as e:
            if e.problem.startswith("cannot read"):  # permissions, I/O: the file may be fine, leave it
                return Loaded((), f"calibrations file {self.path}: {e.problem}", blocked=True)
            doc, problem = None, e.problem
        good, bad = _entries(doc) if problem is None else ([], [problem])
        if not bad:
            return Loaded(tuple(good))
        try:
            aside = self._keep_aside()
            self._write(tuple(good))
        except OSError as e:
            return Loaded(
                (), f"calibrations file {self.path}: {bad[0]}; cannot keep it aside: {e}", blocked=True
            )
        more = f" ({len(bad) - 1} more problem(s))" if len(bad) > 1 else ""
        return Loaded(
            tuple(good),
            f"calibrations file {self.path}: {bad[0]}{more}; kept aside as {aside.name}, "
            f"{len(good)} valid calibration(s) kept",
        )

    def _writable(self) -> Loaded:
        """The store loaded before a change; a file that can be neither read nor kept aside is an error."""
        loaded = self.load()
        if loaded.blocked:
            raise GpumemInputError(f"{loaded.problem}; nothing was changed", field="calibrations")
        return loaded

    def _keep_aside(self) -> Path:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        for n in range(1000):
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}" + (f"-{n}" if n else ""))
            if path_kind(aside) == "missing":
                os.replace(self.path, aside)
                return aside
        raise GpumemInputError(f"calibrations file {self.path}: too many files kept aside next to it")

    def _write(self, cals: tuple[Calibration, ...]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "calibrations": [c.model_dump(mode="json") for c in cals]}
        atomic_write(self.path, json.dumps(doc, indent=2) + "\n")

    def _change(self, cals: tuple[Calibration, ...]) -> None:
        self._last = None  # fresh() reads the new file even where its stamp looks unchanged
        try:
            self._write(cals)
        except OSError as e:
            raise GpumemInputError(
                f"calibrations file {self.path}: cannot write: {e.strerror or e}"
            ) from None

    def save(self, cal: Calibration) -> Loaded:
        """Keep ``cal`` (one of the same name is replaced); what was loaded before, with any problem."""
        before = self._writable()
        kept = tuple(c for c in before.calibrations if c.name != cal.name)
        if len(kept) >= MAX_CALIBRATIONS:
            raise GpumemInputError(
                f"{len(kept)} calibrations are kept already (at most {MAX_CALIBRATIONS}): remove some first",
                field="name",
            )
        self._change((*kept, cal))
        return before

    def remove(self, name: str) -> Calibration:
        """Remove the calibration ``name`` and return it (an unknown name: an input error)."""
        cals = self._writable().calibrations
        gone = next((c for c in cals if c.name == name), None)
        if gone is None:
            names = ", ".join(short(c.name, 40) for c in cals[:10]) or "none"
            raise GpumemInputError(f"no calibration named {short(name)} (kept: {names})", field="name")
        self._change(tuple(c for c in cals if c.name != name))
        return gone
