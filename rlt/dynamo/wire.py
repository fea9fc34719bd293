"""The prefill endpoint's messages (NAMESPACE.prefill.generate): msgspec Structs in two tagged
unions, one per direction, each carried in Dynamo's JSON request or response as
{"wire": base64 of its msgpack}.

- InfoCall: one InfoReply, the prefill worker's Ready (fingerprint, pool geometry, agent);
- PrefillCall: Event replies, the prefill worker's own messages about the request (Outputs,
  TransferDone, Drained, Failed, with the decode side's generation id), ending with TransferDone,
  Drained or Failed;
- CancelCall: one Cancelled reply; the prefill stops and its PrefillCall's stream ends with Drained
  (or TransferDone, when it had finished) once nothing can still be written.
"""

import base64

import msgspec

from rlt.contract import protocol as pr


class InfoCall(msgspec.Struct, tag="info"):
    pass


class PrefillCall(msgspec.Struct, tag="prefill", kw_only=True):
    key: str  # the caller's name for the request (its CancelCall's)
    prefill: pr.Prefill  # with the decode side's generation id and block tables
    peer: pr.PeerInfo  # the decode worker's NIXL agent
    fingerprint: str | None  # the decode worker's: a prefill worker that differs refuses it


class CancelCall(msgspec.Struct, tag="cancel"):
    key: str


Call = InfoCall | PrefillCall | CancelCall


class InfoReply(msgspec.Struct, tag="info"):
    ready: pr.Ready


class Event(msgspec.Struct, tag="event"):
    msg: pr.Outputs | pr.TransferDone | pr.Drained | pr.Failed


class Cancelled(msgspec.Struct, tag="cancelled"):
    ok: bool  # False: no request of that key is held


Reply = InfoReply | Event | Cancelled

_calls, _replies = msgspec.msgpack.Decoder(Call), msgspec.msgpack.Decoder(Reply)


def pack(msg: Call | Reply) -> dict:
    return {"wire": base64.b64encode(pr.encoder.encode(msg)).decode()}


def call(obj: dict) -> Call:
    """A request's Call (msgspec.ValidationError / DecodeError for anything else)."""
    return _calls.decode(base64.b64decode(obj["wire"]))


def reply(obj: dict) -> Reply:
    return _replies.decode(base64.b64decode(obj["wire"]))
