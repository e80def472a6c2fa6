//! Minimal blocking HTTP for probes (no client library: a probe must not share state with the
//! stage under test).

use std::time::Duration;

use anyhow::Result;

use crate::harness::wait::Probe;

/// Whether `GET url` answers 200; otherwise what it answered (status line or connection error).
pub fn answers_200(url: &str) -> Probe<()> {
    match http_get(url) {
        Ok(response) if response.starts_with("HTTP/1.1 200") => Probe::Ready(()),
        Ok(response) => Probe::NotYet(response.lines().next().unwrap_or_default().to_owned()),
        Err(error) => Probe::NotYet(format!("GET {url}: {error}")),
    }
}

/// A minimal blocking HTTP POST of a JSON `body` without credentials (status line and body).
pub fn http_post(url: &str, body: &str) -> Result<String> {
    let head = format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    exchange("POST", url, &head, body, Duration::from_secs(10))
}

/// A minimal blocking HTTP GET (status line and body), for probes.
pub fn http_get(url: &str) -> Result<String> {
    exchange("GET", url, "", "", Duration::from_secs(5))
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`); the whole answer as text.
fn exchange(method: &str, url: &str, headers: &str, body: &str, timeout: Duration) -> Result<String> {
    use std::io::{Read, Write};
    let without_scheme = url.trim_start_matches("http://");
    let (host, path) = without_scheme.split_once('/').unwrap_or((without_scheme, ""));
    let mut stream = std::net::TcpStream::connect(host)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(
        stream,
        "{method} /{path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n{body}"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}
