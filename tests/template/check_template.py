#!/usr/bin/env python3
"""Checks template.yaml with the tools its users run, and against the deployment's invariants.

1. `sam validate --lint`: SAM CLI's own validation.
2. The template translated by SAM's translator (aws-sam-translator, as SAM CLI pins it) into
   the CloudFormation that is really deployed, then cfn-lint with the serverless rules
   (cfn-lint-serverless) over that: current cfn-lint no longer expands AWS::Serverless::*
   resources, so linting template.yaml alone would not see the function, its role or its
   event source mapping.
3. The invariants, on the translated template, for every allowed parameter value:
   visibility timeout >= 6 x function timeout + largest batching window; the record expiry
   covers retention + max receives x visibility; ReportBatchItemFailures; a dead-letter
   queue; exactly the allowed IAM actions; the table retained; the API key only as a
   secret ARN; alarms; concurrency bounds; logs; outputs.
4. Seeded mistakes: copies of the template with one mistake each, each of which must make
   its invariant fail (so a check that cannot fail is caught).

Prints one line per test and closes with `template: N passed, N failed`; exits 1 on a
failure. Usage: check_template.py [template.yaml]  (run with the .venv's Python).
"""

import itertools
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("SAM_CLI_TELEMETRY", "0")

from samtranslator.parser.parser import Parser  # noqa: E402
from samtranslator.translator.translator import Translator  # noqa: E402
from samtranslator.yaml_helper import yaml_parse  # noqa: E402

# The translator warns about metrics nobody publishes when it is used as a library.
logging.getLogger("samtranslator.metrics").setLevel(logging.ERROR)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LAMBDA_MAX_TIMEOUT = 900
SQS_MAX_VISIBILITY = 43200
# The role of the function may hold these and nothing else. Managed policies: what SAM
# attaches for logs and for the SQS poller (ReceiveMessage, DeleteMessage,
# GetQueueAttributes on the queue).
ALLOWED_MANAGED_POLICIES = {
    "arn:${AWS::Partition}:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
    "arn:${AWS::Partition}:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole",
}
# Inline statements as (condition or None, actions, resource): the four table actions,
# then the secret (and its KMS key) only when given.
ALLOWED_STATEMENTS = {
    (
        None,
        frozenset({"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"}),
        json.dumps({"Fn::GetAtt": ["IdempotencyTable", "Arn"]}),
    ),
    ("HasApiKeySecret", frozenset({"secretsmanager:GetSecretValue"}), json.dumps({"Ref": "ModelApiKeySecretArn"})),
    ("HasSecretKmsKey", frozenset({"kms:Decrypt"}), json.dumps({"Ref": "ModelApiKeySecretKmsKeyArn"})),
}
# The worker's one more: the answer's Put in the completion's transaction, on its answers
# table (the function that has ANSWERS_TABLE, on that table only).
ANSWERS_STATEMENT = (
    None,
    frozenset({"dynamodb:PutItem"}),
    json.dumps({"Fn::GetAtt": ["AnswersTable", "Arn"]}),
)
REQUIRED_OUTPUTS = {
    "AnswersTableName",
    "RequestQueueUrl",
    "RequestQueueArn",
    "DeadLetterQueueUrl",
    "DeadLetterQueueArn",
    "FunctionName",
    "FunctionArn",
    "IdempotencyTableName",
    "ModelApiUrl",
}


# ---------------------------------------------------------------------------- translation


def translate(source: str) -> dict:
    """The CloudFormation SAM deploys for this template source."""
    sam = yaml_parse(source)
    for resource in sam.get("Resources", {}).values():
        if resource.get("Type") == "AWS::Serverless::Function":
            # `sam deploy` uploads the code and puts its S3 location here.
            resource["Properties"]["CodeUri"] = "s3://bucket/model-worker.zip"
    translator = Translator(managed_policy_map=None, sam_parser=Parser())
    return translator.translate(
        sam_template=sam, parameter_values={}, passthrough_metadata=True, get_managed_policy_map=lambda: {}
    )


