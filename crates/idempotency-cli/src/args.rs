//! The command line (clap's derive): three commands, the flags every command takes, and
//! the worker's settings as options its variables back.

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};
use lambda_idempotency::store::Status;
use std::time::Duration;

/// The text after the options: stores, durations, `--json` and the exit statuses.
const AFTER_HELP: &str = "\
stores (--store, else the worker's IDEMPOTENCY_STORE and its variables):
  dynamodb://TABLE          region, credentials and endpoint from the AWS variables or
                            profile (IDEMPOTENCY_TABLE without --store)
  redis://HOST:PORT         rediss:// for TLS; a cluster through any of its nodes (found by
                            asking it) or several comma-separated URLs (REDIS_URL without
                            --store, IDEMPOTENCY_STORE=redis or redis-cluster)
  postgres://USER@HOST/DB   the table: --table (DATABASE_URL without --store,
                            IDEMPOTENCY_STORE=postgres)

--json: one JSON document on stdout whatever happens, an error too ({\"error\": ..., \"exit\": N}).

exit status:
  0  done (get: found; forget: deleted, or deleted by another since it was read; list: listed)
  1  the store failed (unreachable, timed out, malformed record)
  2  a usage or configuration error (a malformed URL, a refused password or role, a table
     that is not the worker's, a store this build left out)
  3  no record has the id
  4  forget: the record changed since it was read (claimed, completed, taken over); nothing deleted

The runbook: docs/deploy.md, \"On call\".";

/// `lambda-idempotency`: read, list and forget idempotency records.
#[derive(Debug, Parser)]
#[command(
    name = "lambda-idempotency",
    version,
    about = "Read, list and forget idempotency records in DynamoDB, Redis or PostgreSQL",
    after_help = AFTER_HELP,
    propagate_version = true
)]
pub(crate) struct Args {
    /// The store (below); without it, the worker's IDEMPOTENCY_STORE and its variables
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) store: Option<String>,
    /// One JSON document on stdout, for scripts, an error too
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// No progress on stderr
    #[arg(long, short, global = true)]
    pub(crate) quiet: bool,
    #[command(flatten)]
    pub(crate) settings: Settings,
    /// The command.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The worker's settings the store is read with, each from the worker's own variable
/// unless given.
#[derive(Debug, Clone, Default, ClapArgs)]
#[command(next_help_heading = "The worker's settings")]
pub(crate) struct Settings {
    /// The worker's table: DynamoDB's (without --store), PostgreSQL's [default: idempotency]
    #[arg(long, global = true, env = "IDEMPOTENCY_TABLE", value_name = "TABLE")]
    pub(crate) table: Option<String>,
    /// DynamoDB: the partition key's name [default: id]
    #[arg(
        long,
        global = true,
        env = "IDEMPOTENCY_TABLE_PARTITION_KEY",
        value_name = "NAME"
    )]
    pub(crate) partition_key: Option<String>,
    /// DynamoDB: the sort key's name, in a table shared with other items
    #[arg(
        long,
        global = true,
        env = "IDEMPOTENCY_TABLE_SORT_KEY",
        value_name = "NAME"
    )]
    pub(crate) sort_key: Option<String>,
    /// DynamoDB with a sort key: the worker's records' [default: idempotency#FUNCTION]
    #[arg(
        long,
        global = true,
        env = "IDEMPOTENCY_TABLE_PARTITION_VALUE",
        value_name = "VALUE"
    )]
    pub(crate) partition_value: Option<String>,
    /// The worker's deployed function name (FUNCTION above)
    #[arg(
        long,
        global = true,
        env = "AWS_LAMBDA_FUNCTION_NAME",
        value_name = "NAME"
    )]
    pub(crate) function_name: Option<String>,
    /// Redis: the worker's namespace, before every key
    #[arg(
        long,
        global = true,
        env = "IDEMPOTENCY_REDIS_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub(crate) redis_namespace: Option<String>,
}

impl Settings {
    /// The setting the worker's variable `name` holds, as the worker reads it (trimmed,
    /// empty is unset); `None` for a variable that backs no option.
    pub(crate) fn by_variable(&self, name: &str) -> Option<Option<&str>> {
        let value = match name {
            "IDEMPOTENCY_TABLE" => &self.table,
            "IDEMPOTENCY_TABLE_PARTITION_KEY" => &self.partition_key,
            "IDEMPOTENCY_TABLE_SORT_KEY" => &self.sort_key,
            "IDEMPOTENCY_TABLE_PARTITION_VALUE" => &self.partition_value,
            "AWS_LAMBDA_FUNCTION_NAME" => &self.function_name,
            "IDEMPOTENCY_REDIS_NAMESPACE" => &self.redis_namespace,
            _ => return None,
        };
        Some(value.as_deref().map(str::trim).filter(|v| !v.is_empty()))
    }
}

/// One command.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub(crate) enum Command {
    /// Reads one record: status, expiry, a claim's lease, result size, token, version
    Get {
        /// The stored id: `{function}.{operation}#{key}`
        id: String,
        /// Include the stored result
        #[arg(long)]
        data: bool,
    },
    /// Deletes a record still as read: the next delivery runs the function again
    #[command(long_about = FORGET_ABOUT)]
    Forget {
        /// The stored id: `{function}.{operation}#{key}`
        id: String,
        /// Delete only the record of this version, as `get` showed it
        #[arg(long, value_name = "V")]
        if_version: Option<String>,
    },
    /// Lists records by prefix, status, and how long a claim has been stuck
    #[command(long_about = LIST_ABOUT)]
    List(ListArgs),
}

