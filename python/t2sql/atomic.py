"""Writing files: the one rule for where a t2sql command may write (`OutputFile`; `atomic_write` applies all of it
but the own-output check, for files in t2sql's own folders), and writing so that a reader sees the old file or
the whole new one: a temporary file beside the target, flushed and fsynced, renamed after the checks are made once
more. Each refusal is an OutputPathError naming the path. The rule: docs/cli.md, "Output files: one rule"."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

from t2sql.errors import OutputPathError

# How much of an existing file is read to tell whether it is a command's own output: the first line of
# any t2sql output (a converted row's prompt included) is far below it, and reading it costs nothing.
HEAD_BYTES = 1 << 20


class OutputFile:
    """One file a command writes, under the rule above.

    flag: how the user named the path ("--out"), for the messages; kind: what the command writes there
    ("a t2sql grade verdicts file"); own(head): whether the first HEAD_BYTES of an existing file are
    the command's own output; force: replace any regular file; inputs: (label, path) of the files the
    run reads, which are never its output; instead: what to do instead (default "pass another FLAG")."""

    __slots__ = ("path", "flag", "kind", "own", "force", "inputs", "instead")

    def __init__(self, path: str | os.PathLike, *, flag: str, kind: str,
                 own: Callable[[bytes], bool] | None = None, force: bool = False,
                 inputs: Iterable[tuple[str, str | os.PathLike]] = (), instead: str | None = None) -> None:
        self.path = Path(path)
        self.flag = flag
        self.kind = kind
        self.own = own
        self.force = force
        self.inputs = tuple((label, Path(p)) for label, p in inputs)
        self.instead = instead or f"pass another {flag}"

    @property
    def where(self) -> str:
        return f"{self.flag} {self.path}"

    def check(self) -> Path:
        """The file to write (`path`, or what a symlink at `path` points to); OutputPathError when the
        rule refuses it. Commands call it before their work starts, so a refusal costs nothing."""
        target, existing = check_path(self.path, self.where, self.instead)
        if existing is None:
            return target
        for label, source in self.inputs:
            if _same_file(target, source):
                raise OutputPathError(f"{self.where} is {label} this run reads ({source}); {self.instead}",
                                      path=str(self.path))
        if existing.st_size and not self.force and not (self.own is not None and self.own(read_head(target))):
            raise OutputPathError(
                f"{self.where} exists and is not {self.kind}; t2sql replaces only its own output: pass --force "
                f"to replace it, or {self.instead}", path=str(self.path))
        return target

    @contextlib.contextmanager
    def open(self, mode: str = "w") -> Iterator[IO]:
        """Write the file (see the module doc): checked now and again before the rename."""
        with _replace(self.path, self.check(), mode, self.check) as f:
            yield f

    def write_bytes(self, data: bytes) -> None:
        with self.open("wb") as f:
            f.write(data)


def output_folder(path: str | os.PathLike, *, flag: str, create: bool = True) -> Path:
    """A folder a command writes its files into (convert's --out-dir, gold's --cache-dir, bench's --work-dir):
    a directory that exists, or one made here (`create`) when its parent is a directory: one level, never
    from the root up. create=False only checks, so a refusal comes before the work. The files in it are
    each written under the rule (OutputFile). OutputPathError when the folder cannot be used."""
    path = Path(path)
    where = f"{flag} {path}"
    if path.is_dir():
        _check_writable(path, where, f"pass another {flag}", path)
        return path
    if path.exists() or path.is_symlink():
        raise OutputPathError(f"{where} is not a directory; pass another {flag}", path=str(path))
    if not path.parent.is_dir():
        raise OutputPathError(f"{where}: the folder {path.parent} does not exist (t2sql never creates it); create "
                              f"it first, or pass another {flag}", path=str(path))
    _check_writable(path.parent, where, f"pass another {flag}", path)
    if create:
        path.mkdir(exist_ok=True)
    return path


def check_path(path: Path, where: str | None = None, instead: str = "move it out of the way"
               ) -> tuple[Path, os.stat_result | None]:
    """(the file a write to `path` replaces or creates: symlinks followed; its stat when it exists).
    OutputPathError when no file may be written there: every point of the rule but the content's."""
    where = where or str(path)

    def refuse(why: str, then: str = "") -> OutputPathError:
        return OutputPathError(f"{where}{why}; {then}{instead}", path=str(path))

    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise refuse(f" is a symlink to nothing ({os.readlink(path)})") from None
        parent = path.parent
        if not parent.is_dir():
            raise refuse(f": the folder {parent} does not exist (t2sql never creates it)", "create it first, or ") \
                from None
        _check_writable(parent, where, instead, path)
        return path, None
    except NotADirectoryError:
        raise refuse(f": {path.parent} is not a folder") from None
    if stat.S_ISDIR(st.st_mode):
        raise refuse(" is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        through = f", through the symlink to {os.path.realpath(path)}" if os.path.islink(path) else ""
        raise refuse(f" is not a regular file (a device, FIFO or socket{through}); t2sql writes only regular "
                     "files, never over anything else")
    for fd, stream in ((1, "standard output"), (2, "standard error")):
        try:
            open_as = os.fstat(fd)
        except OSError:  # closed
            continue
        if (open_as.st_dev, open_as.st_ino) == (st.st_dev, st.st_ino):  # `--out /dev/stdout > f`, `--out f > f`
            raise refuse(f" is this command's {stream}; a file renamed over it would leave the stream writing into "
                         "a file that is gone")
    target = Path(os.path.realpath(path)) if os.path.islink(path) else path
    _check_writable(target.parent, where, instead, path)
    return target, st


def _check_writable(folder: Path, where: str, instead: str, path: Path) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {where}: the folder {folder} is not writable; {instead}",
                              path=str(path))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def read_head(path: Path, limit: int = HEAD_BYTES) -> bytes:
    """The first `limit` bytes of a regular file; b"" for anything else (opened without blocking, so a
    FIFO put there since the check is never waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        parts, size = [], 0
        while size < limit:
            part = os.read(fd, limit - size)
            if not part:
                break
            parts.append(part)
            size += len(part)
        return b"".join(parts)
    finally:
        os.close(fd)


def first_line(head: bytes) -> bytes | None:
    """The first line of a file whose head is `head`, without its newline; None when it does not end
    within the head (a line that long is no output of ours)."""
    line, newline, _ = head.partition(b"\n")
    if newline or len(head) < HEAD_BYTES:
        return line
    return None


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Write `path` through a temporary file beside it: on success it is flushed, fsynced, given the
    mode a plain `open` would give (mkstemp's is 0600) and renamed over `path`. On any error, or an
    interrupt, the temporary file is removed and `path` is untouched. For files in t2sql's own folders;
    the rule's checks apply (no folder created, nothing but a regular file replaced), not the content's."""
    path = Path(path)
    with _replace(path, check_path(path)[0], mode, lambda: check_path(path)[0]) as f:
        yield f


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path, "wb") as f:
        f.write(data)


@contextlib.contextmanager
def _replace(path: Path, target: Path, mode: str, recheck: Callable[[], Path]) -> Iterator[IO]:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        try:
            again = recheck()
        except OutputPathError as e:
            raise OutputPathError(f"{e} (found when the output was ready; nothing was written)", path=e.path) from None
        if again != target:
            raise OutputPathError(f"{path} now leads to {again}, not {target} as when this run began; nothing was "
                                  "written: run again", path=str(path))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
