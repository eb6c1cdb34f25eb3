"""`tandem certs`: a local certificate authority and the certificates mutual TLS between the
orchestrator and the workers needs, for a local cluster or a test deployment.

In a directory:
- ca.pem, ca-key.pem: the CA (its key 0600; kept when present, so certificates issued from it
  earlier stay valid);
- worker.pem, worker-key.pem: what every worker presents (serverAuth), for the given hosts;
- orchestrator.pem, orchestrator-key.pem: what the orchestrator presents (clientAuth).

Keys are ECDSA P-256, unencrypted PKCS#8 PEM, 0600. A production deployment would rather use its
own PKI (cert-manager, Vault); tandem only needs three PEM files per side.
"""

import datetime
import ipaddress
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tandem.tls import TLSFiles

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
DEFAULT_DAYS = 365
CA, CA_KEY = "ca.pem", "ca-key.pem"
WORKER, WORKER_KEY = "worker.pem", "worker-key.pem"
ORCHESTRATOR, ORCHESTRATOR_KEY = "orchestrator.pem", "orchestrator-key.pem"
_SKEW = datetime.timedelta(minutes=5)  # valid from a little before now: clocks differ between machines


def worker_files(directory: str | Path) -> TLSFiles:
    """The files a worker is started with (--tls-cert, --tls-key, --tls-ca)."""
    d = Path(directory)
    return TLSFiles(str(d / WORKER), str(d / WORKER_KEY), str(d / CA))


def orchestrator_files(directory: str | Path) -> TLSFiles:
    """The files the orchestrator is started with."""
    d = Path(directory)
    return TLSFiles(str(d / ORCHESTRATOR), str(d / ORCHESTRATOR_KEY), str(d / CA))


def make_certs(directory: str | Path, hosts: Sequence[str] = DEFAULT_HOSTS, days: int = DEFAULT_DAYS) -> list[Path]:
    """Write the CA (unless a usable one is there) and the worker and orchestrator certificates,
    valid for `days`; the worker's names `hosts` (DNS names or IP addresses). Returns the files
    written."""
    hosts = _check_hosts(hosts)
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    written = []
    ca_cert, ca_key = _load_ca(out)
    if ca_cert is None:
        ca_key = _new_key()
        ca_cert = _ca_certificate(ca_key, days)
        written += [_write(out / CA_KEY, _key_pem(ca_key), private=True), _write(out / CA, _cert_pem(ca_cert))]
    for cert_name, key_name, common_name, usage, names in (
        (WORKER, WORKER_KEY, "tandem-worker", ExtendedKeyUsageOID.SERVER_AUTH, hosts),
        (ORCHESTRATOR, ORCHESTRATOR_KEY, "tandem-orchestrator", ExtendedKeyUsageOID.CLIENT_AUTH, ()),
    ):
        key = _new_key()
        cert = _leaf_certificate(key, common_name, usage, names, ca_cert, ca_key, days)
        written += [_write(out / key_name, _key_pem(key), private=True), _write(out / cert_name, _cert_pem(cert))]
    return written


def ensure_certs(directory: str | Path, hosts: Sequence[str] = DEFAULT_HOSTS, days: int = DEFAULT_DAYS) -> bool:
    """make_certs unless the directory already holds every file, with a worker certificate that
    names every host and stays valid for another day; True when it issued."""
    out = Path(directory)
    names = (CA, CA_KEY, WORKER, WORKER_KEY, ORCHESTRATOR, ORCHESTRATOR_KEY)
    if all((out / n).exists() for n in names) and _covers(out / WORKER, _check_hosts(hosts)):
        return False
    make_certs(out, hosts, days)
    return True


# --- certificates ----------------------------------------------------------------------------


def _check_hosts(hosts: Sequence[str]) -> list[str]:
    hosts = [h.strip() for h in hosts if h.strip()]
    if not hosts:
        raise ValueError("need at least one host name or IP address for the worker certificate")
    return list(dict.fromkeys(hosts))


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _ca_certificate(key: ec.EllipticCurvePrivateKey, days: int) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tandem local CA")])
    public = key.public_key()
    return (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - _SKEW).not_valid_after(_now() + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def _leaf_certificate(key: ec.EllipticCurvePrivateKey, common_name: str, usage: x509.ObjectIdentifier,
                      hosts: Sequence[str], ca_cert: x509.Certificate, ca_key, days: int) -> x509.Certificate:
    public = key.public_key()
    # A leaf never outlives the CA that signed it (a kept CA may expire sooner than `days`).
    not_after = min(_now() + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject).public_key(public).serial_number(x509.random_serial_number())
        .not_valid_before(_now() - _SKEW).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]),
                                        critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _load_ca(out: Path) -> tuple[x509.Certificate | None, ec.EllipticCurvePrivateKey | None]:
    """The CA in `out`, if both its files are there and it stays valid for another day."""
    if not ((out / CA).exists() and (out / CA_KEY).exists()):
        return None, None
    cert = x509.load_pem_x509_certificate((out / CA).read_bytes())
    key = serialization.load_pem_private_key((out / CA_KEY).read_bytes(), password=None)
    if cert.not_valid_after_utc < _now() + datetime.timedelta(days=1):
        return None, None
    return cert, key


def _covers(cert_path: Path, hosts: Sequence[str]) -> bool:
    """Whether the certificate names every host and stays valid for another day."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    return (cert.not_valid_after_utc > _now() + datetime.timedelta(days=1)
            and all(_general_name(h) in names for h in hosts))


# --- files -----------------------------------------------------------------------------------


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    """Replace `path` atomically (a worker restarting meanwhile reads the old file or the new
    one, never half of one); a private key is 0600 from its first byte on."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp: 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if not private:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
