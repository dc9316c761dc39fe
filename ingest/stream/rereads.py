"""Before a table's batch commits: ask its connector to read the suspect rows again (:mod:`ingest.rules.rereads`).

With ``source.kafka.reread_suspect_reads`` the run writes an ``execute-snapshot`` signal for those
rows to the connector's signal topic, or inserts it into its signal table (``signal_table``, in the
database ``signal_db_env`` names), as ``ingest resnapshot --where`` does; the connector's next
read of them comes after the commit it missed, and applied by position it puts the row right. Without
it, or when the rows have no condition both source databases read alike, the run logs the command
that does it. A signal the broker did not take is logged; the table goes on either way.
"""

from __future__ import annotations

import logging

from ingest import logs, secrets
from ingest.config import IngestConfig, TableSpec
from ingest.errors import ConfigError, first_line
from ingest.ops.resnapshot import insert_at, send, signals_for
from ingest.rules.rereads import SuspectReads, condition

log = logging.getLogger(__name__)

#: How many keys a log line shows.
_SHOWN = 10
#: The most keys one signal asks for: more is no longer a moment's race but a table that lost changes
#: (or a workload far beyond one), for a person to look at with ``ingest verify``.
MOST = 1000


def ask_again(config: IngestConfig, spec: TableSpec, suspects: SuspectReads, *, batch: int) -> bool:
    """Ask the connector of ``spec`` to read ``suspects`` again, or say how to; returns whether it was asked."""
    where = condition(suspects) if len(suspects) <= MOST else None
    keys = ", ".join(str(k[0] if len(k) == 1 else k) for k in suspects.keys[:_SHOWN])
    more = f" and {len(suspects) - _SHOWN:,} more" if len(suspects) > _SHOWN else ""
    what = (f"table {spec.name}: {len(suspects):,} incremental snapshot read(s) contradict the change streamed "
            f"before them (read before that change was visible, or the lake lost the change), keys {keys}{more}"
            + (f"; {len(suspects.deleted):,} of the reads follow a delete and are applied as it"
               if suspects.deleted else ""))
    kafka = config.source.kafka
    table = kafka.signal_table if kafka is not None else None
    through = f' --signal-table {table} --source-db "${kafka.signal_db_env}"' if kafka is not None and table else ""
    if len(suspects) > MOST:
        command = (f"check the table with ingest verify --source-db, and read it again with ingest resnapshot "
                   f"{spec.name}{through} (more than {MOST:,} rows: not asked for one by one)")
    else:
        command = (f'ingest resnapshot {spec.name} --where "{where}"{through}' if where is not None
                   else f"ingest resnapshot {spec.name}{through} --where with a condition that selects them")
    if where is None or kafka is None or not kafka.reread_suspect_reads:
        logs.event(log, "suspect-reads", f"{what}; to read them again: {command}", table=spec.name, batch=batch,
                   level=logging.WARNING, suspect_reads=len(suspects), asked=False)
        return False
    try:
        signals = signals_for(config, [spec.name], where)
        if kafka.signal_table is None:
            send(config, signals)
            sent_to = signals[0].topic
        else:
            dsn = secrets.lookup(kafka.signal_db_env, config.secrets_path)
            if dsn is None:
                raise ConfigError(f"source.kafka.signal_table is {kafka.signal_table}, but {kafka.signal_db_env} "
                                  "(the environment or the secrets file) names no database that has it")
            sent_to = insert_at(dsn, kafka.signal_table, signals)
    except Exception as exc:  # whatever stopped the signal, the batch commits: one line, and what to run instead
        cause = secrets.redact(f"{type(exc).__name__}: {first_line(exc)}")
        logs.event(log, "suspect-reads", f"{what}; could not ask the connector to read them again ({cause}): {command}",
                   table=spec.name, batch=batch, level=logging.ERROR, suspect_reads=len(suspects), asked=False)
        return False
    logs.event(log, "suspect-reads", f"{what}; asked the connector to read {where} again ({sent_to})", table=spec.name,
               batch=batch, level=logging.WARNING, suspect_reads=len(suspects), asked=True)
    return True