# ----------------------------------------------------------------------------- evaluation


class Unknown(Exception):
    pass


def refs(expr) -> set:
    """Parameters an expression refers to."""
    found = set()
    if isinstance(expr, dict):
        if set(expr) == {"Ref"} and isinstance(expr["Ref"], str):
            found.add(expr["Ref"])
        for value in expr.values():
            found |= refs(value)
    elif isinstance(expr, list):
        for value in expr:
            found |= refs(value)
    return found


def evaluate(cfn: dict, expr, values: dict):
    """The value of a literal, Ref to a parameter or FindInMap, given parameter values."""
    if isinstance(expr, (int, float, str)):
        return expr
    if isinstance(expr, dict) and set(expr) == {"Ref"}:
        if expr["Ref"] in values:
            return values[expr["Ref"]]
        raise Unknown(f"Ref {expr['Ref']}")
    if isinstance(expr, dict) and set(expr) == {"Fn::FindInMap"}:
        name, top, second = (evaluate(cfn, part, values) for part in expr["Fn::FindInMap"])
        try:
            return cfn.get("Mappings", {})[name][str(top)][second]
        except KeyError:
            raise Unknown(f"Mappings.{name}.{top}.{second} does not exist") from None
    raise Unknown(json.dumps(expr))


def cases(cfn: dict, names: set) -> list:
    """Every combination of the extreme allowed values of the named parameters: each
    AllowedValues entry, or MinValue and MaxValue."""
    params = cfn.get("Parameters", {})
    choices = []
    for name in sorted(names):
        p = params.get(name)
        if p is None:
            continue  # pseudo parameters, resources
        if "AllowedValues" in p:
            values = p["AllowedValues"]
        elif "MinValue" in p or "MaxValue" in p:
            values = [v for v in (p.get("MinValue"), p.get("MaxValue")) if v is not None]
        else:
            values = [p.get("Default")]
        choices.append([(name, v) for v in values])
    return [dict(combo) for combo in itertools.product(*choices)]


def number(value) -> float:
    return float(value)


# -------------------------------------------------------------------------------- lookups


def resources(cfn: dict, kind: str) -> dict:
    return {k: v for k, v in cfn["Resources"].items() if v["Type"] == kind}


def sqs_mapping(cfn: dict):
    """The (mapping, function, queue) triple of the SQS trigger: exactly one expected."""
    found = []
    for name, esm in resources(cfn, "AWS::Lambda::EventSourceMapping").items():
        source = esm["Properties"].get("EventSourceArn", {})
        queue = source.get("Fn::GetAtt", [None])[0] if isinstance(source, dict) else None
        if queue in cfn["Resources"] and cfn["Resources"][queue]["Type"] == "AWS::SQS::Queue":
            function = esm["Properties"]["FunctionName"]["Ref"]
            found.append((name, function, queue))
    if len(found) != 1:
        raise AssertionError(f"expected one SQS event source mapping, found {len(found)}")
    return found[0]


def function_env(cfn: dict, function: str) -> dict:
    return cfn["Resources"][function]["Properties"].get("Environment", {}).get("Variables", {})


# --------------------------------------------------------------------------- invariants


def check_visibility_covers_timeout(cfn: dict) -> list:
    esm, function, queue = sqs_mapping(cfn)
    timeout = cfn["Resources"][function]["Properties"].get("Timeout", 3)
    visibility = cfn["Resources"][queue]["Properties"].get("VisibilityTimeout", 30)
    window = cfn["Resources"][esm]["Properties"].get("MaximumBatchingWindowInSeconds", 0)
    problems = []
    for values in cases(cfn, refs(timeout) | refs(visibility) | refs(window)):
        try:
            t, v, w = (number(evaluate(cfn, e, values)) for e in (timeout, visibility, window))
        except Unknown as e:
            problems.append(f"with {values}: cannot evaluate {e}")
            continue
        if v < 6 * t + w:
            problems.append(f"with {values}: visibility timeout {v:g} < 6 x timeout {t:g} + batching window {w:g}")
        if v > SQS_MAX_VISIBILITY or t > LAMBDA_MAX_TIMEOUT:
            problems.append(f"with {values}: visibility {v:g} or timeout {t:g} beyond the service's maximum")
    return problems


