//! The local Cosmos endpoint (`cosmos-dev`) as a process: it stops within its grace on SIGTERM
//! even while a client holds a connection it will not close (the board of `contrail up` keeps its
//! connections open), so stopping a platform does not wait for a kill.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use contrail_testkit::cosmos::CosmosDev;
use contrail_testkit::test_dir;

#[test]
fn sigterm_stops_the_endpoint_within_its_grace_while_a_client_holds_a_connection() {
    let dir = test_dir("cosmos-dev-sigterm");
    let mut dev = CosmosDev::start(&dir).expect("cosmos-dev starts");
    let address = dev
        .endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    // One connection that answered a request and stays open (keep-alive), and one in the middle
    // of a request whose end never comes: a graceful shutdown alone waits for that one (with the
    // grace at 60 s, cosmos-dev had not exited 20 s after the signal).
    let mut idle = TcpStream::connect(&address).expect("connect");
    idle.write_all(b"GET /_dev/healthz HTTP/1.1\r\nHost: cosmos-dev\r\n\r\n")
        .expect("request");
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut answer = [0_u8; 256];
    let read = idle.read(&mut answer).expect("answer");
    assert!(
        String::from_utf8_lossy(&answer[..read]).starts_with("HTTP/1.1 200"),
        "healthz answered {:?}",
        String::from_utf8_lossy(&answer[..read])
    );
    let mut pending = TcpStream::connect(&address).expect("connect");
    pending
        .write_all(b"GET /_dev/stats HTTP/1.1\r\nHost: cosmos-dev\r\n")
        .expect("partial request");
    // Let the server read what was sent before the signal.
    std::thread::sleep(Duration::from_millis(200));

    let started = Instant::now();
    let status = dev
        .process
        .terminate(Duration::from_secs(20))
        .expect("cosmos-dev exits on SIGTERM");
    let took = started.elapsed();
    assert!(status.success(), "cosmos-dev exited with {status}");
    assert!(
        took < Duration::from_secs(4),
        "cosmos-dev took {took:?} to exit after SIGTERM (its grace is 1 s)"
    );
    drop((idle, pending));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Through the ordinary client, against the default (own) store: a query over more documents than
/// one page of a range comes back whole — each once — by following the store's continuations;
/// writes answered 429 with a retry-after are retried by the client until they are applied.
#[test]
fn queries_page_through_every_range_and_throttled_writes_are_retried() {
    use futures::StreamExt as _;

    let dir = test_dir("cosmos-dev-pages");
    let dev = CosmosDev::start(&dir).expect("cosmos-dev starts");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // Four ranges of at most 1,000 rows a page: 5,000 documents need a second page in every range.
    const DOCUMENTS: usize = 5_000;
    runtime.block_on(async {
        let containers = dev.containers().await.expect("client");
        futures::stream::iter(0..DOCUMENTS)
            .for_each_concurrent(32, |n| {
                let flights = containers.flights.clone();
                async move {
                    let key = format!("PG{n:05}-2013-01-01-JFK");
                    let document = serde_json::json!({"id": key, "flightKey": key, "version": 1});
                    flights
                        .upsert_item(key.clone(), &key, &document, None)
                        .await
                        .expect("upsert");
                }
            })
            .await;
        let documents = contrail_testkit::cosmos::query_documents(&containers)
            .await
            .expect("query");
        assert_eq!(documents.len(), DOCUMENTS, "every document, each once");

        let throttle = format!("{}_dev/throttle?requests=3&retryAfterMs=20", dev.endpoint);
        let answer = contrail_testkit::http_post(&throttle, "").expect("throttle");
        assert!(answer.starts_with("HTTP/1.1 200"), "throttle: {answer}");
        let key = "PG-THROTTLED-2013-01-01-JFK";
        let document = serde_json::json!({"id": key, "flightKey": key, "version": 7});
        containers
            .flights
            .upsert_item(key.to_owned(), key, &document, None)
            .await
            .expect("the client retries a 429 and the write is applied");
        let stored = contrail_testkit::cosmos::point_read(&containers, key)
            .await
            .expect("read")
            .expect("stored");
        assert_eq!(stored["version"], 7);
    });
    let stats = contrail_testkit::http_get(&format!("{}_dev/stats", dev.endpoint)).expect("stats");
    let (_, body) = stats.split_once("\r\n\r\n").expect("an HTTP answer");
    let stats: serde_json::Value = serde_json::from_str(body).expect("stats JSON");
    assert_eq!(stats["documents"], DOCUMENTS + 1);
    assert_eq!(stats["throttled"], 3, "three requests were answered 429: {stats}");
    let bad = format!("{}_dev/throttle?requests=many", dev.endpoint);
    let refused = contrail_testkit::http_post(&bad, "").expect("answer");
    assert!(
        refused.starts_with("HTTP/1.1 400"),
        "a bad count is refused: {refused}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
