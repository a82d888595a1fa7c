//! The command line, parsed by hand: three commands and a few flags do not need a parser
//! crate.

use lambda_idempotency::store::Status;
use std::time::Duration;

/// What the user asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Args {
    /// `--store URL`, else the worker's environment.
    pub(crate) store: Option<String>,
    /// `--json`: one JSON document on stdout.
    pub(crate) json: bool,
    /// `--quiet`: no progress on stderr.
    pub(crate) quiet: bool,
    /// The command.
    pub(crate) command: Command,
}

/// One command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// `get ID [--data]`.
    Get { id: String, data: bool },
    /// `forget ID [--if-version V]`.
    Forget {
        id: String,
        if_version: Option<String>,
    },
    /// `list [filters]`.
    List(ListArgs),
    /// `help`, `--help`, `-h`.
    Help,
}

/// `list`'s filters and bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListArgs {
    /// `--prefix P`: ids that start with it (`{function}.{operation}#` for one operation).
    pub(crate) prefix: String,
    /// `--status in-progress|completed`.
    pub(crate) status: Option<Status>,
    /// `--stuck` (0) or `--stuck-for DURATION`: in progress, and its lease ended at least
    /// this long ago (the worker crashed or timed out).
    pub(crate) stuck_for: Option<Duration>,
    /// `--page-size N`: items one store request reads (default 100).
    pub(crate) page_size: usize,
    /// `--max-items N`: stop after the page that reaches this many items examined, matching
    /// or not (default 10 000): a prefix that matches few of a big store's items still
    /// ends.
    pub(crate) max_items: usize,
    /// `--data`: include each stored result.
    pub(crate) data: bool,
}

/// The usage text: `--help` prints it, a usage error ends with it.
pub(crate) const USAGE: &str = "\
lambda-idempotency: read, list and forget idempotency records

usage:
  lambda-idempotency [--store URL] [--json] [--quiet] get ID [--data]
  lambda-idempotency [--store URL] [--json] [--quiet] forget ID [--if-version V]
  lambda-idempotency [--store URL] [--json] [--quiet] list [--prefix P]
      [--status in-progress|completed] [--stuck | --stuck-for DURATION]
      [--page-size N] [--max-items N] [--data]

stores (--store, else the worker's IDEMPOTENCY_STORE and its variables):
  dynamodb://TABLE           region, credentials and endpoint from the AWS variables;
                             IDEMPOTENCY_TABLE_PARTITION_KEY, _SORT_KEY, _PARTITION_VALUE
                             (with a sort key: _PARTITION_VALUE, or AWS_LAMBDA_FUNCTION_NAME)
  redis://HOST:PORT          rediss:// for TLS; a cluster through any of its nodes (found
                             by asking it) or several comma-separated URLs;
                             IDEMPOTENCY_REDIS_NAMESPACE
  postgres://USER@HOST/DB    IDEMPOTENCY_TABLE (default idempotency)

durations: 90s, 10m, 2h, 1d (or seconds)

--json: one JSON document on stdout whatever happens, an error too ({\"error\": ..., \"exit\": N}).

forget deletes the record only if it is still as read: by itself, as it reads it just
before; with --if-version, as `get` showed it (its `version`): a claim, completion or
takeover since then is never deleted.

list stops after --max-items items examined (default 10000; a prefix may match few of
them), and says so; --page-size (default 100, at most 1000) is how many one request reads.

exit status:
  0  done (get: found; forget: deleted, or gone already; list: listed)
  1  the store failed (unreachable, timed out, denied, malformed record)
  2  a usage or configuration error (a malformed URL, a refused password, a setting)
  3  no record has the id
  4  forget: the record changed since it was read (claimed, completed, taken over); nothing deleted
";

/// Parses the arguments after the program's name.
pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut args = args.into_iter().peekable();
    let (mut store, mut json, mut quiet, mut help) = (None, false, false, false);
    let mut command = None;
    let mut rest = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--store" => store = Some(value(&mut args, "--store")?),
            "--json" => json = true,
            "--quiet" | "-q" => quiet = true,
            // Help wins wherever it is asked for: `list --help` too.
            "--help" | "-h" => help = true,
            "help" if command.is_none() => help = true,
            _ if command.is_none() && !arg.starts_with('-') => command = Some(arg),
            _ => rest.push(arg),
        }
    }
    let command = match command.as_deref() {
        _ if help => Command::Help,
        None => return Err("no command: get, forget or list".into()),
        Some("get") => {
            let (mut id, mut data) = (None, false);
            for arg in rest {
                match arg.as_str() {
                    "--data" => data = true,
                    _ => positional(&mut id, arg)?,
                }
            }
            Command::Get {
                id: id.ok_or("get: which id?")?,
                data,
            }
        }
        Some("forget") => {
            let (mut id, mut if_version) = (None, None);
            let mut rest = rest.into_iter();
            while let Some(arg) = rest.next() {
                match arg.as_str() {
                    "--if-version" => if_version = Some(value(&mut rest, "--if-version")?),
                    _ => positional(&mut id, arg)?,
                }
            }
            Command::Forget {
                id: id.ok_or("forget: which id?")?,
                if_version,
            }
        }
        Some("list") => Command::List(list_args(rest)?),
        Some(other) => return Err(format!("unknown command {other:?}: get, forget or list")),
    };
    Ok(Args {
        store,
        json,
        quiet,
        command,
    })
}

