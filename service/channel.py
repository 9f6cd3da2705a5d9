"""gRPC options of rlgate's long-lived streams: how soon a channel reconnects, and keepalive.

Every stream rlgate keeps open (an env client's Connect, a server's SubmitEpisodes and WatchWeights) may
outlive its peer. gRPC's defaults reconnect with a backoff that grows to 120 s, so a learner that is back
may go unnoticed for minutes; and a peer that vanishes without closing its TCP connection (a host switched
off, a NAT that forgot the connection) is noticed only by keepalive pings, which are off by default.

`CHANNEL_OPTIONS` (every rlgate channel): a connection attempt every quarter second while the peer is
away, so a stream waiting for it resumes within about a quarter second of its return (at start-up, when
processes begin together, a client finds its server that soon after it listens; an attempt at a port where
nothing listens costs a refused SYN); a ping after 10 s without traffic, and the connection counts as dead
when 5 s pass without an answer. `SERVER_OPTIONS` (every rlgate server) accepts those pings on idle streams
(gRPC's default policy would end the connection with "too_many_pings").
"""

from __future__ import annotations

KEEPALIVE_MS = 10_000

CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 2_000),  # gRPC takes it as the deadline of one connection attempt
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),  # keep pinging an idle stream (WatchWeights between versions)
)

SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
    ("grpc.keepalive_permit_without_calls", 1),
)
