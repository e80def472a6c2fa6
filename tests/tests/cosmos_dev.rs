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
