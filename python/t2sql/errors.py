"""Every error t2sql raises: one family under T2sqlError. The core's errors are raised by the Rust core and
re-exported here; the rest are Python's. Where an error used to derive from ValueError or RuntimeError it still
does, so code that caught those keeps working."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from t2sql._grader import (
    DatabaseClosed,
    DatabaseError,
    HashSecretMismatch,
    InvalidArgument,
    QueryCancelled,
    QueryTimeout,
    SqlError,
    T2sqlError,
    UnsafeQuery,
)

__all__ = [
    "AdapterError",
    "ArchiveError",
    "ChecksumMismatch",
    "CispoConfigError",
    "CurriculumError",
    "DataError",
    "DatabaseClosed",
    "DatabaseError",
    "DatabaseTooLarge",
    "DownloadError",
    "DownloadStalled",
    "EndpointError",
    "EpisodeFinished",
    "EquivalenceError",
    "EvalError",
    "ForeignFilesError",
    "GoldCacheError",
    "HashSecretMismatch",
    "InvalidArgument",
    "LaunchError",
    "NoSpaceError",
    "OutputPathError",
    "PresetError",
    "PromptCommandError",
    "QueryCancelled",
    "QueryTimeout",
    "SchemaError",
    "SettingsError",
    "SqlError",
    "T2sqlError",
    "TaskError",
    "UnknownDatabase",
    "UnsafeQuery",
]


class EvalError(T2sqlError):
    """A usage or data problem that stops the run before it starts; the message says what to do."""


class LaunchError(T2sqlError, RuntimeError):
    """The run cannot start; the message names what is missing and what to do."""


class SchemaError(T2sqlError, ValueError):
    """The database's schema cannot be read (missing file, not SQLite, no tables)."""


class CurriculumError(T2sqlError, ValueError):
    """The curriculum cannot run as configured; the message says what to change."""


class SettingsError(T2sqlError, ValueError):
    """A rollout setting that cannot be used (a T2SQL_* variable, a framework's config value, a miles flag):
    one line naming the setting and what it must be (t2sql.episode.rollout.check_setting)."""


class AdapterError(T2sqlError, RuntimeError):
    """The adapter cannot run a sample (misconfiguration, or a malformed engine response)."""


class PresetError(T2sqlError, ValueError):
    """An unknown preset name, an unknown field, or a value out of range."""


class Problem(NamedTuple):
    """One reason a row of a question file cannot be converted (DataError lists them). `row` counts
    from 1 (JSON array index + 1, or line). A named tuple, not a dataclass: `import t2sql` loads this
    module, and dataclasses would bring inspect and ast with it."""

    # missing_database | bad_db_id | duplicate_id | empty_gold | empty_question | too_long | missing_field |
    # bad_grading_method | gold_error | bad_line
    kind: str
    row: int
    question_id: str
    message: str

    def __str__(self) -> str:
        qid = f" (question_id {self.question_id})" if self.question_id else ""
        return f"row {self.row}{qid}: {self.kind}: {self.message}"


