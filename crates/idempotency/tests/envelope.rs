//! Envelopes: each built-in over the shape Lambda delivers, composed steps, and every way
//! a body fails to open.

use base64::Engine;
use lambda_idempotency::envelope::{Envelope, Opened, Step};
use serde_json::{Value, json};
use std::io::Write;

fn request(opened: Opened) -> Value {
    match opened {
        Opened::Request(request) => request,
        other => panic!("expected a request, got {other:?}"),
    }
}

fn sqs_bodies(fixture: &str) -> Vec<String> {
    let event: Value = serde_json::from_str(fixture).unwrap();
    event["Records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["body"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn sns_gives_the_message_and_two_publishes_give_the_same_request() {
    let bodies = sqs_bodies(include_str!("../../../events/sns-to-sqs.json"));
    assert_ne!(
        bodies[0], bodies[1],
        "the two publishes differ in their envelopes"
    );
    let first = request(Envelope::sns().open(bodies[0].as_bytes()).unwrap());
    let second = request(Envelope::sns().open(bodies[1].as_bytes()).unwrap());
    assert_eq!(first, second);
    assert_eq!(first["model"], "gpt-4o-mini");
    assert!(first.get("MessageId").is_none() && first.get("Timestamp").is_none());
}

#[test]
fn eventbridge_gives_the_detail() {
    let bodies = sqs_bodies(include_str!("../../../events/eventbridge-to-sqs.json"));
    let first = request(Envelope::eventbridge().open(bodies[0].as_bytes()).unwrap());
    let second = request(Envelope::eventbridge().open(bodies[1].as_bytes()).unwrap());
    assert_eq!(first, second);
    assert_eq!(first["request_id"], "req-eb-order-4411");
}

#[test]
fn s3_skips_the_test_event_and_gives_the_object() {
    let bodies = sqs_bodies(include_str!("../../../events/s3-to-sqs.json"));
    match Envelope::s3().open(bodies[0].as_bytes()).unwrap() {
        Opened::Skip { reason } => assert!(reason.contains("s3:TestEvent"), "{reason}"),
        other => panic!("the test event is skipped, got {other:?}"),
    }
    let object = request(Envelope::s3().open(bodies[1].as_bytes()).unwrap());
    assert_eq!(object["object"]["key"], "prompts/2026/12/05/welcome.json");
    assert_eq!(object["bucket"]["name"], "model-prompts");
}

#[test]
fn s3_inside_sns_is_opened_twice_and_its_test_event_skipped() {
    let notification = |message: &Value| {
        json!({"Type": "Notification", "MessageId": "m", "Message": message.to_string()})
            .to_string()
    };
    let bodies = sqs_bodies(include_str!("../../../events/s3-to-sqs.json"));
    let test_event: Value = serde_json::from_str(&bodies[0]).unwrap();
    let created: Value = serde_json::from_str(&bodies[1]).unwrap();
    assert!(matches!(
        Envelope::s3_sns()
            .open(notification(&test_event).as_bytes())
            .unwrap(),
        Opened::Skip { .. }
    ));
    let object = request(
        Envelope::s3_sns()
            .open(notification(&created).as_bytes())
            .unwrap(),
    );
    assert_eq!(object["object"]["sequencer"], "0A1B2C3D4E5F678901");
    assert_eq!(Envelope::s3_sns().name(), "s3_sns");
}

#[test]
fn http_body_decodes_base64_only_when_the_event_says_so() {
    let plain = json!({"body": "{\"a\":1}", "isBase64Encoded": false});
    assert_eq!(
        request(Envelope::http_body().open_value(plain).unwrap()),
        json!({"a": 1})
    );
    let encoded = base64::engine::general_purpose::STANDARD.encode("{\"a\":2}");
    let event = json!({"body": encoded, "isBase64Encoded": true});
    assert_eq!(
        request(Envelope::http_body().open_value(event).unwrap()),
        json!({"a": 2})
    );
    let no_body = json!({"isBase64Encoded": false, "body": null});
    let e = Envelope::http_body().open_value(no_body).unwrap_err();
    assert!(e.reason.contains("no body"), "{e}");
}

#[test]
fn composed_steps_open_base64_gzip_json() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(br#"{"logEvents": [{"id": "1", "message": "m"}]}"#)
        .unwrap();
    let data = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
    let body = json!({"awslogs": {"data": data}}).to_string();
    let envelope = Envelope::new().pointer("/awslogs/data").base64().gzip();
    let opened = request(envelope.open(body.as_bytes()).unwrap());
    assert_eq!(opened["logEvents"][0]["id"], "1");
    assert_eq!(envelope.name(), "custom");
}

#[test]
fn a_pointer_is_rfc_6901_and_nothing_in_it_means_parse() {
    // `~1` is `/`, `~0` is `~`: a key may hold any character.
    let body = json!({"a/b": {"c~d": {"x": 1}}, "weird|json(x)": 2}).to_string();
    let opened = Envelope::new()
        .pointer("/a~1b/c~0d")
        .open(body.as_bytes())
        .unwrap();
    assert_eq!(request(opened), json!({"x": 1}));
    let opened = Envelope::new()
        .pointer("/weird|json(x)")
        .open(body.as_bytes())
        .unwrap();
    assert_eq!(request(opened), json!(2));
}

#[test]
fn a_body_that_does_not_open_says_why_and_names_the_envelope() {
    let cases: Vec<(Envelope, &[u8], &str)> = vec![
        (Envelope::sns(), b"not json", "not JSON"),
        (
            Envelope::sns(),
            br#"{"Type": "Notification"}"#,
            "nothing at \"/Message\"",
        ),
        (
            Envelope::sns(),
            br#"{"Message": {"already": "json"}}"#,
            "a string holding JSON, found an object",
        ),
        (Envelope::sns(), br#"{"Message": "{not json"}"#, "not JSON"),
        (
            Envelope::new().pointer("/d").base64(),
            br#"{"d": "***"}"#,
            "not base64",
        ),
        (
            Envelope::new().pointer("/d").base64(),
            br#"{"d": 5}"#,
            "needs a string",
        ),
        (
            Envelope::new().pointer("/d").base64().gzip(),
            br#"{"d": "aGVsbG8="}"#,
            "not gzip",
        ),
        (
            Envelope::new().pointer("/d").gzip(),
            br#"{"d": "x"}"#,
            "decode the base64 first",
        ),
    ];
    for (envelope, body, expected) in cases {
        let e = envelope.open(body).unwrap_err();
        assert!(e.reason.contains(expected), "{e} (expected {expected:?})");
        assert!(
            e.to_string()
                .starts_with(&format!("the {} envelope", envelope.name())),
            "{e}"
        );
    }
}

#[test]
fn a_skip_marker_that_is_not_the_value_does_not_skip() {
    let envelope = Envelope::new()
        .skip_when("/Event", "s3:TestEvent", "test")
        .pointer("/r");
    let opened = envelope.open(br#"{"Event": "s3:Other", "r": 1}"#).unwrap();
    assert_eq!(request(opened), json!(1));
    let opened = envelope.open(br#"{"Event": 5, "r": 2}"#).unwrap();
    assert_eq!(request(opened), json!(2));
}

#[test]
fn no_steps_is_the_body_itself_and_steps_are_listed() {
    assert_eq!(
        request(Envelope::new().open(b"{\"a\": 1}").unwrap()),
        json!({"a": 1})
    );
    let debug = format!("{:?}", Envelope::sns());
    assert!(
        debug.contains("Pointer(\"/Message\")") && debug.contains("JsonString"),
        "{debug}"
    );
    let _ = Step::Base64;
}

#[test]
fn an_sns_subscription_confirmation_on_the_queue_is_the_carriers_own_message() {
    // What SNS puts on a queue subscribed across accounts: not a request, and its Message is
    // prose, not JSON. It is acknowledged as the carrier's own message (like S3's test
    // event), not refused as a malformed request with "not JSON" and sent to the DLQ.
    for kind in ["SubscriptionConfirmation", "UnsubscribeConfirmation"] {
        let body = json!({
            "Type": kind,
            "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
            "Token": "2336412f37f",
            "TopicArn": "arn:aws:sns:us-east-1:123456789012:requests",
            "Message": "You have chosen to subscribe to the topic arn:aws:sns:us-east-1:123456789012:requests.\nTo confirm the subscription, visit the SubscribeURL included in this message.",
            "SubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=2336412f37f",
            "Timestamp": "2026-12-05T07:00:00.000Z",
            "SignatureVersion": "1",
        });
        for envelope in [Envelope::sns(), Envelope::s3_sns()] {
            match envelope.open(body.to_string().as_bytes()) {
                Ok(Opened::Skip { .. }) => {}
                other => panic!("{kind} through {}: {other:?}", envelope.name()),
            }
        }
    }
}

#[test]
fn a_gzip_body_with_a_second_member_is_not_silently_cut_to_the_first() {
    // gzip(A) followed by gzip(B) is one valid gzip stream (RFC 1952 members). Reading only
    // A acknowledges B without running it; the body must be refused or read whole.
    let gz = |text: &str| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(text.as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let mut bytes = gz(r#"{"id": "a"}"#);
    bytes.extend(gz(r#"{"id": "b"}"#));
    let body = base64::engine::general_purpose::STANDARD.encode(bytes);
    let opened = Envelope::new().base64().gzip().open(body.as_bytes());
    assert!(
        opened.is_err(),
        "the second member was dropped without a word: {opened:?}"
    );
}

#[test]
#[should_panic(expected = "does not start with '/'")]
fn a_pointer_without_its_slash_fails_where_the_envelope_is_built() {
    let _ = Envelope::new().pointer("detail");
}

#[test]
fn a_body_that_inflates_past_the_bound_is_refused_not_read_whole() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![b' '; 9 * 1024 * 1024]).unwrap();
    let data = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
    let body = json!({ "d": data }).to_string();
    let e = Envelope::new()
        .pointer("/d")
        .base64()
        .gzip()
        .open(body.as_bytes())
        .unwrap_err();
    assert!(e.reason.contains("inflates past"), "{e}");
}

#[test]
fn a_body_under_the_bound_opens_whole() {
    // 7 MiB of JSON whitespace around one value: under the 8 MiB bound, read whole.
    let mut document = b"[".to_vec();
    document.extend(vec![b' '; 7 * 1024 * 1024]);
    document.extend(b"1]");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&document).unwrap();
    let data = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
    let body = json!({ "d": data }).to_string();
    let opened = Envelope::new()
        .pointer("/d")
        .base64()
        .gzip()
        .open(body.as_bytes())
        .unwrap();
    assert_eq!(request(opened), json!([1]));
}
