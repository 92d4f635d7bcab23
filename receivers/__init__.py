"""The receiver service: the durable external world every trial publishes its effects to.

Modules, one concern each:

- ``protocol``: framing and message validation (``PROTOCOL.md`` describes the wire format);
- ``schema``: the shape of exported deliveries (columns, types, the DataFrame builder);
- ``ledger``: the delivery modes (at_least_once, idempotent, fenced) as pure logic;
- ``stores``: ``open_store(url)`` for SQLite and PostgreSQL, with ``export`` for the oracle;
- ``server``: the asyncio service with its group-committing writer;
- ``command``: its command line, ``python -m cutbench.receivers serve`` (``__main__``) and ``cutbench receiver serve``;
- ``process``: ``start_receiver`` runs the service as a separate OS process;
- ``client``: ``ReceiverClient``, the blocking client workloads use (survives CRIU restores);
- ``pgcluster``: a throwaway PostgreSQL cluster for tests and the benchmark;
- ``bench``: throughput and latency figures.
"""

if __name__ != "cutbench.receivers":  # e.g. ``import receivers`` with a checkout's root on sys.path
    raise ImportError(f"{__name__!r} is cutbench's receivers folder under another name: import cutbench.receivers "
                      "(a module imported under two names is two modules, and its classes are not themselves)")
