"""Dataset rows for other frameworks: what `t2sql convert --format verl|skyrl` writes (the whole t2sql row as one JSON
string under "t2sql", the framework's own fields around it) and `t2sql_row`, which reads the t2sql row back from
any of them. Imports no framework. The rows: docs/cli.md, "`t2sql convert`"."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from t2sql import jsonl
from t2sql.errors import DataError, Problem
from t2sql.tasks import open_input

AGENT_NAME = "t2sql"  # verl: the agent loop's registered name, each row's agent_name
ENV_CLASS = "t2sql"  # SkyRL: the environment's registered id, each row's env_class
DATA_SOURCE = "t2sql"
ROW_KEY = "t2sql"  # where the t2sql row's JSON sits in a framework's row
FORMATS = ("miles", "verl", "skyrl")  # `t2sql convert --format`; miles is t2sql's own row


def row_json(row: Mapping[str, Any]) -> str:
    """A t2sql row as the one JSON string a framework's row carries under ROW_KEY."""
    return jsonl.dumps(row, ensure_ascii=False, sort_keys=True)


def _common(row: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str, str]:
    prompt = [dict(m) for m in row["prompt"]]
    return prompt, str(row["label"]["gold_sql"]), str(row["metadata"]["question_id"])


def verl_row(row: Mapping[str, Any], *, split: str, index: int) -> dict[str, Any]:
    """A t2sql row as verl's RLHFDataset reads it, picking the t2sql agent loop."""
    prompt, gold, question_id = _common(row)
    return {
        "data_source": DATA_SOURCE,
        "agent_name": AGENT_NAME,
        "prompt": prompt,
        "ability": "text-to-sql",
        "reward_model": {"style": "rule", "ground_truth": gold},
        "extra_info": {"split": split, "index": index, "question_id": question_id, ROW_KEY: row_json(row)},
    }


def skyrl_row(row: Mapping[str, Any], *, split: str, index: int) -> dict[str, Any]:
    """A t2sql row as SkyRL's prompt dataset reads it, picking the t2sql environment."""
    prompt, gold, question_id = _common(row)
    return {
        "data_source": DATA_SOURCE,
        "prompt": prompt,
        "env_class": ENV_CLASS,
        "reward_spec": {"method": "rule", "ground_truth": gold},
        "split": split,
        "index": index,
        "question_id": question_id,
        ROW_KEY: row_json(row),
    }


SHAPERS = {"verl": verl_row, "skyrl": skyrl_row}


def framework_rows(rows: Iterable[Mapping[str, Any]], framework: str, *, split: str) -> Iterable[dict[str, Any]]:
    """t2sql rows as `framework`'s rows ("miles": t2sql's own, unchanged)."""
    if framework == "miles":
        yield from (dict(r) for r in rows)
        return
    shape = SHAPERS[framework]
    for index, row in enumerate(rows):
        yield shape(row, split=split, index=index)


def t2sql_row(value: Any) -> dict[str, Any]:
    """The t2sql row a framework's row carries: from its JSON text, from a dict that is one (prompt,
    label, metadata), or from a framework row or its extra_info/extras holding it under "t2sql".
    DataError (naming what is missing) otherwise."""
    if isinstance(value, Mapping):
        if "label" in value and "metadata" in value:
            return dict(value)
        for holder in (value, value.get("extra_info"), value.get("extras")):
            if isinstance(holder, Mapping) and ROW_KEY in holder:
                return t2sql_row(holder[ROW_KEY])
        raise DataError(f"this row carries no t2sql task: no {ROW_KEY!r} field (in it or its extra_info) and no "
                        f"label/metadata; write the data with `t2sql convert --format verl|skyrl`")
    if isinstance(value, (str, bytes)):
        try:
            row = jsonl.loads(value)
        except jsonl.JsonProblem as e:
            raise DataError(f"the row's {ROW_KEY!r} field is not a t2sql row's JSON: {e}") from None
        if not (isinstance(row, dict) and isinstance(row.get("label"), dict) and isinstance(row.get("metadata"), dict)
                and "gold_sql" in row["label"]):
            raise DataError(f"the row's {ROW_KEY!r} field is JSON but not a t2sql row (prompt, label with gold_sql, "
                            f"metadata); write the data with `t2sql convert`")
        return row
    raise DataError(f"the row's {ROW_KEY!r} field is a {type(value).__name__}, not a t2sql row")


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The t2sql rows of a file: a converted split (.jsonl, t2sql's own rows) or a verl/SkyRL file of the
    rows above (.jsonl or .parquet). DataError lists every line that holds no t2sql row."""
    path = Path(path)
    f = open_input(path, "rows file")  # a FIFO or a device is refused by its stat, never read
    if path.suffix == ".parquet":
        with f:
            return [t2sql_row(r) for r in _parquet_records(path, f)]
    rows, problems = [], []
    with f:
        for line in jsonl.json_lines(f):
            if line.problem:
                problems.append(Problem("bad_line", line.number, "", line.problem))
                continue
            try:
                rows.append(t2sql_row(line.value))
            except DataError as e:
                problems.append(Problem("bad_line", line.number, "", str(e)))
    if problems:
        raise DataError(f"{path}: {len(problems)} line(s) hold no t2sql row", problems)
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def _parquet_records(path: Path, f: Any) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading parquet needs pyarrow: pip install pyarrow "
                        f"(or write the rows as jsonl: t2sql convert --file-type jsonl)") from None
    try:
        return pq.read_table(f).to_pylist()
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: not a parquet file pyarrow reads ({str(e).splitlines()[0]})") from None


def is_framework_jsonl(first: bytes | None) -> bool:
    """Whether a jsonl file whose first line is `first` holds framework rows t2sql wrote (a t2sql row
    under "t2sql")."""
    value = jsonl.loads_or_none(first)
    if not isinstance(value, Mapping) or "label" in value:
        return False
    try:
        t2sql_row(value)
    except DataError:
        return False
    return True


def parquet_metadata_says_t2sql(path: Path) -> bool:
    """Whether a parquet file is one `t2sql convert` wrote (its footer's key-value metadata names it)."""
    try:
        import pyarrow.parquet as pq

        meta = pq.read_schema(path).metadata or {}
    except Exception:  # noqa: BLE001 - not ours is all this needs to know
        return False
    return meta.get(b"t2sql_format") in {f.encode() for f in FORMATS}


def write_parquet(output: Any, rows: list[dict[str, Any]], framework: str) -> int:
    """`rows` as one parquet file through `output` (a t2sql.atomic.OutputFile: temporary name, rename),
    its footer naming the format so a rerun may replace it."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("writing parquet needs pyarrow: pip install pyarrow (it comes with the verl and skyrl "
                        "extras), or pass --file-type jsonl") from None
    table = pa.Table.from_pylist(rows)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"t2sql_format": framework.encode()})
    with output.open("wb") as f:
        pq.write_table(table, f)
    return len(rows)
