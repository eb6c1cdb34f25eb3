"""Mutual TLS between the orchestrator and the workers: the three PEM files each side is given
(paths, so that a Kubernetes Secret can mount them), read and checked in one place, and the
gRPC credentials made from them.

A worker presents its certificate and accepts only clients whose certificate the CA signed;
the orchestrator presents its own and accepts only workers whose certificate the CA signed
for the name it dialled. `tandem certs` (tandem/certs.py) makes a local CA and both pairs.
"""

import os
import re
from dataclasses import dataclass

import grpc

# field → (what it is, the flag that sets it, the PEM block it must hold)
_FIELDS = {
    "cert": ("certificate", "--tls-cert", "CERTIFICATE"),
    "key": ("private key", "--tls-key", "PRIVATE KEY"),  # PKCS#8, or "EC"/"RSA PRIVATE KEY"
    "ca": ("CA certificate", "--tls-ca", "CERTIFICATE"),
}


@dataclass(frozen=True)
class TLSFiles:
    """PEM files: this side's certificate (chain), its private key, and the CA certificate(s)
    that the peer's certificate must be signed by."""

    cert: str
    key: str
    ca: str

    def __post_init__(self) -> None:
        # Absolute: the orchestrator's config travels to Ray Serve replicas, whose working
        # directory is not the launcher's.
        for name in _FIELDS:
            object.__setattr__(self, name, os.path.abspath(os.fspath(getattr(self, name))))

    @classmethod
    def from_flags(cls, cert: str | None, key: str | None, ca: str | None) -> "TLSFiles | None":
        """The files given on a command line: all three, or None for none; ValueError for some."""
        given = {"cert": cert, "key": key, "ca": ca}
        if not any(given.values()):
            return None
        missing = [_FIELDS[name][1] for name, path in given.items() if not path]
        if missing:
            raise ValueError(f"--tls-cert, --tls-key and --tls-ca go together: {', '.join(missing)} missing")
        return cls(cert, key, ca)

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(cert, key, ca) as PEM bytes; ValueError naming the first file that is missing,
        unreadable or not the PEM it should be."""
        return tuple(_read_pem(name, getattr(self, name)) for name in _FIELDS)

    def check(self) -> None:
        """Raise ValueError, naming the file, unless all three are readable PEM of the right kind."""
        self.read()


def _read_pem(name: str, path: str) -> bytes:
    what, flag, block = _FIELDS[name]
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"TLS {what} ({flag}) {path}: {e.strerror or e}") from None
    labels = set(re.findall(rb"-----BEGIN ([A-Z0-9 ]+)-----", data))
    if b"ENCRYPTED PRIVATE KEY" in labels:  # gRPC takes no passphrase
        raise ValueError(f"TLS {what} ({flag}) {path}: an encrypted private key; give it unencrypted")
    if not any(label.endswith(block.encode()) for label in labels):
        raise ValueError(f"TLS {what} ({flag}) {path}: not a PEM file with a {block} in it")
    return data


def server_credentials(files: TLSFiles) -> grpc.ServerCredentials:
    """A worker's side: present `cert`, and refuse any client without a certificate signed by `ca`."""
    cert, key, ca = files.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def channel_credentials(files: TLSFiles) -> grpc.ChannelCredentials:
    """The orchestrator's side: present `cert`, and trust only servers whose certificate `ca` signed."""
    cert, key, ca = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