def check_expiry_covers_redeliveries(cfn: dict) -> list:
    """The expiry the worker computes from its environment is at least what the queue it
    really reads from can take: retention + max receives x visibility timeout."""
    _, function, queue = sqs_mapping(cfn)
    env = function_env(cfn, function)
    q = cfn["Resources"][queue]["Properties"]
    real = [q.get("MessageRetentionPeriod", 345600), q["RedrivePolicy"]["maxReceiveCount"], q.get("VisibilityTimeout", 30)]
    explicit = env.get("IDEMPOTENCY_EXPIRES_AFTER_SECONDS")
    told = [
        env.get("IDEMPOTENCY_QUEUE_RETENTION_SECONDS"),
        env.get("IDEMPOTENCY_QUEUE_MAX_RECEIVE_COUNT"),
        env.get("IDEMPOTENCY_QUEUE_VISIBILITY_TIMEOUT_SECONDS"),
    ]
    if explicit is None and None in told:
        return ["the function is given neither IDEMPOTENCY_EXPIRES_AFTER_SECONDS nor all three queue settings"]
    problems = []
    for values in cases(cfn, refs(real) | refs(told) | refs(explicit)):
        try:
            r, n, v = (number(evaluate(cfn, e, values)) for e in real)
            if explicit is not None:
                expiry = number(evaluate(cfn, explicit, values))
            else:
                tr, tn, tv = (number(evaluate(cfn, e, values)) for e in told)
                expiry = tr + tn * tv
        except Unknown as e:
            problems.append(f"with {values}: cannot evaluate {e}")
            continue
        if expiry < r + n * v:
            problems.append(f"with {values}: expiry {expiry:g} s < retention {r:g} + {n:g} receives x {v:g} s")
    return problems


def check_reports_batch_item_failures(cfn: dict) -> list:
    esm, _, _ = sqs_mapping(cfn)
    types = cfn["Resources"][esm]["Properties"].get("FunctionResponseTypes", [])
    if "ReportBatchItemFailures" not in types:
        return [f"{esm}: FunctionResponseTypes lacks ReportBatchItemFailures: Lambda would delete failed records"]
    return []


def check_dead_letter_queue(cfn: dict) -> list:
    _, _, queue = sqs_mapping(cfn)
    redrive = cfn["Resources"][queue]["Properties"].get("RedrivePolicy")
    if not redrive:
        return [f"{queue} has no RedrivePolicy"]
    target = redrive.get("deadLetterTargetArn", {})
    dlq = target.get("Fn::GetAtt", [None])[0] if isinstance(target, dict) else None
    if dlq not in resources(cfn, "AWS::SQS::Queue"):
        return [f"{queue}'s dead-letter target is not a queue of this template"]
    if "maxReceiveCount" not in redrive:
        return [f"{queue}'s RedrivePolicy has no maxReceiveCount"]
    return []


def statements(doc) -> list:
    """(condition, statement) for each statement, Fn::If [c, s, AWS::NoValue] unwrapped."""
    out = []
    for s in doc.get("Statement", []):
        if isinstance(s, dict) and set(s) == {"Fn::If"}:
            condition, then, otherwise = s["Fn::If"]
            if otherwise != {"Ref": "AWS::NoValue"}:
                raise AssertionError(f"unexpected else branch in {s}")
            out.append((condition, then))
        else:
            out.append((None, s))
    return out


def functions(cfn: dict) -> list:
    """Every Lambda function of the template (the worker and the HTTP API)."""
    return sorted(resources(cfn, "AWS::Lambda::Function"))


def check_least_privilege(cfn: dict) -> list:
    return [f"{f}: {p}" for f in functions(cfn) for p in least_privilege_of(cfn, f)]


