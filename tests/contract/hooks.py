"""Schemathesis hooks for agentbay's contract (SCHEMATHESIS_HOOKS).

Text fields that carry a JSON document are declared `format: json` (and
`contentMediaType: application/json`, which JSON Schema 2020-12 only
annotates): this registers how to generate such a text, so that a
schema-valid request carries a JSON document as the contract says.
"""

import json

import schemathesis
from hypothesis import strategies as st

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
_documents = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)

schemathesis.openapi.format("json", _documents.map(json.dumps))

# A text that is a JSON Schema: schemas a validator compiles, from the
# trivial to a nested object with an enum.
_schemas = st.sampled_from([
    True,
    {},
    {"type": "string"},
    {"type": "integer", "minimum": 0},
    {"type": "object", "required": ["tier"], "properties": {"tier": {"type": "string"}}},
    {"type": "object", "properties": {"choice": {"enum": ["a", "b"]}, "n": {"type": "number"}}},
    {"type": "array", "items": {"type": "boolean"}},
])
schemathesis.openapi.format("json-schema", _schemas.map(json.dumps))


# A release bundle is a .tar.gz; whatever was generated goes as gzip data,
# so the import's checks (gzip, tar, manifest, signature) see it.
@schemathesis.serializer("application/gzip")
def _gzip(ctx, value):
    import gzip

    if isinstance(value, bytes):
        return gzip.compress(value)
    return gzip.compress(str(value).encode("utf-8", "surrogatepass"))


# Connect answers a refusal because of the system's state (a lease already
# released, an attempt that has ended) as HTTP 400 with the code
# `failed_precondition`, as the protocol maps it; that is not a rejection
# of the request's data. Every other answer is judged by Schemathesis' own
# check (run with `--exclude-checks positive_data_acceptance`).
from schemathesis.specs.openapi.checks import positive_data_acceptance as _builtin


def _connect_code(response):
    if response.status_code != 400:
        return None
    try:
        return json.loads(response.text).get("code")
    except (ValueError, AttributeError):
        return None


# What JSON Schema cannot state, each refused with 400 naming the field
# (and tested where the rule lives):
# - a release bundle's layout, manifest and signature, beyond "a .tar.gz"
#   (`releases::every_bad_bundle_is_refused…`);
# - a decision's recommendation must be one of its options (a relation
#   between two fields' values).
_BEYOND_SCHEMA = {
    ("POST /runtime/releases", None),
    ("POST /agentbay.adapter.v1.Adapter/RequestDecision", "recommendation"),
}


def _refused_field(response):
    try:
        body = json.loads(response.text)
    except ValueError:
        return None
    if "field" in body:
        return body["field"]
    message = body.get("message", "")
    return message.split(":", 1)[0] if ":" in message else None


@schemathesis.check
def positive_data_acceptance_connect(ctx, response, case):
    if _connect_code(response) == "failed_precondition":
        return None
    if response.status_code == 400:
        label = case.operation.label
        if (label, None) in _BEYOND_SCHEMA or (label, _refused_field(response)) in _BEYOND_SCHEMA:
            return None
    return _builtin(ctx, response, case)


# The run's own credential (AGENTBAY_FUZZ_CLIENT) stays: revoking it would
# leave every later request a 401 and test nothing more. Every other client
# id is fair game.
import os

_OWN_CLIENT = os.environ.get("AGENTBAY_FUZZ_CLIENT", "")


@schemathesis.hook
def filter_body(ctx, body):
    if ctx.operation.label != "POST /agentbay.admin.v1.Admin/RevokeClient":
        return True
    return not (isinstance(body, dict) and body.get("clientId") == _OWN_CLIENT)


# A Connect streaming call is answered in streaming framing, refusals too:
# HTTP 200 and the error in the end-of-stream message (flags 0x02), as the
# Connect protocol puts every streaming error. A streaming call without
# its Authorization header must end with `unauthenticated` there; every
# other call is judged by Schemathesis' own check (run with
# `--exclude-checks missing_required_header`).
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.meta import CoveragePhaseData, CoverageScenario
from schemathesis.specs.openapi.checks import missing_required_header as _missing_header


def _end_of_stream_code(response):
    content_type = (response.headers.get("content-type") or [""])[0]
    if not content_type.startswith("application/connect+"):
        return None
    body = response.content
    while len(body) >= 5:
        flags, length = body[0], int.from_bytes(body[1:5], "big")
        message = body[5 : 5 + length]
        if flags & 0x02:
            try:
                return (json.loads(message).get("error") or {}).get("code", "")
            except ValueError:
                return ""
        body = body[5 + length :]
    return ""


@schemathesis.check
def missing_required_header_connect(ctx, response, case):
    code = _end_of_stream_code(response)
    if code is None:
        return _missing_header(ctx, response, case)
    meta = case.meta
    data = meta.phase.data if meta is not None else None
    if (
        isinstance(data, CoveragePhaseData)
        and (data.parameter or "").lower() == "authorization"
        and data.parameter_location == ParameterLocation.HEADER
        and data.scenario == CoverageScenario.MISSING_PARAMETER
    ):
        if code != "unauthenticated":
            raise AssertionError(
                f"a streaming call without Authorization ended with {code!r}, not 'unauthenticated'"
            )
    return None


# The same for Schemathesis' authentication check: a streaming call that
# succeeded with the run's token is sent again without it and with a wrong
# one, and each must end with `unauthenticated` in its end-of-stream
# message (run with `--exclude-checks ignored_auth`; unary calls are judged
# by the check itself).
from schemathesis.specs.openapi._auth_retry import (
    get_security_parameters,
    remove_auth,
    send_probe,
    set_auth_for_case,
)
from schemathesis.specs.openapi.checks import ignored_auth as _ignored_auth


@schemathesis.check
def ignored_auth_connect(ctx, response, case):
    rpc = case.operation.definition.raw.get("x-rpc") or {}
    if not (rpc.get("serverStreaming") or rpc.get("clientStreaming")):
        return _ignored_auth(ctx, response, case)
    if not 200 <= response.status_code < 300 or _end_of_stream_code(response) not in ("", None):
        return None
    parameters = get_security_parameters(case.operation)
    without = remove_auth(case, parameters)
    probes = [("without a token", send_probe(ctx, case, without))]
    for parameter in parameters:
        wrong = remove_auth(case, parameters)
        set_auth_for_case(wrong, parameter)
        probes.append(("with a wrong token", send_probe(ctx, case, wrong)))
    for what, probe in probes:
        code = _end_of_stream_code(probe)
        if code != "unauthenticated" and probe.status_code != 401:
            raise AssertionError(
                f"{case.operation.label} {what}: HTTP {probe.status_code}, end-of-stream code {code!r}, "
                "not unauthenticated"
            )
    return None
