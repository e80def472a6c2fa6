//! changefeed-sync as real processes against the real broker and the Cosmos DB dev endpoint:
//! `kill -9` while writes continue, two instances sharing the leases, takeover of a dead one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use contrail_proto::v1::ServingChange;
use contrail_testkit::cosmos::{CosmosDev, CosmosStage, containers_at, point_read, status_at, sync_env};
use contrail_testkit::{
    Moments, Probe, TopicReader, create_topics, shared_broker, test_dir, unique, wait_until,
};
use prost::Message as _;
use rdkafka::message::Message as _;

/// The id (= flight key) of test document `flight`.
fn flight_key(flight: usize) -> String {
    format!("ZZ-{flight:04}-2013-01-01-JFK")
}

/// Writes `rounds` versions of each of the first `flights` documents, a few ms apart.
fn write_versions(endpoint: &str, flights: usize, rounds: u64, first_round: u64, pause: Duration) {
    write_versions_of(endpoint, 0..flights, rounds, first_round, pause);
}

/// Writes `rounds` versions of each document of `flights`, a few ms apart, from this process.
fn write_versions_of(
    endpoint: &str,
    flights: std::ops::Range<usize>,
    rounds: u64,
    first_round: u64,
    pause: Duration,
) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let containers = containers_at(endpoint).await.expect("client");
        for round in first_round..first_round + rounds {
            for flight in flights.clone() {
                let key = flight_key(flight);
                let document = serde_json::json!({
                    "id": key, "flightKey": key, "version": round, "status": format!("round {round}")
                });
                containers
                    .flights
                    .upsert_item(key.clone(), &key, &document, None)
                    .await
                    .expect("upsert");
                tokio::time::sleep(pause).await;
            }
        }
    });
}

/// `(_lsn, version)` of each of the first `flights` test documents, by point read.
fn stored(dev: &CosmosDev, flights: usize) -> BTreeMap<String, (i64, u64)> {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let containers = dev.containers().await.expect("client");
        let mut documents = BTreeMap::new();
        for flight in 0..flights {
            let key = flight_key(flight);
            if let Some(document) = point_read(&containers, &key).await.expect("point read") {
                let lsn = document["_lsn"].as_i64().unwrap_or(0);
                documents.insert(key, (lsn, document["version"].as_u64().unwrap_or(0)));
            }
        }
        documents
    })
}

/// Reads the change topic (one reader, from the beginning) until it holds every `(id, lsn)` of
/// `wanted`, then 500 ms more so copies show up too; the failure lists what is missing.
fn changes_covering(
    brokers: &str,
    topic: &str,
    wanted: &BTreeMap<String, (i64, u64)>,
    timeout: Duration,
) -> Vec<ServingChange> {
    let mut reader = TopicReader::open(brokers, topic).expect("reader of the change topic");
    let decode = |reader: &TopicReader| -> Vec<ServingChange> {
        reader
            .messages()
            .iter()
            .map(|message| {
                ServingChange::decode(message.payload().unwrap_or_default()).expect("a ServingChange")
            })
            .collect()
    };
    wait_until(
        &format!("the final (id, lsn) of {} documents on {topic}", wanted.len()),
        timeout,
        || {
            reader.poll_for(Duration::from_millis(500))?;
            let changes = decode(&reader);
            let seen: BTreeSet<(&str, i64)> = changes
                .iter()
                .map(|change| (change.id.as_str(), change.lsn))
                .collect();
            let missing: Vec<(&String, i64)> = wanted
                .iter()
                .filter(|(id, (lsn, _))| !seen.contains(&(id.as_str(), *lsn)))
                .map(|(id, (lsn, _))| (id, *lsn))
                .collect();
            Ok(if missing.is_empty() {
                Probe::Ready(())
            } else {
                Probe::NotYet(format!(
                    "{} of {} missing (of {} records read), e.g. {:?}",
                    missing.len(),
                    wanted.len(),
                    changes.len(),
                    &missing[..missing.len().min(5)]
                ))
            })
        },
    )
    .expect("every change on the topic");
    reader.poll_for(Duration::from_millis(500)).expect("read on");
    decode(&reader)
}