class DataError(T2sqlError, ValueError):
    """The question file or databases cannot be converted; `problems` lists every reason."""

    def __init__(self, message: str, problems: list[Problem] | None = None):
        self.problems = list(problems or [])
        kinds = Counter(p.kind for p in self.problems)
        lines = [message]
        if len(kinds) > 1:
            lines.append("  by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
        # The rarer kinds first, so 2 odd rows are not buried under 2,000 missing databases.
        shown = sorted(self.problems, key=lambda p: (kinds[p.kind], p.row))
        lines += cap_lines([f"  {p}" for p in shown], indent="  ")
        super().__init__("\n".join(lines))


MAX_LISTED = 50  # a list a person reads (problems, skipped rows, failed golds) stops here, with a count


def cap_lines(lines: list[str], limit: int = MAX_LISTED, indent: str = "") -> list[str]:
    """The first `limit` lines, then "... and N more" (the whole list goes to --json or a report file)."""
    if len(lines) <= limit:
        return list(lines)
    return [*lines[:limit], f"{indent}... and {len(lines) - limit} more"]


class CispoConfigError(T2sqlError, ValueError):
    """The loss was asked for something CISPO cannot do; the message says which flag to change."""


class EndpointError(T2sqlError):
    """The model endpoint failed (after its retries, or in a way a retry cannot fix)."""

    def __init__(self, message: str, *, url: str, attempts: int, retryable: bool, unreachable: bool = False):
        super().__init__(message)
        self.url = url
        self.attempts = attempts
        self.retryable = retryable
        self.unreachable = unreachable  # no try ever connected (refused, unknown host): nothing is listening


class EquivalenceError(T2sqlError, ValueError):
    """The check is configured wrongly (a bad number of copies, an unknown kind, ...)."""


class DatabaseTooLarge(EquivalenceError):
    """The database is above the size cap for in-memory copies."""


class UnknownDatabase(DatabaseError):
    """A db_id (or path) that the data root or the manifest does not have."""


class TaskError(T2sqlError, ValueError):
    """A data row cannot become a Task (a field is missing or the database cannot be located)."""


class EpisodeFinished(T2sqlError, RuntimeError):
    """on_turn was called after the episode ended."""


class GoldCacheError(T2sqlError):
    """The gold cache directory cannot be used (unreadable secret, not a directory, ...)."""


class PromptCommandError(T2sqlError, ValueError):
    """The task cannot be found or read; the message says what to pass."""


class DownloadError(T2sqlError):
    """A file cannot be downloaded (an HTTP error, a network failure, a file that changed or came back
    short); the message names the URL and says what to do. `status` is the HTTP status when there was one."""

    def __init__(self, message: str, *, url: str, status: int | None = None):
        super().__init__(message)
        self.url = url
        self.status = status


class DownloadStalled(DownloadError):
    """The server stopped sending (no byte for the stall timeout, on every try), or sent too slowly for the
    download to end in time (under its floor rate, or past its deadline)."""


class ChecksumMismatch(DownloadError):
    """The file downloaded whole but its sha256 is not the pinned one (the partial file is deleted)."""

    def __init__(self, message: str, *, url: str, expected: str, actual: str):
        super().__init__(message, url=url)
        self.expected = expected
        self.actual = actual


class ArchiveError(T2sqlError):
    """A zip archive cannot be extracted: cut short, damaged (a member whose CRC32 or size does not match), an
    unsafe member name, or a database in it that is empty or fails its integrity check. The message names the
    archive (and the member) and says what to do; `archive` and `member` say the same for code."""

    def __init__(self, message: str, *, archive: str, member: str | None = None):
        super().__init__(message)
        self.archive = archive
        self.member = member


class NoSpaceError(T2sqlError):
    """Not enough free disk for what is to be written; `needed` and `free` are in bytes."""

    def __init__(self, message: str, *, path: str, needed: int, free: int | None):
        super().__init__(message)
        self.path = path
        self.needed = needed
        self.free = free


class ForeignFilesError(LaunchError):
    """A folder t2sql lays out holds files it did not write there (for `t2sql-train prepare`: and is not a
    complete copy it can use as it is). Nothing there was deleted or written; the message names the files and
    says what to do. `folder`; `files`, relative to it ("." is the folder itself: a link, or not a folder)."""

    def __init__(self, message: str, *, folder: str, files: list[str]):
        super().__init__(message)
        self.folder = folder
        self.files = list(files)


class OutputPathError(T2sqlError):
    """A path a command was told to write where it will not write (t2sql.atomic's rule): a directory, a
    device, a FIFO or socket, a symlink to one of them or to nothing, a folder that does not exist, or an
    existing file that is not this command's own output (without --force). Nothing was written; the
    message names the path and says what to do. `path` is the path as the user gave it."""

    def __init__(self, message: str, *, path: str):
        super().__init__(message)
        self.path = path
