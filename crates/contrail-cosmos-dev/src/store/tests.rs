use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;

const DB: &str = "contrail";
const FLIGHTS: &str = "flights";

fn flights() -> Target<'static> {
    Target {
        db: DB,
        coll: FLIGHTS,
        intended_rid: None,
    }
}

fn account() -> Account {
    let mut account = Account::new();
    account.create_database(DB, 1).expect("database");
    account
        .create_container(
            DB,
            &json!({"id": FLIGHTS, "partitionKey": {"paths": ["/flightKey"], "kind": "Hash", "version": 2}}),
            1,
        )
        .expect("container");
    account
}

fn document(key: &str, version: u64) -> Map<String, Value> {
    match json!({"id": key, "flightKey": key, "version": version}) {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    }
}

fn range_ids(account: &Account) -> Vec<(String, Vec<String>)> {
    let (_, ranges) = account.partition_key_ranges(flights(), None).expect("ranges");
    let ranges = ranges.expect("a body without If-None-Match");
    ranges["PartitionKeyRanges"]
        .as_array()
        .expect("array")
        .iter()
        .map(|range| {
            let parents = range["parents"]
                .as_array()
                .expect("parents")
                .iter()
                .map(|parent| parent.as_str().expect("id").to_owned())
                .collect();
            (range["id"].as_str().expect("id").to_owned(), parents)
        })
        .collect()
}

