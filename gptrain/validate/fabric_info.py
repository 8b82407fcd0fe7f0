"""NVML's GPU fabric info read with NVML's own C layout, not nvidia-ml-py's.

nvidia-ml-py 12.535 to 13.580 declares clusterUuid 80 bytes long (NVML's is 16) and the older
struct so until 13.615.71: the driver writes state and status 64 bytes before where those
classes read them, and a stopped fabric manager reads as not_supported. So the structs are
declared here from nvml.h and the driver's functions called through pynvml's lookup.
"""

from __future__ import annotations

import ctypes
from typing import Any

FABRIC_UUID_LEN = 16  # NVML_GPU_FABRIC_UUID_LEN
FUNCTION_NOT_FOUND = 13  # NVML_ERROR_FUNCTION_NOT_FOUND: the driver's NVML lacks the function

FABRIC_STATES = {
    0: "not_supported",
    1: "not_started",
    2: "in_progress",
    3: "completed",
}  # nvmlGpuFabricState_t


class FabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t (R535): the state is an unsigned char."""

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),  # nvmlReturn_t
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),  # nvmlGpuFabricState_t
    ]


class FabricInfoV2(ctypes.Structure):
    """nvmlGpuFabricInfo_v2_t (R550), the struct nvmlDeviceGetGpuFabricInfoV takes."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
        ("healthMask", ctypes.c_uint),
    ]


# NVML_STRUCT_VERSION(GpuFabricInfo, 2): the struct's size with the version in the top byte (0x02000024).
FABRIC_INFO_V2 = ctypes.sizeof(FabricInfoV2) | (2 << 24)


def fabric(nv: Any, h: Any) -> dict[str, Any]:
    """The GPU's NVLink fabric registration (Hopper and later on NVSwitch systems): its state, and
    NVML's status code once completed (0: registered). nvmlDeviceGetGpuFabricInfoV where the
    driver has it (R550), else the older call (R535)."""
    lookup = nv._nvmlGetFunctionPointer
    try:
        call, info = lookup("nvmlDeviceGetGpuFabricInfoV"), FabricInfoV2(version=FABRIC_INFO_V2)
    except Exception as error:
        if getattr(error, "value", None) != FUNCTION_NOT_FOUND:
            raise
        call, info = lookup("nvmlDeviceGetGpuFabricInfo"), FabricInfo()
    returned = int(call(h, ctypes.byref(info)))
    if returned != 0:
        raise nv.NVMLError(returned)
    state = FABRIC_STATES.get(int(info.state), f"state {int(info.state)}")
    return {"state": state, "status": int(info.status) if state == "completed" else None}