/// Waits until `stage` reports lease owners for which `settled` holds.
fn wait_for_owners(stage: &mut CosmosStage, condition: &str, settled: impl Fn(&[String]) -> bool) {
    let grpc_url = stage.grpc_url.clone();
    stage
        .process
        .wait_until(condition, Duration::from_secs(60), || {
            let owners: Vec<String> = status_at(&grpc_url)
                .map(|status| status.leases.iter().map(|lease| lease.owner.clone()).collect())
                .unwrap_or_default();
            Ok(if settled(&owners) {
                Probe::Ready(())
            } else {
                Probe::NotYet(format!("owners {owners:?}"))
            })
        })
        .expect(condition);
}

#[test]
fn kill_9_while_writing_loses_no_change_and_a_survivor_takes_over() {
    let broker = shared_broker();
    let dir = test_dir("changefeed");
    let dev = CosmosDev::start(&dir).expect("cosmos-dev");
    let topic = format!("{}.ops.flights.changes", unique("c"));
    create_topics(&broker.address, &[&topic], 4).expect("topic");
    // The containers exist before the instances start so both see the same feed ranges.
    write_versions(&dev.endpoint, 1, 1, 0, Duration::ZERO);
    let mut a = CosmosStage::start(
        "changefeed-sync",
        sync_env(&broker.address, &topic, "sync-a", &dev),
        &dir.join("a"),
    )
    .expect("instance a");
    let mut b = CosmosStage::start(
        "changefeed-sync",
        sync_env(&broker.address, &topic, "sync-b", &dev),
        &dir.join("b"),
    )
    .expect("instance b");

    // Both instances share the four leases (the emulator gives a container four feed ranges).
    wait_for_owners(&mut b, "four leases shared 2/2 by sync-a and sync-b", |owners| {
        let a_count = owners.iter().filter(|owner| *owner == "sync-a").count();
        let b_count = owners.iter().filter(|owner| *owner == "sync-b").count();
        owners.len() == 4 && a_count == 2 && b_count == 2
    });

    // Writes continue in the background while instance a is killed at random moments: 150
    // documents rewritten 12 times (versions must only move forward), and beside them new
    // documents written once each until the kills are over — a change of those lost at a kill is
    // not hidden by a later one, so every one must arrive.
    let writing = Arc::new(AtomicBool::new(true));
    let writer_dev_endpoint = dev.endpoint.clone();
    let still_writing = writing.clone();
    let writer = std::thread::spawn(move || {
        write_versions(&writer_dev_endpoint, 150, 12, 1, Duration::from_millis(8));
        still_writing.store(false, Ordering::Relaxed);
    });
    let kills_over = Arc::new(AtomicBool::new(false));
    let once_endpoint = dev.endpoint.clone();
    let stop_once = kills_over.clone();
    let once_writer = std::thread::spawn(move || {
        let mut next = 150;
        while !stop_once.load(Ordering::Relaxed) || next < 450 {
            write_versions_of(&once_endpoint, next..next + 10, 1, 1, Duration::from_millis(5));
            next += 10;
        }
        next
    });
    let mut moments = Moments::from_clock();
    let mut kills = 0;
    while kills < 6 {
        std::thread::sleep(Duration::from_millis(moments.next_ms(300, 2_500)));
        a.restart_after_kill9().expect("restart after kill -9");
        kills += 1;
        println!(
            "kill {kills} (writes still running: {})",
            writing.load(Ordering::Relaxed)
        );
    }
    kills_over.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    let documents = once_writer.join().expect("writer of new documents");
    println!(
        "{} documents written once each while a was killed",
        documents - 150
    );
    let final_documents = stored(&dev, documents);
    assert_eq!(final_documents.len(), documents, "documents written");
    assert!(
        final_documents.values().all(|(lsn, _)| *lsn > 0),
        "every document carries _lsn"
    );
    let changes = changes_covering(
        &broker.address,
        &topic,
        &final_documents,
        Duration::from_secs(120),
    );
    let distinct: BTreeSet<(&str, i64)> = changes
        .iter()
        .map(|change| (change.id.as_str(), change.lsn))
        .collect();
    println!(
        "{} changes on the topic, {} distinct (id, lsn), {} redelivered",
        changes.len(),
        distinct.len(),
        changes.len() - distinct.len()
    );
    for change in &changes {
        let document: serde_json::Value = serde_json::from_str(&change.document_json).expect("document json");
        assert_eq!(document["id"], change.id.as_str());
        assert_eq!(
            document["_lsn"].as_i64(),
            Some(change.lsn),
            "lsn matches the document"
        );
        let (_, final_version) = final_documents.get(&change.id).copied().unwrap_or((0, 0));
        assert!(document["version"].as_u64().unwrap_or(u64::MAX) <= final_version);
    }
    // Per document, the versions seen only move forward in lsn order.
    let mut by_id: BTreeMap<&str, Vec<(i64, u64)>> = BTreeMap::new();
    for change in &changes {
        let document: serde_json::Value = serde_json::from_str(&change.document_json).expect("json");
        by_id
            .entry(change.id.as_str())
            .or_default()
            .push((change.lsn, document["version"].as_u64().unwrap_or(0)));
    }
    for (id, mut seen) in by_id {
        seen.sort_unstable();
        assert!(
            seen.windows(2).all(|pair| pair[0].1 <= pair[1].1),
            "{id}: versions out of lsn order {seen:?}"
        );
    }

    // Takeover: a dies for good; b takes every lease once a's leases expire, and keeps publishing.
    a.process.kill9();
    wait_for_owners(&mut b, "sync-b to own all four leases", |owners| {
        owners.len() == 4 && owners.iter().all(|owner| owner == "sync-b")
    });
    write_versions(&dev.endpoint, 150, 1, 100, Duration::ZERO);
    let after = stored(&dev, 150);
    changes_covering(&broker.address, &topic, &after, Duration::from_secs(60));
    let status = b.status().expect("status");
    assert!(
        status.leases.iter().all(|lease| lease.last_lsn > 0),
        "every lease published: {:?}",
        status.leases
    );
}

