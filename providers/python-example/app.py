"""A cro provider written in Python: the FTI Fabric Manager API, SDK-free.

componentize-py turns this module into a WebAssembly component of the
`cro:provider@0.2.0` `provider-world` world (wit/since_v0.2.0). The host calls the
operations of the exported `CdiProvider` class, one fresh instance per call; the
provider reaches the fabric only through the host's imports (http, secrets, config,
log, state, and lookup for the Node -> machine mapping). Every failure is raised as
`Err(ProviderError_...)`, the WIT `result`'s error case: nothing is printed, nothing
panics on a bad reply.
"""

from typing import List

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types
from wit_world.imports.types import (
    AddOutcome_Attached,
    AttachedDevice,
    Capabilities,
    ConfigKey,
    DeviceKind,
    DeviceType,
    LookupKind,
    ProviderError_NotFound,
    ProviderInfo,
    RemoveOutcome_Removed,
)

import fti

VERSION = "0.2.0"


class CdiProvider(exports.CdiProvider):
    def describe(self) -> types.ProviderInfo:
        # Called at load with nothing granted: no import is used here.
        return ProviderInfo(
            name="fti-python",
            vendor="Fujitsu",
            version=VERSION,
            # Any model the fabric offers.
            devices=[DeviceKind(device_type=DeviceType.GPU, models=[]),
                     DeviceKind(device_type=DeviceType.CXLMEMORY, models=[])],
            capabilities=Capabilities(
                # The identity manager and the Fabric Manager share the endpoint.
                http=["${endpoint}"],
                secret_keys=list(fti.SECRET_KEYS),
                lookup=[LookupKind(api_version="v1", kind="Node", when_config=None)],
                # The cached token's expiry is read against the wall clock.
                clocks=True,
            ),
            config=[ConfigKey(name=name, required=required, description=description)
                    for (name, required, description) in fti.CONFIG_KEYS],
        )

    def add_resource(self, request: types.AddRequest) -> types.AddOutcome:
        r = request.resource
        fabric = fti.Fabric.from_config()
        machine = fabric.machine_of(r.target_node)
        serial, uuid = fabric.attach_once(request, machine)
        return AddOutcome_Attached(
            AttachedDevice(device_id=serial, fabric_device_id=uuid, machine_id=machine))

    def remove_resource(self, resource: types.ComposableResource) -> types.RemoveOutcome:
        if not resource.device_id and not resource.fabric_device_id:
            fti.log_info(f"{resource.name} holds no device id; nothing to detach")
            return RemoveOutcome_Removed()
        fabric = fti.Fabric.from_config()
        fabric.detach(resource, fabric.machine_of_resource(resource))
        return RemoveOutcome_Removed()

    def check_resource(self, resource: types.ComposableResource) -> None:
        if not resource.device_id:
            raise Err(ProviderError_NotFound(f"{resource.name} holds no device id"))
        fabric = fti.Fabric.from_config()
        fabric.check(resource, fabric.machine_of_resource(resource))

    def get_resources(self, claims: List[types.Claim]) -> List[types.DeviceInfo]:
        # The fabric says which machine each device is on; claims are not needed to list.
        fabric = fti.Fabric.from_config()
        return fabric.all_devices()
