//! The Cosmos DB REST API over cosmos-dev's own store ([`crate::store`]): each request is parsed
//! into a store call under one lock (writes exclusive, so `_lsn` order is apply order), and the
//! store's answer or refusal is written as the service writes it — status, `x-ms-substatus`,
//! `etag`, `x-ms-continuation`, `x-ms-item-count`, and a `{"code","message"}` body on errors.
//!
//! Requests the store does not serve (patch, batch, query plans, stored procedures, …) are
//! answered `400` naming the operation, so a new client call fails loudly here rather than
//! quietly differently from Azure.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{Map, Value};

use crate::store::{Account, FeedStart, Refusal, Target, WriteKind, parse_feed_etag, sql};

/// Page size when the client sets none (`x-ms-max-item-count` absent or `-1`).
const DEFAULT_PAGE: usize = 1000;

/// The served account.
pub struct OwnStore {
    account: RwLock<Account>,
    /// The account's endpoint (`GET /` names it as the region's gateway).
    base: url::Url,
    region: String,
    /// Document requests still to be refused with 429, and the retry-after they carry.
    throttled: AtomicU64,
    retry_after_ms: AtomicU64,
    /// Change feed reads that found nothing new (answered 304).
    unchanged: AtomicU64,
    /// Requests answered 429.
    refused_throttled: AtomicU64,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

fn header_true(headers: &HeaderMap, name: &str) -> bool {
    header(headers, name).is_some_and(|value| value.eq_ignore_ascii_case("true"))
}

/// Decodes `%XX` escapes of a path segment (ids with spaces or `+`).
fn decode_segment(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%'
            && let Some(hex) = segment.get(index + 1..index + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            index += 3;
            continue;
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// A response with the headers every Cosmos answer carries.
fn answer(status: StatusCode, request: &HeaderMap, headers: &[(&str, String)], body: Body) -> Response {
    let mut builder = Response::builder()
        .status(status)
        .header("x-ms-request-charge", "1")
        .header(http::header::CONTENT_TYPE, "application/json");
    if let Some(activity) = request.get("x-ms-activity-id") {
        builder = builder.header("x-ms-activity-id", activity.clone());
    }
    for (name, value) in headers {
        builder = builder.header(*name, value.as_str());
    }
    builder.body(body).unwrap_or_else(|error| {
        let mut response = Response::new(Body::from(error.to_string()));
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        response
    })
}

fn json(status: StatusCode, request: &HeaderMap, headers: &[(&str, String)], body: String) -> Response {
    answer(status, request, headers, Body::from(body))
}

fn refused(refusal: &Refusal, request: &HeaderMap) -> Response {
    let status = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({"code": refusal.code, "message": refusal.message}).to_string();
    json(
        status,
        request,
        &[("x-ms-substatus", refusal.substatus.to_string())],
        body,
    )
}

/// `{"_rid": …, "<name>": [rows…], "_count": n}` from rows that are already JSON text.
fn feed_body(rid: &str, name: &str, rows: &[String]) -> String {
    let mut body = String::with_capacity(rows.iter().map(String::len).sum::<usize>() + 64);
    body.push_str("{\"_rid\":");
    body.push_str(&Value::from(rid).to_string());
    body.push_str(",\"");
    body.push_str(name);
    body.push_str("\":[");
    for (index, row) in rows.iter().enumerate() {
        if index > 0 {
            body.push(',');
        }
        body.push_str(row);
    }
    body.push_str("],\"_count\":");
    body.push_str(&rows.len().to_string());
    body.push('}');
    body
}

/// A request body as JSON: Cosmos binary JSON (the client's default for documents) or text.
fn body_json(body: &[u8]) -> Result<Value, Refusal> {
    use azure_data_cosmos_driver::binary_json;
    if binary_json::is_binary(body) {
        binary_json::decode(body).map_err(|error| {
            Refusal::bad_request(format!("request body is not valid Cosmos binary JSON: {error}"))
        })
    } else {
        serde_json::from_slice(body)
            .map_err(|error| Refusal::bad_request(format!("request body is not valid JSON: {error}")))
    }
}

/// The single string value of `x-ms-documentdb-partitionkey` (`["AA-1-…"]`).
fn partition_key(headers: &HeaderMap) -> Result<String, Refusal> {
    let raw = header(headers, "x-ms-documentdb-partitionkey").ok_or_else(|| {
        Refusal::bad_request("the request has no x-ms-documentdb-partitionkey header".to_owned())
    })?;
    match serde_json::from_str::<Vec<Value>>(raw) {
        Ok(values) => match values.as_slice() {
            [Value::String(value)] => Ok(value.clone()),
            _ => Err(Refusal::bad_request(format!(
                "partition key {raw}: cosmos-dev keeps one string partition key value per document"
            ))),
        },
        Err(error) => Err(Refusal::bad_request(format!(
            "partition key header {raw:?}: {error}"
        ))),
    }
}

fn page_size(headers: &HeaderMap) -> usize {
    header(headers, "x-ms-max-item-count")
        .and_then(|value| value.trim().parse::<i64>().ok())
        .and_then(|value| usize::try_from(value).ok())
        .filter(|value| *value > 0)
        .unwrap_or(DEFAULT_PAGE)
}

impl OwnStore {
    /// An empty account answering at `base` as region `region`.
    pub fn new(base: url::Url, region: String) -> OwnStore {
        OwnStore {
            account: RwLock::new(Account::new()),
            base,
            region,
            throttled: AtomicU64::new(0),
            retry_after_ms: AtomicU64::new(0),
            unchanged: AtomicU64::new(0),
            refused_throttled: AtomicU64::new(0),
        }
    }

    /// The newest `_lsn` given to a write.
    pub fn last_lsn(&self) -> u64 {
        self.read_lock().last_lsn()
    }

    /// Documents held, in every container.
    pub fn document_count(&self) -> usize {
        self.read_lock().document_count()
    }

    /// Change feed reads answered "not modified".
    pub fn unchanged_reads(&self) -> u64 {
        self.unchanged.load(Ordering::Relaxed)
    }

    /// Requests answered 429 (`POST /_dev/throttle`).
    pub fn throttled_requests(&self) -> u64 {
        self.refused_throttled.load(Ordering::Relaxed)
    }

    /// `POST /_dev/split`: splits a physical partition; the children's range ids.
    pub fn split(&self, db: &str, coll: &str, range: u32) -> Result<(u32, u32), Refusal> {
        self.write_lock().split(db, coll, range)
    }

    /// `POST /_dev/throttle`: the next `requests` document requests are answered 429 with
    /// `x-ms-retry-after-ms: retry_after_ms`, as a container over its provisioned throughput is.
    pub fn throttle(&self, requests: u64, retry_after_ms: u64) {
        self.retry_after_ms.store(retry_after_ms, Ordering::Relaxed);
        self.throttled.store(requests, Ordering::Relaxed);
    }

    fn take_throttle(&self) -> bool {
        let taken = self
            .throttled
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(1))
            .is_ok();
        if taken {
            self.refused_throttled.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// Answers one Cosmos REST request (already authorized).
    pub fn handle(&self, method: &Method, path: &str, headers: &HeaderMap, body: &[u8]) -> Response {
        let segments: Vec<String> = path
            .split('/')
            .filter(|segment| !segment.is_empty())
            .map(decode_segment)
            .collect();
        let names: Vec<&str> = segments.iter().map(String::as_str).collect();
        if names.len() >= 5 && names[4] == "docs" && self.take_throttle() {
            let retry_after = self.retry_after_ms.load(Ordering::Relaxed);
            let body = serde_json::json!({
                "code": "TooManyRequests",
                "message": "cosmos-dev throttles this request (POST /_dev/throttle)",
            });
            return json(
                StatusCode::TOO_MANY_REQUESTS,
                headers,
                &[
                    ("x-ms-substatus", "3200".to_owned()),
                    ("x-ms-retry-after-ms", retry_after.to_string()),
                ],
                body.to_string(),
            );
        }
        match self.route(method, &names, headers, body) {
            Ok(response) => response,
            Err(refusal) => refused(&refusal, headers),
        }
    }

    fn route(
        &self,
        method: &Method,
        names: &[&str],
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Response, Refusal> {
        let target = |db, coll| Target {
            db,
            coll,
            intended_rid: header(headers, "x-ms-cosmos-intended-collection-rid"),
        };
        match (method.as_str(), names) {
            ("GET", []) => Ok(json(StatusCode::OK, headers, &[], self.account_properties())),
            ("POST", ["dbs"]) => {
                let id = body_json(body)?
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| Refusal::bad_request("database properties need a string id".to_owned()))?;
                let created = self.write_lock().create_database(&id, now_seconds())?;
                Ok(json(StatusCode::CREATED, headers, &[], created.to_string()))
            }
            ("GET", ["dbs", db]) => {
                let properties = self.read_lock().read_database(db)?;
                Ok(json(StatusCode::OK, headers, &[], properties.to_string()))
            }
            ("POST", ["dbs", db, "colls"]) => {
                let created = self
                    .write_lock()
                    .create_container(db, &body_json(body)?, now_seconds())?;
                Ok(json(StatusCode::CREATED, headers, &[], created.to_string()))
            }
            ("GET", ["dbs", db, "colls", coll]) => {
                let properties = self.read_lock().read_container(target(db, coll))?;
                let etag = properties["_etag"].as_str().unwrap_or_default().to_owned();
                Ok(json(
                    StatusCode::OK,
                    headers,
                    &[("etag", etag)],
                    properties.to_string(),
                ))
            }
            ("DELETE", ["dbs", db, "colls", coll]) => {
                self.write_lock().delete_container(target(db, coll))?;
                Ok(answer(StatusCode::NO_CONTENT, headers, &[], Body::empty()))
            }
            ("GET", ["dbs", db, "colls", coll, "pkranges"]) => {
                let (etag, ranges) = self
                    .read_lock()
                    .partition_key_ranges(target(db, coll), header(headers, "if-none-match"))?;
                Ok(match ranges {
                    Some(ranges) => json(StatusCode::OK, headers, &[("etag", etag)], ranges.to_string()),
                    None => answer(
                        StatusCode::NOT_MODIFIED,
                        headers,
                        &[("etag", etag)],
                        Body::empty(),
                    ),
                })
            }
            ("GET", ["dbs", db, "colls", coll, "docs"]) if header(headers, "a-im").is_some() => {
                self.change_feed(target(db, coll), headers)
            }
            ("POST", ["dbs", db, "colls", coll, "docs"]) => {
                if header_true(headers, "x-ms-cosmos-is-query-plan-request") {
                    return Err(Refusal::bad_request(
                        "cosmos-dev plans no queries: send one of the queries it answers (see its SQL subset)".to_owned(),
                    ));
                }
                if header_true(headers, "x-ms-documentdb-isquery")
                    || header_true(headers, "x-ms-documentdb-query")
                {
                    return self.query(target(db, coll), headers, body);
                }
                if header_true(headers, "x-ms-cosmos-is-batch-request") {
                    return Err(Refusal::bad_request(
                        "cosmos-dev does not serve transactional batches".to_owned(),
                    ));
                }
                let kind = if header_true(headers, "x-ms-documentdb-is-upsert") {
                    WriteKind::Upsert
                } else {
                    WriteKind::Create
                };
                self.write(target(db, coll), kind, headers, body)
            }
            ("GET", ["dbs", db, "colls", coll, "docs", id]) => {
                let key = partition_key(headers)?;
                let (document, etag) = self.read_lock().read(target(db, coll), &key, id)?;
                Ok(json(StatusCode::OK, headers, &[("etag", etag)], document))
            }
            ("PUT", ["dbs", db, "colls", coll, "docs", id]) => self.write(
                target(db, coll),
                WriteKind::Replace((*id).to_owned()),
                headers,
                body,
            ),
            ("DELETE", ["dbs", db, "colls", coll, "docs", id]) => {
                let key = partition_key(headers)?;
                self.write_lock()
                    .delete(target(db, coll), &key, id, header(headers, "if-match"))?;
                Ok(answer(StatusCode::NO_CONTENT, headers, &[], Body::empty()))
            }
            _ => Err(Refusal::bad_request(format!(
                "cosmos-dev does not serve {method} /{}",
                names.join("/")
            ))),
        }
    }

    fn read_lock(&self) -> std::sync::RwLockReadGuard<'_, Account> {
        self.account.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_lock(&self) -> std::sync::RwLockWriteGuard<'_, Account> {
        self.account.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(
        &self,
        target: Target<'_>,
        kind: WriteKind,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Response, Refusal> {
        let key = partition_key(headers)?;
        let Value::Object(document) = body_json(body)? else {
            return Err(Refusal::bad_request(
                "a document must be a JSON object".to_owned(),
            ));
        };
        let minimal = header(headers, "prefer").is_some_and(|prefer| prefer.contains("return=minimal"));
        let id = document
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let mut account = self.write_lock();
        let written = account.write(
            target,
            &key,
            kind,
            document,
            header(headers, "if-match"),
            now_seconds(),
        )?;
        let status = if written.created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        let content = if minimal {
            Body::empty()
        } else {
            Body::from(account.read(target, &key, &id).map(|(document, _)| document)?)
        };
        drop(account);
        Ok(answer(
            status,
            headers,
            &[("etag", written.etag), ("lsn", written.lsn.to_string())],
            content,
        ))
    }

    fn change_feed(&self, target: Target<'_>, headers: &HeaderMap) -> Result<Response, Refusal> {
        let range = header(headers, "x-ms-documentdb-partitionkeyrangeid").ok_or_else(|| {
            Refusal::bad_request(
                "a change feed read needs x-ms-documentdb-partitionkeyrangeid (cosmos-dev reads one range at a time)"
                    .to_owned(),
            )
        })?;
        let start = match header(headers, "if-none-match") {
            Some(etag) => parse_feed_etag(etag)?,
            None => FeedStart::After(0),
        };
        let within = header(headers, "x-ms-start-epk").zip(header(headers, "x-ms-end-epk"));
        let account = self.read_lock();
        let page = account.changes(target, range, start, page_size(headers), within)?;
        let rid = account.container_rid(target)?;
        drop(account);
        let range_header = ("x-ms-documentdb-partitionkeyrangeid", range.to_owned());
        if page.documents.is_empty() {
            self.unchanged.fetch_add(1, Ordering::Relaxed);
            return Ok(answer(
                StatusCode::NOT_MODIFIED,
                headers,
                &[("etag", page.etag), range_header],
                Body::empty(),
            ));
        }
        let count = page.documents.len();
        Ok(json(
            StatusCode::OK,
            headers,
            &[
                ("etag", page.etag),
                ("x-ms-item-count", count.to_string()),
                range_header,
            ],
            feed_body(&rid, "Documents", &page.documents),
        ))
    }

    fn query(&self, target: Target<'_>, headers: &HeaderMap, body: &[u8]) -> Result<Response, Refusal> {
        let request = body_json(body)?;
        let text = request
            .get("query")
            .and_then(Value::as_str)
            .ok_or_else(|| Refusal::bad_request("a query body needs a \"query\" string".to_owned()))?;
        let mut parameters = Map::new();
        for parameter in request
            .get("parameters")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(name) = parameter.get("name").and_then(Value::as_str) {
                let value = parameter.get("value").cloned().unwrap_or(Value::Null);
                parameters.insert(name.to_owned(), value);
            }
        }
        let select = sql::parse(text, &parameters).map_err(Refusal::bad_request)?;
        let range = header(headers, "x-ms-documentdb-partitionkeyrangeid").ok_or_else(|| {
            Refusal::bad_request(format!(
                "query {text:?} names no x-ms-documentdb-partitionkeyrangeid (cosmos-dev answers queries one range at a time)"
            ))
        })?;
        let account = self.read_lock();
        let page = account.query(
            target,
            range,
            &select,
            header(headers, "x-ms-continuation"),
            page_size(headers),
        )?;
        let rid = account.container_rid(target)?;
        drop(account);
        let mut extra = vec![("x-ms-item-count", page.rows.len().to_string())];
        if let Some(continuation) = page.continuation {
            extra.push(("x-ms-continuation", continuation));
        }
        Ok(json(
            StatusCode::OK,
            headers,
            &extra,
            feed_body(&rid, "Documents", &page.rows),
        ))
    }

    fn account_properties(&self) -> String {
        let location =
            serde_json::json!([{"name": self.region, "databaseAccountEndpoint": self.base.as_str()}]);
        serde_json::json!({
            "id": "cosmos-dev",
            "_rid": "cosmos-dev.sql.cosmos.azure.com",
            "_self": "",
            "media": "//media/",
            "addresses": "//addresses/",
            "_dbs": "//dbs/",
            "readableLocations": location,
            "writableLocations": location,
            "enableMultipleWriteLocations": false,
            "userReplicationPolicy": {"asyncReplication": false, "minReplicaSetSize": 1, "maxReplicasetSize": 1},
            "userConsistencyPolicy": {"defaultConsistencyLevel": "Session"},
            "systemReplicationPolicy": {"minReplicaSetSize": 1, "maxReplicasetSize": 1},
            "readPolicy": {"primaryReadCoefficient": 1, "secondaryReadCoefficient": 1},
            "queryEngineConfiguration": "{}",
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_unescaped() {
        assert_eq!(decode_segment("AA%20100"), "AA 100");
        assert_eq!(decode_segment("a%2Bb"), "a+b");
        assert_eq!(decode_segment("100%"), "100%");
        assert_eq!(decode_segment("%zz"), "%zz");
    }

    #[test]
    fn feed_bodies_are_valid_json() {
        let body = feed_body(
            "r\"id",
            "Documents",
            &["{\"a\":1}".to_owned(), "{\"b\":2}".to_owned()],
        );
        let value: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(value["_count"], 2);
        assert_eq!(value["Documents"][1]["b"], 2);
        assert_eq!(value["_rid"], "r\"id");
        let empty: Value = serde_json::from_str(&feed_body("r", "Documents", &[])).expect("json");
        assert_eq!(empty["_count"], 0);
    }

    #[test]
    fn the_partition_key_header_must_hold_one_string() {
        let mut headers = HeaderMap::new();
        assert!(partition_key(&headers).is_err());
        headers.insert(
            "x-ms-documentdb-partitionkey",
            http::HeaderValue::from_static("[\"AA-1\"]"),
        );
        assert_eq!(partition_key(&headers).expect("one string"), "AA-1");
        headers.insert(
            "x-ms-documentdb-partitionkey",
            http::HeaderValue::from_static("[1]"),
        );
        assert_eq!(partition_key(&headers).expect_err("a number").status, 400);
    }
}
