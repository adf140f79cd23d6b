"""hixl_wire: what a hixl client and a hixl daemon must agree on, and nothing else.

Both ``hixl_client`` and ``hixl_service`` import this package; it imports
neither, so each side depends on the wire and never on the other's insides:

* ``status``: LLMStatusCode, LLMException and how they travel over gRPC
  (their public home stays ``hixl_client.status``);
* ``types``: element types and their sizes, placements, roles and the
  placeholder id (their public home stays ``hixl_client.types``);
* ``lane``: the lanes' framing, method tables, the calling end of a lane
  and the lane's own request and error bodies;
* ``rings``: the shared-memory rings that carry a session's repeated
  transfers, and the HELLO that hands them over;
* ``link_status``: what a transfer that failed with a native status tells
  a client, whichever end raises it;
* ``defaults``: where a client and its local daemon meet (the default
  socket path, the session metadata key);
* ``compat``: Python 3.10 support shared by both sides;
* ``_proto``: the generated protobuf and gRPC stubs of ``proto/``.

This module imports nothing, so that ``hixl_wire.defaults`` stays cheap to
import (the daemon's ``--check`` needs it without gRPC).
"""
