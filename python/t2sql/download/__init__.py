"""Fetching the recipe's databases: a resumable, verified HTTP download of one file (t2sql.download.http)
and the reading of BIRD's nested archives (t2sql.download.archive). Nothing here knows the splits or the
CLI; `t2sql-train prepare` puts them together."""