def least_privilege_of(cfn: dict, function: str) -> list:
    role_ref = cfn["Resources"][function]["Properties"]["Role"]
    role_name = role_ref.get("Fn::GetAtt", [None])[0] if isinstance(role_ref, dict) else None
    if role_name not in resources(cfn, "AWS::IAM::Role"):
        return [f"the function's role {role_ref} is not a role of this template"]
    role = cfn["Resources"][role_name]["Properties"]
    problems = []
    managed = {m["Fn::Sub"] if isinstance(m, dict) and "Fn::Sub" in m else str(m) for m in role.get("ManagedPolicyArns", [])}
    managed = {re.sub(r"^arn:aws:", "arn:${AWS::Partition}:", m) for m in managed}
    for extra in sorted(managed - ALLOWED_MANAGED_POLICIES):
        problems.append(f"managed policy not allowed: {extra}")
    found = set()
    for policy in role.get("Policies", []):
        for condition, s in statements(policy["PolicyDocument"]):
            if s.get("Effect") != "Allow":
                continue
            actions = s.get("Action", [])
            actions = frozenset([actions] if isinstance(actions, str) else actions)
            resource = s.get("Resource")
            for r in resource if isinstance(resource, list) else [resource]:
                found.add((condition, actions, json.dumps(r)))
    allowed = set(ALLOWED_STATEMENTS)
    if function_env(cfn, function).get("ANSWERS_TABLE") == {"Ref": "AnswersTable"}:
        allowed.add(ANSWERS_STATEMENT)
    for condition, actions, resource in sorted(found - allowed, key=str):
        problems.append(
            f"not allowed: {sorted(actions)} on {resource}" + (f" (if {condition})" if condition else "")
        )
    for condition, actions, resource in sorted(allowed - found, key=str):
        problems.append(f"missing: {sorted(actions)} on {resource}" + (f" (if {condition})" if condition else ""))
    for other in set(resources(cfn, "AWS::IAM::Policy")) | set(resources(cfn, "AWS::IAM::ManagedPolicy")):
        problems.append(f"extra policy resource {other}")
    return problems


def check_table_kept(cfn: dict) -> list:
    """Both tables survive the stack and a mistake (retained, deletion protection, point-in-time
    recovery, on demand, keyed by `id`); the records expire through the table's TTL; the
    worker is given both, and writes its answers beside its records."""
    tables = resources(cfn, "AWS::DynamoDB::Table")
    if set(tables) != {"IdempotencyTable", "AnswersTable"}:
        return [f"expected the tables IdempotencyTable and AnswersTable, found {sorted(tables)}"]
    problems = []
    for name, table in tables.items():
        p = table["Properties"]
        for policy in ("DeletionPolicy", "UpdateReplacePolicy"):
            if table.get(policy) != "Retain":
                problems.append(f"{name}: {policy} is not Retain")
        if p.get("DeletionProtectionEnabled") is not True:
            problems.append(f"{name}: deletion protection is off")
        if p.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled") is not True:
            problems.append(f"{name}: point-in-time recovery is off")
        if p.get("KeySchema") != [{"AttributeName": "id", "KeyType": "HASH"}]:
            problems.append(f"{name}: the key is not `id` alone")
        if p.get("BillingMode") != "PAY_PER_REQUEST":
            problems.append(f"{name}: not on-demand")
    ttl = tables["IdempotencyTable"]["Properties"].get("TimeToLiveSpecification", {})
    if ttl != {"AttributeName": "expiration", "Enabled": True}:
        problems.append("IdempotencyTable: TTL is not on `expiration`")
    env = function_env(cfn, sqs_mapping(cfn)[1])
    if env.get("IDEMPOTENCY_TABLE") != {"Ref": "IdempotencyTable"}:
        problems.append("the function is not given IdempotencyTable as IDEMPOTENCY_TABLE")
    if env.get("ANSWERS_TABLE") != {"Ref": "AnswersTable"}:
        problems.append("the function is not given AnswersTable as ANSWERS_TABLE")
    return problems


