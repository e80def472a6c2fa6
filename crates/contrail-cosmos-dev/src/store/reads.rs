//! The read side of the store: change feed pages and query pages, one partition key range at a
//! time, each from a continuation the store wrote.

use serde_json::Value;

use super::partition::{DocKey, Partition, bound_hex, parse_epk};
use super::{Account, Container, Refusal, SCAN_BUDGET, Target, sql};

/// Where a change feed read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedStart {
    /// After this `_lsn` (0: from the beginning).
    After(u64),
    /// From now: only later changes (`If-None-Match: *`).
    Now,
}

/// One change feed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedPage {
    /// Documents (as stored), oldest change first; empty means "not modified".
    pub documents: Vec<String>,
    /// The continuation for the next read (the ETag of the answer).
    pub etag: String,
}

/// One query answer for one partition key range.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryPage {
    /// Rows: stored documents or projections, as JSON text.
    pub rows: Vec<String>,
    /// Where the next page starts, when the range is not drained.
    pub continuation: Option<String>,
}

/// A change feed continuation: the `_lsn` of the last change read, quoted.
fn feed_etag(lsn: u64) -> String {
    format!("\"{lsn}\"")
}

/// Reads a change feed continuation (`If-None-Match`), refusing what this store did not write.
pub fn parse_feed_etag(etag: &str) -> Result<FeedStart, Refusal> {
    if etag.trim() == "*" {
        return Ok(FeedStart::Now);
    }
    etag.trim()
        .trim_matches('"')
        .parse::<u64>()
        .map(FeedStart::After)
        .map_err(|_| {
            Refusal::bad_request(format!(
                "change feed continuation {etag:?} was not written by this cosmos-dev (expected a quoted _lsn)"
            ))
        })
}

impl Account {
    fn range<'a>(
        container: &'a Container,
        target: Target<'_>,
        range_id: &str,
    ) -> Result<&'a Partition, Refusal> {
        // Clients may send `{collection rid},{id}`.
        let id_text = range_id.rsplit(',').next().unwrap_or(range_id);
        let id: u32 = id_text.parse().map_err(|_| {
            Refusal::bad_request(format!("partition key range id {range_id:?} is not a number"))
        })?;
        container
            .partitions
            .iter()
            .find(|partition| partition.id == id)
            .ok_or_else(|| {
                if id < container.next_range_id {
                    Refusal::new(
                        410,
                        1002,
                        "Gone",
                        format!(
                            "partition key range {id} of {}/{} is gone (split)",
                            target.db, target.coll
                        ),
                    )
                } else {
                    Refusal::bad_request(format!(
                        "no partition key range {id} in {}/{}",
                        target.db, target.coll
                    ))
                }
            })
    }

    /// A change feed read of one partition key range, optionally narrowed to `[start, end)`
    /// effective partition keys (hex, as the client sends them).
    pub fn changes(
        &self,
        target: Target<'_>,
        range_id: &str,
        start: FeedStart,
        limit: usize,
        within: Option<(&str, &str)>,
    ) -> Result<FeedPage, Refusal> {
        let (_, container) = self.container(target)?;
        let partition = Account::range(container, target, range_id)?;
        let after = match start {
            FeedStart::After(lsn) => lsn,
            FeedStart::Now => {
                return Ok(FeedPage {
                    documents: Vec::new(),
                    etag: feed_etag(self.lsn),
                });
            }
        };
        let within = match within {
            Some((low, high)) => Some(parse_epk(low).zip(parse_epk(high)).ok_or_else(|| {
                Refusal::bad_request(format!("bad effective partition key range {low}..{high}"))
            })?),
            None => None,
        };
        let page = partition.changes_after(after, limit.max(1), within);
        let etag = page
            .last()
            .map_or_else(|| feed_etag(after), |stored| feed_etag(stored.lsn));
        Ok(FeedPage {
            documents: page.iter().map(|stored| stored.body.to_string()).collect(),
            etag,
        })
    }

    /// One page of a query over one partition key range, from `continuation`.
    pub fn query(
        &self,
        target: Target<'_>,
        range_id: &str,
        select: &sql::Select,
        continuation: Option<&str>,
        limit: usize,
    ) -> Result<QueryPage, Refusal> {
        let (_, container) = self.container(target)?;
        let partition = Account::range(container, target, range_id)?;
        let after = continuation.map(parse_query_continuation).transpose()?;
        let mut rows = Vec::new();
        let mut last = None;
        let mut drained = true;
        for (scanned, (key, stored)) in partition.scan_after(after.as_ref()).enumerate() {
            if rows.len() >= limit.max(1) || scanned >= SCAN_BUDGET {
                drained = false;
                break;
            }
            last = Some(key);
            if !select.needs_document() {
                rows.push(stored.body.to_string());
                continue;
            }
            let document: Value = serde_json::from_str(&stored.body)
                .map_err(|error| Refusal::bad_request(format!("stored document unreadable: {error}")))?;
            if !select.matches(&document) {
                continue;
            }
            match select.project(&document) {
                Some(row) => rows.push(row.to_string()),
                None => rows.push(stored.body.to_string()),
            }
        }
        let continuation = match (drained, last) {
            (false, Some(key)) => {
                Some(serde_json::json!({"epk": bound_hex(key.0), "id": &*key.1}).to_string())
            }
            _ => None,
        };
        Ok(QueryPage { rows, continuation })
    }
}

fn parse_query_continuation(token: &str) -> Result<DocKey, Refusal> {
    let value: Value = serde_json::from_str(token)
        .map_err(|_| Refusal::bad_request(format!("query continuation {token:?} is not this store's")))?;
    let epk = value.get("epk").and_then(Value::as_str).and_then(parse_epk);
    let id = value.get("id").and_then(Value::as_str);
    match (epk, id) {
        (Some(epk), Some(id)) => Ok((epk, id.into())),
        _ => Err(Refusal::bad_request(format!(
            "query continuation {token:?} is not this store's"
        ))),
    }
}
