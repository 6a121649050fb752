"""Type stubs for the compiled grading core (grader_rs, built by maturin).

Everything SQL runs here, with the GIL released. The Python package re-exports these
names from `t2sql`; import them from there.
"""

from os import PathLike
from pathlib import Path
from typing import Callable, Literal, Protocol, Sequence

# A grading method: multiset, set, ordered (or list), auto (ordered when the gold has ORDER BY, else
# multiset), or subset with a comparison and a count ("subset,=,N": exactly N distinct gold rows; every
# comparison is in METHODS). Names are read leniently (case, spaces). The canonical name of a resolved
# method is one of METHODS but "auto", N its count (a str). `Method` is a name parsed.
MethodName = str
Resolved = str
Outcome = Literal[
    "match", "mismatch", "pred_error", "pred_timeout", "unsafe", "gold_error", "gold_timeout"
]
Value = int | float | str | bytes | None

class T2sqlError(Exception):
    """Base class of every error the grading core raises."""

class UnsafeQuery(T2sqlError):
    """A statement of the SQL parses and would write, attach, detach, load an extension, vacuum or
    change a setting (PRAGMA, a transaction): the authorizer refuses it, it is not read-only, or it
    names such an action on an object that is not there (`DROP TABLE no_such_table`). Wherever it
    stands in the text (`SELECT 1; DROP TABLE t`)."""

class SqlError(T2sqlError):
    """SQLite rejected or failed the query; the message is SQLite's. Also what is not one query but
    writes nothing: text SQLite cannot parse (`SELEC 1`: 'near "SELEC": syntax error ...'), an
    empty query, EXPLAIN, more than one SELECT."""

class QueryTimeout(T2sqlError):
    """The query ran past its deadline and was interrupted ("query timed out after Ns").

    str() of every error is what the model is shown after "Error: "."""

class QueryCancelled(T2sqlError):
    """The query was interrupted through its Cancel token."""

class DatabaseError(T2sqlError):
    """The database file is missing, unreadable, corrupt or not SQLite."""

class DatabaseClosed(DatabaseError):
    """The Database was closed (close(), or the end of its `with` block); open a new one."""

class ConstraintError(DatabaseError):
    """A row given to Database.from_rows breaks a constraint of the schema (a CHECK, a UNIQUE under
    its collation, a unique expression index, NOT NULL, ...): that small database cannot exist."""

class SpillError(T2sqlError):
    """A set or subset digest past its memory budget could not spill to its temporary directory
    (the message names it and says what to do)."""

class TempDiskExceeded(SqlError):
    """The query's temporary files (SQLite's sorts, DISTINCT, GROUP BY and temporary results)
    would have passed its cap, max_temp_mb, and it was stopped. A SqlError: a tool call shows it
    to the model, a prediction grades pred_error and a gold gold_error with its message ("the
    query needed more than N MiB of temporary disk ...")."""

class HashSecretMismatch(T2sqlError):
    """A gold digest made under another hash secret than the process's: compute it again."""

class InvalidArgument(T2sqlError, ValueError):
    """An argument the core cannot take; the message names it and the range allowed (an integer
    limit, seed or digit count out of range such as -1, a timeout that is not a positive number of
    seconds, an unknown method or column order name, a path that is not UTF-8)."""

# The core's verdict outcomes, in report order.
OUTCOMES: tuple[Outcome, ...]
# Floats compare to at most this many significant digits (float_digits).
MAX_FLOAT_DIGITS: int
# The longest SQL text a query may be, in bytes (longer is SqlError before anything is parsed).
MAX_SQL_BYTES: int
# The pragmas Database.catalog reads: ("table_list", "table_info", "index_list", "index_info",
# "foreign_key_list").
CATALOG_PRAGMAS: tuple[str, ...]
# What a grade gets when the caller names nothing; the defaults written `...` below are these values
# (a tool call has no default preview: the caller's preset owns it).
GRADE_DEFAULTS: dict[str, float | int]  # timeout_s, float_digits, memory_mb, max_temp_mb
# Every form of a grading method as messages show them (a subset's count written N), a subset once per
# comparison: ("multiset", "ordered", "set", "subset,=,N", "subset,>=,N", ..., "auto"); the one list.
METHODS: tuple[str, ...]
# Every column order: ("strict", "ignore").
COLUMN_ORDERS: tuple[Literal["strict", "ignore"], ...]