def check_api_key_only_as_secret(cfn: dict) -> list:
    problems = []
    params = cfn.get("Parameters", {})
    for function in functions(cfn):
        env = function_env(cfn, function)
        if "MODEL_API_KEY" in env:
            problems.append(f"{function}: MODEL_API_KEY is a plain environment variable")
        for var, value in env.items():
            for p in refs(value):
                if params.get(p, {}).get("NoEcho"):
                    problems.append(f"{function}: {var} carries the NoEcho parameter {p}")
        if env.get("MODEL_API_KEY_SECRET_ARN") != {"Ref": "ModelApiKeySecretArn"}:
            problems.append(f"{function}: MODEL_API_KEY_SECRET_ARN is not the ModelApiKeySecretArn parameter")
    conditions = cfn.get("Conditions", {})
    if conditions.get("HasApiKeySecret") != {"Fn::Not": [{"Fn::Equals": [{"Ref": "ModelApiKeySecretArn"}, ""]}]}:
        problems.append("HasApiKeySecret is not `ModelApiKeySecretArn is given`")
    if conditions.get("HasSecretKmsKey") != {"Fn::Not": [{"Fn::Equals": [{"Ref": "ModelApiKeySecretKmsKeyArn"}, ""]}]}:
        problems.append("HasSecretKmsKey is not `ModelApiKeySecretKmsKeyArn is given`")
    pattern = params.get("ModelApiKeySecretArn", {}).get("AllowedPattern", "")
    good = "arn:aws:secretsmanager:us-east-1:123456789012:secret:model/api-key-AbC123"
    for value, ok in ((good, True), ("", True), ("*", False), ("arn:aws:secretsmanager:us-east-1:123456789012:secret:*", False)):
        if bool(re.fullmatch(pattern, value)) != ok:
            problems.append(f"ModelApiKeySecretArn's pattern {'refuses' if ok else 'accepts'} {value!r}")
    return problems


