//! cosmos-dev's own store: databases, containers of hash-partitioned documents, version-guarded
//! writes and a latest-version change feed per partition key range — pure and I/O-free, so the
//! HTTP layer ([`crate::server`]) only translates requests and answers.
//!
//! What it keeps from the service, because contrail relies on it:
//! - documents are placed by the client's own hash (V2 effective partition key from
//!   `azure_data_cosmos_driver`), in physical partitions that answer for key ranges; a new
//!   container has four, and a split replaces one by two children naming it as parent;
//! - every write gets the next `_lsn` and an ETag derived from it; `If-Match` guards replace and
//!   delete (412 on a mismatch), create refuses an existing id (409);
//! - a change feed read returns the latest version of each document changed after the
//!   continuation, in `_lsn` order, at most a page; nothing new is `304`; a continuation taken on a
//!   parent range is valid on its children (the `_lsn` is account-wide here);
//! - a deleted and re-created container has a new `_rid`, and a request naming the old one is
//!   refused with 400 / sub-status 1024, as clients expect.
//!
//! Where it departs from the service (and from the SDK's emulator): `_lsn` is one counter for the
//! account, not one per partition (unique and increasing is all a reader may rely on); a query
//! scans one range at a time in key order and answers only the dialect in [`sql`]; there are no
//! session tokens, throughput or indexing policies.

pub mod partition;
mod reads;
pub mod sql;

pub use reads::{FeedPage, FeedStart, QueryPage, parse_feed_etag};

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Map, Value};

use partition::{DocKey, EPK_END, Partition, Stored, bound_hex, parse_epk};

/// Largest document the service stores (2 MiB, system properties included).
pub const MAX_DOCUMENT_BYTES: usize = 2 * 1024 * 1024;

/// Physical partitions of a new container.
const INITIAL_PARTITIONS: u32 = 4;

/// Documents a query examines in one request before it answers with a continuation.
const SCAN_BUDGET: usize = 10_000;

/// Properties the store sets; a client's values for them are replaced.
const SYSTEM_PROPERTIES: [&str; 6] = ["_rid", "_self", "_etag", "_ts", "_attachments", "_lsn"];

/// A request the store refuses, as the service would answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status.
    pub status: u16,
    /// `x-ms-substatus` (0: none).
    pub substatus: u32,
    /// The `code` of the error body.
    pub code: &'static str,
    /// What was wrong, naming the value.
    pub message: String,
}

impl Refusal {
    fn new(status: u16, substatus: u32, code: &'static str, message: String) -> Refusal {
        Refusal {
            status,
            substatus,
            code,
            message,
        }
    }

    /// 400: the request itself is wrong.
    pub fn bad_request(message: String) -> Refusal {
        Refusal::new(400, 0, "BadRequest", message)
    }

    fn not_found(message: String) -> Refusal {
        Refusal::new(404, 0, "NotFound", message)
    }

    fn conflict(message: String) -> Refusal {
        Refusal::new(409, 0, "Conflict", message)
    }
}

/// Which container a request is for.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// Database id.
    pub db: &'a str,
    /// Container id.
    pub coll: &'a str,
    /// `x-ms-cosmos-intended-collection-rid`: the container `_rid` the client resolved.
    pub intended_rid: Option<&'a str>,
}

/// How a document write treats an existing document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteKind {
    /// Refuse an existing id (409).
    Create,
    /// Create or replace.
    Upsert,
    /// Replace the document with this id (404 when absent).
    Replace(String),
}

/// A completed write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Whether it created the document (201) rather than replaced it (200).
    pub created: bool,
    /// The new ETag (also the body's `_etag`).
    pub etag: String,
    /// The new `_lsn`.
    pub lsn: u64,
}

#[derive(Debug)]
struct Container {
    /// The container's properties as served (id, partitionKey, system properties).
    properties: Value,
    rid: String,
    number: u32,
    /// The partition key property (the definition's single path without its `/`).
    key_property: String,
    definition: azure_data_cosmos_driver::models::PartitionKeyDefinition,
    /// Sorted by range, covering the key space.
    partitions: Vec<Partition>,
    next_range_id: u32,
    /// Changes with every split: the partition key ranges' ETag.
    topology: u64,
    self_link: String,
}

#[derive(Debug)]
struct Database {
    properties: Value,
    number: u32,
    next_container: u32,
    containers: BTreeMap<String, Container>,
}

/// The whole account.
#[derive(Debug, Default)]
pub struct Account {
    databases: BTreeMap<String, Database>,
    next_database: u32,
    lsn: u64,
    next_document: u64,
}

