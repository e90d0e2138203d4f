"""OAuth test helpers: signing keys, one JWKS server (also a slow identity provider), JWT claims."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

RESOURCE = "http://testserver/mcp"
#: The "acme" tenant's own endpoint: the default audience of its external issuers' tokens.
TENANT_RESOURCE = RESOURCE + "/t/acme"
ISSUER = "https://login.example.test/"


class KeyPair:
    """A signing key with its public JWK."""

    def __init__(self, kid: str, alg: str = "RS256") -> None:
        self.kid = kid
        self.alg = alg
        if alg.startswith("ES"):
            self.private = ec.generate_private_key(ec.SECP256R1())
            jwk = jwt.algorithms.ECAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        else:
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            jwk = jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        self.jwk = {**jwk, "kid": kid, "use": "sig", "alg": alg}

    def sign(self, claims: dict[str, Any], **headers: Any) -> str:
        return jwt.encode(claims, self.private, algorithm=self.alg, headers={"kid": self.kid, **headers})


class JwksServer:
    """A JWKS document served over HTTP on 127.0.0.1 from a thread; counts fetches."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.hits = 0
        self.delay_s = 0.0  # a slow identity provider
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.hits += 1
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                body = json.dumps({"keys": outer.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def jwt_claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": TENANT_RESOURCE,
        "sub": "user-42",
        "org": "acme",
        "scope": "mcp:tools mcp:tasks",
        "iat": now,
        "exp": now + 300,
        "jti": "j-1",
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}