def check_alarms(cfn: dict) -> list:
    _, _, queue = sqs_mapping(cfn)
    dlq = cfn["Resources"][queue]["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
    wanted = {
        (dlq, "ApproximateNumberOfMessagesVisible"): "a message in the dead-letter queue",
        (queue, "ApproximateAgeOfOldestMessage"): "the oldest request's age",
    }
    notify = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
    problems = []
    for alarm in resources(cfn, "AWS::CloudWatch::Alarm").values():
        p = alarm["Properties"]
        dims = {d["Name"]: d["Value"] for d in p.get("Dimensions", [])}
        q = dims.get("QueueName", {}).get("Fn::GetAtt", [None])[0]
        key = (q, p.get("MetricName"))
        if key in wanted and p.get("Namespace") == "AWS/SQS":
            if p.get("AlarmActions") != notify:
                problems.append(f"the alarm on {wanted[key]} does not notify AlarmTopicArn")
            del wanted[key]
    problems += [f"no alarm on {what}" for what in wanted.values()]
    problems += check_library_alarms(cfn)
    return problems


def check_library_alarms(cfn: dict) -> list:
    """Alarms on the worker's own counters: the namespace it writes (METRICS_NAMESPACE),
    its function name, its operation, and an outcome the library counts."""
    _, function, _ = sqs_mapping(cfn)
    namespace = function_env(cfn, function).get("METRICS_NAMESPACE")
    outcomes = {"took_over", "in_progress", "claim_abandoned"}
    known = {"executed", "took_over", "executed_unstored", "replayed", "replayed_from_cache", "joined",
             "disabled", "in_progress", "claim_abandoned", "rejected", "failed", "lease_lost", "store_error", "panicked", "cancelled"}
    problems = []
    notify = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
    for name, alarm in resources(cfn, "AWS::CloudWatch::Alarm").items():
        p = alarm["Properties"]
        if p.get("MetricName") != "idempotency_outcomes_total":
            continue
        dims = {d["Name"]: d["Value"] for d in p.get("Dimensions", [])}
        if p.get("Namespace") != namespace:
            problems.append(f"{name}: namespace {p.get('Namespace')!r}, but the worker writes {namespace!r}")
        if set(dims) != {"function", "operation", "outcome"}:
            problems.append(f"{name}: dimensions {sorted(dims)}, not the counter's function, operation, outcome")
        if dims.get("function") != {"Ref": function}:
            problems.append(f"{name}: not on the worker's function")
        if dims.get("operation") != "chat_completion":
            problems.append(f"{name}: operation {dims.get('operation')!r} is not the worker's chat_completion")
        if dims.get("outcome") not in known:
            problems.append(f"{name}: the library counts no outcome {dims.get('outcome')!r}")
        if p.get("Statistic") != "Sum":
            problems.append(f"{name}: a counter's alarm sums it")
        if p.get("AlarmActions") != notify:
            problems.append(f"{name}: does not notify AlarmTopicArn")
        outcomes.discard(dims.get("outcome"))
    problems += [f"no alarm on the library's {o} count" for o in sorted(outcomes)]
    if function_env(cfn, function).get("IDEMPOTENCY_AT_MOST_ONCE") != {"Ref": "AtMostOnce"}:
        problems.append("the worker is not given AtMostOnce (IDEMPOTENCY_AT_MOST_ONCE)")
    return problems


def check_concurrency_and_batching(cfn: dict) -> list:
    esm, _, _ = sqs_mapping(cfn)
    p = cfn["Resources"][esm]["Properties"]
    problems = []
    limit = p.get("ScalingConfig", {}).get("MaximumConcurrency")
    for values in cases(cfn, refs(limit)):
        try:
            n = number(evaluate(cfn, limit, values))
        except Unknown as e:
            problems.append(f"MaximumConcurrency: {e}")
            continue
        if not 2 <= n <= 1000:
            problems.append(f"MaximumConcurrency {n:g} outside 2..1000")
    size = p.get("BatchSize", 10)
    for values in cases(cfn, refs(size)):
        if not 1 <= number(evaluate(cfn, size, values)) <= 10:
            problems.append(f"with {values}: BatchSize outside 1..10 (above 10 needs a batching window)")
    return problems


def check_logs(cfn: dict) -> list:
    problems = []
    for function in functions(cfn):
        p = cfn["Resources"][function]["Properties"]
        if p.get("LoggingConfig", {}).get("LogFormat") != "JSON":
            problems.append(f"{function}'s logs are not JSON")
        groups = [
            g
            for g in resources(cfn, "AWS::Logs::LogGroup").values()
            if g["Properties"].get("LogGroupName") == {"Fn::Sub": f"/aws/lambda/${{{function}}}"}
        ]
        if len(groups) != 1 or "RetentionInDays" not in groups[0]["Properties"]:
            problems.append(f"no log group with a retention for {function}")
    return problems


def check_http_api_callers_identified(cfn: dict) -> list:
    """The HTTP API scopes keys by the IAM caller: its Function URL must require SigV4, and
    its function must use the shared table (its ids carry its own function name)."""
    urls = resources(cfn, "AWS::Lambda::Url")
    if len(urls) != 1:
        return [f"expected one Function URL, found {len(urls)}"]
    url = next(iter(urls.values()))["Properties"]
    problems = []
    if url.get("AuthType") != "AWS_IAM":
        problems.append(f"the Function URL's AuthType is {url.get('AuthType')}, not AWS_IAM: callers would not be identified")
    function = url.get("TargetFunctionArn", {}).get("Ref")
    if function not in functions(cfn):
        return problems + [f"the Function URL targets {function}, no function of this template"]
    env = function_env(cfn, function)
    table = "IdempotencyTable"
    if env.get("IDEMPOTENCY_TABLE") != {"Ref": table}:
        problems.append(f"{function} is not given the table {table}")
    if "IDEMPOTENCY_WAIT_FOR_IN_PROGRESS_MS" not in env:
        problems.append(f"{function} has no IDEMPOTENCY_WAIT_FOR_IN_PROGRESS_MS")
    timeout = cfn["Resources"][function]["Properties"].get("Timeout", 3)
    wait = env.get("IDEMPOTENCY_WAIT_FOR_IN_PROGRESS_MS")
    for values in cases(cfn, refs(timeout) | refs(wait)):
        try:
            t, w = number(evaluate(cfn, timeout, values)), number(evaluate(cfn, wait, values))
        except Unknown as e:
            problems.append(f"with {values}: cannot evaluate {e}")
            continue
        if w / 1000 >= t:
            problems.append(f"with {values}: a wait of {w:g} ms does not end before the timeout of {t:g} s")
    return problems


def check_outputs(cfn: dict) -> list:
    return [f"no output {o}" for o in sorted(REQUIRED_OUTPUTS - set(cfn.get("Outputs", {})))]


INVARIANTS = [
    check_visibility_covers_timeout,
    check_expiry_covers_redeliveries,
    check_reports_batch_item_failures,
    check_dead_letter_queue,
    check_least_privilege,
    check_table_kept,
    check_api_key_only_as_secret,
    check_alarms,
    check_concurrency_and_batching,
    check_logs,
    check_http_api_callers_identified,
    check_outputs,
]

# One mistake each, as a textual edit of template.yaml: (name, pattern, replacement, the
# invariant that must catch it).
SEEDED_MISTAKES = [
    (
        "an alarm on an outcome the library never counts (took-over)",
        r"Value: took_over",
        "Value: took-over",
        check_alarms,
    ),
    (
        "no alarm on abandoned claims (at most once)",
        r"Value: claim_abandoned",
        "Value: rejected",
        check_alarms,
    ),
    (
        "the at-most-once switch not passed to the worker",
        r"IDEMPOTENCY_AT_MOST_ONCE: !Ref AtMostOnce",
        "IDEMPOTENCY_AT_MOST_ONCE: \"false\"",
        check_alarms,
    ),
    (
        "the worker's metrics in another namespace than the alarms read",
        r"METRICS_NAMESPACE: lambda-idempotency",
        "METRICS_NAMESPACE: model-worker",
        check_alarms,
    ),
    (
        "the Function URL open to anyone (AuthType NONE)",
        r"AuthType: AWS_IAM",
        "AuthType: NONE",
        check_http_api_callers_identified,
    ),
    (
        "the HTTP API's role allowed to scan the table",
        r"(\n(\s+)- dynamodb:DeleteItem)(?![\s\S]*ModelApiFunction:)",
        r"\1\n\2- dynamodb:Scan",
        check_least_privilege,
    ),
    (
        "the HTTP API's wait allowed past its shortest timeout",
        r"(ApiWaitForInProgressMs:\n(?:.*\n)*?\s+MaxValue:) 9000",
        r"\1 60000",
        check_http_api_callers_identified,
    ),
    (
        "visibility below 6 x timeout (the 60 s row lowered)",
        r'("60":\n\s+VisibilityTimeout:) 420',
        r"\1 300",
        check_visibility_covers_timeout,
    ),
    (
        "an allowed timeout without a visibility row",
        r"AllowedValues: \[30, 60, 120, 300, 600, 900\]",
        "AllowedValues: [30, 60, 120, 300, 600, 900, 450]",
        check_visibility_covers_timeout,
    ),
    (
        "ReportBatchItemFailures missing",
        r"\n\s+FunctionResponseTypes:\n\s+- ReportBatchItemFailures",
        "",
        check_reports_batch_item_failures,
    ),
    (
        "one IAM action too many (dynamodb:Scan)",
        r"(\n(\s+)- dynamodb:DeleteItem)(?=[\s\S]*ModelApiFunction:)",
        r"\1\n\2- dynamodb:Scan",
        check_least_privilege,
    ),
    (
        "the secret readable on every resource",
        r"(Action: secretsmanager:GetSecretValue\n\s+Resource:) !Ref ModelApiKeySecretArn(?=[\s\S]*ModelApiFunction:)",
        r'\1 "*"',
        check_least_privilege,
    ),
    (
        "the expiry told a shorter visibility than the queue's",
        r"(IDEMPOTENCY_QUEUE_VISIBILITY_TIMEOUT_SECONDS:) !FindInMap .*",
        r"\1 60",
        check_expiry_covers_redeliveries,
    ),
    (
        "the table deleted with the stack",
        r"DeletionPolicy: Retain(?=[\s\S]*\n  AnswersTable:\n)",
        "DeletionPolicy: Delete",
        check_table_kept,
    ),
    (
        "the answers table deleted with the stack",
        r"(AnswersTable:\n\s+Type: AWS::DynamoDB::Table\n(?:\s+#.*\n)*\s+)DeletionPolicy: Retain",
        r"\1DeletionPolicy: Delete",
        check_table_kept,
    ),
    (
        "the worker may not write its answers",
        r"\n\s+- Effect: Allow\n\s+Action: dynamodb:PutItem\n\s+Resource: !GetAtt AnswersTable.Arn",
        "",
        check_least_privilege,
    ),
    (
        "the worker without its answers table",
        r"\n\s+ANSWERS_TABLE: !Ref AnswersTable",
        "",
        check_table_kept,
    ),
    (
        "the API key as a plain environment variable",
        r"(\n(\s+)MODEL_API_KEY_SECRET_ARN: !Ref ModelApiKeySecretArn)(?![\s\S]*ModelApiFunction:)",
        r"\1\n\2MODEL_API_KEY: sk-plain",
        check_api_key_only_as_secret,
    ),
]


# ------------------------------------------------------------------------------- the run


class Note(str):
    """A line a passing test shows."""


def run_tool(args: list) -> list:
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return [f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout}{done.stderr}".rstrip()]
    return []


def main() -> int:
    template = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "template.yaml"
    source = template.read_text()
    cfn = translate(source)
    results = []

    def test(name, fn):
        """Runs fn, which returns its problems (and Note lines to show on success)."""
        try:
            lines = fn()
        except Exception as e:  # a check that crashes fails
            lines = [f"{type(e).__name__}: {e}"]
        problems = [line for line in lines if not isinstance(line, Note)]
        results.append(not problems)
        print(f"{'ok  ' if not problems else 'FAIL'} {name}")
        for line in problems or lines:
            print(f"       {line}")

    test("sam validate --lint", lambda: run_tool([BIN / "sam", "validate", "--lint", "-t", template]))

    with tempfile.TemporaryDirectory() as tmp:
        translated = Path(tmp) / "translated.json"
        translated.write_text(json.dumps(cfn, indent=1))
        test(
            "cfn-lint with serverless rules on the translated template",
            lambda: run_tool([BIN / "cfn-lint", "--append-rules", "cfn_lint_serverless.rules", "--", translated]),
        )

    for check in INVARIANTS:
        test(check.__name__.removeprefix("check_").replace("_", " "), lambda check=check: check(cfn))

    def samconfig():
        config = tomllib.loads((ROOT / "samconfig.toml").read_text())
        problems = []
        for command in ("build", "deploy"):
            params = config.get("default", {}).get(command, {}).get("parameters", {})
            if params.get("beta_features") is not True:
                problems.append(f"samconfig.toml: default.{command}.parameters.beta_features is not true")
        return problems

    test("samconfig.toml enables rust-cargolambda (a beta feature) without prompting", samconfig)

    for name, pattern, replacement, check in SEEDED_MISTAKES:

        def seeded(pattern=pattern, replacement=replacement, check=check):
            mutated, n = re.subn(pattern, replacement, source)
            if n != 1:
                return [f"the mistake could not be seeded: {n} matches of {pattern!r}"]
            try:
                translated = translate(mutated)
            except Exception:  # SAM's translator refused it: caught before any check
                return []
            problems = check(translated)  # a crash fails this test
            if not problems:
                return [f"{check.__name__} passed a template with this mistake"]
            return [Note(f"{check.__name__}: {problems[0]}")]

        test(f"seeded mistake caught: {name}", seeded)

    passed = sum(results)
    print(f"template: {passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