fn encode_rid(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD
        .encode(bytes)
        .replace('/', "-")
}

fn database_rid(number: u32) -> String {
    encode_rid(&number.to_be_bytes())
}

fn container_rid(database: u32, container: u32) -> String {
    let mut bytes = [0_u8; 8];
    bytes[..4].copy_from_slice(&database.to_be_bytes());
    bytes[4..].copy_from_slice(&(container | 0x8000_0000).to_be_bytes());
    encode_rid(&bytes)
}

fn document_rid(database: u32, container: u32, document: u64) -> String {
    let mut bytes = [0_u8; 16];
    bytes[..4].copy_from_slice(&database.to_be_bytes());
    bytes[4..8].copy_from_slice(&(container | 0x8000_0000).to_be_bytes());
    bytes[8..].copy_from_slice(&document.to_le_bytes());
    encode_rid(&bytes)
}

/// The ETag of a document version: its `_lsn`, quoted as HTTP writes entity tags.
pub fn etag_of(lsn: u64) -> String {
    format!("\"{lsn:016x}\"")
}

impl Account {
    /// An empty account.
    pub fn new() -> Account {
        Account::default()
    }

    /// The newest `_lsn` given to a write.
    pub fn last_lsn(&self) -> u64 {
        self.lsn
    }

    /// `POST /dbs`.
    pub fn create_database(&mut self, id: &str, ts: u64) -> Result<Value, Refusal> {
        check_id(id)?;
        if self.databases.contains_key(id) {
            return Err(Refusal::conflict(format!("database {id} already exists")));
        }
        self.next_database += 1;
        let number = self.next_database;
        let rid = database_rid(number);
        let properties = serde_json::json!({
            "id": id,
            "_rid": rid,
            "_self": format!("dbs/{rid}/"),
            "_etag": format!("\"db-{number}\""),
            "_colls": "colls/",
            "_users": "users/",
            "_ts": ts,
        });
        self.databases.insert(
            id.to_owned(),
            Database {
                properties: properties.clone(),
                number,
                next_container: 0,
                containers: BTreeMap::new(),
            },
        );
        Ok(properties)
    }

    /// `GET /dbs/{db}`.
    pub fn read_database(&self, id: &str) -> Result<Value, Refusal> {
        self.databases
            .get(id)
            .map(|database| database.properties.clone())
            .ok_or_else(|| Refusal::not_found(format!("database {id} does not exist")))
    }

