"""Devices by name: the one check of a device name, free memory on a device, checked uploads.

Contract:
- `check_device(device)` refuses a name TensorFlow cannot parse (ValueError), one that names no
  device type, a non-str (TypeError), or a device of this process that TensorFlow does not see;
  the message names the devices it sees. A device of another job or task passes: only the
  cluster knows it. `resolve_device(device)` runs the same check on a local device and returns
  its full name ("/device:GPU:0"); None means GPU:0 if there is one, else CPU:0.
- `device_memory_budget(device)` reads the device's free memory now; nothing is cached.
- `upload(array, device)` makes one host-to-device copy into a new non-trainable variable.
Every function only asks TensorFlow, so all are safe to call from any thread.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from prefetch.runtime import available_memory_bytes

# The share of a device's free memory that the budget check allows by default; the rest is
# left for the model, its activations and TensorFlow's own buffers.
BUDGET_FRACTION = 0.8


def _parse(device: Any) -> tf.DeviceSpec:
    """`device` as a DeviceSpec that names a device type, or TypeError/ValueError saying why."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a device name such as '/gpu:0', got {device!r}")
    try:
        spec = tf.DeviceSpec.from_string(device)
    except ValueError as error:
        raise ValueError(
            f"device {device!r} is not a TensorFlow device name; use one such as '/gpu:0' "
            f"or '/cpu:0' ({error})"
        ) from error
    if spec.device_type is None:
        raise ValueError(f"device {device!r} names no device type; use one such as '/gpu:0'")
    return spec


def _find_local(device: str, spec: tf.DeviceSpec) -> str:
    """The full name of the first device TensorFlow sees that `spec` names (any index if none)."""
    logical = [d.name for d in tf.config.list_logical_devices()]
    for name in logical:
        found = tf.DeviceSpec.from_string(name)
        if found.device_type == str(spec.device_type).upper() and spec.device_index in (
            None,
            found.device_index,
        ):
            return str(name)
    raise ValueError(
        f"device {device!r} is not a device TensorFlow sees in this process (it sees "
        f"{logical}); name one of them, or leave device=None"
    )


def check_device(device: str) -> None:
    """Refuse a device name TensorFlow cannot parse, or a local device it does not see."""
    spec = _parse(device)
    if spec.job not in (None, "localhost") or spec.task not in (None, 0):
        return  # a device of another task: only the cluster knows it
    _find_local(device, spec)


def resolve_device(device: str | None = None) -> str:
    """The full name of `device` ("/device:GPU:0"); None means GPU:0 if there is one, else CPU:0.

    Raises ValueError naming the devices TensorFlow sees when `device` is not one of them.
    """
    if device is None:
        logical = [d.name for d in tf.config.list_logical_devices()]
        gpus = [name for name in logical if tf.DeviceSpec.from_string(name).device_type == "GPU"]
        return gpus[0] if gpus else "/device:CPU:0"
    return _find_local(device, _parse(device))


def device_memory_budget(device: str | None = None, *, fraction: float = BUDGET_FRACTION) -> int:
    """Bytes that may be placed on `device`: `fraction` of its free memory now.

    A GPU's free memory is TensorFlow's allocator limit for it less what TensorFlow holds there
    (`tf.config.experimental.get_memory_info`). The CPU's is the RAM the kernel reports as
    available (`MemAvailable`, or free pages where that is missing).

    Parameters:

    - `device`: a device name such as `"/gpu:0"` or `"/cpu:0"`; None for GPU:0 if there is
      one, else CPU:0.
    - `fraction`: the share of the free memory to allow, in (0, 1]; default
      `BUDGET_FRACTION`, leaving room for the model and TensorFlow's own buffers.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    name = resolve_device(device)
    if tf.DeviceSpec.from_string(name).device_type == "CPU":
        free = available_memory_bytes()
    else:
        used = int(tf.config.experimental.get_memory_info(name)["current"])
        free = max(_allocator_limit(name) - used, 0)
    return int(free * fraction)


def _allocator_limit(name: str) -> int:
    """TensorFlow's memory limit for a GPU (its allocator's size), in bytes."""
    from tensorflow.python.client import device_lib  # no public API gives the total

    wanted = tf.DeviceSpec.from_string(name)
    for attributes in device_lib.list_local_devices():
        found = tf.DeviceSpec.from_string(attributes.name)
        if (found.device_type, found.device_index) == (wanted.device_type, wanted.device_index):
            return int(attributes.memory_limit)
    raise ValueError(f"TensorFlow reports no memory limit for {name}")


def upload(array: Any, device: str, *, strict: bool = True) -> tf.Variable:
    """Copy `array` into a new non-trainable variable on `device` (one host-to-device copy).

    With `strict`, a variable that TensorFlow placed elsewhere (it has no kernel for that
    dtype on the device) raises RuntimeError. Labels are not strict: TensorFlow has no GPU
    kernel for int32 variables, so they stay in host memory; a batch of labels is a few bytes.
    """
    with tf.device(device):
        variable = tf.Variable(array, trainable=False)
    placed = tf.DeviceSpec.from_string(variable.device)
    wanted = tf.DeviceSpec.from_string(device)
    if strict and (placed.device_type, placed.device_index) != (
        wanted.device_type,
        wanted.device_index,
    ):
        raise RuntimeError(
            f"TensorFlow placed a {variable.dtype.name} variable on {variable.device}, not on "
            f"{device}; this device cannot hold that dtype: use uint8 or float images"
        )
    return variable