#[test]
fn a_new_container_has_four_ranges_covering_the_key_space() {
    let account = account();
    let (etag, ranges) = account.partition_key_ranges(flights(), None).expect("ranges");
    let ranges = ranges.expect("body");
    let bounds: Vec<(String, String)> = ranges["PartitionKeyRanges"]
        .as_array()
        .expect("array")
        .iter()
        .map(|range| {
            (
                range["minInclusive"].as_str().expect("min").to_owned(),
                range["maxExclusive"].as_str().expect("max").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        bounds,
        vec![
            (String::new(), "10000000000000000000000000000000".to_owned()),
            (
                "10000000000000000000000000000000".to_owned(),
                "20000000000000000000000000000000".to_owned()
            ),
            (
                "20000000000000000000000000000000".to_owned(),
                "30000000000000000000000000000000".to_owned()
            ),
            ("30000000000000000000000000000000".to_owned(), "FF".to_owned()),
        ]
    );
    let (same, unchanged) = account
        .partition_key_ranges(flights(), Some(&etag))
        .expect("conditional read");
    assert_eq!(same, etag);
    assert!(unchanged.is_none(), "an unchanged topology answers 304");
}

#[test]
fn writes_are_guarded_by_existence_and_etag() {
    let mut account = account();
    let first = account
        .write(flights(), "AA-1", WriteKind::Create, document("AA-1", 1), None, 5)
        .expect("create");
    assert!(first.created);
    let again = account.write(flights(), "AA-1", WriteKind::Create, document("AA-1", 1), None, 5);
    assert_eq!(again.expect_err("exists").status, 409);
    let (body, etag) = account.read(flights(), "AA-1", "AA-1").expect("read");
    assert_eq!(etag, first.etag);
    let body: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(body["_etag"], Value::from(etag.clone()));
    assert_eq!(body["_lsn"], Value::from(first.lsn));
    assert_eq!(body["version"], 1);

    let replace = WriteKind::Replace("AA-1".to_owned());
    let second = account
        .write(
            flights(),
            "AA-1",
            replace.clone(),
            document("AA-1", 2),
            Some(&etag),
            6,
        )
        .expect("replace under the current ETag");
    assert!(!second.created);
    assert!(second.lsn > first.lsn);
    let stale = account.write(
        flights(),
        "AA-1",
        replace.clone(),
        document("AA-1", 3),
        Some(&etag),
        7,
    );
    assert_eq!(stale.expect_err("stale ETag").status, 412);
    let missing = account.write(
        flights(),
        "AA-2",
        WriteKind::Replace("AA-2".to_owned()),
        document("AA-2", 1),
        None,
        7,
    );
    assert_eq!(missing.expect_err("absent").status, 404);
    let wrong_key = account.write(flights(), "BB-9", WriteKind::Upsert, document("AA-1", 4), None, 7);
    assert_eq!(wrong_key.expect_err("header and body disagree").status, 400);

    let upserted = account
        .write(flights(), "AA-1", WriteKind::Upsert, document("AA-1", 4), None, 8)
        .expect("upsert");
    assert!(!upserted.created);
    let delete_stale = account.delete(flights(), "AA-1", "AA-1", Some(&second.etag));
    assert_eq!(delete_stale.expect_err("stale").status, 412);
    account
        .delete(flights(), "AA-1", "AA-1", Some(&upserted.etag))
        .expect("delete");
    assert_eq!(
        account.read(flights(), "AA-1", "AA-1").expect_err("gone").status,
        404
    );
}

#[test]
fn an_oversized_document_is_refused_and_nothing_changes() {
    let mut account = account();
    let mut big = document("AA-1", 1);
    big.insert("padding".to_owned(), Value::from("x".repeat(MAX_DOCUMENT_BYTES)));
    let refused = account.write(flights(), "AA-1", WriteKind::Upsert, big, None, 1);
    assert_eq!(refused.expect_err("too large").status, 413);
    assert_eq!(account.last_lsn(), 0);
    assert_eq!(account.document_count(), 0);
}

#[test]
fn a_recreated_container_refuses_requests_naming_the_old_one() {
    let mut account = account();
    let old = account.container_rid(flights()).expect("rid");
    account.delete_container(flights()).expect("delete");
    assert_eq!(account.read_container(flights()).expect_err("gone").status, 404);
    account
        .create_container(
            DB,
            &json!({"id": FLIGHTS, "partitionKey": {"paths": ["/flightKey"]}}),
            2,
        )
        .expect("re-create");
    let new = account.container_rid(flights()).expect("rid");
    assert_ne!(old, new);
    let stale = Target {
        intended_rid: Some(&old),
        ..flights()
    };
    let refused = account.read(stale, "AA-1", "AA-1").expect_err("stale rid");
    assert_eq!((refused.status, refused.substatus), (400, 1024));
    let properties = account.read_container(flights()).expect("read");
    assert_eq!(properties["partitionKey"]["version"], 2);
}

#[test]
fn queries_filter_project_and_page_through_a_range() {
    let mut account = account();
    for index in 0..50 {
        let key = format!("K-{index}");
        let mut doc = document(&key, index);
        doc.insert(
            "origin".to_owned(),
            Value::from(if index % 2 == 0 { "JFK" } else { "LGA" }),
        );
        account
            .write(flights(), &key, WriteKind::Upsert, doc, None, 1)
            .expect("write");
    }
    let mut parameters = Map::new();
    parameters.insert("@origin".to_owned(), Value::from("JFK"));
    let select = sql::parse(
        "SELECT c.id, c.version FROM c WHERE c.origin = @origin",
        &parameters,
    )
    .expect("query");
    let mut rows = Vec::new();
    for (range, _) in range_ids(&account) {
        let mut continuation = None;
        loop {
            let page = account
                .query(flights(), &range, &select, continuation.as_deref(), 3)
                .expect("page");
            assert!(page.rows.len() <= 3);
            rows.extend(page.rows);
            match page.continuation {
                Some(next) => continuation = Some(next),
                None => break,
            }
        }
    }
    let mut ids: Vec<u64> = rows
        .iter()
        .map(|row| {
            let row: Value = serde_json::from_str(row).expect("row");
            assert_eq!(row.as_object().expect("object").len(), 2, "{row}");
            row["version"].as_u64().expect("version")
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..50).filter(|index| index % 2 == 0).collect::<Vec<_>>());
}

/// A change feed reader as the client is one: a continuation per range; a range that is gone is
/// replaced by its children, each starting from the parent's continuation.
struct Reader {
    continuations: BTreeMap<String, FeedStart>,
    seen: BTreeMap<String, u64>,
}

impl Reader {
    fn new(account: &Account) -> Reader {
        Reader {
            continuations: range_ids(account)
                .into_iter()
                .map(|(id, _)| (id, FeedStart::After(0)))
                .collect(),
            seen: BTreeMap::new(),
        }
    }

    /// Reads every range until nothing is new; checks each change is newer than the last seen.
    fn catch_up(&mut self, account: &Account, page: usize) {
        loop {
            let mut any = false;
            for range in self.continuations.keys().cloned().collect::<Vec<_>>() {
                let start = self.continuations[&range];
                match account.changes(flights(), &range, start, page, None) {
                    Ok(answer) => {
                        assert!(answer.documents.len() <= page);
                        for body in &answer.documents {
                            let doc: Value = serde_json::from_str(body).expect("json");
                            let key = doc["id"].as_str().expect("id").to_owned();
                            let lsn = doc["_lsn"].as_u64().expect("_lsn");
                            let before = self.seen.insert(key.clone(), lsn);
                            assert!(
                                before.is_none_or(|before| before < lsn),
                                "{key}: {before:?} then {lsn}"
                            );
                            any = true;
                        }
                        let next = parse_feed_etag(&answer.etag).expect("etag");
                        self.continuations.insert(range, next);
                    }
                    Err(refusal) => {
                        assert_eq!((refusal.status, refusal.substatus), (410, 1002));
                        self.continuations.remove(&range);
                        for (child, parents) in range_ids(account) {
                            if parents.contains(&range) {
                                self.continuations.insert(child, start);
                            }
                        }
                        any = true;
                    }
                }
            }
            if !any {
                return;
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    Write(u8),
    Delete(u8),
    Read(usize),
    Split(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0_u8..40).prop_map(Step::Write),
        1 => (0_u8..40).prop_map(Step::Delete),
        2 => (1_usize..7).prop_map(Step::Read),
        1 => (0_usize..8).prop_map(Step::Split),
    ]
}

proptest! {
    /// Against a model of the latest write per key: a reader that polls between writes, deletes
    /// and splits ends with exactly the latest version of every live document, never sees a
    /// version go backwards, and a caught-up poll answers nothing.
    #[test]
    fn the_change_feed_delivers_the_latest_version_of_every_document_across_splits(
        steps in proptest::collection::vec(step(), 1..120)
    ) {
        let mut account = account();
        let mut reader = Reader::new(&account);
        let mut model: BTreeMap<String, u64> = BTreeMap::new();
        for step in steps {
            match step {
                Step::Write(key) => {
                    let key = format!("F-{key}");
                    let written = account
                        .write(flights(), &key, WriteKind::Upsert, document(&key, 0), None, 1)
                        .expect("upsert");
                    model.insert(key, written.lsn);
                }
                Step::Delete(key) => {
                    let key = format!("F-{key}");
                    let deleted = account.delete(flights(), &key, &key, None);
                    prop_assert_eq!(deleted.is_ok(), model.remove(&key).is_some());
                }
                Step::Read(page) => reader.catch_up(&account, page),
                Step::Split(index) => {
                    let ranges = range_ids(&account);
                    let (id, _) = &ranges[index % ranges.len()];
                    account.split(DB, FLIGHTS, id.parse().expect("id")).expect("split");
                }
            }
        }
        reader.catch_up(&account, 5);
        for (key, lsn) in &model {
            prop_assert_eq!(reader.seen.get(key), Some(lsn), "{}", key);
        }
        for (range, start) in &reader.continuations {
            let page = account.changes(flights(), range, *start, 10, None).expect("read");
            prop_assert!(page.documents.is_empty());
        }
        let live: usize = model.len();
        prop_assert_eq!(account.document_count(), live);
    }
}
