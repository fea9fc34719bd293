"""A worker's role-specific parts, one per role (the Handshake's: unified, prefill, decode),
behind one small interface, Side (side.py), that the worker's loop (rlt/workers/worker.py)
drives:

- handle(msg): a control message of the role's (Reserve, Activate; Prefill, Cancel; Connect);
- abort(gen): drop what the role holds of an aborted request, before the engine aborts it;
- stepped(outs): the engine's step outputs (a prefill worker: which prompts have run);
- fail(gen, error): fail a request the engine failed (a prefill worker waits for its writes);
- progress(): after the step's Outputs, move the KV transfers and reply to what ended;
- busy(), queued(): what the role holds outside the engine (the loop's wait; the stats).

What a role sends goes through the worker's Outbox (rlt/workers/outbox.py)."""

from rlt.workers.roles.decode import DecodeSide
from rlt.workers.roles.prefill import PrefillSide
from rlt.workers.roles.side import Side

ROLES: dict[str, type[Side]] = {"unified": Side, "prefill": PrefillSide, "decode": DecodeSide}
