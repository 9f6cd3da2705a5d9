"""The settings fields every rlgate process shares: environment variables `RLGATE_*`, overridden by flags.

`RlgateSettings` is the base of every process's settings (the bearer token, given as a value or as a
file); `ServiceSettings` adds what a gRPC + HTTP service binds to and serves with (address, TLS).
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, FilePath, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


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


class ServiceSettings(RlgateSettings):
    """What a gRPC + HTTP service binds to and how it secures its gRPC port."""

    host: str = Field("127.0.0.1", description="Address the gRPC and HTTP servers bind to (0.0.0.0 in containers).")
    tls_cert: FilePath | None = Field(None, description="PEM certificate chain; with tls_key, gRPC is served over TLS.")
    tls_key: FilePath | None = Field(None, description="PEM private key for tls_cert.")
    allow_import: list[str] = Field(
        [],
        description="Modules (each with its submodules) that a run spec from elsewhere (the learner, a "
        "checkpoint) may name code in: connector pieces, a model class. rlgate's own are always allowed; "
        "a spec given with --config allows what it names.",
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together: set both to serve TLS, or neither")
        return self

    def tls(self, client_ca: Path | None = None) -> tuple[Path, Path, Path | None] | None:
        """(certificate, key, client CA for mTLS) when TLS is configured, else None."""
        return (self.tls_cert, self.tls_key, client_ca) if self.tls_cert and self.tls_key else None
