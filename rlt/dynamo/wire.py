"""rlt's protocol messages inside Dynamo requests and responses (JSON objects): each message is
msgpack (rlt/protocol.py), base64 in a string.

The prefill endpoint (NAMESPACE.prefill.generate) takes {"op": ...}:
- "info": one response {"ready": Ready} (the prefill worker's fingerprint, pool geometry, agent);
- "prefill": {"key", "prefill": Prefill, "peer": PeerInfo, "fingerprint"}: the responses are the
  prefill worker's own messages about it ({"msg": Outputs | TransferDone | Drained | Failed}, with
  the decode side's generation id), ending with TransferDone, Drained or Failed;
- "cancel": {"key"}: the prefill stops; its "prefill" stream then ends with Drained (or
  TransferDone, when it had finished) once nothing can still be written.
"""

import base64

import msgspec

from rlt import protocol as pr


def pack(msg) -> str:
    return base64.b64encode(pr.encoder.encode(msg)).decode()


def unpack(text: str, decoder: msgspec.msgpack.Decoder):
    """decoder: rlt.protocol's from_worker, or one of PREFILL, PEER, READY."""
    return decoder.decode(base64.b64decode(text))


PREFILL = msgspec.msgpack.Decoder(pr.Prefill)
PEER = msgspec.msgpack.Decoder(pr.PeerInfo)
READY = msgspec.msgpack.Decoder(pr.Ready)
