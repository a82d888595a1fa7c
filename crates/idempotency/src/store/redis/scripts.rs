//! The Lua scripts, one file each under `scripts/` (its header lists its keys,
//! arguments and answers), built once into [`Script`]s, and the calls that send them.

use super::KEY_GRACE;
use super::RedisStore;
use super::error::store_error;
use super::reply::{claim_outcome, fenced};
use crate::error::Error;
use crate::record::{Claim, Record, epoch_millis, epoch_secs};
use crate::store::{ClaimOutcome, Forgotten};
use redis::{Cmd, ErrorKind, RedisWrite, Script, ServerErrorKind, Value};
use std::io::Write;
use std::sync::LazyLock;
use std::time::SystemTime;

/// Claims a record, returning the old one ([`claim_outcome`] reads the answer).
const CLAIM_LUA: &str = include_str!("scripts/claim.lua");
/// Completes a record if the lease token still matches ([`fenced`] reads the answer).
const COMPLETE_LUA: &str = include_str!("scripts/complete.lua");
/// Deletes a record if the lease token still matches ([`fenced`] reads the answer).
const RELEASE_LUA: &str = include_str!("scripts/release.lua");
/// Deletes a record if it is still as an operator read it.
const FORGET_LUA: &str = include_str!("scripts/forget.lua");

/// A script's body and its SHA-1, computed once.
struct Lua {
    body: &'static str,
    script: LazyLock<Script>,
}

impl Lua {
    const fn new(body: &'static str, script: fn() -> Script) -> Self {
        Self {
            body,
            script: LazyLock::new(script),
        }
    }
}

static CLAIM: Lua = Lua::new(CLAIM_LUA, || Script::new(CLAIM_LUA));
static COMPLETE: Lua = Lua::new(COMPLETE_LUA, || Script::new(COMPLETE_LUA));
static RELEASE: Lua = Lua::new(RELEASE_LUA, || Script::new(RELEASE_LUA));
static FORGET: Lua = Lua::new(FORGET_LUA, || Script::new(FORGET_LUA));

impl RedisStore {
    /// `EVALSHA`, and the script itself once if the server does not know it. `args` adds
    /// the script's arguments, `text` their length in bytes besides the numbers: the
    /// command is sized once and the numbers written straight into it, with no string in
    /// between (this runs for every message).
    async fn eval(
        &self,
        lua: &Lua,
        id: &str,
        text: usize,
        args: impl Fn(&mut Cmd),
    ) -> Result<Value, Error> {
        let command = |name: &str, script: &str| {
            // Thirteen arguments at most (the claim: name, hash, key count, key and nine
            // values), each framed in about 30 bytes with its number.
            let size = script.len() + self.namespace.len() + id.len() + text + 400;
            let mut cmd = Cmd::with_capacity(13, size);
            cmd.arg(name);
            // Every script takes one key, `KEYS[1]`: cluster-safe without hash tags.
            cmd.arg(script).arg(1);
            // The key written straight into the command, with no string in between.
            let mut key = cmd.writer_for_next_arg();
            key.write_all(self.namespace.as_bytes())
                .and_then(|()| key.write_all(id.as_bytes()))
                .expect("a command is written to memory");
            drop(key);
            args(&mut cmd);
            cmd
        };
        match self
            .send(&command("EVALSHA", lua.script.get_hash()))
            .await?
        {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => self
                .send(&command("EVAL", lua.body))
                .await?
                .map_err(store_error),
            other => other.map_err(store_error),
        }
    }

    pub(super) async fn send_claim(&self, claim: &Claim) -> Result<ClaimOutcome, Error> {
        let reply = self
            .eval(
                &CLAIM,
                &claim.id,
                claim.lease_token.len() + claim.validation.as_ref().map_or(0, String::len),
                |cmd| {
                    cmd.arg(epoch_millis(claim.now))
                        .arg(epoch_secs(claim.now))
                        .arg(epoch_secs(claim.expiration))
                        .arg(epoch_millis(claim.lease_until))
                        .arg(&claim.lease_token)
                        .arg(if claim.validation.is_some() { "1" } else { "0" })
                        .arg(claim.validation.as_deref().unwrap_or_default())
                        .arg(key_expiry_ms(claim.expiration, Some(claim.lease_until)))
                        .arg(if claim.at_most_once { "1" } else { "0" });
                },
            )
            .await?;
        claim_outcome(&claim.id, reply)
    }

