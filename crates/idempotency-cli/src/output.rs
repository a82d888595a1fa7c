//! A record for a person (aligned lines, times in UTC with how long ago) or for a script
//! (JSON, times as the stored epoch numbers too). The stored result only when asked for.

use lambda_idempotency::store::{Record, Status, Utc, epoch_millis, epoch_secs};
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};

/// Whether `record` is a claim whose lease ended at least `for_at_least` before `now`.
pub(crate) fn is_stuck(record: &Record, now: SystemTime, for_at_least: Duration) -> bool {
    record.status == Status::InProgress
        && record
            .in_progress_expiration
            .and_then(|end| end.checked_add(for_at_least))
            .is_some_and(|stuck_from| stuck_from < now)
}

/// The record as read, in 16 hex digits: what `forget --if-version` compares, built from
/// every field whose change makes a delete refuse ([`Record::is_as_read`]: status,
/// expiry, lease end, lease token). A completion keeps its claim's token, so the token
/// alone would not tell a stuck claim from the answer its worker stored since.
pub(crate) fn version(record: &Record) -> String {
    let fields = format!(
        "{}\0{}\0{}\0{}",
        record.status.as_str(),
        epoch_secs(record.expiration),
        record
            .in_progress_expiration
            .map_or(String::new(), |end| epoch_millis(end).to_string()),
        record.lease_token.as_deref().unwrap_or_default(),
    );
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let hash = fields.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// `text` safe for a terminal: control characters (an escape sequence in an id that came
/// from a message could rewrite the lines above it) shown escaped, as Rust writes them.
pub(crate) fn shown(text: &str) -> String {
    if text.chars().any(char::is_control) {
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        text.to_owned()
    }
}

/// The record as JSON.
pub(crate) fn json(record: &Record, now: SystemTime, data: bool) -> Value {
    let mut value = json!({
        "id": record.id,
        "status": record.status.as_str(),
        "expiration": epoch_secs(record.expiration),
        "expiration_utc": Utc(record.expiration).to_string(),
        "in_progress_expiration": record.in_progress_expiration.map(epoch_millis),
        "lease_ended": record.status == Status::InProgress
            && record.in_progress_expiration.is_some_and(|end| end < now),
        "result_stored": record.data.is_some() && record.writes_refused().is_none(),
        "writes_refused": record.writes_refused(),
        "result_bytes": record.data.as_ref().map(String::len),
        "validation": record.validation.is_some(),
        "lease_token": record.lease_token,
        "version": version(record),
    });
    if let Some(end) = record.in_progress_expiration {
        value["in_progress_expiration_utc"] = Utc(end).to_string().into();
    }
    if data {
        value["data"] = record.data.clone().into();
    }
    value
}

/// The record as aligned lines.
pub(crate) fn human(record: &Record, now: SystemTime, data: bool) -> String {
    let mut out = String::new();
    let mut line = |name: &str, value: String| {
        out.push_str(&format!("{name:<12} {value}\n"));
    };
    line("id", shown(&record.id));
    line("status", record.status.as_str().to_owned());
    line("expires", when(record.expiration, now));
    // A claim's lease; a completed record has none, whatever its store kept of the claim's.
    if record.status == Status::InProgress
        && let Some(end) = record.in_progress_expiration
    {
        let ended = if end < now { "ended" } else { "ends" };
        line("lease", format!("{ended} {}", when(end, now)));
    }
    line(
        "result",
        match (&record.data, record.writes_refused()) {
            (_, Some(reason)) => format!(
                "none: the function's writes were refused, and every delivery answers that without running: {}",
                shown(reason)
            ),
            (Some(d), None) => format!("stored, {} bytes", d.len()),
            (None, _) if record.status == Status::Completed => "not stored (too large)".into(),
            (None, _) => "none yet".into(),
        },
    );
    line(
        "validation",
        if record.validation.is_some() {
            "a payload hash"
        } else {
            "none"
        }
        .into(),
    );
    line(
        "lease token",
        record
            .lease_token
            .as_deref()
            .map_or_else(|| "none".into(), shown),
    );
    line("version", version(record));
    if data && let Some(d) = &record.data {
        line("data", shown(d));
    }
    out
}

/// One line of a listing.
pub(crate) fn summary(record: &Record, now: SystemTime) -> String {
    let state = match (record.status, record.in_progress_expiration) {
        (Status::InProgress, Some(end)) if end < now => {
            format!(
                "lease ended {} ago",
                span(now.duration_since(end).unwrap_or_default())
            )
        }
        (Status::InProgress, Some(end)) => {
            format!(
                "lease ends in {}",
                span(end.duration_since(now).unwrap_or_default())
            )
        }
        (Status::InProgress, None) => "no lease".into(),
        (_, _) => match (&record.data, record.writes_refused()) {
            (_, Some(_)) => "writes refused".into(),
            (Some(d), None) => format!("{} bytes stored", d.len()),
            (None, _) => "no result stored".into(),
        },
    };
    format!(
        "{:<10}  {:<26}  {}",
        record.status.as_str(),
        state,
        shown(&record.id)
    )
}

/// A time in UTC, and how far it is from `now`.
fn when(t: SystemTime, now: SystemTime) -> String {
    match t.duration_since(now) {
        Ok(ahead) => format!("{} (in {})", Utc(t), span(ahead)),
        Err(behind) => format!("{} ({} ago)", Utc(t), span(behind.duration())),
    }
}

/// `3d 4h`, `12m 5s`, `40s`: the two largest units.
fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_idempotency::store::from_epoch_secs;

    #[test]
    fn a_stuck_claim_reads_as_one_and_its_result_only_when_asked() {
        let now = from_epoch_secs(1_800_000_000);
        let mut record = Record::new(
            "f.op#k",
            Status::InProgress,
            now + Duration::from_secs(86_400),
        );
        record.in_progress_expiration = Some(now - Duration::from_secs(720));
        record.lease_token = Some("tok".into());
        assert!(is_stuck(&record, now, Duration::from_secs(600)));
        assert!(!is_stuck(&record, now, Duration::from_secs(800)));
        let text = human(&record, now, false);
        assert!(
            text.contains("lease        ended 2027-01-15T07:48:00.000Z (12m 0s ago)"),
            "{text}"
        );
        assert!(summary(&record, now).contains("lease ended 12m 0s ago"));
        let value = json(&record, now, false);
        assert_eq!(value["lease_ended"], true);
        assert_eq!(value["in_progress_expiration"], 1_799_999_280_000u64);

        record.status = Status::Completed;
        record.data = Some("\"secret answer\"".into());
        assert!(!is_stuck(&record, now, Duration::ZERO));
        assert!(!human(&record, now, false).contains("secret"));
        assert!(!json(&record, now, false).to_string().contains("secret"));
        assert!(human(&record, now, true).contains("secret"));
        assert_eq!(json(&record, now, true)["data"], "\"secret answer\"");
        assert_eq!(json(&record, now, false)["writes_refused"], Value::Null);
        assert_eq!(json(&record, now, false)["result_bytes"], 15);

        // A kept refusal (the stored form is the library's): no result, its reason shown.
        record.data = Some("!writes-refused: statement 0: SQLSTATE 23505".into());
        let text = human(&record, now, false);
        assert!(
            text.contains("result       none: the function's writes were refused"),
            "{text}"
        );
        assert!(text.contains("SQLSTATE 23505"), "{text}");
        assert!(summary(&record, now).contains("writes refused"));
        let value = json(&record, now, false);
        assert_eq!(value["result_stored"], false);
        assert_eq!(value["writes_refused"], "statement 0: SQLSTATE 23505");
    }

    /// A live lease reads as one that ends; a completion without its result says it was
    /// too large, a claim says none yet; times in their two largest units.
    #[test]
    fn a_live_claim_and_a_completion_read_as_what_they_are() {
        let now = from_epoch_secs(1_800_000_000);
        let mut claim = Record::new("f.op#k", Status::InProgress, now);
        claim.in_progress_expiration = Some(now + Duration::from_secs(30));
        assert!(human(&claim, now, false).contains("lease        ends "));
        assert!(human(&claim, now, false).contains("result       none yet"));
        assert!(summary(&claim, now).contains("lease ends in 30s"));
        let mut done = Record::new("f.op#k", Status::Completed, now);
        done.in_progress_expiration = Some(now - Duration::from_secs(30));
        assert!(!human(&done, now, false).contains("lease  "));
        assert!(human(&done, now, false).contains("not stored (too large)"));
        assert!(summary(&done, now).contains("no result stored"));
        assert_eq!(span(Duration::from_secs(59)), "59s");
        assert_eq!(span(Duration::from_secs(3_600 * 5 + 60 * 7)), "5h 7m");
        assert_eq!(span(Duration::from_secs(86_400 * 2 + 3_600)), "2d 1h");
    }

    /// `--stuck-for` as long as a duration can be is "never stuck", not a panic.
    #[test]
    fn the_longest_stuck_for_finds_nothing() {
        let now = from_epoch_secs(1_800_000_000);
        let mut record = Record::new("f.op#k", Status::InProgress, now);
        record.in_progress_expiration = Some(now - Duration::from_secs(60));
        assert!(!is_stuck(&record, now, Duration::MAX));
        assert!(is_stuck(&record, now, Duration::from_secs(59)));
    }

    /// Each field a conditional delete compares changes the version; the data does not.
    #[test]
    fn the_version_changes_with_what_forget_compares() {
        let now = from_epoch_secs(1_800_000_000);
        let mut claim = Record::new("f.op#k", Status::InProgress, now);
        claim.in_progress_expiration = Some(now - Duration::from_secs(60));
        claim.lease_token = Some("tok".into());
        let v = version(&claim);
        assert_eq!(v.len(), 16);
        assert_eq!(v, version(&claim.clone()));
        let mut completed = claim.clone();
        completed.status = Status::Completed;
        let mut later = claim.clone();
        later.expiration += Duration::from_secs(1);
        let mut extended = claim.clone();
        extended.in_progress_expiration = Some(now);
        let mut taken = claim.clone();
        taken.lease_token = Some("other".into());
        let mut unleased = claim.clone();
        unleased.in_progress_expiration = None;
        for changed in [completed, later, extended, taken, unleased] {
            assert_ne!(version(&changed), v, "{changed:?}");
        }
        let mut with_data = claim.clone();
        with_data.data = Some("x".into());
        assert_eq!(version(&with_data), v);
    }

    /// An id from a message is shown, not obeyed: no escape sequence reaches the terminal.
    #[test]
    fn control_characters_are_shown_escaped() {
        let now = from_epoch_secs(1_800_000_000);
        let mut record = Record::new("f.op#a\u{1b}[1A\u{1b}[2K\rb", Status::Completed, now);
        record.data = Some("\"x\u{7}\"".into());
        for text in [human(&record, now, true), summary(&record, now)] {
            assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
            assert!(text.contains(r"f.op#a\u{1b}[1A\u{1b}[2K\rb"), "{text:?}");
        }
        assert_eq!(shown("plain é"), "plain é");
    }
}
