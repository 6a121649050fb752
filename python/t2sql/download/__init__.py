"""Fetching the recipe's databases: a resumable, verified HTTP download of one file (t2sql.download.http)
and the laying out of BIRD's nested archives (t2sql.download.archive, on t2sql's own zip reading in
t2sql.download.zipformat, zipdirectory, zipstream and zipentries; the laid-out folder's marker in
t2sql.download.marker, a database's check in t2sql.download.integrity). Nothing here knows the splits or the
CLI; `t2sql-train prepare` puts them together."""
