"""Server reflection that serves the contract with its comments.

grpcio-reflection answers with descriptors copied from the Python descriptor pool, and the
generated Python code carries no source info, so `grpcurl describe` would show the contract
without a word of its documentation. This servicer resolves names in the same pool, but for
the files in agentstate/common/descriptors.binpb (written by scripts/gen_protos.py from the same
.proto files with --include_source_info, committed and checked for staleness) it sends those
descriptors instead: the same definitions, plus their comments.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from functools import cache
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

DESCRIPTOR_SET = "descriptors.binpb"
SERVICE_NAME: str = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"].full_name


@cache
def documented_files() -> dict[str, bytes]:
    """File name -> serialized FileDescriptorProto with source info, from the package."""
    data = resources.files("agentstate.common").joinpath(DESCRIPTOR_SET).read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    return {f.name: f.SerializeToString() for f in files}


class DocumentedReflectionServicer(reflection_pb2_grpc.ServerReflectionServicer):  # type: ignore[misc]
    """grpc.reflection.v1alpha.ServerReflection (what grpcurl and Postman speak)."""

    def __init__(self, service_names: Iterable[str]) -> None:
        self._service_names = sorted(service_names)
        self._pool = descriptor_pool.Default()
        self._documented = documented_files()

    async def ServerReflectionInfo(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        async for request in request_iterator:
            yield self._answer(request)

    def _answer(self, request: Any) -> Any:
        kind = request.WhichOneof("message_request")
        try:
            if kind == "list_services":
                return reflection_pb2.ServerReflectionResponse(
                    original_request=request,
                    list_services_response=reflection_pb2.ListServiceResponse(
                        service=[
                            reflection_pb2.ServiceResponse(name=name)
                            for name in self._service_names
                        ]
                    ),
                )
            if kind == "file_by_filename":
                return self._files(request, self._pool.FindFileByName(request.file_by_filename))
            if kind == "file_containing_symbol":
                symbol = request.file_containing_symbol
                return self._files(request, self._pool.FindFileContainingSymbol(symbol))
            if kind == "file_containing_extension":
                wanted = request.file_containing_extension
                message = self._pool.FindMessageTypeByName(wanted.containing_type)
                extension = self._pool.FindExtensionByNumber(message, wanted.extension_number)
                file = self._pool.FindFileContainingSymbol(extension.full_name)
                return self._files(request, file)
            if kind == "all_extension_numbers_of_type":
                message = self._pool.FindMessageTypeByName(request.all_extension_numbers_of_type)
                numbers = sorted(e.number for e in self._pool.FindAllExtensions(message))
                return reflection_pb2.ServerReflectionResponse(
                    original_request=request,
                    all_extension_numbers_response=reflection_pb2.ExtensionNumberResponse(
                        base_type_name=message.full_name, extension_number=numbers
                    ),
                )
        except KeyError:
            return self._error(request, grpc.StatusCode.NOT_FOUND)
        return self._error(request, grpc.StatusCode.INVALID_ARGUMENT)

    def _files(self, request: Any, file: FileDescriptor) -> Any:
        """The file and everything it imports, each with comments where we have them."""
        ordered: dict[str, FileDescriptor] = {}
        pending = [file]
        while pending:
            current = pending.pop()
            if current.name not in ordered:
                ordered[current.name] = current
                pending.extend(current.dependencies)
        return reflection_pb2.ServerReflectionResponse(
            original_request=request,
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(
                file_descriptor_proto=[self._serialized(f) for f in ordered.values()]
            ),
        )

    def _serialized(self, file: FileDescriptor) -> bytes:
        documented = self._documented.get(file.name)
        if documented is not None:
            return documented
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        return proto.SerializeToString()

    @staticmethod
    def _error(request: Any, code: grpc.StatusCode) -> Any:
        number, message = code.value
        return reflection_pb2.ServerReflectionResponse(
            original_request=request,
            error_response=reflection_pb2.ErrorResponse(
                error_code=number, error_message=str(message)
            ),
        )


def enable_documented_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    names = [*service_names, SERVICE_NAME]
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        DocumentedReflectionServicer(names), server
    )
