//! A bounded in-process cache of completed records: duplicates answered with no store request.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

#[derive(Debug, Clone)]
pub(crate) struct Cached {
    pub(crate) data: Option<String>,
    pub(crate) validation: Option<String>,
    pub(crate) expiration: SystemTime,
}

/// The most entries [`CompletedCache::new`] makes room for before any is inserted.
const PREALLOCATED: usize = 1024;

/// First-in, first-out eviction: completed records never change, so recency buys little.
/// One mutex, held for a map lookup: safe and cheap under `run_concurrent`.
#[derive(Debug)]
pub(crate) struct CompletedCache {
    capacity: usize,
    inner: Mutex<(HashMap<String, Cached>, VecDeque<String>)>,
}

impl CompletedCache {
    /// Room for at most [`PREALLOCATED`] entries is made up front; the cache grows past that
    /// as entries come, so any capacity, up to `usize::MAX`, is only a bound.
    pub(crate) fn new(capacity: usize) -> Self {
        let room = capacity.min(PREALLOCATED);
        Self {
            capacity,
            inner: Mutex::new((HashMap::with_capacity(room), VecDeque::with_capacity(room))),
        }
    }

    pub(crate) fn get(&self, id: &str, now: SystemTime) -> Option<Cached> {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, _) = &mut *guard;
        match map.get(id) {
            Some(c) if c.expiration >= now => Some(c.clone()),
            Some(_) => {
                map.remove(id);
                None
            }
            None => None,
        }
    }

    pub(crate) fn insert(&self, id: String, entry: Cached) {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *guard;
        if map.insert(id.clone(), entry).is_none() {
            order.push_back(id);
        }
        while map.len() > self.capacity {
            match order.pop_front() {
                Some(old) => {
                    map.remove(&old);
                }
                None => break,
            }
        }
        // Ids removed on expiry stay in `order` until they come up; bound it too.
        while order.len() > self.capacity.saturating_mul(2).max(1) {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(exp: SystemTime) -> Cached {
        Cached {
            data: Some("1".into()),
            validation: None,
            expiration: exp,
        }
    }

    #[test]
    fn evicts_oldest_beyond_capacity_and_expired_entries() {
        let now = SystemTime::now();
        let later = now + Duration::from_secs(60);
        let cache = CompletedCache::new(2);
        cache.insert("a".into(), entry(later));
        cache.insert("b".into(), entry(later));
        cache.insert("c".into(), entry(later));
        assert!(cache.get("a", now).is_none());
        assert!(cache.get("b", now).is_some());
        assert!(cache.get("c", now).is_some());
        assert!(cache.get("c", later + Duration::from_secs(1)).is_none());
    }

    #[test]
    fn stale_ids_in_the_order_never_evict_a_live_entry_within_capacity() {
        let now = SystemTime::now();
        let (soon, later) = (now + Duration::from_secs(1), now + Duration::from_secs(60));
        let past = soon + Duration::from_secs(1);
        let cache = CompletedCache::new(2);
        cache.insert("live".into(), entry(later));
        cache.insert("x".into(), entry(soon));
        assert!(cache.get("x", past).is_none(), "x expired and left the map");
        cache.insert("y".into(), entry(soon));
        assert!(cache.get("y", past).is_none(), "y too");
        // The order now holds live, x, y and d: twice the capacity, two entries live.
        cache.insert("d".into(), entry(later));
        assert!(cache.get("live", now).is_some(), "within capacity: kept");
        assert!(cache.get("d", now).is_some());
    }
}