    pub(super) async fn send_completion(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
    ) -> Result<(), Error> {
        let reply = self
            .eval(
                &COMPLETE,
                &claim.id,
                claim.lease_token.len() + data.map_or(0, str::len),
                |cmd| {
                    cmd.arg(&claim.lease_token)
                        .arg(epoch_secs(expiration))
                        .arg(key_expiry_ms(expiration, None))
                        .arg(if data.is_some() { "1" } else { "0" })
                        .arg(data.unwrap_or_default());
                },
            )
            .await?;
        fenced(&claim.id, reply)
    }

    pub(super) async fn send_release(&self, claim: &Claim) -> Result<(), Error> {
        let reply = self
            .eval(&RELEASE, &claim.id, claim.lease_token.len(), |cmd| {
                cmd.arg(&claim.lease_token);
            })
            .await?;
        fenced(&claim.id, reply)
    }

    pub(super) async fn send_forget(&self, read: &Record) -> Result<Forgotten, Error> {
        let token = read.lease_token.as_deref().unwrap_or_default();
        let reply = self
            .eval(&FORGET, &read.id, token.len() + 64, |cmd| {
                cmd.arg(read.status.as_str())
                    .arg(epoch_secs(read.expiration))
                    .arg(
                        read.in_progress_expiration
                            .map(epoch_millis)
                            .map_or_else(String::new, |ms| ms.to_string()),
                    )
                    .arg(token);
            })
            .await?;
        match reply {
            Value::Int(1) => Ok(Forgotten::Deleted),
            Value::Int(0) => Ok(Forgotten::Changed),
            Value::Int(-1) => Ok(Forgotten::Absent),
            other => Err(super::reply::unexpected(&read.id, &other)),
        }
    }
}

/// When Redis may delete the key: the lease module's rule, with [`KEY_GRACE`].
fn key_expiry_ms(expiration: SystemTime, lease_until: Option<SystemTime>) -> u64 {
    crate::record::lease::key_expiry_ms(expiration, lease_until, KEY_GRACE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{from_epoch_millis, from_epoch_secs};

    #[test]
    fn a_key_outlives_its_record_and_its_lease() {
        let exp = from_epoch_secs(1_000);
        // Through the whole expiration second, plus the grace.
        assert_eq!(key_expiry_ms(exp, None), 1_001_000 + 60_000);
        // A lease past the expiry keeps the key through its last millisecond.
        assert_eq!(
            key_expiry_ms(exp, Some(from_epoch_millis(2_000_500))),
            2_000_501 + 60_000
        );
        assert_eq!(
            key_expiry_ms(exp, Some(from_epoch_millis(10))),
            1_001_000 + 60_000
        );
        // Capped times never overflow.
        assert!(key_expiry_ms(crate::clock::far_future(), None) > 1_001_000);
    }

    #[test]
    fn each_script_s_header_lists_the_keys_and_arguments_it_reads() {
        for (name, lua) in [
            ("claim", CLAIM_LUA),
            ("complete", COMPLETE_LUA),
            ("release", RELEASE_LUA),
            ("forget", FORGET_LUA),
        ] {
            let (header, body) = lua
                .strip_prefix("--[[\n")
                .and_then(|rest| rest.split_once("]]\n"))
                .unwrap_or_else(|| panic!("{name}.lua opens with a --[[ ]] header"));
            assert!(
                header.contains("Input:") && header.contains("Output:"),
                "{name}.lua"
            );
            for (array, most) in [("KEYS", 1), ("ARGV", 9)] {
                let used = (1..=most)
                    .filter(|i| body.contains(&format!("{array}[{i}]")))
                    .collect::<Vec<_>>();
                let listed = (1..=most)
                    .filter(|i| header.contains(&format!("    {array}[{i}] ")))
                    .collect::<Vec<_>>();
                assert_eq!(used, listed, "{name}.lua: the {array} it reads");
                assert!(
                    !body.contains(&format!("{array}[{}]", most + 1)),
                    "{name}.lua"
                );
            }
        }
    }
}
