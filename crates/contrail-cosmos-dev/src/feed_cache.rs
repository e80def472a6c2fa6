//! Answers a change feed read the emulator already answered "nothing new" (`304 Not Modified`)
//! the same way again while nothing was written to its container since, without asking the
//! emulator: the emulator copies and sorts every document of the range on each change feed read
//! (its cost grows with the container, not with the changes), and a caught-up reader asks the
//! same question several times a second.
//!
//! Sound because the answer to a change feed read depends only on the request and the
//! container's documents: every request that is not a read moves its container's generation on
//! once the emulator has applied it (and a request above container level, or a split, moves every
//! container's), and an answer is reused only for an identical request — every header but those
//! that differ per request without changing the question — at the generation it was computed at.

use std::collections::HashMap;
use std::sync::Mutex;

/// Request headers that differ between two asks of the same question: the signature and its
/// date, the request's identity and trace context.
const VOLATILE_HEADERS: [&str; 8] = [
    "authorization",
    "x-ms-date",
    "date",
    "x-ms-activity-id",
    "x-ms-client-request-id",
    "traceparent",
    "tracestate",
    "user-agent",
];

/// At most this many answers are kept; a full cache is emptied (each caught-up reader asks one
/// question at a time, so only the newest matter).
const MAX_ENTRIES: usize = 4096;

/// The container (`dbs/{db}/colls/{coll}`) a request path addresses, `None` above container level.
pub fn container_of(path: &str) -> Option<String> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["dbs", db, "colls", coll, ..] => Some(format!("dbs/{db}/colls/{coll}")),
        _ => None,
    }
}

/// Whether a request is a change feed read: `GET …/docs` with an `A-IM` header.
pub fn is_change_feed_read(method: &http::Method, path: &str, headers: &http::HeaderMap) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    *method == http::Method::GET
        && segments.len() == 5
        && segments[0] == "dbs"
        && segments[4] == "docs"
        && headers.contains_key("a-im")
}

/// Whether a request carries a query (a `POST …/docs` with a query body).
pub fn is_query(headers: &http::HeaderMap) -> bool {
    headers
        .get("x-ms-documentdb-isquery")
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"))
        || headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|value| value.as_bytes().starts_with(b"application/query+json"))
}

/// Whether a request only reads: `GET`/`HEAD`, or a query.
pub fn only_reads(method: &http::Method, headers: &http::HeaderMap) -> bool {
    matches!(*method, http::Method::GET | http::Method::HEAD)
        || (*method == http::Method::POST && is_query(headers))
}

/// The question a change feed read asks: its path and query, and every header but the volatile.
pub fn question(path_and_query: &str, headers: &http::HeaderMap) -> String {
    let mut named: Vec<(String, &[u8])> = headers
        .iter()
        .map(|(name, value)| (name.as_str().to_ascii_lowercase(), value.as_bytes()))
        .filter(|(name, _)| !VOLATILE_HEADERS.contains(&name.as_str()))
        .collect();
    named.sort();
    let mut key = path_and_query.to_owned();
    for (name, value) in named {
        key.push('\n');
        key.push_str(&name);
        key.push(':');
        key.push_str(&String::from_utf8_lossy(value));
    }
    key
}

/// Where the containers' contents stand: a generation per container and one for all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    all: u64,
    container: u64,
}

/// An answer kept: its headers (a `304` has no body) and the stamp it was computed at.
#[derive(Debug, Clone)]
struct Kept {
    stamp: Stamp,
    headers: Vec<(String, String)>,
}

#[derive(Default)]
struct Inner {
    all: u64,
    containers: HashMap<String, u64>,
    answers: HashMap<String, Kept>,
}

/// The generations and the kept answers.
#[derive(Default)]
pub struct FeedCache {
    inner: Mutex<Inner>,
    hits: std::sync::atomic::AtomicU64,
}

impl FeedCache {
    /// The stamp of `container` now: taken before a read is handed to the emulator.
    pub fn stamp(&self, container: &str) -> Stamp {
        let inner = self.lock();
        Stamp {
            all: inner.all,
            container: inner.containers.get(container).copied().unwrap_or(0),
        }
    }

    /// A write (or any request that is not a read) to `container` (`None`: above container level,
    /// or a split) has been applied: every answer computed before it is stale.
    pub fn written(&self, container: Option<&str>) {
        let mut inner = self.lock();
        match container {
            Some(container) => *inner.containers.entry(container.to_owned()).or_insert(0) += 1,
            None => inner.all += 1,
        }
    }

