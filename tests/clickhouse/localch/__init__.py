"""The local ClickHouse: the real ClickHouse engine (chDB) behind ClickHouse's HTTP interface.

- `errors`: ClickHouse's error shape and HTTP statuses.
- `engine`: the chDB engine, a bounded pool of its connections, and named sessions.
- `codecs`: HTTP content codings and ClickHouse's own compressed block format.
- `request`: where a query comes from (URL, body, multipart form) and how INSERT data is split off.
- `handler`: the HTTP handler that ties them together.

`server.py` beside this package is the command that runs it.
"""
