//! `lambda-idempotency`: the on-call engineer's tool. Reads a record (`get`), deletes a
//! stuck claim or a bad stored result as it was read (`forget`), and lists records by
//! prefix, status and how long a claim has been stuck (`list`), in DynamoDB, Redis or
//! PostgreSQL. `--help` lists the exit statuses scripts can rely on.

mod args;
mod output;
mod target;

use args::{Args, Command, ListArgs, USAGE};
use lambda_idempotency::Idempotency;
use lambda_idempotency::store::{Forgotten, ListRequest};
use serde_json::json;
use std::process::ExitCode;
use std::time::SystemTime;
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
    let args = match args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    if args.command == Command::Help {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let handle = match target::url(args.store.clone(), &env) {
        Ok(url) => target::open(&url, &env).await,
        Err(e) => Err(OpenError::Setting(e)),
    };
    let handle = match handle {
        Ok(handle) => handle,
        Err(OpenError::Setting(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(USAGE_ERROR);
        }
        Err(OpenError::Unreachable(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(STORE_FAILED);
        }
    };
    match run(&args, &handle).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", lambda_idempotency::report(&e));
            ExitCode::from(STORE_FAILED)
        }
    }
}

async fn run(args: &Args, handle: &Idempotency) -> Result<u8, lambda_idempotency::Error> {
    let now = SystemTime::now();
    match &args.command {
        Command::Help => Ok(0),
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
        Command::Forget { id, if_token } => {
            let Some(read) = handle.record_by_id(id).await? else {
                say(
                    args,
                    json!({"id": id, "forgotten": false, "found": false}),
                    &format!("no record has the id {id:?}"),
                );
                return Ok(NO_RECORD);
            };
            if if_token.is_some() && read.lease_token != *if_token {
                say(
                    args,
                    json!({"id": id, "forgotten": false, "changed": true, "record": output::json(&read, now, false)}),
                    &format!(
                        "not forgotten: its lease token is no longer {:?}; read it again\n{}",
                        if_token.as_deref().unwrap_or_default(),
                        output::human(&read, now, false).trim_end()
                    ),
                );
                return Ok(CHANGED);
            }
            let (code, text) = match handle.forget(&read).await? {
                Forgotten::Deleted => (
                    0,
                    "forgotten: the next delivery of its message runs the function again",
                ),
                Forgotten::Absent => (
                    0,
                    "gone: the record was deleted before this request reached it (expired, forgotten, or this request's own earlier attempt)",
                ),
                Forgotten::Changed => (
                    CHANGED,
                    "not forgotten: the record changed since it was read (claimed, completed or taken over); read it again",
                ),
                _ => (
                    STORE_FAILED,
                    "not forgotten: an answer this tool does not know",
                ),
            };
            say(
                args,
                json!({"id": id, "forgotten": code == 0, "changed": code == CHANGED, "record": output::json(&read, now, false)}),
                &format!("{}\n{text}", output::human(&read, now, false)),
            );
            Ok(code)
        }
        Command::List(list) => listing(args, list, handle, now).await,
    }
}

/// Pages through the store until the end or `--max-items`, keeping what the filters
/// match; progress on stderr after each page.
async fn listing(
    args: &Args,
    list: &ListArgs,
    handle: &Idempotency,
    now: SystemTime,
) -> Result<u8, lambda_idempotency::Error> {
    let mut request = ListRequest::new(list.prefix.clone(), list.page_size);
    let (mut scanned, mut matched, mut unreadable) = (0usize, Vec::new(), Vec::new());
    let mut seen = std::collections::HashSet::new();
    let complete = loop {
        let page = handle.list(&request).await?;
        scanned += page.records.len() + page.unreadable.len();
        unreadable.extend(page.unreadable);
        for record in page.records {
            let keep = list.status.is_none_or(|s| record.status == s)
                && list
                    .stuck_for
                    .is_none_or(|d| output::is_stuck(&record, now, d));
            // Redis's SCAN may return a key twice.
            if keep && seen.insert(record.id.clone()) {
                matched.push(record);
            }
        }
        if !args.quiet {
            eprintln!("scanned {scanned} records, {} match", matched.len());
        }
        match page.next {
            None => break true,
            Some(_) if scanned >= list.max_items => break false,
            next => request = request.after(next),
        }
    };
    if args.json {
        let records: Vec<_> = matched
            .iter()
            .map(|r| output::json(r, now, list.data))
            .collect();
        let unreadable: Vec<_> = unreadable
            .iter()
            .map(|(id, why)| json!({"id": id, "why": why}))
            .collect();
        println!(
            "{}",
            json!({"records": records, "scanned": scanned, "complete": complete, "unreadable": unreadable})
        );
    } else {
        for record in &matched {
            println!("{}", output::summary(record, now));
            if list.data
                && let Some(data) = &record.data
            {
                println!("            {data}");
            }
        }
        for (id, why) in &unreadable {
            println!("UNREADABLE  {id}: {why}");
        }
        println!("{} matching of {scanned} scanned", matched.len());
        if !complete {
            println!("stopped at --max-items {}: there are more", list.max_items);
        }
    }
    Ok(0)
}

/// `value` with `--json`, else `text`.
fn say(args: &Args, value: serde_json::Value, text: &str) {
    if args.json {
        println!("{value}");
    } else {
        println!("{text}");
    }
}
