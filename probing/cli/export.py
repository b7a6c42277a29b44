"""`probing FILE export --parquet DIR`: every table of a record as a Parquet (or CSV) file, for
sharing; the record's header beside them as record.json."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.kinds.record import Record
from .invocation import Invocation
from .options import apply, pass_invocation
from .render import notes
from .render.record import write_exported
from .spec import TEXT_OR_JSON


@click.command()
@click.option("--parquet", metavar="DIR", help="Write each table as DIR/TABLE.parquet (created if missing).")
@click.option("--csv", metavar="DIR", help="Write each table as DIR/TABLE.csv (created if missing).")
@click.option("--force", is_flag=True, help="Replace files that exist.")
@apply(TEXT_OR_JSON)
@pass_invocation
def export(
    invocation: Invocation, parquet: Optional[str], csv: Optional[str], force: bool, format: str
) -> int:
    """Every table of a record as Parquet (or CSV) through DuckDB, and its header as record.json.

    \b
      probing FILE export --parquet out/     out/python.torch_trace.parquet, ... out/record.json
      probing PID record                     a record of a live job first, then export that
    """
    if (parquet is None) == (csv is None):
        raise click.UsageError("give one of --parquet DIR or --csv DIR")

    target = invocation.kind()
    if not isinstance(target, Record):
        raise click.UsageError(
            "export reads a record file: `probing PID record` writes one of a live job, "
            "then `probing FILE export`"
        )
    kind, directory = ("parquet", parquet) if parquet is not None else ("csv", csv)
    answer = target.export(directory or "", kind, force)
    notes(answer.notes)
    write_exported(answer.value, format)
    return answer.exit_code
