//! Listing records for operators: `SCAN` over the keys under the namespace and a prefix,
//! then each record read as `get` reads it. A cluster is walked one primary at a time.

use super::connection::Target;
use super::error::store_error;
use super::reply::{self, malformed};
use super::{BACKEND, RedisStore};
use crate::error::Error;
use crate::record::Record;
use crate::store::{ListRequest, RecordPage};
use futures_util::future::join_all;
use redis::Value;

impl RedisStore {
    /// One `SCAN` step. The cursor is `{node}:{scan cursor}`: the index of the primary
    /// (in address order; `0` on one node) and where its `SCAN` goes on. A cluster whose
    /// primaries change during a listing may skip or repeat a node's keys.
    pub(super) async fn send_list(&self, request: &ListRequest) -> Result<RecordPage, Error> {
        let (node, cursor) = match request.cursor.as_deref() {
            None => (0, 0),
            Some(cursor) => parse_cursor(cursor).ok_or_else(|| {
                Error::store(BACKEND, false, format!("not a listing cursor: {cursor:?}"))
            })?,
        };
        let nodes = match &self.inner.target {
            // Through one node of a cluster, a listing would miss every other node's keys
            // and call itself complete.
            Target::Node(_)
                if request.cursor.is_none() && self.is_one_node_of_a_cluster().await? =>
            {
                return Err(Error::store(
                    BACKEND,
                    false,
                    "this Redis node is one of a cluster's: a listing through it would see only its own keys; connect to the cluster (RedisStore::connect_cluster)",
                ));
            }
            Target::Node(_) => Vec::new(),
            Target::Cluster(_) => self.primaries().await?,
        };
        if !nodes.is_empty() && node >= nodes.len() {
            return Ok(RecordPage::default());
        }
        let pattern = format!(
            "{}{}*",
            glob_escape(&self.namespace),
            glob_escape(&request.prefix)
        );
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(request.limit)
            .arg("TYPE")
            .arg("hash");
        let reply = self
            .send_to(&scan, nodes.get(node))
            .await?
            .map_err(store_error)?;
        let (after, keys) = scan_reply(reply)?;
        let next = match (after, node + 1 < nodes.len()) {
            (0, true) => Some(format!("{}:0", node + 1)),
            (0, false) => None,
            (after, _) => Some(format!("{node}:{after}")),
        };
        let ids: Vec<String> = keys
            .into_iter()
            .filter_map(|key| key.strip_prefix(&self.namespace).map(str::to_owned))
            .collect();
        let reads = join_all(ids.iter().map(|id| self.read_listed(id))).await;
        let mut page = RecordPage::new(Vec::with_capacity(ids.len()), next);
        page.examined = request.limit.max(ids.len());
        for (id, read) in ids.into_iter().zip(reads) {
            match read {
                Ok(Some(record)) => page.records.push(record),
                // Deleted since the scan saw it, or another application's hash.
                Ok(None) => {}
                Err(err) if err.is_retryable_store_error() => return Err(err),
                Err(err) => page.unreadable.push((id, crate::error::report(&err))),
            }
        }
        Ok(page)
    }

    /// A listed key's record: its fields only ([`reply::hmget`]).
    async fn read_listed(&self, id: &str) -> Result<Option<Record>, Error> {
        let reply = self.query(&reply::hmget(&self.redis_key(id))).await?;
        match reply::hmget_fields(id, reply)? {
            Some(fields) => reply::parse(id, fields).map(Some),
            None => Ok(None),
        }
    }

    /// The cluster's primaries, from `CLUSTER SLOTS`, in address order.
    async fn primaries(&self) -> Result<Vec<(String, u16)>, Error> {
        let reply = self.query(redis::cmd("CLUSTER").arg("SLOTS")).await?;
        let bad = || malformed("CLUSTER SLOTS", "not a slot map");
        let Value::Array(ranges) = reply else {
            return Err(bad());
        };
        let mut nodes = Vec::new();
        for range in ranges {
            let Value::Array(parts) = range else {
                return Err(bad());
            };
            let Some(Value::Array(primary)) = parts.get(2) else {
                return Err(bad());
            };
            let (Some(host), Some(Value::Int(port))) = (primary.first(), primary.get(1)) else {
                return Err(bad());
            };
            let host = match host {
                Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return Err(bad()),
            };
            nodes.push((host, u16::try_from(*port).map_err(|_| bad())?));
        }
        nodes.sort();
        nodes.dedup();
        Ok(nodes)
    }
}

/// `node:cursor`, both numbers.
fn parse_cursor(cursor: &str) -> Option<(usize, u64)> {
    let (node, scan) = cursor.split_once(':')?;
    Some((node.parse().ok()?, scan.parse().ok()?))
}

/// `SCAN`'s reply: the next cursor and the keys.
fn scan_reply(reply: Value) -> Result<(u64, Vec<String>), Error> {
    let bad = || malformed("SCAN", "not a cursor and a list of keys");
    let Value::Array(parts) = reply else {
        return Err(bad());
    };
    let [cursor, keys] = <[Value; 2]>::try_from(parts).map_err(|_| bad())?;
    let cursor = match cursor {
        Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        Value::Int(n) => u64::try_from(n).ok(),
        _ => None,
    }
    .ok_or_else(bad)?;
    let Value::Array(keys) = keys else {
        return Err(bad());
    };
    let keys = keys
        .into_iter()
        .filter_map(|key| match key {
            // A key that is not UTF-8 is no record of ours.
            Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
            Value::SimpleString(s) => Some(s),
            _ => None,
        })
        .collect();
    Ok((cursor, keys))
}

/// `text` matched literally by a `SCAN` pattern.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_its_text_literally() {
        assert_eq!(glob_escape(r"f.op#a*b?[c]\d"), r"f.op#a\*b\?\[c\]\\d");
        assert_eq!(parse_cursor("2:1234"), Some((2, 1234)));
        assert_eq!(parse_cursor("x:1"), None);
        assert_eq!(parse_cursor("12"), None);
    }
}