/// The container's feed ranges as the ordinary client sees them.
fn feed_ranges(dev: &CosmosDev) -> usize {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let containers = dev.containers().await.expect("client");
        let options = azure_data_cosmos::options::ReadFeedRangesOptions::default().with_force_refresh(true);
        containers
            .flights
            .read_feed_ranges(Some(options))
            .await
            .expect("feed ranges")
            .len()
    })
}

#[test]
fn a_split_feed_range_keeps_delivering_every_change() {
    let broker = shared_broker();
    let dir = test_dir("changefeed-split");
    let dev = CosmosDev::start(&dir).expect("cosmos-dev");
    let topic = format!("{}.ops.flights.changes", unique("s"));
    create_topics(&broker.address, &[&topic], 4).expect("topic");
    write_versions(&dev.endpoint, 60, 1, 1, Duration::ZERO);
    let sync = CosmosStage::start(
        "changefeed-sync",
        sync_env(&broker.address, &topic, "sync-split", &dev),
        &dir.join("sync"),
    )
    .expect("changefeed-sync");
    changes_covering(
        &broker.address,
        &topic,
        &stored(&dev, 60),
        Duration::from_secs(60),
    );
    let before = feed_ranges(&dev);

    // The service splits a partition that grows; the dev endpoint does it on request.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let answer = runtime.block_on(async {
        reqwest::Client::new()
            .post(format!(
                "{}_dev/split?db=contrail&coll=flights&partition=0",
                dev.endpoint
            ))
            .send()
            .await
            .expect("split request")
    });
    assert!(answer.status().is_success(), "split: {}", answer.status());
    let after = feed_ranges(&dev);
    assert_eq!(after, before + 1, "the split adds a feed range");

    // Changes in both children of the split range keep arriving through the parent's lease.
    write_versions(&dev.endpoint, 60, 3, 2, Duration::from_millis(5));
    changes_covering(
        &broker.address,
        &topic,
        &stored(&dev, 60),
        Duration::from_secs(60),
    );
    let status = sync.status().expect("status");
    assert_eq!(
        status.leases.len(),
        before,
        "no lease is added for the children: {:?}",
        status.leases
    );
}

/// Deletes every lease document of the dev endpoint's lease container but the first by id, as an
/// interrupted bootstrap (or an operator) leaves them; returns how many it deleted.
fn delete_all_leases_but_one(dev: &CosmosDev) -> usize {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        use futures::StreamExt as _;
        let containers = dev.containers().await.expect("client");
        let mut ids = Vec::new();
        let mut items = containers
            .leases
            .query_items::<serde_json::Value>(
                "SELECT c.id FROM c",
                azure_data_cosmos::FeedScope::full_container(),
                None,
            )
            .await
            .expect("query leases");
        while let Some(item) = items.next().await {
            ids.push(item.expect("lease")["id"].as_str().expect("id").to_owned());
        }
        ids.sort();
        for id in &ids[1..] {
            containers
                .leases
                .delete_item(id.clone(), id, None)
                .await
                .expect("delete a lease");
        }
        ids.len() - 1
    })
}

