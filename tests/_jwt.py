"""Throwaway JWTs for the OAUTHBEARER tests: unsigned ones (``alg`` none, Kafka's unsecured
validator) and ones signed by an RSA or EC key whose JWKS the broker is given."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

AUDIENCE = "kafka"
ISSUER = "https://idp.test"


def _b64(doc: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def unsigned(claims: dict[str, Any], header: dict[str, Any] | None = None, sig: str = "") -> str:
    return f"{_b64(header or {'alg': 'none'})}.{_b64(claims)}.{sig}"


def initial(token: str, authzid: str = "") -> bytes:
    """RFC 7628's client initial response carrying ``token``."""
    a = f"a={authzid}" if authzid else ""
    return f"n,{a},\x01auth=Bearer {token}\x01\x01".encode()


def claims(**over: Any) -> dict[str, Any]:
    """Good claims for a signed token (audience, issuer, ten minutes to live), overridden."""
    now = int(time.time())
    return {"sub": "alice", "iat": now, "exp": now + 600, "aud": AUDIENCE, "iss": ISSUER, **over}


class Keys:
    """An RSA key (kid r1) and an EC key (kid e1) the JWKS holds, and one it does not."""

    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.other = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self, *, with_ec: bool = True) -> dict[str, Any]:
        rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.rsa.public_key()))
        keys = [{**rsa_jwk, "kid": "r1", "use": "sig"}]
        if with_ec:
            ec_jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.ec.public_key()))
            keys.append({**ec_jwk, "kid": "e1"})
        return {"keys": keys}

    def sign(self, payload: dict[str, Any], kid: str = "r1", key: Any = None) -> str:
        alg = "ES256" if kid == "e1" else "RS256"
        key = key or (self.ec if kid == "e1" else self.rsa)
        return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid})


def keys_and_jwks(root: Path) -> tuple[Keys, Path]:
    """Fresh keys, and their JWKS written to ``root/jwks.json`` (a broker's JWKS file)."""
    keys = Keys()
    jwks = root / "jwks.json"
    jwks.write_text(json.dumps(keys.jwks()))
    return keys, jwks
