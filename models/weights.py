"""Module weights as safetensors bytes: what the learner publishes and servers load (never pickle)."""

from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn


def weights_to_bytes(module: nn.Module) -> bytes:
    """Serialize the module's state_dict (parameters and buffers) as safetensors."""
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in module.state_dict().items()}
    return save_safetensors(tensors)


class WeightsMismatch(ValueError):
    """Weights whose tensors are not the module's (names, shapes or dtypes): another model's weights."""


def load_weights(module: nn.Module, data: bytes) -> None:
    """Load safetensors bytes into the module in place.

    Raises WeightsMismatch (a ValueError), naming the tensors, unless the bytes hold exactly the module's
    tensors with the same shapes and dtypes; the module is left untouched then.
    """
    try:
        tensors = load_safetensors(data)
    except SafetensorError as error:
        raise ValueError(f"Weights are not valid safetensors bytes: {error}") from error
    expected = module.state_dict()
    missing = sorted(expected.keys() - tensors.keys())
    unexpected = sorted(tensors.keys() - expected.keys())
    if missing or unexpected:
        said = [f"missing {missing}" if missing else "", f"unexpected {unexpected}" if unexpected else ""]
        raise WeightsMismatch(f"Weights do not fit the module: tensors {', '.join(filter(None, said))}")
    for name, want in expected.items():  # the module's order: the first mismatch named is deterministic
        tensor = tensors[name]
        if tensor.shape != want.shape or tensor.dtype != want.dtype:
            raise WeightsMismatch(
                f"Weights do not fit the module: {name!r} is {tensor.dtype}{list(tensor.shape)}, "
                f"the module has {want.dtype}{list(want.shape)}"
            )
    module.load_state_dict(tensors, strict=True)