/// `forget --help`.
const FORGET_ABOUT: &str = "\
Deletes a record still as read: the next delivery runs the function again.

By itself it deletes the record as it reads it just before; with --if-version, as `get`
showed it (its version covers status, expiry, lease end and token): a claim, completion
or takeover since is never deleted (exit 4).

Rows the function committed with the record (execute_committing, WithWrites) stay: the
next delivery runs the function again, and its own writes may then be refused by their
own condition (a unique key): delete or upsert those rows first (docs/deploy.md, \"On
call\").";

/// `list --help`.
const LIST_ABOUT: &str = "\
Lists records by prefix, status, and how long a claim has been stuck.

It pages through the records (a DynamoDB Scan or Query, Redis SCAN, SQL), progress on
stderr, and stops after --max-items items examined, matching or not, and says so: a
prefix that matches few of a big store's items still ends.";

/// `list`'s filters and bounds.
#[derive(Debug, Clone, PartialEq, Eq, ClapArgs)]
pub(crate) struct ListArgs {
    /// Ids that start with it (`{function}.{operation}#` for one operation)
    #[arg(long, default_value = "", hide_default_value = true)]
    pub(crate) prefix: String,
    /// Only records of this status
    #[arg(long, value_enum)]
    pub(crate) status: Option<StatusArg>,
    /// Claims in progress whose lease has ended (the worker crashed or timed out)
    #[arg(long, conflicts_with = "stuck_for")]
    pub(crate) stuck: bool,
    /// Claims in progress whose lease ended at least this long ago: 90s, 10m, 1h30m, 2d
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub(crate) stuck_for: Option<Duration>,
    /// Items one store request reads
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub(crate) page_size: u16,
    /// Stop after the page that reaches this many items examined, matching or not
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_items: u64,
    /// Include each stored result
    #[arg(long)]
    pub(crate) data: bool,
}

impl ListArgs {
    /// The least time a listed claim's lease has been over: `--stuck` is any.
    pub(crate) fn stuck_for(&self) -> Option<Duration> {
        self.stuck_for.or(if self.stuck {
            Some(Duration::ZERO)
        } else {
            None
        })
    }

    /// The status asked for.
    pub(crate) fn status(&self) -> Option<Status> {
        self.status.map(|s| match s {
            StatusArg::InProgress => Status::InProgress,
            StatusArg::Completed => Status::Completed,
        })
    }
}

/// `--status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StatusArg {
    /// A claim (INPROGRESS)
    #[value(alias = "inprogress", alias = "INPROGRESS")]
    InProgress,
    /// A stored answer (COMPLETED)
    #[value(alias = "COMPLETED")]
    Completed,
}

/// Parses `args` (the program's name first); a stuck claim is never completed.
pub(crate) fn parse<I, T>(args: I) -> Result<Args, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args = Args::try_parse_from(args)?;
    if let Command::List(list) = &args.command
        && list.stuck_for().is_some()
        && list.status == Some(StatusArg::Completed)
    {
        return Err(<Args as clap::CommandFactory>::command().error(
            clap::error::ErrorKind::ArgumentConflict,
            "--stuck and --stuck-for list claims in progress: not with --status completed",
        ));
    }
    Ok(args)
}

/// A duration as people write it (`90s`, `10m`, `1h30m`, `2d`), or plain seconds.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    if let Ok(secs) = text.trim().parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{e}: a duration is 90s, 10m, 1h30m, 2d, or plain seconds"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Result<Args, clap::Error> {
        parse(std::iter::once("lambda-idempotency").chain(line.split_whitespace()))
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
        let parsed = args("list --prefix f.op# --stuck-for 10m --page-size 5 -q").unwrap();
        assert!(parsed.quiet);
        let Command::List(list) = parsed.command else {
            panic!("a listing")
        };
        assert_eq!(list.stuck_for(), Some(Duration::from_secs(600)));
        assert_eq!((list.prefix.as_str(), list.page_size), ("f.op#", 5));
        assert_eq!((list.max_items, list.status()), (10_000, None));
        let Command::List(list) = args("list --stuck --status INPROGRESS").unwrap().command else {
            panic!("a listing")
        };
        assert_eq!(
            (list.stuck_for(), list.status()),
            (Some(Duration::ZERO), Some(Status::InProgress))
        );
    }

    #[test]
    fn mistakes_are_named() {
        for (line, says) in [
            ("", "Usage"),
            ("fetch x", "unrecognized subcommand"),
            ("get", "<ID>"),
            ("get a b", "unexpected argument 'b'"),
            ("get a --date", "--data"),
            ("forget a --if-version", "a value is required"),
            ("list --status done", "in-progress, completed"),
            (
                "list --stuck-for 10 minutes",
                "unexpected argument 'minutes'",
            ),
            ("list --stuck-for 10x", "a duration is"),
            ("list --page-size 0", "1..=1000"),
            ("list --max-items 0", "1.."),
            ("list --stuck --stuck-for 1m", "cannot be used with"),
            (
                "list --stuck --status completed",
                "not with --status completed",
            ),
        ] {
            let err = args(line).unwrap_err().to_string();
            assert!(err.contains(says), "{line:?}: {err}");
        }
        assert_eq!(duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert!(duration("99999999999999999999d").is_err());
    }

    #[test]
    fn the_command_line_is_well_formed() {
        <Args as clap::CommandFactory>::command().debug_assert();
    }
}
