"""Server reflection, both versions: ``grpc.reflection.v1`` and ``grpc.reflection.v1alpha``.

grpcio-reflection serves only v1alpha; newer tools (grpcurl 1.9, Postman,
grpc-java's CLI) ask for v1 first. The two protocols are the same messages
under another package name, byte for byte on the wire, so v1 is served by
the same servicer, with v1alpha's messages (de)serializing its frames. For
v1 to describe itself, its file descriptor (v1alpha's, renamed) goes into
the default descriptor pool once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
import grpc.aio
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

__all__ = ["V1ALPHA_SERVICE_NAME", "V1_SERVICE_NAME", "enable_reflection"]

V1ALPHA_SERVICE_NAME: str = reflection.SERVICE_NAME
_V1ALPHA_PACKAGE = "grpc.reflection.v1alpha"
_V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE_NAME = V1ALPHA_SERVICE_NAME.replace(_V1ALPHA_PACKAGE, _V1_PACKAGE)


def _renamed(type_name: str) -> str:
    return type_name.replace(f".{_V1ALPHA_PACKAGE}.", f".{_V1_PACKAGE}.")


def _rename_fields(message: descriptor_pb2.DescriptorProto) -> None:
    for field in message.field:
        if field.type_name:
            field.type_name = _renamed(field.type_name)
    for nested in message.nested_type:
        _rename_fields(nested)


def _add_v1_descriptor(pool: Any) -> None:
    """Put ``grpc/reflection/v1/reflection.proto`` into ``pool``, unless it is there."""
    try:
        pool.FindServiceByName(V1_SERVICE_NAME)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = "grpc/reflection/v1/reflection.proto"
    proto.package = _V1_PACKAGE
    proto.ClearField("options")  # v1alpha's language options name v1alpha packages
    for message in proto.message_type:
        _rename_fields(message)
    for service in proto.service:
        for method in service.method:
            method.input_type = _renamed(method.input_type)
            method.output_type = _renamed(method.output_type)
    pool.Add(proto)


def enable_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Serve reflection v1 and v1alpha on ``server``, listing ``service_names`` and both
    reflection services."""
    _add_v1_descriptor(descriptor_pool.Default())
    names = (*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString),
    })
    server.add_generic_rpc_handlers((v1,))
