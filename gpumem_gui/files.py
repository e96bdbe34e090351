"""Files gpumem reads and writes, and its cache root. A leaf module (standard library only, no Qt, no core) so
that every layer uses the same code: the core's readers, the fake GPUs, the window's scenarios and saves, the
Hub client's cache and trace mode's cache.

Reading (:func:`read_text`, :func:`read_json`, :func:`open_regular`) never hangs and never reads without a
bound: the path must name a regular file (a FIFO would block the first ``read``, a link to ``/dev/zero``
would be read until memory runs out), the file must be at most the caller's cap, and the open is
non-blocking, so a file swapped for a FIFO between the check and the open cannot block either. JSON is
parsed to at most :data:`MAX_JSON_DEPTH` levels. Every problem is one :class:`FileReadError` whose
``problem`` is a sentence without the path; callers add the path their own way.

Writing (:func:`atomic_write`) goes through a temporary file in the same folder and ``os.replace``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Any, Literal

# Deepest JSON nesting read. The files gpumem reads nest 2-5 levels (a config.json with its
# quantization_config or text_config, a scenario's run, an index's weight_map); 64 is far above that and far
# below Python's recursion limit (1000), which json.loads, repr() and error rendering reach on deeper input.
MAX_JSON_DEPTH = 64

# errno values that mean "nothing is there" when a path is looked at (not "something is there that cannot be
# read"): pathlib's own list (ENOENT, ENOTDIR, EBADF, ELOOP, in pathlib._IGNORED_ERRNOS), plus ENAMETOOLONG,
# which a model name, a catalog id or a hub id longer than a path component gives and which is no file either.
_ABSENT_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP, errno.ENAMETOOLONG})

PathKind = Literal["missing", "folder", "file", "other"]


class FileReadError(ValueError):
    """A file that cannot be read as asked; ``problem`` is one line without the path (callers add it)."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def _describe(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _oserror(path: str | os.PathLike[str], e: OSError) -> FileReadError:
    return FileReadError(path, f"cannot read: {e.strerror or e}")


def path_kind(path: str | os.PathLike[str]) -> PathKind:
    """What ``path`` names, following links: ``missing`` (nothing there, a dangling link, a path through a
    file, a name too long), a ``folder``, a regular ``file`` or ``other`` (FIFO, device, socket). Anything
    else that stops the look (no permission, an I/O error) is a :class:`FileReadError`; ``Path.is_file``
    raises a bare ``PermissionError`` there."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno in _ABSENT_ERRNOS:
            return "missing"
        raise _oserror(path, e) from None
    except ValueError:  # an embedded NUL byte: no file has that name
        return "missing"
    if stat.S_ISDIR(mode):
        return "folder"
    return "file" if stat.S_ISREG(mode) else "other"


def list_folder(folder: str | os.PathLike[str]) -> list[tuple[str, PathKind]]:
    """``(name, kind)`` of every entry of ``folder``, sorted by name; an unreadable folder is a
    :class:`FileReadError` (``Path.glob`` silently yields nothing there)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise _oserror(folder, e) from None
    return [(n, path_kind(os.path.join(folder, n))) for n in names]


def open_regular(path: str | os.PathLike[str], max_bytes: int | None = None, what: str = "file") -> IO[bytes]:
    """Open a regular file for binary reading, checked (module docstring): a :class:`FileReadError` when it
    is missing, not a regular file, unreadable, or (``max_bytes``) larger than that. The caller closes it."""
    kind = path_kind(path)
    if kind == "missing":
        raise FileReadError(path, "no such file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _oserror(path, e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileReadError(path, f"is {_describe(st.st_mode)}, not a {what}")
        if max_bytes is not None and st.st_size > max_bytes:
            raise FileReadError(
                path, f"is {st.st_size:,} bytes; a {what} is at most {max_bytes:,} bytes here"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], max_bytes: int, what: str = "file") -> bytes:
    """The whole of a regular file of at most ``max_bytes`` bytes (it may not grow past that while read)."""
    with open_regular(path, max_bytes, what) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            data = f.read(size + 1)  # the size it has (read() would allocate the whole cap up front)
            if len(data) > size:  # it grows while read: on to the cap, not beyond
                data += f.read(max_bytes + 1 - len(data))
        except OSError as e:
            raise _oserror(path, e) from None
    if len(data) > max_bytes:
        raise FileReadError(path, f"grew past {max_bytes:,} bytes while being read")
    return data


def read_text(path: str | os.PathLike[str], max_bytes: int, what: str = "file") -> str:
    """A UTF-8 text file of at most ``max_bytes`` bytes."""
    data = read_bytes(path, max_bytes, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileReadError(path, f"not UTF-8 text (byte {e.start})") from None


def json_problem(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> tuple[Any, str | None]:
    """``(document, None)`` for valid JSON nested at most ``max_depth`` levels, else ``(None, problem)``:
    one line, never an exception (``json.loads`` raises ``ValueError`` for an integer of more than 4,300
    digits, Python's int_max_str_digits, and ``RecursionError`` for deep nesting)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}"
    except RecursionError:
        return None, f"JSON nested too deeply (more than {max_depth} levels)"
    except ValueError as e:  # the int-digit limit (or bytes that are not UTF-8/16/32)
        if "digits" in str(e):
            return None, "malformed JSON: an integer of more than 4,300 digits (Python's limit)"
        return None, "malformed JSON: not UTF-8 text"
    if _depth_over(doc, max_depth):
        return None, f"JSON nested too deeply (more than {max_depth} levels)"
    return doc, None


def _depth_over(doc: Any, max_depth: int) -> bool:
    """Whether ``doc`` nests deeper than ``max_depth`` containers (iteratively: no recursion)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def read_json(path: str | os.PathLike[str], max_bytes: int, what: str = "JSON file") -> Any:
    """A JSON file of at most ``max_bytes`` bytes and :data:`MAX_JSON_DEPTH` levels, parsed."""
    doc, problem = json_problem(read_text(path, max_bytes, what))
    if problem is not None:
        raise FileReadError(path, problem)
    return doc


# ---- writing ----------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """gpumem's cache folder (platformdirs: ``~/.cache/gpumem`` on Linux); each user of it takes a
    subfolder (``hub``, ``trace``)."""
    from platformdirs import user_cache_dir  # only the caches need it: not imported at start-up

    return Path(user_cache_dir("gpumem", appauthor=False))


def _target(path: Path) -> Path:
    """Where a write to ``path`` lands: through a symbolic link, the file the link points to (the link
    stays, as an editor's save keeps it); otherwise ``path`` itself."""
    if path.is_symlink():
        return Path(os.path.realpath(path))
    return path


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``, so a crash
    or a full disk never leaves a half-written file behind.

    The file keeps the mode of the file it replaces; a new file gets ``0666 & ~umask``, as ``open()`` gives
    (the temporary file is created with that mode, so the kernel applies the umask). Writing through a
    symbolic link replaces the file it points to and keeps the link."""
    target = _target(Path(path))
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        keep_mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        keep_mode = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):  # a fresh random name each try, as tempfile.mkstemp does
        tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary file name", str(target.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            if keep_mode is not None:
                os.fchmod(f.fileno(), keep_mode)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
