//! `lambda-idempotency`: the on-call engineer's tool. Reads a record (`get`), deletes a
//! stuck claim or a bad stored result as it was read (`forget`), and lists records by
//! prefix, status and how long a claim has been stuck (`list`), in DynamoDB, Redis or
//! PostgreSQL. `--help` lists the exit statuses scripts can rely on.

mod args;
mod output;
mod target;

use args::{Args, Command, ListArgs};
use lambda_idempotency::Idempotency;
use lambda_idempotency::store::{Forgotten, ListRequest};
use serde_json::json;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};
use target::OpenError;

/// The store failed.
const STORE_FAILED: u8 = 1;
/// A usage or configuration error.
const USAGE_ERROR: u8 = 2;
/// No record has the id.
const NO_RECORD: u8 = 3;
/// `forget`: the record changed since it was read.
const CHANGED: u8 = 4;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match args::parse(std::env::args_os()) {
        Ok(args) => args,
        Err(e) => return usage_error(&e),
    };
    let settings = args.settings.clone();
    // The worker's settings as it reads them (trimmed, empty is unset): an option's value
    // (its variable's when not given), else the variable.
    let env = move |name: &str| match settings.by_variable(name) {
        Some(value) => value.map(str::to_owned),
        None => std::env::var(name)
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty()),
    };
    let handle = match target::url(args.store.clone(), &env) {
        Ok(url) => target::open(&url, &env).await,
        Err(e) => Err(OpenError::Setting(e)),
    };
    let handle = match handle {
        Ok(handle) => handle,
        Err(OpenError::Setting(e)) => return fail(&args, &e, USAGE_ERROR),
        Err(OpenError::Unreachable(e)) => return fail(&args, &e, STORE_FAILED),
    };
    match run(&args, &handle).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail(&args, &lambda_idempotency::report(&e), STORE_FAILED),
    }
}

/// A command line that did not parse, or asked for help or the version: clap's answer,
/// with its status (2 for a mistake, 0 for help). With `--json` anywhere in it, a mistake
/// is also one JSON document on stdout.
fn usage_error(e: &clap::Error) -> ExitCode {
    let code = e.exit_code();
    if code != 0 && std::env::args_os().any(|a| a == "--json") {
        let text = e.render().to_string();
        let text = text.trim().trim_start_matches("error: ");
        failed_json(text, USAGE_ERROR);
    }
    // Help and the version on stdout, a mistake on stderr.
    let _ = e.print();
    ExitCode::from(u8::try_from(code).unwrap_or(USAGE_ERROR))
}

/// Ends with `code`, saying why on stderr, and on stdout too as JSON with `--json`, so a
/// script reading stdout always gets one document.
fn fail(args: &Args, why: &str, code: u8) -> ExitCode {
    if args.json {
        failed_json(why, code);
    }
    eprintln!("error: {why}");
    ExitCode::from(code)
}

fn failed_json(why: &str, code: u8) {
    out(&json!({"error": why, "exit": code}).to_string());
}

async fn run(args: &Args, handle: &Idempotency) -> Result<u8, lambda_idempotency::Error> {
    let now = SystemTime::now();
    match &args.command {
        Command::Get { id, data } => match handle.record_by_id(id).await? {
            None => {
                say(
                    args,
                    json!({"id": id, "found": false}),
                    &format!("no record has the id {id:?}"),
                );
                Ok(NO_RECORD)
            }
            Some(record) => {
                let mut value = output::json(&record, now, *data);
                value["found"] = true.into();
                say(args, value, output::human(&record, now, *data).trim_end());
                Ok(0)
            }
        },
        Command::Forget { id, if_version } => {
            let Some(read) = handle.record_by_id(id).await? else {
                say(
                    args,
                    json!({"id": id, "forgotten": false, "found": false}),
                    &format!("no record has the id {id:?}"),
                );
                return Ok(NO_RECORD);
            };
            // The operator decided on the record as `get` showed it: if it is no longer
            // that one (completed since, say, with its claim's token), nothing is deleted.
            if let Some(version) = if_version
                && output::version(&read) != *version
            {
                say(
                    args,
                    json!({"id": id, "forgotten": false, "changed": true, "record": output::json(&read, now, false)}),
                    &format!(
                        "not forgotten: it is no longer the record of version {version}; read it again\n{}",
                        output::human(&read, now, false).trim_end()
                    ),
                );
                return Ok(CHANGED);
            }
            let (code, forgotten, text) = forget_answer(handle.forget(&read).await?);
            say(
                args,
                json!({
                    "id": id,
                    "forgotten": forgotten,
                    "absent": code == 0 && !forgotten,
                    "changed": code == CHANGED,
                    "record": output::json(&read, now, false),
                }),
                &format!("{}\n{text}", output::human(&read, now, false)),
            );
            Ok(code)
        }
        Command::List(list) => listing(args, list, handle, now).await,
    }
}

