//! Listing records for operators: `SCAN` over the keys under the namespace and a prefix,
//! then each record read as `get` reads it. A cluster is walked one primary at a time, its
//! primaries read once per listing and carried in the cursor.

use super::connection::Target;
use super::error::store_error;
use super::reply::{self, malformed};
use super::{BACKEND, RedisStore};
use crate::error::Error;
use crate::record::Record;
use crate::store::{ListRequest, RecordPage};
use futures_util::future::join_all;
use redis::Value;

/// The most keys a `SCAN` step is asked to look at: a few milliseconds of the server's
/// time, however sparse the prefix.
const MAX_SCAN_COUNT: usize = 10_000;

impl RedisStore {
    /// One `SCAN` step. The cursor holds where the `SCAN` goes on, the `COUNT` for the next
    /// step, and on a cluster the primaries left to walk (the current one first), so the
    /// slot map is read once per listing (a cluster whose primaries change during a
    /// listing may skip or repeat a node's keys): `{scan}~{count}[@{host}:{port}|…]`.
    ///
    /// The `COUNT` is not the page size: it starts there and follows how many keys the
    /// prefix matched, so that a step returns about a page of records, and a prefix that
    /// matches few of many keys walks the keyspace up to [`MAX_SCAN_COUNT`] keys per round
    /// trip (ten times more after a step that matched nothing).
    pub(super) async fn send_list(&self, request: &ListRequest) -> Result<RecordPage, Error> {
        let limit = request.limit.max(1);
        let (scan_cursor, count, nodes) = match request.cursor.as_deref() {
            None => (0, limit.min(MAX_SCAN_COUNT), None),
            Some(cursor) => {
                let (scan, count, nodes) = parse_cursor(cursor).ok_or_else(|| {
                    Error::store(BACKEND, false, format!("not a listing cursor: {cursor:?}"))
                })?;
                (scan, count, Some(nodes))
            }
        };
        let nodes = match (&self.inner.target, nodes) {
            // Through one node of a cluster, a listing would miss every other node's keys
            // and call itself complete.
            (Target::Node(_), None) if self.is_one_node_of_a_cluster().await? => {
                return Err(Error::store(
                    BACKEND,
                    false,
                    "this Redis node is one of a cluster's: a listing through it would see only its own keys; connect to the cluster (RedisStore::connect_cluster)",
                ));
            }
            (Target::Node(_), _) => Vec::new(),
            (Target::Cluster(_), None) => self.primaries().await?,
            (Target::Cluster(_), Some(nodes)) if !nodes.is_empty() => nodes,
            (Target::Cluster(_), Some(_)) => {
                return Err(Error::store(
                    BACKEND,
                    false,
                    "a listing cursor of one node, given to a store on a cluster",
                ));
            }
        };
        let pattern = format!(
            "{}{}*",
            glob_escape(&self.namespace),
            glob_escape(&request.prefix)
        );
        let mut scan = redis::cmd("SCAN");
        scan.arg(scan_cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(count)
            .arg("TYPE")
            .arg("hash");
        let reply = self
            .send_to(&scan, nodes.first())
            .await?
            .map_err(store_error)?;
        let (after, keys) = scan_reply(reply)?;
        // About a page of matches next time: the count scaled by how many matched.
        let next_count = if keys.is_empty() {
            count.saturating_mul(10)
        } else {
            count.saturating_mul(limit) / keys.len()
        }
        .clamp(limit.min(MAX_SCAN_COUNT), MAX_SCAN_COUNT);
        let next = match (after, nodes.len() > 1) {
            (0, true) => Some(cursor_text(0, next_count, &nodes[1..])),
            (0, false) => None,
            (after, _) => Some(cursor_text(after, next_count, &nodes)),
        };
        let ids: Vec<String> = keys
            .into_iter()
            .filter_map(|key| key.strip_prefix(&self.namespace).map(str::to_owned))
            .collect();
        let reads = join_all(ids.iter().map(|id| self.read_listed(id))).await;
        let mut page = RecordPage::new(Vec::with_capacity(ids.len()), next);
        // What the step asked the server to look at (Redis says no more).
        page.examined = count.max(ids.len());
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

/// A listing's cursor: `{scan}~{count}`, then on a cluster `@` and the primaries left,
/// `{host}:{port}` each, `|` between them.
fn cursor_text(scan: u64, count: usize, nodes: &[(String, u16)]) -> String {
    let mut text = format!("{scan}~{count}");
    for (i, (host, port)) in nodes.iter().enumerate() {
        text.push(if i == 0 { '@' } else { '|' });
        text.push_str(&format!("{host}:{port}"));
    }
    text
}

/// A cluster's primaries, `(host, port)` each.
type Nodes = Vec<(String, u16)>;

/// The inverse of [`cursor_text`].
fn parse_cursor(cursor: &str) -> Option<(u64, usize, Nodes)> {
    let (step, nodes) = match cursor.split_once('@') {
        Some((step, nodes)) => (step, Some(nodes)),
        None => (cursor, None),
    };
    let (scan, count) = step.split_once('~')?;
    let count: usize = count.parse().ok()?;
    let nodes = match nodes {
        None => Vec::new(),
        Some(nodes) => nodes
            .split('|')
            .map(|node| {
                let (host, port) = node.rsplit_once(':')?;
                Some((host.to_owned(), port.parse().ok()?))
            })
            .collect::<Option<Vec<_>>>()?,
    };
    Some((scan.parse().ok()?, count.clamp(1, MAX_SCAN_COUNT), nodes))
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
        let nodes = [("10.0.0.1".to_owned(), 7000), ("::1".to_owned(), 7001)];
        for (scan, count, nodes) in [
            (0, 100, &nodes[..]),
            (1234, 10_000, &nodes[1..]),
            (7, 5, &[][..]),
        ] {
            let text = cursor_text(scan, count, nodes);
            assert_eq!(
                parse_cursor(&text),
                Some((scan, count, nodes.to_vec())),
                "{text}"
            );
        }
        assert_eq!(parse_cursor("2:1234"), None);
        assert_eq!(parse_cursor("x~1"), None);
        assert_eq!(parse_cursor("12"), None);
        assert_eq!(parse_cursor("1~10@host"), None);
    }
}
