"""The loopback HTTP file server the download, archive and end-to-end tests serve files with.

It lives in the package, t2sql.bench.loopback, because `t2sql bench download` serves its file with the same
server; this module is its name in the tests. 127.0.0.1 only; Range, If-Range, ETag, Last-Modified, and
faults, for the next request (`fault`) or for every request (`always`): a status, a cut after N bytes, a
stall, a rate limit (a drip), a lying Content-Length, Range ignored, an ETag new at every request, a wrong
Content-Range, an endless body without a Content-Length."""

from t2sql.bench.loopback import Fault, LoopbackFileServer, Request, ServedFile

__all__ = ["Fault", "LoopbackFileServer", "Request", "ServedFile"]
