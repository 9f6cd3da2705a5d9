"""The settings fields every rlgate process shares: environment variables `RLGATE_*`, overridden by flags.

`RlgateSettings` is the base of every process's settings (the bearer token, given as a value or as a
file); `BackendSettings` says what runs the forward pass of a process that acts (a server, a local-inference
client); `ServiceSettings` adds what a gRPC + HTTP service binds to and serves with (address, TLS).
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, Field, FilePath, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rlgate.core.errors import UserError


def _not_a_file(path: Path) -> Path:
    if path.exists() and not path.is_dir():
        raise ValueError("path points to a file, not a directory")
    return path


# A directory rlgate creates when missing (checkpoints, logs, spool): one that names a file is refused at
# once, naming its flag, instead of failing with a traceback when first written.
Directory = Annotated[Path, AfterValidator(_not_a_file)]

# gRPC's own target forms (dns:///host:port, unix:path, ...) and host:port, the host a name, IPv4 or [IPv6].
_GRPC_URI = re.compile(r"(dns|ipv4|ipv6|unix|unix-abstract|vsock|xds|google-c2p):\S+")
_HOST_PORT = re.compile(r"(?P<host>[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")


def grpc_target(target: str) -> str:
    """`target` when gRPC can dial it (host:port or one of gRPC's target URIs); else ValueError, at start,
    since a channel to a malformed target only ever retries."""
    match = _HOST_PORT.fullmatch(target)
    if _GRPC_URI.fullmatch(target) or (match and 0 < int(match["port"]) <= 65535):
        return target
    raise ValueError("not a gRPC target: write host:port (e.g. learner:50052) or a gRPC URI (dns:///learner:50052)")


def require_device(device: str) -> None:
    """Refuse a CUDA device this torch cannot use, at start: else the first forward pass fails deep in torch."""
    if not device.startswith("cuda"):
        return
    import torch  # here only: settings load without torch, and a CPU server asks torch nothing here

    if not torch.cuda.is_available():
        raise UserError(
            f"--device {device}: CUDA is not available to this torch (a CPU-only build, or no GPU visible); "
            "use --device cpu"
        )
    index, count = torch.device(device).index, torch.cuda.device_count()
    if index is not None and index >= count:
        raise UserError(f"--device {device}: torch sees {count} GPU{'s' * (count != 1)} here, numbered from cuda:0")


def resolve_device(device: str) -> str:
    """`device` with "auto" made cuda where this torch sees a GPU, else cpu; any other device as it is."""
    if device != "auto":
        return device
    import torch  # here only: settings load without torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class RlgateSettings(BaseSettings):
    """`RLGATE_<NAME>=value` equals `--<name> value`; the flag wins."""

    model_config = SettingsConfigDict(
        env_prefix="RLGATE_",
        env_nested_delimiter="__",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_exit_on_error=False,  # a bad flag raises; the command line prints it as one line (cli/main.py)
    )

    token: SecretStr | None = Field(
        None,
        description="Bearer token: a service requires it on every call but the standard health checks (which "
        "probes make without one); a client sends it as 'authorization: Bearer <token>'. Unset: no token. "
        "Prefer --token-file (RLGATE_TOKEN_FILE): a value here shows in the process list.",
    )
    token_file: Path | None = Field(
        None,
        description="File holding the bearer token (surrounding whitespace ignored), e.g. a compose or Kubernetes "
        "secret mounted at /run/secrets/rlgate-token. Set token or token_file, not both.",
    )

    @model_validator(mode="after")
    def _read_token_file(self) -> Self:
        if self.token_file is None:
            return self
        if self.token is not None:
            raise ValueError("set --token or --token-file, not both")
        try:
            text = self.token_file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"--token-file {self.token_file}: {exc.strerror}") from exc
        if not text:
            raise ValueError(f"--token-file {self.token_file} is empty")
        self.token = SecretStr(text)
        return self

    def bearer_token(self) -> str | None:
        """The token's value, or None when no token is set."""
        return self.token.get_secret_value() if self.token is not None else None


class ImportSettings(RlgateSettings):
    """For a process that may build a policy from a run spec it was sent (a server, a local-inference client)."""

    allow_import: list[str] = Field(
        [],
        description="Modules (each with its submodules) that a run spec from elsewhere (the learner, a "
        "checkpoint, the server) may name code in: connector pieces, a model class. rlgate's own are always "
        "allowed; a spec given with --config allows what it names.",
    )


#: What runs an acting core's forward pass (policy/acting.py's BACKENDS).
Backend = Literal["auto", "torch", "onnxruntime"]


class BackendSettings(RlgateSettings):
    """For a process that acts with a policy it built (a server, a local-inference client)."""

    backend: Backend = Field(
        "auto",
        description="What runs the forward pass: torch, or onnxruntime with the module exported to ONNX (single-agent "
        "runs on the CPU; rebound to each weights version; the connector pieces run as they are; docs/onnx.md). "
        "auto: onnxruntime for the default model on the CPU (less CPU per env step), torch otherwise (and where "
        "the module does not export).",
    )


class ServiceSettings(ImportSettings):
    """What a gRPC + HTTP service binds to and how it secures its gRPC port."""

    host: str = Field("127.0.0.1", description="Address the gRPC and HTTP servers bind to (0.0.0.0 in containers).")
    tls_cert: FilePath | None = Field(None, description="PEM certificate chain; with tls_key, gRPC is served over TLS.")
    tls_key: FilePath | None = Field(None, description="PEM private key for tls_cert.")

    @model_validator(mode="after")
    def _tls_pair(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together: set both to serve TLS, or neither")
        if self.tls_cert is not None and self.tls_key is not None:
            try:  # gRPC would only log it, then fail to bind: checked here, its message names the files
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.tls_cert, self.tls_key, password="")
            except ssl.SSLError:
                raise ValueError(
                    f"--tls-cert {self.tls_cert} and --tls-key {self.tls_key} are not a valid PEM certificate "
                    "chain and its (unencrypted) private key"
                ) from None
        return self

    def tls(self, client_ca: Path | None = None) -> tuple[Path, Path, Path | None] | None:
        """(certificate, key, client CA for mTLS) when TLS is configured, else None."""
        return (self.tls_cert, self.tls_key, client_ca) if self.tls_cert and self.tls_key else None