/// What `forget` answers for the store's outcome: the exit status, whether this request
/// deleted the record, and what to tell a person.
fn forget_answer(outcome: Forgotten) -> (u8, bool, &'static str) {
    match outcome {
        Forgotten::Deleted => (
            0,
            true,
            "forgotten: the next delivery of its message runs the function again. Rows the \
             function committed with the record (execute_committing, WithWrites), if any, \
             stay, and its own writes may then be refused by their own condition (a unique \
             key): delete or upsert those rows before the message is delivered again \
             (docs/deploy.md, \"On call\")",
        ),
        Forgotten::Absent => (
            0,
            false,
            "gone: the record was deleted before this request reached it (expired, forgotten, or this request's own earlier attempt whose answer was lost)",
        ),
        Forgotten::Changed => (
            CHANGED,
            false,
            "not forgotten: the record changed since it was read (claimed, completed or taken over; or this request's own earlier attempt deleted it, its answer was lost, and a new claim came since); read it again",
        ),
        _ => (
            STORE_FAILED,
            false,
            "not forgotten: an answer this tool does not know",
        ),
    }
}

/// Pages through the store until the end or `--max-items` examined, keeping what the
/// filters match; progress on stderr at most once a second.
async fn listing(
    args: &Args,
    list: &ListArgs,
    handle: &Idempotency,
    now: SystemTime,
) -> Result<u8, lambda_idempotency::Error> {
    let mut request = ListRequest::new(list.prefix.clone(), usize::from(list.page_size));
    let (status, stuck_for) = (list.status(), list.stuck_for());
    let max_items = usize::try_from(list.max_items).unwrap_or(usize::MAX);
    let (mut examined, mut read, mut matched, mut unreadable) =
        (0usize, 0usize, Vec::new(), Vec::new());
    let mut seen = std::collections::HashSet::new();
    let mut said = Instant::now();
    let complete = loop {
        let page = handle.list(&request).await?;
        examined = examined.saturating_add(page.examined);
        read += page.records.len() + page.unreadable.len();
        unreadable.extend(page.unreadable);
        for record in page.records {
            let keep = status.is_none_or(|s| record.status == s)
                && stuck_for.is_none_or(|d| output::is_stuck(&record, now, d));
            // Redis's SCAN may return a key twice.
            if keep && seen.insert(record.id.clone()) {
                matched.push(record);
            }
        }
        let next = match page.next {
            None => break true,
            Some(_) if examined >= max_items => break false,
            next => next,
        };
        if !args.quiet && said.elapsed() >= Duration::from_secs(1) {
            eprintln!(
                "about {examined} examined, {read} records read, {} match",
                matched.len()
            );
            said = Instant::now();
        }
        request = request.after(next);
    };
    // The summary is said once, with the listing (the JSON's counts, the last line).
    if args.json {
        let records: Vec<_> = matched
            .iter()
            .map(|r| output::json(r, now, list.data))
            .collect();
        let unreadable: Vec<_> = unreadable
            .iter()
            .map(|(id, why)| json!({"id": id, "why": why}))
            .collect();
        out(&json!({"records": records, "examined": examined, "read": read, "complete": complete, "unreadable": unreadable}).to_string());
    } else {
        let mut text = String::new();
        for record in &matched {
            text.push_str(&output::summary(record, now));
            text.push('\n');
            if list.data
                && let Some(data) = &record.data
            {
                text.push_str(&format!("            {}\n", output::shown(data)));
            }
        }
        for (id, why) in &unreadable {
            text.push_str(&format!(
                "UNREADABLE  {}: {}\n",
                output::shown(id),
                output::shown(why)
            ));
        }
        text.push_str(&format!(
            "{} matching of {read} records read (about {examined} items examined)",
            matched.len()
        ));
        if !complete {
            text.push_str(&format!(
                "\nstopped at --max-items {} examined: there are more (raise --max-items, or --page-size up to 1000)",
                list.max_items
            ));
        }
        out(&text);
    }
    Ok(0)
}

/// Prints `text` and a newline on stdout. A reader that went away (`| head`) ends the
/// process quietly, with the status a shell gives a broken pipe, instead of a panic.
fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("error: cannot write the output: {e}");
        std::process::exit(i32::from(STORE_FAILED));
    }
}

/// `value` with `--json`, else `text`.
fn say(args: &Args, value: serde_json::Value, text: &str) {
    if args.json {
        out(&value.to_string());
    } else {
        out(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record gone before the delete is no failure and no deletion; one changed since
    /// the read is the "read it again" status.
    #[test]
    fn each_forget_outcome_has_its_status() {
        assert_eq!(forget_answer(Forgotten::Deleted).0, 0);
        assert!(forget_answer(Forgotten::Deleted).1);
        let (code, forgotten, text) = forget_answer(Forgotten::Absent);
        assert_eq!((code, forgotten), (0, false));
        assert!(text.starts_with("gone"), "{text}");
        let (code, forgotten, text) = forget_answer(Forgotten::Changed);
        assert_eq!((code, forgotten), (CHANGED, false));
        assert!(text.contains("read it again"), "{text}");
    }
}
