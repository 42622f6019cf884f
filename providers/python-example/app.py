"""A cro provider written in Python: the FTI Fabric Manager API, SDK-free.

componentize-py turns this module into a WebAssembly component of the
`cro:provider/provider-world` world (wit/since_v0.1.0). The host calls the four
operations of the exported `Provider` class, one fresh instance per call; the provider
reaches the fabric only through the host's imports (http, secrets, config, log, state,
and lookup for the Node -> machine mapping). Every failure is raised as
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
    ProviderError_NotFound,
    RemoveOutcome_Removed,
)

import fti


class Provider(exports.Provider):
    def add_resource(self, resource: types.ComposableResource) -> types.AddOutcome:
        fabric = fti.Fabric.from_config()
        machine = fabric.machine_of(resource.target_node)
        serial, uuid = fabric.attach(resource, machine)
        return AddOutcome_Attached(AttachedDevice(device_id=serial, fabric_device_id=uuid))

    def remove_resource(self, resource: types.ComposableResource) -> types.RemoveOutcome:
        if not resource.device_id and not resource.fabric_device_id:
            fti.log_info(f"{resource.name} holds no device id; nothing to detach")
            return RemoveOutcome_Removed()
        fabric = fti.Fabric.from_config()
        machine = fabric.machine_of(resource.target_node)
        fabric.detach(resource, machine)
        return RemoveOutcome_Removed()

    def check_resource(self, resource: types.ComposableResource) -> None:
        if not resource.device_id:
            raise Err(ProviderError_NotFound(f"{resource.name} holds no device id"))
        fabric = fti.Fabric.from_config()
        machine = fabric.machine_of(resource.target_node)
        fabric.check(resource, machine)

    def get_resources(self) -> List[types.DeviceInfo]:
        fabric = fti.Fabric.from_config()
        return fabric.all_devices()