    /// `POST /dbs/{db}/colls` with the container's properties.
    pub fn create_container(&mut self, db: &str, body: &Value, ts: u64) -> Result<Value, Refusal> {
        let database = self
            .databases
            .get_mut(db)
            .ok_or_else(|| Refusal::not_found(format!("database {db} does not exist")))?;
        let id = body
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| Refusal::bad_request("container properties need a string id".to_owned()))?;
        check_id(id)?;
        if database.containers.contains_key(id) {
            return Err(Refusal::conflict(format!("container {db}/{id} already exists")));
        }
        let mut key = body
            .get("partitionKey")
            .cloned()
            .ok_or_else(|| Refusal::bad_request(format!("container {id} has no partitionKey definition")))?;
        if let Some(key) = key.as_object_mut() {
            key.entry("kind").or_insert_with(|| Value::from("Hash"));
            key.entry("version").or_insert_with(|| Value::from(2));
        }
        let definition: azure_data_cosmos_driver::models::PartitionKeyDefinition =
            serde_json::from_value(key.clone())
                .map_err(|error| Refusal::bad_request(format!("partitionKey {key}: {error}")))?;
        let paths = key.get("paths").and_then(Value::as_array);
        let key_property = match paths.map(Vec::as_slice) {
            Some([Value::String(path)])
                if key.get("kind").and_then(Value::as_str) == Some("Hash")
                    && key.get("version").and_then(Value::as_u64) == Some(2)
                    && path.len() > 1
                    && path.starts_with('/')
                    && !path[1..].contains('/') =>
            {
                path[1..].to_owned()
            }
            _ => {
                return Err(Refusal::bad_request(format!(
                    "partitionKey {key}: cosmos-dev keeps hash (version 2) keys of one top-level path only"
                )));
            }
        };
        database.next_container += 1;
        let number = database.next_container;
        let rid = container_rid(database.number, number);
        let self_link = format!("dbs/{}/colls/{rid}/", database_rid(database.number));
        let mut properties = body.clone();
        if let Some(object) = properties.as_object_mut() {
            object.insert("partitionKey".to_owned(), key);
            object.insert("_rid".to_owned(), Value::from(rid.clone()));
            object.insert("_self".to_owned(), Value::from(self_link.clone()));
            object.insert("_etag".to_owned(), Value::from(format!("\"coll-{number}\"")));
            object.insert("_ts".to_owned(), Value::from(ts));
            for (name, link) in [
                ("_docs", "docs/"),
                ("_sprocs", "sprocs/"),
                ("_triggers", "triggers/"),
                ("_udfs", "udfs/"),
                ("_conflicts", "conflicts/"),
            ] {
                object.insert(name.to_owned(), Value::from(link));
            }
        }
        let width = (1_u128 << 126) / u128::from(INITIAL_PARTITIONS);
        let partitions = (0..INITIAL_PARTITIONS)
            .map(|index| {
                let min = u128::from(index) * width;
                let max = if index + 1 == INITIAL_PARTITIONS {
                    EPK_END
                } else {
                    u128::from(index + 1) * width
                };
                Partition::new(index, min, max, Vec::new())
            })
            .collect();
        database.containers.insert(
            id.to_owned(),
            Container {
                properties: properties.clone(),
                rid,
                number,
                key_property,
                definition,
                partitions,
                next_range_id: INITIAL_PARTITIONS,
                topology: 1,
                self_link,
            },
        );
        Ok(properties)
    }

    fn database(&self, db: &str) -> Result<&Database, Refusal> {
        self.databases
            .get(db)
            .ok_or_else(|| Refusal::not_found(format!("database {db} does not exist")))
    }

    fn container(&self, target: Target<'_>) -> Result<(&Database, &Container), Refusal> {
        let database = self.database(target.db)?;
        let container = database.containers.get(target.coll).ok_or_else(|| {
            Refusal::not_found(format!("container {}/{} does not exist", target.db, target.coll))
        })?;
        check_rid(container, target)?;
        Ok((database, container))
    }

    fn container_mut(&mut self, target: Target<'_>) -> Result<(u32, &mut Container), Refusal> {
        let database = self
            .databases
            .get_mut(target.db)
            .ok_or_else(|| Refusal::not_found(format!("database {} does not exist", target.db)))?;
        let number = database.number;
        let container = database.containers.get_mut(target.coll).ok_or_else(|| {
            Refusal::not_found(format!("container {}/{} does not exist", target.db, target.coll))
        })?;
        check_rid(container, target)?;
        Ok((number, container))
    }

    /// `GET /dbs/{db}/colls/{coll}`.
    pub fn read_container(&self, target: Target<'_>) -> Result<Value, Refusal> {
        self.container(target)
            .map(|(_, container)| container.properties.clone())
    }

    /// `DELETE /dbs/{db}/colls/{coll}`: the container and its documents are gone.
    pub fn delete_container(&mut self, target: Target<'_>) -> Result<(), Refusal> {
        self.container(target)?;
        if let Some(database) = self.databases.get_mut(target.db) {
            database.containers.remove(target.coll);
        }
        Ok(())
    }

    /// `GET …/pkranges`: the current ranges and their ETag, or `None` when `if_none_match` is that
    /// ETag (nothing changed).
    pub fn partition_key_ranges(
        &self,
        target: Target<'_>,
        if_none_match: Option<&str>,
    ) -> Result<(String, Option<Value>), Refusal> {
        let (_, container) = self.container(target)?;
        let etag = format!("\"ranges-{}\"", container.topology);
        if if_none_match == Some(etag.as_str()) {
            return Ok((etag, None));
        }
        let ranges: Vec<Value> = container
            .partitions
            .iter()
            .map(|partition| {
                serde_json::json!({
                    "id": partition.id.to_string(),
                    "_rid": container.rid,
                    "_self": format!("{}pkranges/{}/", container.self_link, partition.id),
                    "_etag": etag,
                    "minInclusive": bound_hex(partition.min),
                    "maxExclusive": bound_hex(partition.max),
                    "ridPrefix": partition.id,
                    "throughputFraction": 1.0 / container.partitions.len() as f64,
                    "status": "online",
                    "parents": partition.parents.iter().map(u32::to_string).collect::<Vec<_>>(),
                })
            })
            .collect();
        let count = ranges.len();
        Ok((
            etag,
            Some(serde_json::json!({
                "_rid": container.rid,
                "PartitionKeyRanges": ranges,
                "_count": count,
            })),
        ))
    }

    /// Splits range `range_id` of a container in two; the children's ids.
    pub fn split(&mut self, db: &str, coll: &str, range_id: u32) -> Result<(u32, u32), Refusal> {
        let target = Target {
            db,
            coll,
            intended_rid: None,
        };
        let (_, container) = self.container_mut(target)?;
        let index = container
            .partitions
            .iter()
            .position(|partition| partition.id == range_id)
            .ok_or_else(|| {
                Refusal::not_found(format!(
                    "no physical partition {range_id} in container {db}/{coll}"
                ))
            })?;
        let parent = container.partitions.remove(index);
        let (left_id, right_id) = (container.next_range_id, container.next_range_id + 1);
        container.next_range_id += 2;
        let (left, right) = parent.split(left_id, right_id);
        container.partitions.insert(index, right);
        container.partitions.insert(index, left);
        container.topology += 1;
        Ok((left_id, right_id))
    }

    /// The document key of `(partition key, id)` in a container.
    fn key_of(container: &Container, partition_key: &str, id: &str) -> DocKey {
        (epk_of(container, partition_key), id.into())
    }

    /// `GET …/docs/{id}`: the stored document and its ETag.
    pub fn read(
        &self,
        target: Target<'_>,
        partition_key: &str,
        id: &str,
    ) -> Result<(String, String), Refusal> {
        let (_, container) = self.container(target)?;
        let key = Account::key_of(container, partition_key, id);
        container
            .range_of(key.0)
            .and_then(|partition| partition.get(&key))
            .map(|stored| (stored.body.to_string(), etag_of(stored.lsn)))
            .ok_or_else(|| {
                Refusal::not_found(format!(
                    "document {id} (partition key {partition_key}) does not exist in {}/{}",
                    target.db, target.coll
                ))
            })
    }

    /// A create, upsert or replace of `document` under `partition_key`, guarded by `if_match`.
    pub fn write(
        &mut self,
        target: Target<'_>,
        partition_key: &str,
        kind: WriteKind,
        mut document: Map<String, Value>,
        if_match: Option<&str>,
        ts: u64,
    ) -> Result<Written, Refusal> {
        let next_lsn = self.lsn + 1;
        let next_document = self.next_document + 1;
        let (database_number, container) = self.container_mut(target)?;
        let id = match document.get("id") {
            Some(Value::String(id)) => id.clone(),
            _ => return Err(Refusal::bad_request("the document has no string id".to_owned())),
        };
        check_id(&id)?;
        if let WriteKind::Replace(path_id) = &kind
            && *path_id != id
        {
            return Err(Refusal::bad_request(format!(
                "the document's id {id} is not the id in the path, {path_id}"
            )));
        }
        match document.get(&container.key_property) {
            Some(Value::String(value)) if value == partition_key => {}
            other => {
                return Err(Refusal::bad_request(format!(
                    "partition key {partition_key:?} in the header does not match the document's {}: {other:?}",
                    container.key_property
                )));
            }
        }
        let key = Account::key_of(container, partition_key, &id);
        // The partitions field alone: the document's system properties read other fields below.
        let Some(partition) = container
            .partitions
            .iter_mut()
            .find(|partition| partition.holds(key.0))
        else {
            return Err(Refusal::bad_request(format!("no range holds document {id}")));
        };
        let existing = partition.get(&key);
        match (&kind, existing) {
            (WriteKind::Create, Some(_)) => {
                return Err(Refusal::conflict(format!(
                    "document {id} already exists in {}/{}",
                    target.db, target.coll
                )));
            }
            (WriteKind::Replace(_), None) => {
                return Err(Refusal::not_found(format!(
                    "document {id} does not exist in {}/{}",
                    target.db, target.coll
                )));
            }
            _ => {}
        }
        check_if_match(&id, if_match, existing.map(|stored| stored.lsn))?;
        let rid_number = existing.map_or(next_document, |stored| stored.rid);
        for property in SYSTEM_PROPERTIES {
            document.remove(property);
        }
        let rid = document_rid(database_number, container.number, rid_number);
        let etag = etag_of(next_lsn);
        document.insert("_rid".to_owned(), Value::from(rid.clone()));
        document.insert(
            "_self".to_owned(),
            Value::from(format!("{}docs/{rid}/", container.self_link)),
        );
        document.insert("_etag".to_owned(), Value::from(etag.clone()));
        document.insert("_attachments".to_owned(), Value::from("attachments/"));
        document.insert("_ts".to_owned(), Value::from(ts));
        document.insert("_lsn".to_owned(), Value::from(next_lsn));
        let body = Value::Object(document).to_string();
        if body.len() > MAX_DOCUMENT_BYTES {
            return Err(Refusal::new(
                413,
                0,
                "RequestEntityTooLarge",
                format!(
                    "document {id} is {} bytes, over the {MAX_DOCUMENT_BYTES}-byte limit",
                    body.len()
                ),
            ));
        }
        let created = existing.is_none();
        partition.put(
            key,
            Stored {
                body: body.into_boxed_str(),
                lsn: next_lsn,
                rid: rid_number,
            },
        );
        self.lsn = next_lsn;
        if created {
            self.next_document = next_document;
        }
        Ok(Written {
            created,
            etag,
            lsn: next_lsn,
        })
    }

    /// `DELETE …/docs/{id}`, guarded by `if_match`.
    pub fn delete(
        &mut self,
        target: Target<'_>,
        partition_key: &str,
        id: &str,
        if_match: Option<&str>,
    ) -> Result<(), Refusal> {
        let (_, container) = self.container_mut(target)?;
        let key = Account::key_of(container, partition_key, id);
        let current = container
            .range_of(key.0)
            .and_then(|partition| partition.get(&key))
            .map(|stored| stored.lsn);
        let Some(lsn) = current else {
            return Err(Refusal::not_found(format!(
                "document {id} does not exist in {}/{}",
                target.db, target.coll
            )));
        };
        check_if_match(id, if_match, Some(lsn))?;
        if let Some(partition) = container.range_of_mut(key.0) {
            partition.remove(&key);
        }
        Ok(())
    }

    /// The `_rid` of a container, for the answers that carry it.
    pub fn container_rid(&self, target: Target<'_>) -> Result<String, Refusal> {
        self.container(target).map(|(_, container)| container.rid.clone())
    }

    /// Documents in every container (for `/_dev/stats`).
    pub fn document_count(&self) -> usize {
        self.databases
            .values()
            .flat_map(|database| database.containers.values())
            .flat_map(|container| container.partitions.iter())
            .map(Partition::document_count)
            .sum()
    }
}

