"""The shape of exported deliveries: column names, types and the DataFrame builder.

Shared by both stores and by the client's wire export, so the oracle sees the
same frame whichever way it reads the store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:  # pandas is imported lazily: the server must start fast after a kill
    import pandas

# Column order of the deliveries table.
ROW_COLUMNS = (
    "arrival_seq",  # global arrival order over all trials, gap-free per write event
    "trial",
    "op_id",
    "attempt",  # 1 for a first send, +1 per client resend; 0 on a refused commit row
    "epoch",  # -1 on a refused commit row that named no epoch
    "digest",
    "connection_id",  # boot * 1_000_000 + connection number within that boot
    "client",  # what the client said in hello (e.g. "pid:1234"), else ""
    "kind",  # publish | prepare | commit (only refused commits make rows)
    "decision",  # applied | suppressed | prepared | committed | aborted | rejected
    "decided_seq",  # arrival_seq of the event that set the decision
    "received_at",  # unix time the frame was parsed by the server
    "sender",  # the incarnation of the process that sent this frame (a resend: the one that resent it); -1 if unsaid
)
# Export adds the trial's delivery mode, joined from the trials table.
EXPORT_COLUMNS = ROW_COLUMNS + ("mode",)
INT_COLUMNS = ("arrival_seq", "op_id", "attempt", "epoch", "connection_id", "decided_seq", "sender")
FENCE_COLUMNS = ("arrival_seq", "trial", "fence", "received_at")


def rows_to_frame(rows: Iterable[Sequence], columns: Sequence[str] = EXPORT_COLUMNS) -> "pandas.DataFrame":
    """Return a DataFrame of ``rows`` with fixed columns and dtypes (also when empty)."""
    import pandas as pd

    df = pd.DataFrame.from_records(list(rows), columns=list(columns))
    for col in df.columns:
        if col in INT_COLUMNS or col == "fence":
            df[col] = df[col].astype("int64")
        elif col == "received_at":
            df[col] = df[col].astype("float64")
        else:
            df[col] = df[col].astype("object")
    return df
