"""DescribeUserScramCredentials (KIP-554): the SCRAM mechanisms and iterations of users
(never salts or keys). Without an authorizer, as in Kafka, any authenticated client may ask."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.broker.sasl import credentials_for, describe_credentials
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    users = None if request.users is None else [u.name for u in request.users]
    # Rule 33: Describe on the cluster.
    if not authorized(broker, ctx, Op.DESCRIBE, Res.CLUSTER, CLUSTER_NAME):
        return _refused(v)
    results = describe_credentials(credentials_for(broker.config.data_dir), users)
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "DescribeUserScramCredentialsResponse",
            throttle_time=0,
            error_code=ErrorCode.NONE,
            error_message=None,
            results=tuple(
                make(
                    K,
                    v,
                    "DescribeUserScramCredentialsResult",
                    user=user,
                    error_code=error,
                    error_message=message,
                    credential_infos=tuple(
                        make(K, v, "CredentialInfo", mechanism=m, iterations=i) for m, i in infos
                    ),
                )
                for user, error, message, infos in results
            ),
        ),
    )


def _refused(v: int) -> Body:
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "DescribeUserScramCredentialsResponse",
            throttle_time=0,
            error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            error_message="not authorized to Describe the cluster",
            results=(),
        ),
    )