/// The periodic lease check (`leases.coverage_check_interval_ms`): leases deleted while
/// changefeed-sync runs are given back by the running process — it says so in its log — and
/// every change written afterwards arrives, whichever feed range it is in.
#[test]
fn leases_deleted_while_running_are_given_back_and_every_range_is_read() {
    let broker = shared_broker();
    let dir = test_dir("changefeed-lease-check");
    let dev = CosmosDev::start(&dir).expect("cosmos-dev");
    let topic = format!("{}.ops.flights.changes", unique("c"));
    create_topics(&broker.address, &[&topic], 4).expect("topic");
    let ranges = feed_ranges(&dev);
    let mut env = sync_env(&broker.address, &topic, "sync-check", &dev);
    env.push((
        "CONTRAIL_LEASES__COVERAGE_CHECK_INTERVAL_MS".to_owned(),
        "1000".to_owned(),
    ));
    let mut stage = CosmosStage::start("changefeed-sync", env, &dir.join("sync")).expect("changefeed-sync");
    wait_for_owners(&mut stage, "every range leased", |owners| owners.len() == ranges);
    let given_back = "feed ranges without a lease found and given one";
    assert!(
        !stage.log_text().contains(given_back),
        "nothing was missing at start"
    );

    assert_eq!(delete_all_leases_but_one(&dev), ranges - 1);
    wait_until(
        "changefeed-sync gives the deleted leases back while it runs",
        Duration::from_secs(30),
        || {
            Ok(if stage.log_text().contains(given_back) {
                Probe::Ready(())
            } else {
                Probe::NotYet(stage.process.log_tail(5))
            })
        },
    )
    .expect("leases given back");
    write_versions(&dev.endpoint, 80, 1, 1, Duration::ZERO);
    changes_covering(
        &broker.address,
        &topic,
        &stored(&dev, 80),
        Duration::from_secs(60),
    );
    wait_for_owners(&mut stage, "every range leased again", |owners| {
        owners.len() == ranges
    });
}

/// Every feed range has a lease (docs/CONTRACT.md, "No silent gap"): a bootstrap interrupted after
/// its first lease leaves one lease of the container's four. On its next start changefeed-sync
/// completes the set — it checks every feed range against the leases, not only whether any lease
/// exists — and every document's change arrives, whichever range it is in.
#[test]
fn a_partial_lease_set_is_completed_and_every_range_is_read() {
    let broker = shared_broker();
    let dir = test_dir("changefeed-partial-leases");
    let dev = CosmosDev::start(&dir).expect("cosmos-dev");
    let topic = format!("{}.ops.flights.changes", unique("p"));
    create_topics(&broker.address, &[&topic], 4).expect("topic");
    let ranges = feed_ranges(&dev);
    assert!(
        ranges >= 4,
        "the dev endpoint gives a container several feed ranges: {ranges}"
    );
    // A first start creates the leases of every range (nothing written yet); then all but one are
    // deleted, as an interrupted bootstrap leaves them.
    let mut first = CosmosStage::start(
        "changefeed-sync",
        sync_env(&broker.address, &topic, "sync-partial", &dev),
        &dir.join("sync-first"),
    )
    .expect("changefeed-sync");
    first.process.terminate(Duration::from_secs(30)).expect("stops");
    let deleted = delete_all_leases_but_one(&dev);
    assert_eq!(
        deleted,
        ranges - 1,
        "the first start created one lease per feed range"
    );

    write_versions(&dev.endpoint, 80, 1, 1, Duration::ZERO);
    let second = CosmosStage::start(
        "changefeed-sync",
        sync_env(&broker.address, &topic, "sync-partial", &dev),
        &dir.join("sync-second"),
    )
    .expect("changefeed-sync");
    changes_covering(
        &broker.address,
        &topic,
        &stored(&dev, 80),
        Duration::from_secs(60),
    );
    assert_eq!(
        second.status().expect("status").leases.len(),
        ranges,
        "one lease per feed range again"
    );
}
