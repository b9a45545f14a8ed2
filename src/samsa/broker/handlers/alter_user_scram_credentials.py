"""AlterUserScramCredentials (KIP-554): add, replace or delete users' SCRAM credentials. The
client sends the SaltedPassword, never the password; the change is durable before the answer
and counts for the next authentication. Without an authorizer, as in Kafka, any
authenticated client may do it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.broker.sasl import alter_credentials, credentials_for
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.ALTER_USER_SCRAM_CREDENTIALS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    if not authorized(broker, ctx, Op.ALTER, Res.CLUSTER, CLUSTER_NAME):  # rule 33
        users = [d.name for d in request.deletions] + [u.name for u in request.upsertions]
        names = dict.fromkeys(users)
        results: list[tuple[str, ErrorCode, str | None]] = [
            (n, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "not authorized to Alter the cluster")
            for n in names
        ]
    else:
        results = alter_credentials(
            credentials_for(broker.config.data_dir),
            [(d.name, int(d.mechanism)) for d in request.deletions],
            [
                (
                    u.name,
                    int(u.mechanism),
                    int(u.iterations),
                    bytes(u.salt),
                    bytes(u.salted_password),
                )
                for u in request.upsertions
            ],
        )
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "AlterUserScramCredentialsResponse",
            throttle_time=0,
            results=tuple(
                make(
                    K,
                    v,
                    "AlterUserScramCredentialsResult",
                    user=user,
                    error_code=error,
                    error_message=message,
                )
                for user, error, message in results
            ),
        ),
    )
