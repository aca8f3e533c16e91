"""SigningKey: the Ed25519 key pair that signs model bundles and the audit log's head, and its public half.

Keys travel as PEM: the private key (PKCS#8) lives in a Prefect Secret block and is handed to
``SigningKey.from_pem`` at run time — never read from a spec, a file in the repository or the
code; the public key (SubjectPublicKeyInfo) is what release targets and auditors trust
(``VerifyKey.from_pem``). A key is named by its ``key_id``, ``ed25519:`` + the first 32 hex
digits of the SHA-256 of the raw 32-byte public key, so a signature says which key made it and
a verifier can tell "signed by another key" from "signed content changed".

All cryptography is delegated to ``cryptography``'s Ed25519 implementation; nothing here
hand-rolls a primitive.
"""

from __future__ import annotations

import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALGORITHM = "ed25519"


def _key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"{ALGORITHM}:{hashlib.sha256(raw).hexdigest()[:32]}"


class VerifyKey:
    """An Ed25519 public key: checks signatures; safe to publish."""

    def __init__(self, key: Ed25519PublicKey):
        self._key = key
        self.key_id = _key_id(key)

    def __repr__(self) -> str:
        return f"VerifyKey({self.key_id})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VerifyKey) and other.key_id == self.key_id

    def __hash__(self) -> int:
        return hash(self.key_id)

    @classmethod
    def from_pem(cls, pem: bytes | str) -> VerifyKey:
        """Load a PEM public key; ``ValueError`` saying what was wrong when it is not an Ed25519 public key."""
        data = pem.encode() if isinstance(pem, str) else pem
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError as exc:
            raise ValueError(f"not a PEM public key ({exc}); expected '-----BEGIN PUBLIC KEY-----'") from None
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"expected an Ed25519 public key, got {type(key).__name__}")
        return cls(key)

    def to_pem(self) -> bytes:
        return self._key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def verify(self, signature: bytes, message: bytes) -> bool:
        """True when ``signature`` is this key's Ed25519 signature of ``message``."""
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True


class SigningKey:
    """An Ed25519 private key: signs bytes. Its ``repr`` never shows the key."""

    def __init__(self, key: Ed25519PrivateKey):
        self._key = key
        self.public = VerifyKey(key.public_key())

    def __repr__(self) -> str:
        return f"SigningKey({self.key_id}, private=<hidden>)"

    @property
    def key_id(self) -> str:
        return self.public.key_id

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, pem: bytes | str, password: bytes | None = None) -> SigningKey:
        """Load a PEM (PKCS#8) private key, e.g. the value of the Prefect Secret block."""
        data = pem.encode() if isinstance(pem, str) else pem
        try:
            key = serialization.load_pem_private_key(data, password=password)
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"not a usable PEM private key ({exc}); expected '-----BEGIN PRIVATE KEY-----' "
                "as written by SigningKey.to_pem()"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"expected an Ed25519 private key, got {type(key).__name__}")
        return cls(key)

    def to_pem(self, password: bytes | None = None) -> bytes:
        """PKCS#8 PEM, encrypted with ``password`` when one is given."""
        encryption = (serialization.BestAvailableEncryption(password) if password
                      else serialization.NoEncryption())
        return self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)