impl Container {
    /// The partition key range holding effective partition key `epk` (the ranges cover the space).
    fn range_of(&self, epk: u128) -> Option<&Partition> {
        self.partitions.iter().find(|partition| partition.holds(epk))
    }

    fn range_of_mut(&mut self, epk: u128) -> Option<&mut Partition> {
        self.partitions.iter_mut().find(|partition| partition.holds(epk))
    }
}

/// `If-Match`: refused (412) unless it names the current version's ETag (`None`: no document).
fn check_if_match(id: &str, if_match: Option<&str>, current_lsn: Option<u64>) -> Result<(), Refusal> {
    let Some(expected) = if_match else {
        return Ok(());
    };
    let current = current_lsn.map(etag_of);
    if current.as_deref() == Some(expected) {
        return Ok(());
    }
    Err(Refusal::new(
        412,
        0,
        "PreconditionFailed",
        format!(
            "document {id}: If-Match {expected} but the current ETag is {}",
            current.as_deref().unwrap_or("none (no document)")
        ),
    ))
}

fn check_rid(container: &Container, target: Target<'_>) -> Result<(), Refusal> {
    match target.intended_rid {
        Some(rid) if rid != container.rid => Err(Refusal::new(
            400,
            1024,
            "BadRequest",
            format!(
                "container {}/{} was recreated: the request names _rid {rid}, the container now has {}",
                target.db, target.coll, container.rid
            ),
        )),
        _ => Ok(()),
    }
}

/// Ids the service refuses: empty, over 255 characters, or with `/ \ ? #`.
fn check_id(id: &str) -> Result<(), Refusal> {
    if id.is_empty() || id.chars().count() > 255 || id.contains(['/', '\\', '?', '#']) {
        return Err(Refusal::bad_request(format!(
            "id {id:?} is not valid: 1–255 characters without / \\ ? #"
        )));
    }
    Ok(())
}

/// The effective partition key of a string partition key value, hashed as the client hashes it.
fn epk_of(container: &Container, partition_key: &str) -> u128 {
    use azure_data_cosmos_driver::models::{FeedRange, PartitionKey};
    let range = FeedRange::for_partition(
        PartitionKey::from(partition_key.to_owned()),
        &container.definition,
    );
    parse_epk(&range.min_inclusive().to_hex()).unwrap_or(0)
}

#[cfg(test)]
mod tests;