fn list_args(rest: Vec<String>) -> Result<ListArgs, String> {
    let mut list = ListArgs {
        prefix: String::new(),
        status: None,
        stuck_for: None,
        page_size: 100,
        max_items: 10_000,
        data: false,
    };
    let mut rest = rest.into_iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--prefix" => list.prefix = value(&mut rest, "--prefix")?,
            "--status" => {
                list.status = Some(match value(&mut rest, "--status")?.as_str() {
                    "in-progress" | "inprogress" | "INPROGRESS" => Status::InProgress,
                    "completed" | "COMPLETED" => Status::Completed,
                    other => {
                        return Err(format!("--status {other:?}: in-progress or completed"));
                    }
                })
            }
            "--stuck" => list.stuck_for = Some(Duration::ZERO),
            "--stuck-for" => list.stuck_for = Some(duration(&value(&mut rest, "--stuck-for")?)?),
            "--page-size" => list.page_size = count(&value(&mut rest, "--page-size")?, 1000)?,
            "--max-items" => list.max_items = count(&value(&mut rest, "--max-items")?, usize::MAX)?,
            "--data" => list.data = true,
            other => return Err(format!("list: unknown argument {other:?}")),
        }
    }
    if list.stuck_for.is_some() && list.status == Some(Status::Completed) {
        return Err("--stuck lists claims in progress; it cannot be --status completed".into());
    }
    Ok(list)
}

fn value(args: &mut impl Iterator<Item = String>, flag: &str) -> Result<String, String> {
    args.next().ok_or_else(|| format!("{flag} needs a value"))
}

fn positional(slot: &mut Option<String>, arg: String) -> Result<(), String> {
    if arg.starts_with("--") {
        return Err(format!("unknown argument {arg:?}"));
    }
    if slot.replace(arg).is_some() {
        return Err("one id at a time".into());
    }
    Ok(())
}

/// A whole number from 1 to `max`.
fn count(text: &str, max: usize) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("{text:?} is not a count from 1 to {max}")),
    }
}

/// `90s`, `10m`, `2h`, `1d`, or plain seconds.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration (90s, 10m, 2h, 1d)");
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let number: u64 = number.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    number
        .checked_mul(secs)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Result<Args, String> {
        parse(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn each_command_and_its_flags() {
        let get = args("--store redis://h:6379 get f.op#k --data --json").unwrap();
        assert_eq!(get.store.as_deref(), Some("redis://h:6379"));
        assert!(get.json && !get.quiet);
        assert_eq!(
            get.command,
            Command::Get {
                id: "f.op#k".into(),
                data: true
            }
        );
        assert_eq!(
            args("forget f.op#k --if-version abc").unwrap().command,
            Command::Forget {
                id: "f.op#k".into(),
                if_version: Some("abc".into())
            }
        );
        let Command::List(list) = args("list --prefix f.op# --stuck-for 10m --page-size 5 -q")
            .unwrap()
            .command
        else {
            panic!("a listing")
        };
        assert_eq!(list.stuck_for, Some(Duration::from_secs(600)));
        assert_eq!((list.prefix.as_str(), list.page_size), ("f.op#", 5));
        assert_eq!(args("--help").unwrap().command, Command::Help);
        assert_eq!(args("list --help").unwrap().command, Command::Help);
        assert_eq!(args("help").unwrap().command, Command::Help);
    }

    #[test]
    fn mistakes_are_named() {
        for (line, says) in [
            ("", "no command"),
            ("fetch x", "unknown command"),
            ("get", "which id"),
            ("get a b", "one id"),
            ("get a --date", "unknown argument"),
            ("forget a --if-version", "needs a value"),
            ("list --status done", "in-progress or completed"),
            ("list --stuck-for 10 minutes", "unknown argument"),
            ("list --stuck-for 10x", "not a duration"),
            ("list --page-size 0", "from 1 to 1000"),
            ("list --stuck --status completed", "cannot be"),
        ] {
            let err = args(line).unwrap_err();
            assert!(err.contains(says), "{line:?}: {err}");
        }
        assert_eq!(duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("1d"), Ok(Duration::from_secs(86_400)));
        assert!(duration("99999999999999999999d").is_err());
    }
}