    /// Keeps a `304` answer to `question`, computed at `stamp`.
    pub fn keep(&self, question: String, stamp: Stamp, headers: Vec<(String, String)>) {
        let mut inner = self.lock();
        if inner.answers.len() >= MAX_ENTRIES {
            inner.answers.clear();
        }
        inner.answers.insert(question, Kept { stamp, headers });
    }

    /// The headers of a `304` answer to `question` still true at `now`, if one is kept.
    pub fn answer(&self, question: &str, now: Stamp) -> Option<Vec<(String, String)>> {
        let inner = self.lock();
        let kept = inner.answers.get(question).filter(|kept| kept.stamp == now)?;
        self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(kept.headers.clone())
    }

    /// How many reads were answered from the cache.
    pub fn hits(&self) -> u64 {
        self.hits.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, http::HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn requests_are_classified_by_method_path_and_headers() {
        let feed = headers(&[("a-im", "Incremental feed")]);
        let path = "/dbs/contrail/colls/flights/docs";
        assert!(is_change_feed_read(&http::Method::GET, path, &feed));
        assert!(!is_change_feed_read(&http::Method::GET, path, &headers(&[])));
        assert!(!is_change_feed_read(
            &http::Method::GET,
            "/dbs/contrail/colls/flights/docs/x",
            &feed
        ));
        assert!(!is_change_feed_read(&http::Method::POST, path, &feed));
        assert_eq!(container_of(path).as_deref(), Some("dbs/contrail/colls/flights"));
        assert_eq!(container_of("/dbs/contrail/colls"), None);
        assert_eq!(container_of("/"), None);
        let query = headers(&[("x-ms-documentdb-isquery", "True")]);
        assert!(only_reads(&http::Method::POST, &query));
        assert!(!only_reads(&http::Method::POST, &headers(&[])));
        assert!(!only_reads(&http::Method::PUT, &query));
        assert!(only_reads(&http::Method::GET, &headers(&[])));
    }

    #[test]
    fn the_question_ignores_only_the_volatile_headers() {
        let path = "/dbs/d/colls/c/docs";
        let first = headers(&[
            ("if-none-match", "\"41\""),
            ("x-ms-date", "mon, 07 dec 2026 03:00:00 gmt"),
            ("authorization", "type%3Dmaster%26sig%3Da"),
            ("x-ms-activity-id", "1"),
        ]);
        let again = headers(&[
            ("if-none-match", "\"41\""),
            ("x-ms-date", "mon, 07 dec 2026 03:00:01 gmt"),
            ("authorization", "type%3Dmaster%26sig%3Db"),
            ("x-ms-activity-id", "2"),
        ]);
        let moved_on = headers(&[("if-none-match", "\"42\"")]);
        assert_eq!(question(path, &first), question(path, &again));
        assert_ne!(question(path, &first), question(path, &moved_on));
        assert_ne!(
            question(path, &first),
            question("/dbs/d/colls/other/docs", &first)
        );
    }

    #[test]
    fn an_answer_is_reused_only_until_its_container_or_everything_is_written() {
        let cache = FeedCache::default();
        let flights = "dbs/d/colls/flights";
        let stamp = cache.stamp(flights);
        cache.keep(
            "q".to_owned(),
            stamp,
            vec![("etag".to_owned(), "\"41\"".to_owned())],
        );
        assert!(cache.answer("q", cache.stamp(flights)).is_some());
        assert!(cache.answer("other", cache.stamp(flights)).is_none());
        cache.written(Some("dbs/d/colls/leases"));
        assert!(
            cache.answer("q", cache.stamp(flights)).is_some(),
            "another container's write"
        );
        cache.written(Some(flights));
        assert!(
            cache.answer("q", cache.stamp(flights)).is_none(),
            "its container written"
        );
        let stamp = cache.stamp(flights);
        cache.keep("q".to_owned(), stamp, Vec::new());
        cache.written(None);
        assert!(
            cache.answer("q", cache.stamp(flights)).is_none(),
            "a split or a database change"
        );
        assert_eq!(cache.hits(), 2);
    }

    #[test]
    fn an_answer_computed_while_a_write_was_applied_is_never_reused() {
        // The stamp is taken before the read goes to the emulator and the generation moves on
        // after the write is applied: a read that overlapped the write keeps an old stamp.
        let cache = FeedCache::default();
        let flights = "dbs/d/colls/flights";
        let before_read = cache.stamp(flights);
        cache.written(Some(flights));
        cache.keep("q".to_owned(), before_read, Vec::new());
        assert!(cache.answer("q", cache.stamp(flights)).is_none());
    }
}