class ToolLimits:
    """What one `execute_sql_query` call may show, how long it may run and how much temporary disk
    it may use, built once (a preset builds one: Preset.tool_limits) and handed to the core whole:
    Database.run_tool, Grader.run_tool and the pool's ToolJob take it. The preview and its timeout
    have no default (the preset owns them); max_temp_mb defaults to the core's cap (GRADE_DEFAULTS).
    Checked at construction: an integer out of range or a timeout that is not a positive number of
    seconds is InvalidArgument naming it. A preview shows at least 16 characters and counts at least
    1 row whatever max_chars and count_cap say. Frozen, comparable, hashable, picklable."""

    def __init__(
        self,
        *,
        timeout_s: float,
        max_rows: int,
        max_cell_chars: int,
        max_chars: int,
        count_cap: int,
        max_temp_mb: int = ...,
    ) -> None: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def max_rows(self) -> int: ...  # preview rows shown
    @property
    def max_cell_chars(self) -> int: ...  # each cell cut to this many characters
    @property
    def max_chars(self) -> int: ...  # the whole preview text cut to this many characters
    @property
    def count_cap(self) -> int: ...  # rows are counted up to this many
    @property
    def max_temp_mb(self) -> int: ...  # MiB of temporary files the query may hold: TempDiskExceeded past it
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class Method:
    """A grading method as a task or a flag names it, parsed by the core's one parser (the parser
    every grade uses): read leniently (case, spaces, `list` = ordered, `==` = `=`), "auto" kept
    unresolved. An unreadable name (an unknown word, "subset,<,3") is InvalidArgument saying what
    is wrong. The prompt's ordering rule reads it (t2sql.episode.prompt.order_rule). Frozen,
    comparable, hashable, picklable."""

    def __init__(self, name: MethodName) -> None: ...
    @property
    def name(self) -> str: ...  # canonical: one of METHODS, a subset's N its count
    @property
    def kind(self) -> Literal["auto", "multiset", "ordered", "set", "subset"]: ...
    @property
    def operator(self) -> str | None: ...  # a subset's comparison as its name writes it: "=", ">=", ...
    @property
    def operator_words(self) -> str | None: ...  # the same in the prompt's words: "exactly", "at least", ...
    @property
    def count(self) -> int | None: ...  # a subset's N: distinct gold rows
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class GradeSpec:
    """How a prediction is graded: the method, float digits, column order, and the timeout and
    temporary disk (max_temp_mb, MiB, at least 1) of each query, checked once at construction. The
    method is read (leniently: case, spaces, `list` = ordered) and resolved here, once: "auto" is
    ordered when `gold_sql`'s outermost query has ORDER BY, else multiset, and needs `gold_sql`
    (without it: InvalidArgument). An unreadable method, float_digits outside 1..MAX_FLOAT_DIGITS
    (None: exact), another column order, a timeout that is not a positive number of seconds or a
    max_temp_mb under 1 is InvalidArgument with the message the grade calls give. Frozen,
    comparable, hashable, picklable."""

    def __init__(
        self,
        method: MethodName = "multiset",
        *,
        gold_sql: str | None = None,
        float_digits: int | None = ...,
        column_order: Literal["strict", "ignore"] = "strict",
        timeout_s: float = ...,
        max_temp_mb: int = ...,
    ) -> None: ...
    @property
    def method(self) -> Resolved: ...  # canonical: one of METHODS but auto, a subset's N its count
    @property
    def float_digits(self) -> int | None: ...
    @property
    def column_order(self) -> Literal["strict", "ignore"]: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def max_temp_mb(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class Cancel:
    """A cancellation token: `cancel()` from any thread interrupts the query that holds it."""
    def __init__(self) -> None: ...
    def cancel(self) -> None: ...
    @property
    def cancelled(self) -> bool: ...

class ToolResult:
    """What the model sees for one `execute_sql_query` call. Picklable (it comes back from worker
    processes and Ray actors as itself); equal when every field is."""
    columns: list[str]
    rows: list[tuple[Value, ...]]  # the preview rows, at most max_rows
    row_count: int  # true row count, counted up to count_cap
    row_count_capped: bool  # counting stopped at count_cap: the count is "row_count+"
    truncated: bool  # the preview (rows, cells or text) was cut
    elapsed_s: float
    text: str  # the rendered text sent back to the model

class Digest:
    """A result's streaming digest: counts plus a 128-bit keyed hash (never rows)."""
    method: Resolved
    float_digits: int | None
    rows: int  # rows for multiset/ordered; distinct rows for set and subset
    columns: int
    elapsed_s: float
    secret_id: str  # which hash secret made it; digests of different secrets never compare
    def to_bytes(self) -> bytes: ...
    @staticmethod
    def from_bytes(data: bytes) -> Digest: ...
    def same_result(self, other: Digest) -> bool:
        """Whether two digests (same method and secret) stand for equal results: maj@K's vote."""

class Verdict:
    outcome: Outcome
    detail: str
    method: Resolved
    pred_rows: int | None
    gold_rows: int | None
    elapsed_s: float
    @property
    def matched(self) -> bool: ...

class Database:
    """A hardened read-only connection to one SQLite file (the policy: docs/grader.md#guarantees).

    Not for sharing between threads at once: calls on one Database are serialized.
    Open one per thread (t2sql.Grader does this for you). `with Database(path) as db:` closes it at
    the end of the block, as close() does; a closed Database raises DatabaseClosed.
    Integer arguments are checked: out of their range (a negative limit, say) is InvalidArgument.
    """
    path: str
    # True: opened immutable=1 (no locks, the file trusted not to change). False: read with locks,
    # because the caller asked or a writer's -wal/-journal file was beside it at open.
    immutable: bool
    def __init__(self, path: str | bytes | PathLike[str] | PathLike[bytes], *, immutable: bool = True) -> None: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None:
        """Close the file (a call running on another thread finishes first); closing twice is fine."""
    def __enter__(self) -> Database: ...
    def __exit__(self, exc_type: object, exc_value: object, traceback: object) -> bool: ...
    def run_tool(self, sql: str, limits: ToolLimits, *, cancel: Cancel | None = None) -> ToolResult:
        """One tool call under `limits` (the caller's: the core has no default preview)."""
    def digest(self, sql: str, spec: GradeSpec | None = None, *, cancel: Cancel | None = None) -> Digest:
        """The result's digest under `spec` (None: GradeSpec(), multiset), each query under its timeout."""
    def grade_against(
        self,
        pred_sql: str,
        gold: Digest,
        timeout_s: float = ...,
        *,
        cancel: Cancel | None = None,
        max_temp_mb: int = ...,
    ) -> Verdict:
        """Grade against a gold digest (its method and float_digits apply). HashSecretMismatch
        when the digest was made under another hash secret: recompute it."""
    def grade(
        self, pred_sql: str, gold_sql: str, spec: GradeSpec | None = None, *, cancel: Cancel | None = None
    ) -> Verdict:
        """Grade under `spec` (built for this gold: its "auto" resolved against it; None: GradeSpec()).
        t2sql.grade() takes the spec's parts as arguments instead."""
    @staticmethod
    def from_rows(
        label: str,
        schema: list[str],
        tables: list[tuple[str, list[str], list[tuple[Value, ...]]]],
        *,
        reverse_scans: bool = False,
        timeout_s: float = ...,
        cancel: Cancel | None = None,
        max_temp_mb: int = ...,
    ) -> Database:
        """A small in-memory database: `schema` (CREATE TABLE / INDEX / VIEW statements only, else
        InvalidArgument) then each table's rows (None, int, float, str or bytes cells; an int outside
        64 bits is InvalidArgument), hardened like a file (query_only, writes refused). Built under
        `timeout_s` (QueryTimeout), `cancel` (QueryCancelled) and `max_temp_mb`: a schema's CHECK runs
        at every insert. A row a constraint refuses is ConstraintError (a DatabaseError).
        `reverse_scans`: unordered scans run in reverse (a query whose result depends on scan order
        shows it)."""
    def rows(
        self,
        sql: str,
        params: Sequence[Value] = (),
        *,
        timeout_s: float = ...,
        max_temp_mb: int = ...,
        max_rows: int = ...,
        max_bytes: int = ...,
        cancel: Cancel | None = None,
    ) -> list[tuple[Value, ...]]:
        """The rows of one query checked as a tool call's is (one read-only statement, the authorizer),
        `params` bound to its `?` marks, under `timeout_s`, `cancel` and `max_temp_mb`: at most
        `max_rows` rows (default 10,000; the rest is never stepped), SqlError past `max_bytes` bytes
        of values (default 16 MiB). The equivalence check's reads of a real database go through it."""
    def tally(
        self,
        sql: str,
        params: Sequence[Value] = (),
        *,
        timeout_s: float = ...,
        max_temp_mb: int = ...,
        max_bytes: int = ...,
        cancel: Cancel | None = None,
    ) -> list[tuple[Value, int, tuple[str, ...]]] | None:
        """The distinct values of one checked query's one column (NULLs skipped), counted as the rows
        stream in a bounded hash, as `GROUP BY v COLLATE BINARY` groups them (texts and blobs by their
        bytes, an integer and a real of one value together): (a value of the group, its rows, the
        storage classes its rows hold). None once the groups pass `max_bytes` (default 16 MiB): group
        in SQL then. InvalidArgument for a query of another column count. Mining's column facts."""
    def catalog(
        self, pragma: str, name: str | None = None, *, timeout_s: float = ..., cancel: Cancel | None = None
    ) -> list[tuple[Value, ...]]:
        """The rows of SQLite's `pragma_<pragma>(name)` for one of CATALOG_PRAGMAS (`table_list` takes
        no name and lists the main schema's tables): what the database declares, for the equivalence
        check's mining. A query may name no pragma at all (UnsafeQuery); these run on a connection of
        the core's own whose authorizer allows exactly these reads, the name bound as a parameter."""
    def count_rows(
        self, sql: str, timeout_s: float = ..., *, cancel: Cancel | None = None, max_temp_mb: int = ...
    ) -> int:
        """Step through the result without reading a value (same checks as every query)."""
    def schema(self) -> list[tuple[str, str, str]]: ...  # (type, name, sql) from sqlite_master

class _Job(Protocol):
    """The fields SqlPool reads, by name, from every job (t2sql.serving.jobs)."""

    job_id: int
    db_path: str
    identity: tuple[int, int]  # the file's (size, version) as the Grader saw it
    sql: str

class _ToolJob(_Job, Protocol):
    limits: ToolLimits  # read whole; its timeout_s is the job's

class _DigestJob(_Job, Protocol):
    spec: GradeSpec  # read whole; its timeout_s is the query's

class _GradeJob(_Job, Protocol):
    gold: bytes  # Digest.to_bytes()
    timeout_s: float
    max_temp_mb: int

class SqlPool:
    """SQL worker threads that never take the GIL. Submit jobs by id; when `wake_fd()` turns
    readable, `drain()` returns (id, value, error) for every finished job: value is a ToolResult,
    (digest bytes, seconds), a Verdict or what a call returned, error the exception the same call
    on a Database raises (QueryCancelled for a cancelled job) or the call raised."""

    def __init__(self, size: int, *, nice: int = 0) -> None: ...
    def wake_fd(self) -> int: ...
    def submit_tool(self, job: _ToolJob) -> None: ...
    def submit_digest(self, job: _DigestJob) -> None: ...
    def submit_grade(self, job: _GradeJob) -> None: ...
    def submit_call(self, job_id: int, function: Callable[[Cancel], object]) -> None:
        """Run `function(cancel)` on a worker in a query's place (it counts against the pool's
        size); the worker takes the GIL to call it."""
    def cancel(self, job_id: int) -> None: ...
    def drain(self) -> list[tuple[int, object | None, BaseException | None]]: ...
    def close(self) -> None:
        """Cancel what runs or waits and join the workers; a last drain() collects those jobs."""

def method_name(name: MethodName) -> str:
    """The canonical name of a method as a task or a flag writes it ("list" -> "ordered", a bare
    "subset" -> "subset,>=,1", "auto" stays "auto"); InvalidArgument saying what is wrong."""
def resolve_method(gold_sql: str, method: MethodName) -> Resolved:
    """The canonical name of the method `method` names for this gold ("auto" resolved against its SQL);
    ValueError for a name that cannot be read."""
def sqlite_version() -> str: ...
def set_hash_secret(secret: bytes) -> None: ...
def hash_secret_id() -> str: ...
def sql_tokens(sql: str) -> list[tuple[Literal["word", "quoted", "semicolon", "open", "close", "other"], int, int]]:
    """The significant tokens of `sql` (whitespace and comments skipped) as (kind, start, end),
    in characters; the scanner the safety policy uses."""
def lower_thread_priority(nice: int) -> None:
    """Make the calling thread `nice` steps nicer (Linux; elsewhere, or if refused, a no-op)."""
def set_grade_memory(bytes: int, tmp_dir: str | PathLike[str] | None = None) -> tuple[int, Path | None]:
    """The process's grading memory: bytes of row keys one set or subset digest holds before it
    spills to anonymous files under `tmp_dir` (None: the system's temporary directory); at least
    64 KiB. Digests started afterwards use it. Returns the previous (bytes, tmp_dir);
    InvalidArgument for a budget under 64 KiB or a tmp_dir that is not a directory."""
def grade_memory() -> tuple[int, Path | None]:
    """The process's grading memory: (bytes, tmp_dir); the default is GRADE_DEFAULTS["memory_mb"] MiB."""
def spill_usage(*, reset: bool = False) -> tuple[int, int]:
    """(bytes the live spill files hold now, the most they held at once); reset=True starts the
    peak over from now."""
def temp_usage(*, reset: bool = False) -> tuple[int, int]:
    """(bytes the process's SQLite temporary files hold now, the most they held at once); reset=True
    starts the peak over from now. Each query's own share is capped by its max_temp_mb."""
def sqlite_temp_dir() -> Path | None:
    """The directory SQLite puts its temporary files in: the first of SQLITE_TMPDIR, TMPDIR,
    /var/tmp, /usr/tmp, /tmp and . that this process may write; None when none is."""
def file_digest(path: str | bytes | PathLike[str] | PathLike[bytes], *, cancel: Cancel | None = None) -> str:
    """XXH3-128 of the file's bytes, 32 hex digits, streamed without the GIL (DatabaseError for a
    missing file or one that is not regular; `cancel` stops it between 1 MiB chunks: QueryCancelled):
    what the equivalence check's caches are keyed by."""
def set_heap_limit(bytes: int) -> int:
    """SQLite's process-wide hard heap limit (0 = none); returns the previous one. Without a
    call, the first Database installs 2 GiB."""
