"""Basic auth and TLS for the test Prometheus: its ``--web.config.file`` (Prometheus 2.42, exporter-toolkit:
``basic_auth_users`` with bcrypt hashes, ``tls_server_config`` with cert_file / key_file) and a throwaway CA
plus server certificate for 127.0.0.1 made with the openssl CLI.

Import these through ``tests.prometheus_harness``; this module only keeps that one under the size limit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The fixed test login. The hash was made once, with cost 10 like `htpasswd -nbBC 10`, by the system Python's
# crypt module (libxcrypt bcrypt; .venv has no bcrypt package and this machine no htpasswd):
#   python3 -c "import crypt; print(crypt.crypt('gpumem-test-password',
#               crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1024)))"
# Go's golang.org/x/crypto/bcrypt, which Prometheus checks it with, accepts the $2b$ prefix.
TEST_USER = "gpumem"
TEST_PASSWORD = "gpumem-test-password"
TEST_PASSWORD_BCRYPT = "$2b$10$xtvx7qxSFfUFkfSrezLEdOCcloXVQmok5keT5OZseY5pMWqIfiUvi"
BASIC_AUTH = (TEST_USER, TEST_PASSWORD)
OPENSSL_TIMEOUT_S = 60  # a few EC key and certificate operations take well under a second each


@dataclass(frozen=True)
class TlsFiles:
    ca_file: Path
    cert_file: Path
    key_file: Path


def bcrypt_hash(password: str) -> str:
    """The bcrypt hash Prometheus gets for ``password``: the stored constant for the test password, else
    computed with the ``bcrypt`` package when it is importable."""
    if password == TEST_PASSWORD:
        return TEST_PASSWORD_BCRYPT
    try:
        import bcrypt  # type: ignore[import-not-found]
    except ImportError:
        raise ValueError(
            f"basic_auth: only the test password {TEST_PASSWORD!r} has a stored bcrypt hash "
            "(install the bcrypt package for others)"
        ) from None
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()


def _openssl(*args: str | Path, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise RuntimeError("the TLS tests need the openssl command (Debian package openssl)")
    done = subprocess.run(
        [exe, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=OPENSSL_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")


def make_tls_files(directory: Path) -> TlsFiles:
    """A self-signed CA and a server certificate signed by it for 127.0.0.1 (subjectAltName IP:127.0.0.1,
    valid two days), EC P-256 keys, written into ``directory``."""
    d = Path(directory)
    ca_key, ca_crt, key, csr, crt = (
        d / n for n in ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt")
    )
    ext = d / "server.ext"
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    ca_ext = (
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    _openssl("req", "-x509", *ec, *ca_ext, "-keyout", ca_key, "-out", ca_crt, "-days", "2",
             "-subj", "/CN=gpumem test CA", cwd=d)  # fmt: skip
    _openssl("req", "-new", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1", cwd=d)
    _openssl("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial", "-days", "2",
             "-extfile", ext, "-out", crt, cwd=d)  # fmt: skip
    return TlsFiles(ca_file=ca_crt, cert_file=crt, key_file=key)


def write_web_config(path: Path, basic_auth: tuple[str, str] | None, tls: TlsFiles | None) -> Path:
    """Prometheus' --web.config.file (JSON is YAML): basic_auth_users and/or tls_server_config."""
    config: dict = {}
    if tls is not None:
        config["tls_server_config"] = {"cert_file": str(tls.cert_file), "key_file": str(tls.key_file)}
    if basic_auth is not None:
        config["basic_auth_users"] = {basic_auth[0]: bcrypt_hash(basic_auth[1])}
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path
